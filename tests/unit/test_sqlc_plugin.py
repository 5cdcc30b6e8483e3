"""tools/sqlc_gen_psycopg.py: the sqlc process plugin that writes the query layer.

The plugin runs as sqlc runs it (a subprocess, JSON on stdin and stdout) on
tests/unit/sqlc_fixture/request.json, a GenerateRequest saved from sqlc for
the fixture project next to it (its schema and queries cover every type and
command the plugin maps, all in the schema jobrun, the plugin option schema).
The generated code is then inspected with ast and imported, and its schema
rewrite (_schema.py) is run on the fixture's SQL and on odd SQL of its own.
The asyncio twins (aio/) are checked against the sync methods they mirror.
tests/postgres/test_sqlc_fixture_roundtrip.py runs it on PostgreSQL, in the
default schema and in another.

Also here: tools/check_sqlc_schema.py and tools/check_generated.py.
"""

from __future__ import annotations

import ast
import base64
import copy
import enum
import importlib
import importlib.util
import inspect
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tools" / "sqlc_gen_psycopg.py"
CHECK_SCHEMA = ROOT / "tools" / "check_sqlc_schema.py"
CHECK_GENERATED = ROOT / "tools" / "check_generated.py"
FIXTURE = Path(__file__).resolve().parent / "sqlc_fixture"
REQUEST = FIXTURE / "request.json"
PACKAGE = "sqlc_fixture_gen"
SQLC = Path(sys.executable).parent / "sqlc"
RUFF = Path(sys.executable).parent / "ruff"
SCHEMA = "jobrun"  # the fixture's plugin option schema

needs_sqlc = pytest.mark.skipif(not SQLC.exists(), reason=f"sqlc not installed at {SQLC}")


# --------------------------------------------------------------------------- helpers


def load_request() -> dict[str, Any]:
    request: dict[str, Any] = json.loads(REQUEST.read_text(encoding="utf-8"))
    return request


def run_plugin(request: dict[str, Any] | bytes) -> tuple[int, dict[str, str], str]:
    """Run the plugin like sqlc does: exit status, files written, stderr."""
    data = request if isinstance(request, bytes) else json.dumps(request).encode()
    proc = subprocess.run(
        [sys.executable, str(PLUGIN)], input=data, capture_output=True, check=False
    )
    files: dict[str, str] = {}
    if proc.returncode == 0:
        response = json.loads(proc.stdout)
        files = {
            f["name"]: base64.b64decode(f["contents"]).decode("utf-8") for f in response["files"]
        }
    return proc.returncode, files, proc.stderr.decode()


def generate_ok(request: dict[str, Any]) -> dict[str, str]:
    rc, files, err = run_plugin(request)
    assert rc == 0, err
    return files


def write_package(files: dict[str, str], parent: Path, package: str = PACKAGE) -> Path:
    pkg = parent / package
    pkg.mkdir(parents=True)
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text, encoding="utf-8")
    return pkg


def query(request: dict[str, Any], name: str) -> dict[str, Any]:
    return next(q for q in request["queries"] if q["name"] == name)


def functions(source: str) -> dict[str, ast.FunctionDef]:
    """The module-level functions of ``source``."""
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)}


def methods(source: str) -> dict[str, ast.FunctionDef]:
    """The methods of the module's Queries class: one per query."""
    cls = classes(source)["Queries"]
    return {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}


def async_methods(source: str) -> dict[str, ast.AsyncFunctionDef]:
    """The coroutine methods of an aio module's AsyncQueries class: one per query."""
    cls = classes(source)["AsyncQueries"]
    assert not [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    return {n.name: n for n in cls.body if isinstance(n, ast.AsyncFunctionDef)}


def imported_names(source: str, module: str) -> list[str]:
    """The names ``source`` imports from ``module``, in their order."""
    return [
        alias.name
        for n in ast.parse(source).body
        if isinstance(n, ast.ImportFrom) and n.module == module
        for alias in n.names
    ]


def classes(source: str) -> dict[str, ast.ClassDef]:
    return {n.name: n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)}


