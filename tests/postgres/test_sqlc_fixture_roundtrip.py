"""The code sqlc-gen-psycopg generates, run against a real PostgreSQL.

The plugin (tools/sqlc_gen_psycopg.py) runs on the saved fixture request
(tests/unit/sqlc_fixture/request.json); the generated package is imported
from a temporary directory and every function is run on a throwaway database
holding the fixture schema: every mapped type round-trips, enums travel by
value, jsonb is written correctly by parameters and by binary COPY, and the
batch commands send one statement per input row.

The database: an empty database of each test's own on the suite's server
(tests/conftest.py).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import importlib
import itertools
import json
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tools" / "sqlc_gen_psycopg.py"
FIXTURE = ROOT / "tests" / "unit" / "sqlc_fixture"
SCHEMA = ("schema/0001.types.sql", "schema/0002.all_types.sql")
PACKAGE = "sqlc_fixture_gen"

_names = itertools.count()


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The generated fixture package: .models, .jobs, .all_types."""
    request = (FIXTURE / "request.json").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(PLUGIN)], input=request, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    parent = tmp_path_factory.mktemp("sqlc_gen")
    (parent / PACKAGE).mkdir()
    for f in json.loads(proc.stdout)["files"]:
        (parent / PACKAGE / f["name"]).write_bytes(base64.b64decode(f["contents"]))
    sys.path.insert(0, str(parent))
    try:
        modules: dict[str, ModuleType] = {
            name: importlib.import_module(f"{PACKAGE}.{name}")
            for name in ("models", "jobs", "all_types")
        }
        yield SimpleNamespace(**modules)
    finally:
        sys.path.remove(str(parent))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