def constants(source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            assert node.value is not None
            out[node.target.id] = ast.literal_eval(node.value)
    return out


def fields(cls: ast.ClassDef) -> dict[str, str]:
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """``(self, conn: psycopg.Connection[Any], *, id: uuid.UUID) -> Job | None``."""
    returns = ast.unparse(fn.returns) if fn.returns else "None"
    return f"({ast.unparse(fn.args)}) -> {returns}"


def body(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return "\n".join(ast.unparse(stmt) for stmt in fn.body)


def load_plugin_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sqlc_gen_psycopg_under_test", PLUGIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return generate_ok(load_request())


@pytest.fixture(scope="module")
def plugin() -> ModuleType:
    return load_plugin_module()


@pytest.fixture
def imported(generated: dict[str, str], tmp_path: Path) -> Iterator[dict[str, ModuleType]]:
    """The generated package, imported from a temporary directory."""
    write_package(generated, tmp_path)
    sys.path.insert(0, str(tmp_path))
    try:
        modules = {
            name: importlib.import_module(f"{PACKAGE}.{name}")
            for name in (
                "models",
                "jobs",
                "all_types",
                "_schema",
                "aio",
                "aio.jobs",
                "aio.all_types",
            )
        }
        yield {"package": importlib.import_module(PACKAGE), **modules}
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


# --------------------------------------------------------------------------- the plugin file


def test_plugin_is_an_executable_python3_script() -> None:
    assert PLUGIN.read_text(encoding="utf-8").startswith("#!/usr/bin/env python3\n")
    mode = PLUGIN.stat().st_mode
    assert mode & stat.S_IXUSR and mode & stat.S_IXGRP and mode & stat.S_IXOTH


def test_saved_request_is_a_real_sqlc_request_in_json() -> None:
    request = load_request()
    assert request["sqlc_version"].startswith("v1.")
    assert request["settings"]["engine"] == "postgresql"
    assert {q["cmd"] for q in request["queries"]} == {
        ":one",
        ":many",
        ":exec",
        ":execrows",
        ":copyfrom",
        ":batchexec",
        ":batchone",
        ":batchmany",
    }


# --------------------------------------------------------------------------- files


def test_writes_one_module_per_query_file_plus_models_and_init(
    generated: dict[str, str],
) -> None:
    assert sorted(generated) == [
        "__init__.py",
        "_schema.py",
        "aio/__init__.py",
        "aio/all_types.py",
        "aio/jobs.py",
        "all_types.py",
        "jobs.py",
        "models.py",
    ]


def test_every_file_starts_with_the_do_not_edit_header(generated: dict[str, str]) -> None:
    version = load_request()["sqlc_version"]
    sources = {
        "jobs.py": "query/jobs.sql",
        "all_types.py": "query/all_types.sql",
        "models.py": "schema/0001.types.sql, schema/0002.all_types.sql, schema/0003.audit.sql",
        "__init__.py": "query",
        "_schema.py": "query",
        "aio/jobs.py": "query/jobs.sql",
        "aio/all_types.py": "query/all_types.sql",
        "aio/__init__.py": "query",
    }
    for name, text in generated.items():
        lines = text.splitlines()
        assert (
            lines[0] == f"# Code generated by sqlc-gen-psycopg from {sources[name]}. DO NOT EDIT."
        )
        assert f"#   sqlc {version}" in lines[1:4], name


def test_generated_code_compiles(generated: dict[str, str]) -> None:
    for name, text in generated.items():
        compile(text, name, "exec")


def test_generated_code_passes_mypy_strict(generated: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("mypy")
    write_package(generated, tmp_path)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            os.devnull,
            "--python-version",
            "3.11",
            PACKAGE,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_output_is_deterministic(generated: dict[str, str]) -> None:
    request = load_request()
    assert generate_ok(request) == generated
    # Key order in the JSON must not matter either.
    reordered = json.loads(json.dumps(request, sort_keys=True))
    reordered = {k: reordered[k] for k in reversed(list(reordered))}
    assert generate_ok(reordered) == generated


def test_queries_keep_sqlc_text_and_placeholders_exactly(generated: dict[str, str]) -> None:
    request = load_request()
    for module in ("jobs", "all_types"):
        consts = constants(generated[f"{module}.py"])
        for q in request["queries"]:
            if q["filename"] == f"{module}.sql":
                name = load_plugin_module().snake(q["name"]).upper()
                assert consts[name] == q["text"], q["name"]


# --------------------------------------------------------------------------- models


def test_enums_become_strenums_with_upper_case_members(
    imported: dict[str, ModuleType],
) -> None:
    models = imported["models"]
    assert issubclass(models.JobState, enum.StrEnum)
    assert [(m.name, m.value) for m in models.JobState] == [
        ("QUEUED", "queued"),
        ("LEASED", "leased"),
        ("SUCCEEDED", "succeeded"),
        ("DEAD", "dead"),
        ("CANCELLED", "cancelled"),
    ]
    assert models.Mood.SO_SO == "so-so"  # not an identifier: sanitized name, exact value


def test_tables_become_slotted_row_dataclasses_named_in_the_singular(
    imported: dict[str, ModuleType],
) -> None:
    models = imported["models"]
    for name in ("Job", "JobEvent", "AllType", "AuditEntry"):  # audit.entries: schema prefix
        cls = getattr(models, name)
        params = cls.__dataclass_params__
        # Not frozen: a frozen __init__ costs 1.6x, and rows come by the thousand.
        assert not params.frozen and hasattr(cls, "__slots__"), name
    with pytest.raises(TypeError):
        models.AuditEntry(1, "positional")  # kw_only


def test_postgres_own_catalog_tables_get_no_models(generated: dict[str, str]) -> None:
    request = load_request()
    system = [s for s in request["catalog"]["schemas"] if s["name"] == "pg_catalog"]
    assert system and system[0]["tables"]  # the saved request keeps a sample
    assert list(classes(generated["models.py"])) == [
        "JobState",
        "Mood",
        "Job",
        "JobEvent",
        "AllType",
        "AuditEntry",
    ]


@pytest.mark.parametrize(
    ("schema", "table", "expected"),
    [
        ("public", "jobs", "Job"),
        ("public", "job_events", "JobEvent"),
        ("public", "processed_effects", "ProcessedEffect"),
        ("public", "schedules", "Schedule"),
        ("public", "categories", "Category"),
        ("public", "boxes", "Box"),
        ("public", "addresses", "Address"),
        ("public", "status", "Status"),
        ("public", "data", "Data"),
        ("audit", "entries", "AuditEntry"),
    ],
)
def test_model_names_are_singular_camel_case(
    plugin: ModuleType, schema: str, table: str, expected: str
) -> None:
    assert plugin.model_class_name(schema, table, "public") == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ClaimJobs", "claim_jobs"),
        ("ListJobIDs", "list_job_ids"),
        ("GetJobByID", "get_job_by_id"),
        ("HTTPServer", "http_server"),
        ("already_snake", "already_snake"),
    ],
)
def test_query_names_become_snake_case_functions(
    plugin: ModuleType, name: str, expected: str
) -> None:
    assert plugin.snake(name) == expected


def test_every_postgres_type_maps_to_its_python_type(generated: dict[str, str]) -> None:
    assert fields(classes(generated["models.py"])["AllType"]) == {
        "id": "int",  # bigserial
        "c_serial": "int",
        "c_smallint": "int",
        "c_int2": "int | None",
        "c_integer": "int",
        "c_int4": "int | None",
        "c_bigint": "int",
        "c_int8": "int | None",
        "c_boolean": "bool",
        "c_bool": "bool | None",
        "c_real": "float",
        "c_float4": "float | None",
        "c_double": "float",
        "c_float8": "float | None",
        "c_numeric": "decimal.Decimal",
        "c_decimal": "decimal.Decimal | None",
        "c_text": "str",
        "c_varchar": "str | None",
        "c_charvar": "str | None",
        "c_bpchar": "str | None",
        "c_character": "str | None",
        "c_name": "str | None",
        "c_uuid": "uuid.UUID",
        "c_jsonb": "Any",
        "c_json": "Any",
        "c_timestamptz": "datetime.datetime",
        "c_ts_tz": "datetime.datetime | None",
        "c_timestamp": "datetime.datetime | None",
        "c_ts_notz": "datetime.datetime | None",
        "c_date": "datetime.date | None",
        "c_time": "datetime.time | None",
        "c_interval": "datetime.timedelta | None",
        "c_bytea": "bytes | None",
        "c_mood": "Mood",
        "c_mood_null": "Mood | None",
        "c_text_array": "list[str]",
        "c_int_array": "list[int] | None",
        "c_uuid_array": "list[uuid.UUID] | None",
        "c_jsonb_array": "list[Any] | None",
        "c_mood_array": "list[Mood] | None",
    }


def test_expression_columns_map_sqlc_type_aliases(generated: dict[str, str]) -> None:
    # sqlc spells these differently from the table columns ("timestamp with
    # time zone", "bool", "pg_catalog.int4[]", ...).
    assert fields(classes(generated["all_types.py"])["ExpressionsRow"]) == {
        "a_smallint": "int",
        "a_bigint": "int",
        "a_real": "float",
        "a_double": "float",
        "a_numeric": "decimal.Decimal",
        "a_bool": "bool",
        "a_varchar": "str",
        "a_char": "str",
        "a_now": "datetime.datetime",
        "a_timestamp": "datetime.datetime",
        "a_date": "datetime.date",
        "an_interval": "datetime.timedelta",
        "a_bytea": "bytes",
        "a_json": "Any",
        "a_uuid": "uuid.UUID",
        "a_mood": "Mood",
        "some_moods": "list[Mood]",
        "some_ints": "list[int]",
        "a_name": "str",
        "a_time": "datetime.time",
    }


def test_enum_array_text_is_parsed_into_enum_members(imported: dict[str, ModuleType]) -> None:
    models = imported["models"]
    parse = models.parse_enum_array
    assert parse(models.Mood, "{}") == []
    assert parse(models.Mood, '{happy,"so-so",sad}') == [
        models.Mood.HAPPY,
        models.Mood.SO_SO,
        models.Mood.SAD,
    ]
    assert parse(models.Mood, "[0:0]={sad}") == [models.Mood.SAD]
    assert parse(models.Mood, ["happy"]) == [models.Mood.HAPPY]  # a registered loader's list
    with pytest.raises(ValueError, match="NULL"):
        parse(models.Mood, "{happy,NULL}")


# --------------------------------------------------------------------------- functions


def test_methods_take_the_connection_and_keyword_only_typed_parameters(
    generated: dict[str, str],
) -> None:
    fns = methods(generated["jobs.py"])
    assert signature(fns["claim_jobs"]) == (
        "(self, conn: psycopg.Connection[Any], *, owner: str | None, queues: list[str], "
        "max_jobs: int) -> list[ClaimJobsRow]"
    )
    assert signature(fns["set_state"]) == (
        "(self, conn: psycopg.Connection[Any], *, new_state: JobState, ids: list[uuid.UUID]) -> int"
    )
    assert signature(fns["jobs_in_states"]) == (
        "(self, conn: psycopg.Connection[Any], *, states: list[JobState]) -> list[JobsInStatesRow]"
    )
    assert signature(fns["count_jobs"]) == "(self, conn: psycopg.Connection[Any]) -> int | None"


def test_parameter_names_are_deduplicated_numbered_and_kept_off_reserved_words(
    generated: dict[str, str],
) -> None:
    fns = methods(generated["jobs.py"])
    # SELECT pg_notify($1, $2): sqlc names both after the function.
    assert signature(fns["notify"]) == (
        "(self, conn: psycopg.Connection[Any], *, pg_notify: str, pg_notify_2: str) -> None"
    )
    # $1::int + $2::int has no name; sqlc.arg(class) and sqlc.arg(rows) would clash.
    assert signature(fns["add_numbers"]) == (
        "(self, conn: psycopg.Connection[Any], *, param_1: int, param_2: int, class_: str, "
        "rows_: int) -> AddNumbersRow | None"
    )
    assert fields(classes(generated["jobs.py"])["AddNumbersRow"]) == {
        "total": "int",
        "class_": "str",
        "rows": "int",
    }


def test_every_method_runs_on_a_raw_cursor_with_tuple_rows(generated: dict[str, str]) -> None:
    for module in ("jobs.py", "all_types.py"):
        for name, fn in methods(generated[module]).items():
            assert "psycopg.RawCursor(conn, row_factory=tuple_row)" in body(fn), name
            assert "%s" not in body(fn), name


def test_whole_table_results_reuse_the_shared_model(generated: dict[str, str]) -> None:
    jobs = methods(generated["jobs.py"])
    assert signature(jobs["insert_job"]).endswith("-> Job | None")  # RETURNING *
    assert signature(jobs["get_job"]).endswith("-> Job | None")  # SELECT jobs.*
    # a data-modifying CTE whose result is exactly a jobs row
    assert signature(jobs["insert_job_with_event"]).endswith("-> Job | None")
    assert signature(jobs["events_for_job"]).endswith("-> list[list[JobEvent]]")
    all_types = methods(generated["all_types.py"])
    assert signature(all_types["list_all_types"]).endswith("-> list[AllType]")
    assert signature(all_types["list_audit_entries"]).endswith("-> list[AuditEntry]")
    assert "InsertJobRow" not in generated["jobs.py"]
    assert "GetJobRow" not in generated["jobs.py"]


def test_partial_or_nullable_results_get_their_own_row_dataclass(
    generated: dict[str, str],
) -> None:
    cls = classes(generated["jobs.py"])
    assert fields(cls["ClaimJobsRow"]) == {
        "id": "uuid.UUID",
        "queue": "str",
        "payload": "Any",
        "state": "JobState",
        "lease_owner": "str | None",
    }
    decorator = ast.unparse(cls["ClaimJobsRow"].decorator_list[0])
    assert decorator == "dataclasses.dataclass(slots=True, kw_only=True)"
    # The LEFT JOIN makes jobs.* nullable: not the Job model.
    assert fields(cls["JobsWithEventsRow"])["id"] == "uuid.UUID | None"
    assert fields(cls["JobsWithEventsRow"])["state"] == "JobState | None"


def test_single_column_results_are_bare_values(generated: dict[str, str]) -> None:
    fns = methods(generated["jobs.py"])
    returns = {name: ast.unparse(fn.returns) for name, fn in fns.items() if fn.returns}
    assert returns["list_job_ids"] == "list[uuid.UUID]"
    assert returns["count_jobs"] == "int | None"
    assert returns["get_lease_owner"] == "str | None"
    assert returns["get_state"] == "JobState | None"
    assert returns["get_payload"] == "Any"
    assert returns["notify_one"] == "None"  # void
    assert returns["event_kinds"] == "list[list[str]]"
    assert returns["insert_events_unnest"] == "list[int]"


def test_enum_columns_are_converted_to_the_strenum(generated: dict[str, str]) -> None:
    fns = methods(generated["jobs.py"])
    assert "JobState(r[0])" in body(fns["get_state"])
    assert "state=JobState(r[3])" in body(fns["claim_jobs"])
    assert "state=JobState(r[5]) if r[5] is not None else None" in body(fns["jobs_with_events"])
    all_types = methods(generated["all_types.py"])
    assert "parse_enum_array(Mood, r[39]) if r[39] is not None else None" in body(
        all_types["list_all_types"]
    )


def test_json_parameters_are_wrapped_for_psycopg_unless_already_wrapped(
    generated: dict[str, str],
) -> None:
    insert_job = body(methods(generated["jobs.py"])["insert_job"])
    assert "payload if isinstance(payload, Jsonb) else Jsonb(payload)" in insert_job
    assert (
        "(detail if isinstance(detail, Jsonb) else Jsonb(detail)) if detail is not None else None"
        in insert_job
    )
    insert_all = body(methods(generated["all_types.py"])["insert_all_types"])
    assert "c_jsonb if isinstance(c_jsonb, Jsonb) else Jsonb(c_jsonb)" in insert_all
    assert "isinstance(c_json, Json) else Json(c_json)" in insert_all
    # array elements: None stays an SQL NULL, wrapped values pass through
    assert (
        "[v if v is None or isinstance(v, Jsonb) else Jsonb(v) for v in c_jsonb_array]"
        in insert_all
    )
    batch = body(methods(generated["jobs.py"])["insert_event"])
    assert "isinstance(p.detail, Jsonb) else Jsonb(p.detail)" in batch


def test_one_fetches_one_row_or_none(generated: dict[str, str]) -> None:
    fn = methods(generated["jobs.py"])["get_job"]
    assert "cur.execute(self.sql(GET_JOB), (id,))" in body(fn)
    assert "cur.fetchone()" in body(fn)
    assert "if r is None:\n    return None" in body(fn)


def test_many_fetches_all_rows(generated: dict[str, str]) -> None:
    fn = methods(generated["jobs.py"])["claim_jobs"]
    assert "for r in cur.fetchall()]" in body(fn)


def test_a_deferred_many_query_also_gets_a_method_that_sends_now_and_reads_later(
    generated: dict[str, str],
) -> None:
    sync = methods(generated["jobs.py"])
    twin = async_methods(generated["aio/jobs.py"])
    plain, deferred = sync["jobs_in_states"], sync["jobs_in_states_deferred"]
    assert signature(deferred) == signature(plain).replace(
        "-> list[JobsInStatesRow]", "-> Callable[[], list[JobsInStatesRow]]"
    )
    assert signature(twin["jobs_in_states_deferred"]).endswith(
        "-> Callable[[], Awaitable[list[JobsInStatesRow]]]"
    )
    text = body(deferred)
    # Executed in the call, fetched (and the cursor closed) by the function it returns.
    assert text.index("cur.execute(") < text.index("def rows()") < text.index("cur.fetchall()")
    assert "with cur:" in text and "cur.close()" in text  # closed on a failed send too
    doc = ast.get_docstring(deferred) or ""
    assert doc.startswith(ast.get_docstring(plain) or "") and "Deferred:" in doc
    assert "@deferred" not in generated["jobs.py"] + generated["aio/jobs.py"]
    assert "jobs_in_states_deferred" not in generated["all_types.py"]


def test_deferred_on_a_query_that_is_not_many_is_refused() -> None:
    request = load_request()
    query(request, "GetJob")["comments"] = [" @deferred"]
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "GetJob" in err and "@deferred applies to :many queries only" in err


def test_nullable_names_result_columns_that_may_be_null_whatever_sqlc_infers() -> None:
    # sqlc infers NOT NULL for any cast (a CASE without ELSE, cast): the SQL
    # says which columns may be NULL, and their fields are typed so.
    request = load_request()
    query(request, "ClaimJobs")["comments"] = [" @nullable queue state"]
    out = generate_ok(request)
    row = fields(classes(out["jobs.py"])["ClaimJobsRow"])
    assert row["queue"] == "str | None"
    assert row["state"] == "JobState | None"
    assert row["id"] == "uuid.UUID"
    assert "@nullable" not in out["jobs.py"] + out["aio/jobs.py"]
    assert "JobState(r[3]) if r[3] is not None else None" in out["jobs.py"]


def test_nullable_naming_no_result_column_is_refused() -> None:
    request = load_request()
    query(request, "ClaimJobs")["comments"] = [" @nullable queue qeue"]
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "ClaimJobs" in err and "@nullable names no result column 'qeue'" in err


def test_exec_returns_nothing_and_execrows_the_row_count(generated: dict[str, str]) -> None:
    fns = methods(generated["jobs.py"])
    assert signature(fns["delete_job"]).endswith("-> None")
    assert "fetch" not in body(fns["delete_job"])
    assert "return cur.rowcount" in body(fns["set_state"])


def test_copyfrom_streams_rows_through_binary_copy(generated: dict[str, str]) -> None:
    source = generated["jobs.py"]
    fn = methods(source)["copy_jobs"]
    assert signature(fn) == (
        "(self, conn: psycopg.Connection[Any], rows: Iterable[CopyJobsParams]) -> int"
    )
    assert fields(classes(source)["CopyJobsParams"]) == {
        "id": "uuid.UUID",
        "queue": "str",
        "payload": "Any",
        "priority": "int",
        "state": "JobState",
        "detail": "Any",
    }
    consts = constants(source)
    assert consts["COPY_JOBS_COPY"] == (
        "COPY jobrun.jobs (id, queue, payload, priority, state, detail) FROM STDIN (FORMAT BINARY)"
    )
    # An enum travels as text in binary COPY; jsonb gets its version byte from psycopg.
    assert consts["COPY_JOBS_COPY_TYPES"] == ("uuid", "text", "jsonb", "int4", "text", "jsonb")
    text = body(fn)
    assert "cur.copy(self.sql(COPY_JOBS_COPY)) as copy" in text
    assert "copy.set_types(COPY_JOBS_COPY_TYPES)" in text
    assert "for p in rows:" in text
    assert (
        "copy.write_row((p.id, p.queue, p.payload if isinstance(p.payload, Jsonb) "
        "else Jsonb(p.payload), p.priority, p.state, p.detail))"
    ) in text


def test_copyfrom_with_an_enum_array_falls_back_to_text_copy(generated: dict[str, str]) -> None:
    consts = constants(generated["all_types.py"])
    assert consts["COPY_MOODS_COPY"].endswith(") FROM STDIN")
    assert consts["COPY_MOODS_COPY_TYPES"][-1] == "text[]"
    assert consts["COPY_ALL_TYPES_COPY"].endswith("FROM STDIN (FORMAT BINARY)")


def test_copyfrom_follows_the_insert_column_order(plugin: ModuleType) -> None:
    request = load_request()
    q = query(request, "CopyJobs")
    q["text"] = "INSERT INTO jobrun.jobs (queue, id) VALUES ($2, $1)"
    q["params"] = [p for p in q["params"] if p["number"] in (1, 2)]
    files = generate_ok(request)
    source = files["jobs.py"]
    assert constants(source)["COPY_JOBS_COPY"].startswith("COPY jobrun.jobs (queue, id) FROM STDIN")
    assert "copy.write_row((p.queue, p.id))" in body(methods(source)["copy_jobs"])


def test_copyfrom_rejects_a_parameter_used_twice() -> None:
    request = load_request()
    q = query(request, "CopyJobs")
    q["text"] = "INSERT INTO jobrun.jobs (id, queue) VALUES ($1, $1)"
    q["params"] = q["params"][:1]
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'CopyJobs'" in err and "parameter twice" in err


def test_batchexec_sends_all_rows_with_executemany(generated: dict[str, str]) -> None:
    source = generated["jobs.py"]
    fn = methods(source)["insert_event"]
    assert signature(fn) == (
        "(self, conn: psycopg.Connection[Any], rows: Sequence[InsertEventParams]) -> None"
    )
    assert "cur.executemany(self.sql(INSERT_EVENT), (" in body(fn)
    assert fields(classes(source)["InsertEventParams"]) == {
        "job_id": "uuid.UUID",
        "kind": "str",
        "detail": "Any",
    }


def test_batchone_returns_one_row_or_none_per_input(generated: dict[str, str]) -> None:
    fn = methods(generated["jobs.py"])["ack_job"]
    assert signature(fn) == (
        "(self, conn: psycopg.Connection[Any], rows: Sequence[AckJobParams]) "
        "-> list[AckJobRow | None]"
    )
    text = body(fn)
    assert "returning=True" in text
    assert "cur.nextset()" in text
    assert "cur.fetchone()" in text


def test_batchmany_returns_a_list_of_rows_per_input(generated: dict[str, str]) -> None:
    fn = methods(generated["jobs.py"])["events_for_job"]
    assert signature(fn) == (
        "(self, conn: psycopg.Connection[Any], rows: Sequence[EventsForJobParams]) "
        "-> list[list[JobEvent]]"
    )
    assert "cur.fetchall()" in body(fn)


def test_query_comments_become_docstrings(generated: dict[str, str]) -> None:
    fn = methods(generated["jobs.py"])["insert_job"]
    assert ast.get_docstring(fn) == "Returns the whole row: the result reuses the shared Job model."


# --------------------------------------------------------------------------- Queries classes


def test_each_query_module_has_a_queries_class_with_one_method_per_query(
    generated: dict[str, str],
) -> None:
    request = load_request()
    snake = load_plugin_module().snake
    for module in ("jobs", "all_types"):
        source = generated[f"{module}.py"]
        cls = classes(source)["Queries"]
        assert [ast.unparse(b) for b in cls.bases] == ["QueriesBase"]
        expected = []
        for q in request["queries"]:
            if q["filename"] == f"{module}.sql":
                expected.append(snake(q["name"]))
                if "@deferred" in [c.strip() for c in q.get("comments") or []]:
                    expected.append(snake(q["name"]) + "_deferred")
        assert list(methods(source)) == expected
        assert functions(source) == {}  # no module-level query functions any more
        assert all(next(iter(fn.args.args)).arg == "self" for fn in methods(source).values())


def test_the_package_queries_class_inherits_every_modules_queries(
    imported: dict[str, ModuleType],
) -> None:
    package, jobs, all_types = imported["package"], imported["jobs"], imported["all_types"]
    queries = package.Queries
    assert queries.__bases__ == (all_types.Queries, jobs.Queries)
    assert issubclass(queries, imported["_schema"].QueriesBase)
    q = queries(schema="myapp_jobs")
    assert q.schema == "myapp_jobs" and repr(q) == "Queries(schema='myapp_jobs')"
    assert q.claim_jobs.__func__ is jobs.Queries.claim_jobs
    assert q.copy_all_types.__func__ is all_types.Queries.copy_all_types
    with pytest.raises(AttributeError):
        q.anything = 1  # slots: the schema is all an instance holds
    assert package.DEFAULT_SCHEMA == SCHEMA == queries().schema


def test_every_statement_runs_through_the_schema(generated: dict[str, str]) -> None:
    for module in ("jobs.py", "all_types.py"):
        consts = constants(generated[module])
        both = [
            *methods(generated[module]).items(),
            *async_methods(generated[f"aio/{module}"]).items(),
        ]
        for name, fn in both:
            calls = [
                n
                for n in ast.walk(fn)
                if isinstance(n, ast.Call)
                and ast.unparse(n.func) in ("cur.execute", "cur.executemany", "cur.copy")
            ]
            assert len(calls) == 1, name
            statement = ast.unparse(calls[0].args[0])
            assert statement.startswith("self.sql(") and statement.endswith(")"), name
            assert statement[len("self.sql(") : -1] in consts, name


def test_the_default_schema_uses_the_sql_text_unchanged(imported: dict[str, ModuleType]) -> None:
    for q in (imported["package"].Queries(), imported["package"].Queries(schema=SCHEMA)):
        for module in (imported["jobs"], imported["all_types"]):
            for name, value in vars(module).items():
                if name.isupper() and isinstance(value, str):
                    assert q.sql(value) is value, name


def _oracle(text: str, schema: str) -> str:
    """The fixture's SQL rebound by plain text substitution: right where it
    names jobrun only in lower case and never inside a string or comment."""
    return re.sub(r"\bjobrun\.", f'"{schema}".', text)


def test_a_custom_schema_rewrites_every_qualified_reference_and_nothing_else(
    imported: dict[str, ModuleType],
) -> None:
    q = imported["package"].Queries(schema="myapp_jobs")
    seen = 0
    for module in (imported["jobs"], imported["all_types"]):
        for name, value in vars(module).items():
            if not (name.isupper() and isinstance(value, str)) or name == "SCHEMA_NAMES":
                continue
            rebound = q.sql(value)
            assert rebound == _oracle(value, "myapp_jobs"), name
            assert "jobrun" not in rebound, name
            seen += value.count("jobrun.")
    assert seen > 30
    # The other schema (audit) is not the queries' schema: it stays.
    assert q.sql(imported["all_types"].ADD_AUDIT_ENTRY).startswith("INSERT INTO audit.entries")
    # Strings, comments and dollar quotes keep the name; "jobrun" and JOBRUN are names.
    assert q.sql(imported["jobs"].SCHEMA_NAMES) == (
        "SELECT 'jobrun.jobs'::text AS literal, E'it\\'s jobrun.jobs'::text AS escaped,\n"
        "    $$jobrun.jobs$$::text AS dollar_quoted,\n"
        '    (SELECT count(*) FROM "myapp_jobs".jobs)::int AS jobs,\n'
        '    (SELECT count(*) FROM "myapp_jobs".job_events /* not jobrun.jobs */)::int AS events'
    )


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT * FROM jobrun.jobs j", 'SELECT * FROM "s".jobs j'),
        ("SELECT jobrun.jobs.id FROM jobrun.jobs", 'SELECT "s".jobs.id FROM "s".jobs'),
        ("SELECT $1::jobrun.job_state[]", 'SELECT $1::"s".job_state[]'),
        ("SELECT JobRun.f(1)", 'SELECT "s".f(1)'),  # unquoted names fold to lower case
        ('SELECT "jobrun".t', 'SELECT "s".t'),
        ('SELECT "JobRun".t', 'SELECT "JobRun".t'),  # quoted: another schema
        ('SELECT "jobrun.t"', 'SELECT "jobrun.t"'),  # one quoted name holding a dot
        ('SELECT "a""jobrun".t', 'SELECT "a""jobrun".t'),
        ("SELECT 'jobrun.t'", "SELECT 'jobrun.t'"),
        ("SELECT 'it''s jobrun.t', jobrun.t", "SELECT 'it''s jobrun.t', \"s\".t"),
        ("SELECT E'\\' jobrun.t', jobrun.t", "SELECT E'\\' jobrun.t', \"s\".t"),
        ("SELECT e'\\\\', jobrun.t", "SELECT e'\\\\', \"s\".t"),
        ("SELECT '\\', jobrun.t", "SELECT '\\', \"s\".t"),  # standard strings: \ is a char
        ("SELECT U&'jobrun.t', B'01', X'ff'", "SELECT U&'jobrun.t', B'01', X'ff'"),
        ("SELECT $$jobrun.t$$, jobrun.t", 'SELECT $$jobrun.t$$, "s".t'),
        ("SELECT $q$ $$ jobrun.t $q$, jobrun.t", 'SELECT $q$ $$ jobrun.t $q$, "s".t'),
        ("SELECT $1, jobrun.t, $2", 'SELECT $1, "s".t, $2'),
        ("SELECT a$jobrun.t, jobrunx.t, x_jobrun.t", "SELECT a$jobrun.t, jobrunx.t, x_jobrun.t"),
        ("SELECT 1 -- jobrun.t\n, jobrun.t", 'SELECT 1 -- jobrun.t\n, "s".t'),
        (
            "SELECT /* a /* jobrun.t */ jobrun.t */ jobrun.t",
            'SELECT /* a /* jobrun.t */ jobrun.t */ "s".t',
        ),
        ("SELECT 'unterminated jobrun.t", "SELECT 'unterminated jobrun.t"),
        ("SELECT jobrun.t, 'é', ÿjobrun.t, jobrun.t", 'SELECT "s".t, \'é\', ÿjobrun.t, "s".t'),
    ],
)
def test_the_rewrite_replaces_qualifiers_only(
    imported: dict[str, ModuleType], sql: str, expected: str
) -> None:
    assert imported["_schema"].rebind(sql, "s") == expected
    assert imported["_schema"].rebind(sql, SCHEMA) is sql


def test_a_schema_that_is_an_sql_keyword_works_quoted(imported: dict[str, ModuleType]) -> None:
    q = imported["package"].Queries(schema="user")
    assert q.sql(imported["jobs"].COUNT_JOBS) == 'SELECT count(*) FROM "user".jobs'


@pytest.mark.parametrize(
    "schema",
    ["", "Jobs", "my-app", "1st", "pg_jobs", "a" * 64, "jobs;drop", 'x"y', "a b", "ünï", "a.b"],
)
def test_invalid_schema_names_are_refused(imported: dict[str, ModuleType], schema: str) -> None:
    with pytest.raises(ValueError, match="invalid schema name"):
        imported["package"].Queries(schema=schema)
    with pytest.raises(ValueError, match="invalid schema name"):
        imported["_schema"].rebind("SELECT 1", schema)


@pytest.mark.parametrize("schema", ["a" * 63, "_x", "myapp_jobs", "jobs2", "pgjobs", "public"])
def test_plain_lower_case_schema_names_are_accepted(
    imported: dict[str, ModuleType], schema: str
) -> None:
    assert imported["package"].Queries(schema=schema).schema == schema


def test_the_rewritten_text_is_made_once_per_schema(imported: dict[str, ModuleType]) -> None:
    text = imported["jobs"].CLAIM_JOBS
    first = imported["package"].Queries(schema="cached_a")
    rebound = first.sql(text)
    assert rebound is first.sql(text)
    assert imported["jobs"].Queries(schema="cached_a").sql(text) is rebound  # any instance
    assert imported["package"].Queries(schema="cached_b").sql(text) == rebound.replace(
        '"cached_a"', '"cached_b"'
    )