@pytest.fixture
def fixture_dsn(empty_dsn: str) -> str:
    """A database of the test's own holding the fixture schema."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        for path in SCHEMA:
            conn.execute((FIXTURE / path).read_text(encoding="utf-8").encode())
    return empty_dsn


@pytest.fixture
def conn(fixture_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(fixture_dsn, autocommit=True) as c:
        yield c


NOW = dt.datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def all_values(gen: SimpleNamespace) -> dict[str, Any]:
    """A value for every column of all_types, none of them NULL."""
    mood = gen.models.Mood
    return {
        "c_smallint": -32768,
        "c_int2": 32767,
        "c_integer": -(2**31),
        "c_int4": 2**31 - 1,
        "c_bigint": -(2**63),
        "c_int8": 2**63 - 1,
        "c_boolean": True,
        "c_bool": False,
        "c_real": 1.5,
        "c_float4": -2.25,
        "c_double": 3.141592653589793,
        "c_float8": float("inf"),
        "c_numeric": decimal.Decimal("123456789.125"),
        "c_decimal": decimal.Decimal("-0.000000001"),
        "c_text": "tëxt with 'quotes', \"dq\", \\ and\nnewline",
        "c_varchar": "varchar",
        "c_charvar": "",
        "c_bpchar": "ab",  # char(3): comes back padded
        "c_character": "xy",
        "c_name": "a_name",
        "c_uuid": uuid.UUID("01234567-89ab-cdef-0123-456789abcdef"),
        "c_jsonb": {"a": [1, 2.5, None, True], "ü": {"nested": "x"}},
        "c_json": [1, "two", {"3": 4}],
        "c_timestamptz": NOW,
        "c_ts_tz": NOW + dt.timedelta(days=1),
        # timestamp (without time zone) columns take naive datetimes.
        "c_timestamp": dt.datetime(2020, 2, 29, 23, 59, 59, 999999),  # noqa: DTZ001
        "c_ts_notz": dt.datetime(1999, 12, 31),  # noqa: DTZ001
        "c_date": dt.date(2024, 2, 29),
        "c_time": dt.time(13, 14, 15, 16),
        "c_interval": dt.timedelta(days=3, seconds=7, microseconds=8),
        "c_bytea": bytes(range(256)),
        "c_mood": mood.SO_SO,
        "c_mood_null": mood.SAD,
        "c_text_array": ["a", "b c", "", "{}", 'q"uote'],
        "c_int_array": [1, -2, 3],
        "c_uuid_array": [uuid.UUID(int=1), uuid.UUID(int=2)],
        "c_jsonb_array": [{"x": 1}, "s", 3, [None]],
        "c_mood_array": [mood.HAPPY, mood.SO_SO],
    }


def null_values(gen: SimpleNamespace) -> dict[str, Any]:
    """all_values() with every nullable column NULL."""
    values = all_values(gen)
    not_null = {
        "c_smallint",
        "c_integer",
        "c_bigint",
        "c_boolean",
        "c_real",
        "c_double",
        "c_numeric",
        "c_text",
        "c_uuid",
        "c_jsonb",
        "c_timestamptz",
        "c_mood",
        "c_text_array",
    }
    return {k: (v if k in not_null else None) for k, v in values.items()}


def expected_row(values: dict[str, Any]) -> dict[str, Any]:
    """What reading values back gives (char(3) pads, float4 is float4)."""
    out = dict(values)
    if out["c_bpchar"] is not None:
        out["c_bpchar"] = out["c_bpchar"].ljust(3)
    return out


def as_dict(row: Any) -> dict[str, Any]:
    return {name: getattr(row, name) for name in row.__dataclass_fields__}


# --------------------------------------------------------------------------- types


def test_every_type_round_trips_through_parameters_and_results(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    for values in (all_values(gen), null_values(gen)):
        row = gen.all_types.insert_all_types(conn, **values)
        assert isinstance(row, gen.models.AllType)
        got = as_dict(row)
        assert isinstance(got.pop("id"), int)
        assert isinstance(got.pop("c_serial"), int)
        assert got == expected_row(values)
    listed = gen.all_types.list_all_types(conn)
    assert [as_dict(r)["c_text_array"] for r in listed] == [all_values(gen)["c_text_array"]] * 2
    assert type(listed[0].c_mood) is gen.models.Mood
    assert all(type(m) is gen.models.Mood for m in listed[0].c_mood_array)


def test_expression_results_load_as_the_annotated_types(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    row = gen.all_types.expressions(conn)
    mood = gen.models.Mood
    assert (row.a_smallint, row.a_bigint, row.a_real, row.a_double) == (1, 2, 1.5, 2.5)
    assert row.a_numeric == decimal.Decimal("3.25") and row.a_bool is True
    assert (row.a_varchar, row.a_char, row.a_name) == ("x", "y ", "n")
    assert isinstance(row.a_now, dt.datetime) and row.a_now.tzinfo is not None
    assert isinstance(row.a_timestamp, dt.datetime) and row.a_timestamp.tzinfo is None
    assert type(row.a_date) is dt.date
    assert row.an_interval == dt.timedelta(days=1)
    assert row.a_bytea == b"\x00\xff"
    assert row.a_json == {"a": 1}
    assert isinstance(row.a_uuid, uuid.UUID)
    assert row.a_mood is mood.HAPPY
    assert row.some_moods == [mood.SAD, mood.SO_SO]
    assert row.some_ints == [1, 2]
    assert row.a_time == dt.time(12, 30)


def test_enums_travel_by_value_both_ways(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    state = gen.models.JobState
    job_id = uuid.uuid4()
    gen.jobs.insert_job(
        conn, id=job_id, queue="q", payload={}, priority=0, state=state.CANCELLED, detail=None
    )
    assert conn.execute("SELECT state::text FROM jobs").fetchone() == ("cancelled",)
    assert gen.jobs.get_state(conn, id=job_id) is state.CANCELLED
    rows = gen.jobs.jobs_in_states(conn, states=[state.CANCELLED, state.DEAD])
    assert [(r.id, r.state) for r in rows] == [(job_id, state.CANCELLED)]
    assert gen.jobs.jobs_in_states(conn, states=[state.QUEUED]) == []


@pytest.mark.parametrize(
    "payload", [{"a": 1}, [1, "x"], "a json string", 42, 1.5, True, None], ids=repr
)
def test_jsonb_parameters_store_the_json_value(
    gen: SimpleNamespace, conn: psycopg.Connection[Any], payload: Any
) -> None:
    job_id = uuid.uuid4()
    job = gen.jobs.insert_job(
        conn,
        id=job_id,
        queue="q",
        payload=payload,
        priority=0,
        state=gen.models.JobState.QUEUED,
        detail=None,
    )
    assert job.payload == payload
    assert job.detail is None
    # None for NOT NULL jsonb is JSON null; for a nullable one, SQL NULL.
    stored = conn.execute(
        "SELECT payload = %s::jsonb, detail IS NULL FROM jobs", [json.dumps(payload)]
    ).fetchone()
    assert stored == (True, True)
    gen.jobs.set_detail(conn, detail={"k": "v"}, id=job_id)
    assert gen.jobs.get_job(conn, id=job_id).detail == {"k": "v"}
    gen.jobs.set_detail(conn, detail=None, id=job_id)
    assert conn.execute("SELECT detail IS NULL FROM jobs").fetchone() == (True,)


def test_an_already_wrapped_json_value_passes_through_unserialised_again(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    from psycopg.types.json import Jsonb  # noqa: PLC0415

    raw = Jsonb('{"pre": "serialised"}', dumps=lambda text: text)
    job = gen.jobs.insert_job(
        conn,
        id=uuid.uuid4(),
        queue="q",
        payload=raw,
        priority=0,
        state=gen.models.JobState.QUEUED,
        detail=raw,
    )
    assert job.payload == {"pre": "serialised"} and job.detail == {"pre": "serialised"}


# --------------------------------------------------------------------------- commands


def _job(gen: SimpleNamespace, conn: psycopg.Connection[Any], **kw: Any) -> Any:
    args: dict[str, Any] = {
        "id": uuid.uuid4(),
        "queue": "q",
        "payload": {},
        "priority": 0,
        "state": gen.models.JobState.QUEUED,
        "detail": None,
    }
    args.update(kw)
    return gen.jobs.insert_job(conn, **args)


def test_one_returns_the_shared_model_or_none(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, conn, priority=7)
    assert isinstance(job, gen.models.Job)
    assert gen.jobs.get_job(conn, id=job.id) == job
    assert gen.jobs.get_job(conn, id=uuid.uuid4()) is None
    assert gen.jobs.count_jobs(conn) == 1
    assert gen.jobs.get_lease_owner(conn, id=job.id) is None
    assert gen.jobs.get_payload(conn, id=job.id) == {}
    assert gen.jobs.max_priority(conn, state=gen.models.JobState.QUEUED) == 7
    via_cte = gen.jobs.insert_job_with_event(
        conn,
        id=uuid.uuid4(),
        queue="q",
        payload={"a": 1},
        priority=1,
        state=gen.models.JobState.QUEUED,
    )
    assert isinstance(via_cte, gen.models.Job)
    assert gen.jobs.get_job(conn, id=via_cte.id) == via_cte


def test_many_returns_rows_and_bare_values(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    ids = sorted(_job(gen, conn, queue=q, priority=i).id for i, q in enumerate("aab"))
    assert gen.jobs.list_job_ids(conn, queue="a") == sorted(
        i for i in ids if gen.jobs.get_job(conn, id=i).queue == "a"
    )
    claimed = gen.jobs.claim_jobs(conn, owner="w1", queues=["a", "b"], max_jobs=2)
    assert len(claimed) == 2
    assert all(type(r).__name__ == "ClaimJobsRow" for r in claimed)
    assert {r.state for r in claimed} == {gen.models.JobState.LEASED}
    assert {r.lease_owner for r in claimed} == {"w1"}


def test_execrows_returns_the_number_of_rows_changed(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    a, b = _job(gen, conn), _job(gen, conn)
    dead = gen.models.JobState.DEAD
    assert gen.jobs.set_state(conn, new_state=dead, ids=[a.id, b.id, uuid.uuid4()]) == 2
    assert gen.jobs.set_state(conn, new_state=dead, ids=[]) == 0
    gen.jobs.delete_job(conn, id=a.id)
    assert gen.jobs.list_job_ids(conn, queue="q") == [b.id]


def test_void_results_and_notify(
    gen: SimpleNamespace, conn: psycopg.Connection[Any], fixture_dsn: str
) -> None:
    with psycopg.connect(fixture_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fixture_channel")
        gen.jobs.notify(conn, pg_notify="fixture_channel", pg_notify_2="one")
        assert gen.jobs.notify_one(conn, channel="fixture_channel", message="two") is None
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert got == ["one", "two"]


def test_left_join_rows_carry_nulls(gen: SimpleNamespace, conn: psycopg.Connection[Any]) -> None:
    job = _job(gen, conn)
    gen.jobs.insert_event(
        conn,
        [
            gen.jobs.InsertEventParams(job_id=job.id, kind="with job", detail=None),
            gen.jobs.InsertEventParams(job_id=uuid.uuid4(), kind="orphan", detail=None),
        ],
    )
    rows = gen.jobs.jobs_with_events(conn)
    assert [(r.id, r.state) for r in rows] == [
        (job.id, gen.models.JobState.QUEUED),
        (None, None),
    ]


def test_copyfrom_writes_jsonb_enums_and_nulls_in_binary(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    state = gen.models.JobState
    payloads: list[Any] = [{"a": [1, {"b": None}]}, [1, 2], "text", 0, None, {"ü": "ñ"}]
    rows = [
        gen.jobs.CopyJobsParams(
            id=uuid.UUID(int=i + 1),
            queue=f"q{i}",
            payload=payload,
            priority=i,
            state=list(state)[i % len(state)],
            detail=None if i % 2 else {"i": i},
        )
        for i, payload in enumerate(payloads)
    ]
    assert gen.jobs.copy_jobs(conn, rows) == len(rows)
    for params in rows:
        job = gen.jobs.get_job(conn, id=params.id)
        assert (job.queue, job.payload, job.priority, job.state, job.detail) == (
            params.queue,
            params.payload,
            params.priority,
            params.state,
            params.detail,
        )
    # Real jsonb values (not strings holding JSON), JSON null for NOT NULL None.
    types = conn.execute("SELECT jsonb_typeof(payload) FROM jobs ORDER BY id").fetchall()
    assert [t for (t,) in types] == ["object", "array", "string", "number", "null", "object"]
    assert conn.execute("SELECT count(*) FROM jobs WHERE detail IS NULL").fetchone() == (3,)


def test_copyfrom_round_trips_every_type(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    params = gen.all_types.CopyAllTypesParams
    fields = set(params.__dataclass_fields__)
    inputs = [
        {k: v for k, v in values.items() if k in fields}
        for values in (all_values(gen), null_values(gen))
    ]
    assert gen.all_types.copy_all_types(conn, (params(**v) for v in inputs)) == 2
    got = [as_dict(r) for r in gen.all_types.list_all_types(conn)]
    for row, values in zip(got, inputs, strict=True):
        assert {k: row[k] for k in fields} == expected_row(values)
        assert row["c_mood_array"] is None


def test_copyfrom_with_enum_arrays_uses_text_copy(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    params = gen.all_types.CopyMoodsParams
    fields = set(params.__dataclass_fields__)
    inputs = [{k: v for k, v in all_values(gen).items() if k in fields}]
    inputs.append({**inputs[0], "c_mood_array": None})
    assert gen.all_types.copy_moods(conn, [params(**v) for v in inputs]) == 2
    got = [as_dict(r) for r in gen.all_types.list_all_types(conn)]
    assert [{k: r[k] for k in fields} for r in got] == inputs


def test_copyfrom_streams_rows_from_an_iterator_in_bounded_memory(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    n = 30_000
    produced = 0

    def rows() -> Iterator[Any]:
        nonlocal produced
        for i in range(n):
            produced += 1
            yield gen.jobs.CopyJobsParams(
                id=uuid.UUID(int=i + 1),
                queue="bulk",
                payload={"i": i, "pad": "x" * 100},
                priority=i % 10,
                state=gen.models.JobState.QUEUED,
                detail=None,
            )

    tracemalloc.start()
    try:
        assert gen.jobs.copy_jobs(conn, rows()) == n
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert produced == n
    # The rows alone are ~10 MB; streaming keeps only COPY's buffers around.
    assert peak < 4_000_000, peak
    assert gen.jobs.count_jobs(conn) == n


@pytest.mark.slow
def test_copyfrom_a_million_rows(gen: SimpleNamespace, conn: psycopg.Connection[Any]) -> None:
    n = 1_000_000
    rows = (
        gen.jobs.CopyJobsParams(
            id=uuid.UUID(int=i + 1),
            queue="bulk",
            payload={"i": i},
            priority=0,
            state=gen.models.JobState.QUEUED,
            detail=None,
        )
        for i in range(n)
    )
    assert gen.jobs.copy_jobs(conn, rows) == n
    assert gen.jobs.count_jobs(conn) == n


def test_batchexec_runs_the_statement_for_every_row(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, conn)
    rows = [
        gen.jobs.InsertEventParams(job_id=job.id, kind=f"k{i}", detail={"i": i} if i else None)
        for i in range(5)
    ]
    with conn.transaction():
        gen.jobs.insert_event(conn, rows)
    events = gen.jobs.events_for_job(conn, [gen.jobs.EventsForJobParams(job_id=job.id)])[0]
    assert [(e.kind, e.detail) for e in events] == [(r.kind, r.detail) for r in rows]
    gen.jobs.insert_event(conn, [])  # nothing to do


def test_batchone_returns_a_row_or_none_per_input(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    state = gen.models.JobState
    leased = _job(gen, conn, state=state.LEASED)
    queued = _job(gen, conn)
    params = gen.jobs.AckJobParams
    got = gen.jobs.ack_job(
        conn, [params(id=leased.id), params(id=queued.id), params(id=uuid.uuid4())]
    )
    assert got == [gen.jobs.AckJobRow(id=leased.id, state=state.SUCCEEDED), None, None]
    assert gen.jobs.ack_job(conn, []) == []


def test_batchmany_returns_the_rows_of_every_input(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    a, b = _job(gen, conn), _job(gen, conn)
    ids = gen.jobs.insert_events_unnest(conn, job_ids=[a.id, a.id, b.id], kinds=["x", "y", "z"])
    assert len(ids) == 3 and all(isinstance(i, int) for i in ids)
    params = gen.jobs.EventKindsParams
    got = gen.jobs.event_kinds(
        conn, [params(job_id=a.id), params(job_id=uuid.uuid4()), params(job_id=b.id)]
    )
    assert got == [["x", "y"], [], ["z"]]
    events = gen.jobs.events_for_job(conn, [gen.jobs.EventsForJobParams(job_id=b.id)])
    assert [[type(e).__name__ for e in es] for es in events] == [["JobEvent"]]


def test_renamed_parameters_and_other_schemas(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    row = gen.jobs.add_numbers(conn, param_1=2, param_2=3, class_="c", rows_=4)
    assert (row.total, row.class_, row.rows) == (5, "c", 4)
    entry = gen.all_types.add_audit_entry(conn, note="hello")
    assert isinstance(entry, gen.models.AuditEntry)
    assert gen.all_types.list_audit_entries(conn) == [entry]


def test_functions_ignore_the_connection_row_factory(
    gen: SimpleNamespace, fixture_dsn: str
) -> None:
    with psycopg.connect(fixture_dsn, autocommit=True, row_factory=dict_row) as conn:
        job = _job(gen, conn)
        assert gen.jobs.get_job(conn, id=job.id) == job
        assert gen.jobs.count_jobs(conn) == 1
        assert gen.jobs.ack_job(conn, [gen.jobs.AckJobParams(id=job.id)]) == [None]