def test_the_cache_stays_bounded_for_hand_written_sql(imported: dict[str, ModuleType]) -> None:
    q = imported["package"].Queries(schema="bounded")
    limit = imported["_schema"]._MAX_CACHED
    for i in range(limit + 10):
        assert q.sql(f"SELECT {i} FROM jobrun.t") == f'SELECT {i} FROM "bounded".t'
    assert len(imported["_schema"]._REWRITTEN["bounded"]) == limit


def test_copy_statements_are_schema_qualified(
    generated: dict[str, str], imported: dict[str, ModuleType]
) -> None:
    consts = constants(generated["jobs.py"])
    assert consts["COPY_JOBS_COPY"].startswith("COPY jobrun.jobs (id, queue,")
    q = imported["package"].Queries(schema="myapp_jobs")
    assert q.sql(imported["jobs"].COPY_JOBS_COPY).startswith('COPY "myapp_jobs".jobs (id, queue,')
    assert q.sql(imported["all_types"].COPY_MOODS_COPY).startswith('COPY "myapp_jobs".all_types (')


def test_copy_of_a_bare_table_name_is_qualified_with_sqlcs_schema() -> None:
    # sqlc resolves a bare name in its default schema (public): COPY says so.
    request = load_request()
    query(request, "CopyJobs")["text"] = (
        'INSERT INTO "jobs" (id, queue, payload, priority, state, detail) '
        "VALUES ($1, $2, $3, $4, $5, $6)"
    )
    consts = constants(generate_ok(request)["jobs.py"])
    assert consts["COPY_JOBS_COPY"].startswith('COPY public."jobs" (id, queue,')


def test_copy_types_name_no_schema(generated: dict[str, str]) -> None:
    # psycopg's set_types() looks names up in its client-side types registry,
    # where an enum is only once registered (and a schema-qualified name only
    # if it was fetched off the search_path). The enums go as text instead:
    # every name is a built-in, the same in every schema.
    builtin = {"uuid", "text", "jsonb", "json", "int2", "int4", "int8", "bool", "float4"}
    builtin |= {"float8", "numeric", "timestamptz", "timestamp", "date", "time", "interval"}
    builtin |= {"bytea"}
    for module in ("jobs.py", "all_types.py"):
        for name, value in constants(generated[module]).items():
            if name.endswith("_COPY_TYPES"):
                assert {t.removesuffix("[]") for t in value} <= builtin, name


# --------------------------------------------------------------------------- asyncio twins


def _sync_twin(fn: ast.FunctionDef) -> str:
    """The signature of a sync method as its async twin must read (a deferred
    method's reader is a coroutine function)."""
    twin = signature(fn).replace("psycopg.Connection[Any]", "psycopg.AsyncConnection[Any]")
    if fn.name.endswith("_deferred"):
        head, _, rows = twin.partition("-> Callable[[], ")
        twin = f"{head}-> Callable[[], Awaitable[{rows[:-1]}]]"
    return twin


def test_every_query_has_an_async_twin_with_the_same_parameters_and_result(
    generated: dict[str, str],
) -> None:
    for module in ("jobs", "all_types"):
        sync = methods(generated[f"{module}.py"])
        twins = async_methods(generated[f"aio/{module}.py"])
        assert list(twins) == list(sync), module
        for name, fn in sync.items():
            assert signature(twins[name]) == _sync_twin(fn), name
            assert ast.get_docstring(twins[name]) == ast.get_docstring(fn), name


def test_async_methods_run_on_an_async_raw_cursor_and_await_the_database(
    generated: dict[str, str],
) -> None:
    awaited = ("cur.execute", "cur.executemany", "cur.fetchone", "cur.fetchall", "copy.write_row")
    for module in ("aio/jobs.py", "aio/all_types.py"):
        for name, fn in async_methods(generated[module]).items():
            text = body(fn)
            if name.endswith("_deferred"):  # the cursor outlives the call: closed by its reader
                assert "cur = psycopg.AsyncRawCursor(conn, row_factory=tuple_row)" in text, name
            else:
                assert "psycopg.AsyncRawCursor(conn, row_factory=tuple_row) as cur" in text, name
            assert "async with" in text and "psycopg.RawCursor" not in text, name
            calls = [
                n
                for n in ast.walk(fn)
                if isinstance(n, ast.Call) and ast.unparse(n.func) in awaited
            ]
            assert calls, name
            parents = {
                id(child): node for node in ast.walk(fn) for child in ast.iter_child_nodes(node)
            }
            for c in calls:
                assert isinstance(parents[id(c)], ast.Await), f"{name}: {ast.unparse(c)}"


def test_async_modules_import_the_sql_and_rows_of_the_sync_module_and_define_none(
    generated: dict[str, str], imported: dict[str, ModuleType]
) -> None:
    for module in ("jobs", "all_types"):
        source = generated[f"aio/{module}.py"]
        assert constants(source) == {}  # no SQL text of its own
        assert list(classes(source)) == ["AsyncQueries"]  # no dataclass of its own
        shared = imported_names(source, f"{PACKAGE}.{module}")
        assert shared, module
        sync_module, aio_module = imported[module], imported[f"aio.{module}"]
        for name in shared:
            assert getattr(aio_module, name) is getattr(sync_module, name), name
    names = imported_names(generated["aio/jobs.py"], f"{PACKAGE}.jobs")
    assert {"GET_JOB", "COPY_JOBS_COPY", "COPY_JOBS_COPY_TYPES", "ClaimJobsRow"} <= set(names)
    assert "COPY_JOBS" not in names  # the INSERT of a :copyfrom never runs
    assert {"InsertEventParams", "AckJobParams", "AckJobRow"} <= set(names)


def test_async_copyfrom_writes_through_async_copy(generated: dict[str, str]) -> None:
    fn = async_methods(generated["aio/jobs.py"])["copy_jobs"]
    assert signature(fn) == (
        "(self, conn: psycopg.AsyncConnection[Any], rows: Iterable[CopyJobsParams]) -> int"
    )
    text = body(fn)
    assert "cur.copy(self.sql(COPY_JOBS_COPY)) as copy" in text
    assert "copy.set_types(COPY_JOBS_COPY_TYPES)" in text
    assert "await copy.write_row((p.id, p.queue, p.payload if isinstance(p.payload, Jsonb)" in text
    moods = async_methods(generated["aio/all_types.py"])["copy_moods"]
    assert "cur.copy(self.sql(COPY_MOODS_COPY)) as copy" in body(moods)


def test_async_batches_read_every_result_set(generated: dict[str, str]) -> None:
    fns = async_methods(generated["aio/jobs.py"])
    ack = body(fns["ack_job"])
    assert "await cur.executemany(self.sql(ACK_JOB), ((p.id,) for p in rows), returning=True)" in (
        ack
    )
    assert "r = await cur.fetchone()" in ack and "if not cur.nextset():" in ack
    assert "for r in await cur.fetchall()" in body(fns["event_kinds"])
    assert "await cur.executemany(self.sql(INSERT_EVENT)" in body(fns["insert_event"])


def test_the_package_async_queries_class_inherits_every_async_modules_class(
    imported: dict[str, ModuleType],
) -> None:
    aio = imported["aio"]
    queries = aio.AsyncQueries
    assert queries.__bases__ == (
        imported["aio.all_types"].AsyncQueries,
        imported["aio.jobs"].AsyncQueries,
    )
    assert issubclass(queries, imported["_schema"].QueriesBase)
    q = queries(schema="myapp_jobs")
    assert repr(q) == "AsyncQueries(schema='myapp_jobs')"
    assert q.sql(imported["jobs"].COUNT_JOBS) == 'SELECT count(*) FROM "myapp_jobs".jobs'
    assert inspect.iscoroutinefunction(q.claim_jobs)
    with pytest.raises(AttributeError):
        q.anything = 1
    assert aio.DEFAULT_SCHEMA == SCHEMA == queries().schema
    # The sync package is unchanged by the async one: no async method in it.
    assert not any(
        inspect.iscoroutinefunction(fn) for fn in vars(imported["jobs"].Queries).values()
    )


@pytest.mark.parametrize("stem", ["aio", "models"])
def test_a_query_file_named_like_a_generated_module_fails(stem: str) -> None:
    request = load_request()
    for q in request["queries"]:
        if q["filename"] == "all_types.sql":
            q["filename"] = f"{stem}.sql"
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert f"'{stem}.sql'" in err


def test_a_model_named_async_queries_fails() -> None:
    request = load_request()
    _catalog_schema(request, SCHEMA)["enums"].append({"name": "async_queries", "vals": ["a"]})
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'AsyncQueries'" in err and "a name of the generated query modules" in err


@pytest.mark.parametrize(
    ("names", "ordered"),
    [
        (
            ["parse_enum_array", "Job", "ClaimJobsRow", "GET_JOB", "CLAIM_JOBS", "AB", "A"],
            ["AB", "CLAIM_JOBS", "GET_JOB", "A", "ClaimJobsRow", "Job", "parse_enum_array"],
        ),
        (["X_10", "X_9", "Job10Row", "Job2Row"], ["X_9", "X_10", "Job2Row", "Job10Row"]),
        (["Jsonb", "Json", "Final", "Any"], ["Any", "Final", "Json", "Jsonb"]),
    ],
)
def test_imported_names_are_ordered_like_ruffs_isort(
    plugin: ModuleType, names: list[str], ordered: list[str]
) -> None:
    assert sorted(names, key=plugin.member_key) == ordered


# --------------------------------------------------------------------------- the schema option


@pytest.mark.parametrize(
    "text",
    [
        "SELECT jobrun.id FROM jobrun.jobs jobrun",  # an alias named like the schema
        "SELECT count(*) FROM jobrun . jobs",  # the dot apart
        'SELECT "jobrun" FROM jobrun.jobs',  # a column
    ],
)
def test_a_query_naming_the_schema_other_than_as_a_qualifier_fails(text: str) -> None:
    request = load_request()
    query(request, "CountJobs")["text"] = text
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'CountJobs'" in err and "'jobrun' without a dot" in err


def test_the_schema_option_defaults_to_sqlcs_default_schema() -> None:
    request = load_request()
    request["plugin_options"] = base64.b64encode(json.dumps({"package": PACKAGE}).encode()).decode()
    files = generate_ok(request)
    assert 'DEFAULT_SCHEMA: Final = "public"' in files["_schema.py"]
    # The models of jobrun take its name as a prefix then.
    assert "class JobrunJob:" in files["models.py"]


def test_the_schema_option_sets_the_default_schema_and_its_models_take_no_prefix() -> None:
    request = load_request()
    options = {"package": PACKAGE, "schema": "audit"}
    request["plugin_options"] = base64.b64encode(json.dumps(options).encode()).decode()
    files = generate_ok(request)
    assert 'DEFAULT_SCHEMA: Final = "audit"' in files["_schema.py"]
    assert "class Entry:" in files["models.py"]  # audit.entries, AuditEntry before
    assert "class JobrunJob:" in files["models.py"]


@pytest.mark.parametrize("name", ["Schema", "Sql"])
def test_a_query_named_like_a_queriesbase_attribute_fails(name: str) -> None:
    request = load_request()
    query(request, "CountJobs")["name"] = name
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert f"Queries.{name.lower()}()" in err


def test_queries_of_two_files_making_the_same_method_fail() -> None:
    request = load_request()
    query(request, "ListAuditEntries")["name"] = "count_jobs"  # CountJobs in jobs.sql
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'count_jobs'" in err and "'CountJobs'" in err and "Queries.count_jobs()" in err


def test_generated_code_is_ruff_formatted_and_lint_clean(
    generated: dict[str, str], tmp_path: Path
) -> None:
    if not RUFF.exists():
        pytest.skip(f"ruff not installed at {RUFF}")
    write_package(generated, tmp_path)
    common = ["--isolated", "--line-length", "100", "--target-version", "py311"]
    commands = [
        ["format", "--check", "--diff", *common],
        # E501 aside: the SQL texts and the header keep their long lines.
        ["check", "--select=E,F,W,I,B,UP,SIM,RUF", "--ignore=E501", *common],
    ]
    for command in commands:
        proc = subprocess.run(
            [str(RUFF), *command, PACKAGE],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- options


def test_plugin_options_are_decoded_from_base64(generated: dict[str, str]) -> None:
    request = load_request()
    assert json.loads(base64.b64decode(request["plugin_options"])) == {
        "package": PACKAGE,
        "schema": SCHEMA,
    }
    request["plugin_options"] = base64.b64encode(b'{"package": "other.pkg"}').decode()
    files = generate_ok(request)
    assert "from other.pkg.models import" in files["jobs.py"]
    assert "from other.pkg._schema import QueriesBase" in files["jobs.py"]
    assert "from other.pkg import all_types, jobs" in files["__init__.py"]
    assert "from sqlc_fixture_gen" not in files["jobs.py"] + files["__init__.py"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("", "'package'"),
        (base64.b64encode(b"{}").decode(), "'package'"),
        (base64.b64encode(b'{"package": "not a name"}').decode(), "'package'"),
        (base64.b64encode(b'{"package": "p", "emit": 1}').decode(), "unknown plugin option"),
        (base64.b64encode(b'{"package": "p", "schema": "Jobrun"}').decode(), "'schema'"),
        (base64.b64encode(b'{"package": "p", "schema": "pg_jobs"}').decode(), "'schema'"),
        (base64.b64encode(b'{"package": "p", "schema": 1}').decode(), "'schema'"),
        ("%%% not base64", "base64"),
    ],
)
def test_bad_plugin_options_fail(options: str, message: str) -> None:
    request = load_request()
    request["plugin_options"] = options
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert message in err


# --------------------------------------------------------------------------- failures


def test_unknown_column_type_fails_naming_query_and_type() -> None:
    request = load_request()
    col = query(request, "GetPayload")["columns"][0]
    col["type"] = {"catalog": "", "schema": "", "name": "tsvector"}
    rc, files, err = run_plugin(request)
    assert rc == 1 and not files
    assert "'GetPayload'" in err
    assert "'tsvector'" in err
    assert err.startswith("sqlc-gen-psycopg: ")


def test_unknown_parameter_type_fails_naming_query_and_type() -> None:
    request = load_request()
    query(request, "DeleteJob")["params"][0]["column"]["type"]["name"] = "pg_catalog.inet"
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'DeleteJob'" in err and "pg_catalog.inet" in err and "parameter $1" in err


def test_result_column_of_unknown_any_type_fails() -> None:
    request = load_request()
    col = query(request, "CountJobs")["columns"][0]
    col["type"] = {"catalog": "", "schema": "", "name": "any"}
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'CountJobs'" in err and "'any'" in err and "cast" in err


def test_every_problem_is_reported_at_once() -> None:
    request = load_request()
    query(request, "CountJobs")["columns"][0]["type"]["name"] = "any"
    query(request, "GetPayload")["columns"][0]["type"]["name"] = "tsvector"
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'CountJobs'" in err and "'GetPayload'" in err


@pytest.mark.parametrize("cmd", [":execlastid", ":execresult", ":bogus"])
def test_unknown_command_fails_naming_query_and_command(cmd: str) -> None:
    request = load_request()
    query(request, "DeleteJob")["cmd"] = cmd
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'DeleteJob'" in err and repr(cmd) in err and "supported" in err


def test_unused_result_columns_of_exec_are_not_type_checked() -> None:
    # :exec ignores the result, so a void or odd type there is fine.
    request = load_request()
    query(request, "Notify")["columns"][0]["type"]["name"] = "tsvector"
    rc, _, err = run_plugin(request)
    assert rc == 0, err


def test_protobuf_input_fails_with_a_hint_about_format_json() -> None:
    rc, _, err = run_plugin(b"\x0a\x03abc\x12\x00")
    assert rc == 1
    assert "format: json" in err


def _catalog_schema(request: dict[str, Any], name: str) -> dict[str, Any]:
    schema: dict[str, Any] = next(s for s in request["catalog"]["schemas"] if s["name"] == name)
    return schema


def _jobs_table(request: dict[str, Any]) -> dict[str, Any]:
    tables = _catalog_schema(request, SCHEMA)["tables"]
    return copy.deepcopy(next(t for t in tables if t["rel"]["name"] == "jobs"))


def test_model_class_name_clash_fails() -> None:
    request = load_request()
    clone = _jobs_table(request)
    clone["rel"]["name"] = "job"  # job and jobs both make `Job`
    _catalog_schema(request, SCHEMA)["tables"].append(clone)
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "'Job'" in err


def test_tables_of_sqlc_default_schema_and_the_plugin_schema_share_the_unprefixed_names() -> None:
    # Neither public.jobs nor jobrun.jobs takes a prefix: both would be `Job`.
    request = load_request()
    clone = _jobs_table(request)
    clone["rel"]["schema"] = "public"
    _catalog_schema(request, "public")["tables"].append(clone)
    rc, _, err = run_plugin(request)
    assert rc == 1
    assert "public.jobs" in err and "'Job'" in err


def test_a_model_named_like_the_generated_classes_fails() -> None:
    for add in ("enum", "table"):
        request = load_request()
        if add == "enum":  # enum classes keep the name: queries -> Queries
            _catalog_schema(request, SCHEMA)["enums"].append({"name": "queries", "vals": ["a"]})
        else:  # table rows are singular: queries_bases -> QueriesBase
            clone = _jobs_table(request)
            clone["rel"]["name"] = "queries_bases"
            _catalog_schema(request, SCHEMA)["tables"].append(clone)
        rc, _, err = run_plugin(request)
        assert rc == 1, add
        assert "a name of the generated query modules" in err, add


# --------------------------------------------------------------------------- with sqlc


def _copy_fixture(dest: Path) -> None:
    for name in ("schema", "query"):
        shutil.copytree(FIXTURE / name, dest / name)
    shutil.copy2(FIXTURE / "sqlc.yaml", dest / "sqlc.yaml")
    shutil.copy2(FIXTURE / "capture_request.py", dest / "capture_request.py")


def _sqlc_generate(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(
        [str(SQLC), "generate"], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


@needs_sqlc
def test_saved_request_matches_what_sqlc_sends_now(tmp_path: Path) -> None:
    _copy_fixture(tmp_path)
    (tmp_path / "request.json").unlink(missing_ok=True)
    proc = _sqlc_generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    fresh = json.loads((tmp_path / "request.json").read_text(encoding="utf-8"))
    assert fresh == load_request(), (
        "tests/unit/sqlc_fixture/request.json is stale: run `sqlc generate` in that directory"
    )


@needs_sqlc
def test_sqlc_runs_the_plugin_end_to_end(tmp_path: Path, generated: dict[str, str]) -> None:
    _copy_fixture(tmp_path)
    (tmp_path / "tools").mkdir()
    shutil.copy2(PLUGIN, tmp_path / "tools" / PLUGIN.name)
    (tmp_path / "sqlc.yaml").write_text(
        f"""version: "2"
plugins:
  - name: psycopg
    env: [PATH]
    process:
      cmd: tools/{PLUGIN.name}
      format: json
sql:
  - engine: postgresql
    schema: [schema/0001.types.sql, schema/0002.all_types.sql, schema/0003.audit.sql]
    queries: query
    codegen:
      - plugin: psycopg
        out: out/{PACKAGE}
        options:
          package: {PACKAGE}
          schema: {SCHEMA}
""",
        encoding="utf-8",
    )
    proc = _sqlc_generate(tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out" / PACKAGE
    written = {
        p.relative_to(out).as_posix(): p.read_text(encoding="utf-8")
        for p in out.rglob("*")
        if p.is_file()
    }
    assert written == generated


@needs_sqlc
def test_sqlc_reports_the_plugins_error(tmp_path: Path) -> None:
    _copy_fixture(tmp_path)
    (tmp_path / "tools").mkdir()
    shutil.copy2(PLUGIN, tmp_path / "tools" / PLUGIN.name)
    (tmp_path / "query" / "bad.sql").write_text(
        "-- name: Bad :one\nSELECT to_tsvector('x') AS v;\n", encoding="utf-8"
    )
    (tmp_path / "sqlc.yaml").write_text(
        (tmp_path / "sqlc.yaml")
        .read_text(encoding="utf-8")
        .replace("./capture_request.py", f"tools/{PLUGIN.name}"),
        encoding="utf-8",
    )
    proc = _sqlc_generate(tmp_path)
    assert proc.returncode != 0
    assert "'Bad'" in proc.stderr + proc.stdout
    assert "tsvector" in proc.stderr + proc.stdout


# --------------------------------------------------------------------------- check_sqlc_schema


def _schema_repo(root: Path, listed: list[str], files: list[str]) -> Path:
    (root / "db" / "migrations").mkdir(parents=True)
    for name in files:
        (root / "db" / "migrations" / name).write_text("-- x\n", encoding="utf-8")
    items = "".join(f"      - {p}\n" for p in listed)
    (root / "sqlc.yaml").write_text(
        f'version: "2"\nsql:\n  - engine: postgresql\n    schema:\n{items}    queries: db/query\n',
        encoding="utf-8",
    )
    return root


def _check_schema(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK_SCHEMA), "--root", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_check_sqlc_schema_accepts_the_forward_migrations_in_order(tmp_path: Path) -> None:
    files = ["0001.initial.sql", "0001.initial.rollback.sql", "0002.more.sql"]
    root = _schema_repo(
        tmp_path, ["db/migrations/0001.initial.sql", "db/migrations/0002.more.sql"], files
    )
    proc = _check_schema(root)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("listed", "message"),
    [
        (["db/migrations/0001.initial.sql"], "missing from sqlc.yaml: db/migrations/0002.more.sql"),
        (["db/migrations/0002.more.sql", "db/migrations/0001.initial.sql"], "wrong order"),
        (
            [
                "db/migrations/0001.initial.sql",
                "db/migrations/0001.initial.rollback.sql",
                "db/migrations/0002.more.sql",
            ],
            "listed but not a forward migration: db/migrations/0001.initial.rollback.sql",
        ),
    ],
)
def test_check_sqlc_schema_fails_when_the_list_differs(
    tmp_path: Path, listed: list[str], message: str
) -> None:
    files = ["0001.initial.sql", "0001.initial.rollback.sql", "0002.more.sql"]
    proc = _check_schema(_schema_repo(tmp_path, listed, files))
    assert proc.returncode == 1
    assert message in proc.stderr


def test_check_sqlc_schema_reads_flow_lists() -> None:
    spec = importlib.util.spec_from_file_location("check_sqlc_schema_under_test", CHECK_SCHEMA)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "sql:\n  - schema: [a.sql, 'b.sql']  # comment\n  - schema: c.sql\n"
    assert module.schema_lists(text) == [["a.sql", "b.sql"], ["c.sql"]]


def test_check_sqlc_schema_skips_the_plugins_schema_option() -> None:
    spec = importlib.util.spec_from_file_location("check_sqlc_schema_under_test", CHECK_SCHEMA)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (
        "sql:\n  - schema:\n      - a.sql\n    codegen:\n      - plugin: p\n"
        "        options:\n          package: x\n\n          schema: jobrun\n"
        "        out: o\n  - schema: b.sql\n"
    )
    assert module.schema_lists(text) == [["a.sql"], ["b.sql"]]


def test_check_sqlc_schema_passes_on_this_repository() -> None:
    proc = _check_schema(ROOT)
    assert proc.returncode == 0, proc.stderr


# --------------------------------------------------------------------------- check_generated


def _check_generated_repo(root: Path) -> Path:
    """A repository like this one at ``root``, made of the fixture's schema and queries."""
    (root / "tools").mkdir(parents=True)
    shutil.copy2(PLUGIN, root / "tools" / PLUGIN.name)
    shutil.copytree(FIXTURE / "schema", root / "db" / "migrations")
    shutil.copytree(FIXTURE / "query", root / "db" / "query")
    (root / "sqlc.yaml").write_text(
        f"""version: "2"
plugins:
  - name: psycopg
    env: [PATH]
    process:
      cmd: tools/{PLUGIN.name}
      format: json
sql:
  - engine: postgresql
    schema:
      - db/migrations/0001.types.sql
      - db/migrations/0002.all_types.sql
      - db/migrations/0003.audit.sql
    queries: db/query
    codegen:
      - plugin: psycopg
        out: jobrun/postgres/sqlc
        options:
          package: jobrun.postgres.sqlc
          schema: jobrun
""",
        encoding="utf-8",
    )
    return root


def _check_generated(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CHECK_GENERATED), "--root", str(root)],
        capture_output=True,
        text=True,
        check=False,
    )


@needs_sqlc
def test_check_generated_detects_stale_missing_and_changed_files(tmp_path: Path) -> None:
    root = _check_generated_repo(tmp_path / "repo")
    proc = _check_generated(root)
    assert proc.returncode == 1
    assert "missing: jobrun/postgres/sqlc/jobs.py" in proc.stdout

    assert _sqlc_generate(root).returncode == 0
    out = root / "jobrun" / "postgres" / "sqlc"
    (out / "__pycache__").mkdir()
    (out / "__pycache__" / "jobs.cpython-311.pyc").write_bytes(b"")  # ignored
    proc = _check_generated(root)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    (out / "old_queries.py").write_text("# stale\n", encoding="utf-8")
    jobs = out / "jobs.py"
    jobs.write_text(jobs.read_text(encoding="utf-8").replace("def ", "def x", 1), encoding="utf-8")
    proc = _check_generated(root)
    assert proc.returncode == 1
    assert "stale:   jobrun/postgres/sqlc/old_queries.py" in proc.stdout
    assert "differs: jobrun/postgres/sqlc/jobs.py" in proc.stdout


@needs_sqlc
def test_check_generated_covers_the_async_package(tmp_path: Path) -> None:
    root = _check_generated_repo(tmp_path / "repo")
    assert _sqlc_generate(root).returncode == 0
    aio = root / "jobrun" / "postgres" / "sqlc" / "aio"
    (aio / "__pycache__").mkdir()
    (aio / "__pycache__" / "jobs.cpython-311.pyc").write_bytes(b"")  # ignored
    assert _check_generated(root).returncode == 0

    (aio / "old.py").write_text("# stale\n", encoding="utf-8")
    jobs = aio / "jobs.py"
    jobs.write_text(jobs.read_text(encoding="utf-8").replace("await ", "", 1), encoding="utf-8")
    (aio / "all_types.py").unlink()
    proc = _check_generated(root)
    assert proc.returncode == 1
    assert "stale:   jobrun/postgres/sqlc/aio/old.py" in proc.stdout
    assert "differs: jobrun/postgres/sqlc/aio/jobs.py" in proc.stdout
    assert "missing: jobrun/postgres/sqlc/aio/all_types.py" in proc.stdout
