"""The code sqlc-gen-psycopg generates, run against a real PostgreSQL.

The plugin (tools/sqlc_gen_psycopg.py) runs on the saved fixture request
(tests/unit/sqlc_fixture/request.json); the generated package is imported
from a temporary directory and every query is run on a throwaway database
holding the fixture schema: every mapped type round-trips, enums travel by
value, jsonb is written correctly by parameters and by binary COPY, and the
batch commands send one statement per input row.

Every test runs twice: with ``Queries()`` in the fixture's own schema jobrun,
and with ``Queries(schema="myapp_jobs")`` in a second schema of the same
database made from the same DDL with the name replaced, so that the schema
rewrite of _schema.py is proven end to end. The connections' search_path is
empty: a statement naming a table or type without its schema fails.

The asyncio twins (``aio.AsyncQueries``) run the same statements on a
``psycopg.AsyncConnection``, each test driving its coroutine with
asyncio.run: every command answers as its sync twin does.

The database: an empty database of each test's own on the suite's server
(tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import decimal
import importlib
import json
import re
import subprocess
import sys
import tracemalloc
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "tools" / "sqlc_gen_psycopg.py"
FIXTURE = ROOT / "tests" / "unit" / "sqlc_fixture"
# The DDL of the schema jobrun, and of the schema audit (once: not rebound).
SCHEMA_DDL = ("schema/0001.types.sql", "schema/0002.all_types.sql")
SHARED_DDL = ("schema/0003.audit.sql",)
PACKAGE = "sqlc_fixture_gen"
DEFAULT = "jobrun"  # the fixture's plugin option schema
OTHER = "myapp_jobs"
NO_SEARCH_PATH = "-c search_path="


@pytest.fixture(scope="module")
def gen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    """The generated fixture package: .Queries, .models, .jobs, .all_types."""
    request = (FIXTURE / "request.json").read_bytes()
    proc = subprocess.run(
        [sys.executable, str(PLUGIN)], input=request, capture_output=True, check=False
    )
    assert proc.returncode == 0, proc.stderr.decode()
    parent = tmp_path_factory.mktemp("sqlc_gen")
    (parent / PACKAGE).mkdir()
    for f in json.loads(proc.stdout)["files"]:
        target = parent / PACKAGE / f["name"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(f["contents"]))
    sys.path.insert(0, str(parent))
    try:
        modules: dict[str, ModuleType] = {
            name: importlib.import_module(f"{PACKAGE}.{name}")
            for name in ("models", "jobs", "all_types")
        }
        yield SimpleNamespace(
            Queries=importlib.import_module(PACKAGE).Queries,
            AsyncQueries=importlib.import_module(f"{PACKAGE}.aio").AsyncQueries,
            **modules,
        )
    finally:
        sys.path.remove(str(parent))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


def ddl_in(schema: str) -> str:
    """The fixture's DDL of the schema jobrun, making ``schema`` instead.

    A plain text substitution, independent of the rewrite under test: the
    DDL names jobrun nowhere but as the schema.
    """
    text = "\n".join((FIXTURE / path).read_text(encoding="utf-8") for path in SCHEMA_DDL)
    assert text.count(f"{DEFAULT}.") > 5
    return re.sub(rf"\b{DEFAULT}\b", schema, text)


@pytest.fixture
def fixture_dsn(empty_dsn: str) -> str:
    """A database of the test's own holding the fixture schema twice: jobrun and myapp_jobs."""
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        conn.execute(ddl_in(DEFAULT).encode())
        conn.execute(ddl_in(OTHER).encode())
        for path in SHARED_DDL:
            conn.execute((FIXTURE / path).read_text(encoding="utf-8").encode())
    return empty_dsn


@pytest.fixture(params=[DEFAULT, OTHER])
def schema(request: pytest.FixtureRequest) -> str:
    """The schema the test's queries run in."""
    name: str = request.param
    return name


@pytest.fixture
def q(gen: SimpleNamespace, schema: str, fixture_dsn: str) -> Iterator[Any]:
    """The fixture's queries bound to the test's schema: Queries() for jobrun.

    A test in myapp_jobs leaves the schema jobrun empty: no statement of it
    went to the default schema.
    """
    yield gen.Queries() if schema == DEFAULT else gen.Queries(schema=schema)
    if schema != DEFAULT:
        with psycopg.connect(fixture_dsn) as c:
            left = c.execute(
                f"SELECT (SELECT count(*) FROM {DEFAULT}.jobs),"
                f" (SELECT count(*) FROM {DEFAULT}.job_events),"
                f" (SELECT count(*) FROM {DEFAULT}.all_types)"
            ).fetchone()
        assert left == (0, 0, 0), f"rows written into {DEFAULT} by Queries(schema={schema!r})"


@pytest.fixture
def conn(fixture_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection with an empty search_path: every name must be qualified."""
    with psycopg.connect(fixture_dsn, autocommit=True, options=NO_SEARCH_PATH) as c:
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
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    for values in (all_values(gen), null_values(gen)):
        row = q.insert_all_types(conn, **values)
        assert isinstance(row, gen.models.AllType)
        got = as_dict(row)
        assert isinstance(got.pop("id"), int)
        assert isinstance(got.pop("c_serial"), int)
        assert got == expected_row(values)
    listed = q.list_all_types(conn)
    assert [as_dict(r)["c_text_array"] for r in listed] == [all_values(gen)["c_text_array"]] * 2
    assert type(listed[0].c_mood) is gen.models.Mood
    assert all(type(m) is gen.models.Mood for m in listed[0].c_mood_array)


def test_expression_results_load_as_the_annotated_types(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    row = q.expressions(conn)
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
    gen: SimpleNamespace, q: Any, schema: str, conn: psycopg.Connection[Any]
) -> None:
    state = gen.models.JobState
    job_id = uuid.uuid4()
    q.insert_job(
        conn, id=job_id, queue="q", payload={}, priority=0, state=state.CANCELLED, detail=None
    )
    assert conn.execute(f"SELECT state::text FROM {schema}.jobs").fetchone() == ("cancelled",)
    assert q.get_state(conn, id=job_id) is state.CANCELLED
    rows = q.jobs_in_states(conn, states=[state.CANCELLED, state.DEAD])
    assert [(r.id, r.state) for r in rows] == [(job_id, state.CANCELLED)]
    assert q.jobs_in_states(conn, states=[state.QUEUED]) == []


@pytest.mark.parametrize(
    "payload", [{"a": 1}, [1, "x"], "a json string", 42, 1.5, True, None], ids=repr
)
def test_jsonb_parameters_store_the_json_value(
    gen: SimpleNamespace, q: Any, schema: str, conn: psycopg.Connection[Any], payload: Any
) -> None:
    job_id = uuid.uuid4()
    job = q.insert_job(
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
        f"SELECT payload = %s::jsonb, detail IS NULL FROM {schema}.jobs", [json.dumps(payload)]
    ).fetchone()
    assert stored == (True, True)
    q.set_detail(conn, detail={"k": "v"}, id=job_id)
    assert q.get_job(conn, id=job_id).detail == {"k": "v"}
    q.set_detail(conn, detail=None, id=job_id)
    assert conn.execute(f"SELECT detail IS NULL FROM {schema}.jobs").fetchone() == (True,)


def test_an_already_wrapped_json_value_passes_through_unserialised_again(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    from psycopg.types.json import Jsonb  # noqa: PLC0415

    raw = Jsonb('{"pre": "serialised"}', dumps=lambda text: text)
    job = q.insert_job(
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


def _job(gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any], **kw: Any) -> Any:
    args: dict[str, Any] = {
        "id": uuid.uuid4(),
        "queue": "q",
        "payload": {},
        "priority": 0,
        "state": gen.models.JobState.QUEUED,
        "detail": None,
    }
    args.update(kw)
    return q.insert_job(conn, **args)


def test_one_returns_the_shared_model_or_none(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, q, conn, priority=7)
    assert isinstance(job, gen.models.Job)
    assert q.get_job(conn, id=job.id) == job
    assert q.get_job(conn, id=uuid.uuid4()) is None
    assert q.count_jobs(conn) == 1
    assert q.get_lease_owner(conn, id=job.id) is None
    assert q.get_payload(conn, id=job.id) == {}
    assert q.max_priority(conn, state=gen.models.JobState.QUEUED) == 7
    via_cte = q.insert_job_with_event(
        conn,
        id=uuid.uuid4(),
        queue="q",
        payload={"a": 1},
        priority=1,
        state=gen.models.JobState.QUEUED,
    )
    assert isinstance(via_cte, gen.models.Job)
    assert q.get_job(conn, id=via_cte.id) == via_cte


def test_many_returns_rows_and_bare_values(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    ids = sorted(_job(gen, q, conn, queue=name, priority=i).id for i, name in enumerate("aab"))
    assert q.list_job_ids(conn, queue="a") == sorted(
        i for i in ids if q.get_job(conn, id=i).queue == "a"
    )
    claimed = q.claim_jobs(conn, owner="w1", queues=["a", "b"], max_jobs=2)
    assert len(claimed) == 2
    assert all(type(r).__name__ == "ClaimJobsRow" for r in claimed)
    assert {r.state for r in claimed} == {gen.models.JobState.LEASED}
    assert {r.lease_owner for r in claimed} == {"w1"}


def test_a_deferred_query_is_sent_at_once_and_read_after_what_followed_it(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any], fixture_dsn: str, schema: str
) -> None:
    queued = _job(gen, q, conn)
    state = gen.models.JobState
    with conn.pipeline():
        conn.execute("BEGIN")
        rows = q.jobs_in_states_deferred(conn, states=[state.QUEUED])
        q.set_state(conn, new_state=state.DEAD, ids=[queued.id])
        conn.execute("COMMIT")  # sent before the rows are read: one round trip
        got = rows()
    assert [(r.id, r.state) for r in got] == [(queued.id, state.QUEUED)]  # its own snapshot
    assert q.get_state(conn, id=queued.id) is state.DEAD
    with psycopg.connect(fixture_dsn) as other:  # committed, for everyone
        seen = other.execute(f"SELECT state::text FROM {schema}.jobs").fetchall()
        assert seen == [("dead",)]
    # A statement the server refused raises when its rows are read.
    with pytest.raises(psycopg.errors.InvalidTextRepresentation), conn.pipeline():
        broken = q.jobs_in_states_deferred(conn, states=["no such state"])
        broken()


def test_a_deferred_async_query_reads_its_rows_when_awaited(
    gen: SimpleNamespace, q: Any, aq: Any, conn: psycopg.Connection[Any], on_async_conn: Any
) -> None:
    queued = _job(gen, q, conn)
    state = gen.models.JobState

    async def scenario(aconn: Any) -> list[Any]:
        async with aconn.pipeline():
            rows = await aq.jobs_in_states_deferred(aconn, states=[state.QUEUED])
            await aq.set_state(aconn, new_state=state.DEAD, ids=[queued.id])
            return list(await rows())

    got = on_async_conn(scenario)
    assert [(r.id, r.state) for r in got] == [(queued.id, state.QUEUED)]
    assert q.get_state(conn, id=queued.id) is state.DEAD


def test_execrows_returns_the_number_of_rows_changed(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    a, b = _job(gen, q, conn), _job(gen, q, conn)
    dead = gen.models.JobState.DEAD
    assert q.set_state(conn, new_state=dead, ids=[a.id, b.id, uuid.uuid4()]) == 2
    assert q.set_state(conn, new_state=dead, ids=[]) == 0
    q.delete_job(conn, id=a.id)
    assert q.list_job_ids(conn, queue="q") == [b.id]


def test_void_results_and_notify(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any], fixture_dsn: str
) -> None:
    with psycopg.connect(fixture_dsn, autocommit=True) as listener:
        listener.execute("LISTEN fixture_channel")
        q.notify(conn, pg_notify="fixture_channel", pg_notify_2="one")
        assert q.notify_one(conn, channel="fixture_channel", message="two") is None
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    assert got == ["one", "two"]


def test_left_join_rows_carry_nulls(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, q, conn)
    q.insert_event(
        conn,
        [
            gen.jobs.InsertEventParams(job_id=job.id, kind="with job", detail=None),
            gen.jobs.InsertEventParams(job_id=uuid.uuid4(), kind="orphan", detail=None),
        ],
    )
    rows = q.jobs_with_events(conn)
    assert [(r.id, r.state) for r in rows] == [
        (job.id, gen.models.JobState.QUEUED),
        (None, None),
    ]


def test_copyfrom_writes_jsonb_enums_and_nulls_in_binary(
    gen: SimpleNamespace, q: Any, schema: str, conn: psycopg.Connection[Any]
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
    assert q.copy_jobs(conn, rows) == len(rows)
    for params in rows:
        job = q.get_job(conn, id=params.id)
        assert (job.queue, job.payload, job.priority, job.state, job.detail) == (
            params.queue,
            params.payload,
            params.priority,
            params.state,
            params.detail,
        )
    # Real jsonb values (not strings holding JSON), JSON null for NOT NULL None.
    types = conn.execute(f"SELECT jsonb_typeof(payload) FROM {schema}.jobs ORDER BY id").fetchall()
    assert [t for (t,) in types] == ["object", "array", "string", "number", "null", "object"]
    assert conn.execute(f"SELECT count(*) FROM {schema}.jobs WHERE detail IS NULL").fetchone() == (
        3,
    )


def test_copyfrom_round_trips_every_type(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    params = gen.all_types.CopyAllTypesParams
    fields = set(params.__dataclass_fields__)
    inputs = [
        {k: v for k, v in values.items() if k in fields}
        for values in (all_values(gen), null_values(gen))
    ]
    assert q.copy_all_types(conn, (params(**v) for v in inputs)) == 2
    got = [as_dict(r) for r in q.list_all_types(conn)]
    for row, values in zip(got, inputs, strict=True):
        assert {k: row[k] for k in fields} == expected_row(values)
        assert row["c_mood_array"] is None


def test_copyfrom_with_enum_arrays_uses_text_copy(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    params = gen.all_types.CopyMoodsParams
    fields = set(params.__dataclass_fields__)
    inputs = [{k: v for k, v in all_values(gen).items() if k in fields}]
    inputs.append({**inputs[0], "c_mood_array": None})
    assert q.copy_moods(conn, [params(**v) for v in inputs]) == 2
    got = [as_dict(r) for r in q.list_all_types(conn)]
    assert [{k: r[k] for k in fields} for r in got] == inputs


def test_copyfrom_streams_rows_from_an_iterator_in_bounded_memory(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
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
        assert q.copy_jobs(conn, rows()) == n
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert produced == n
    # The rows alone are ~10 MB; streaming keeps only COPY's buffers around.
    assert peak < 4_000_000, peak
    assert q.count_jobs(conn) == n


@pytest.mark.slow
def test_copyfrom_a_million_rows(gen: SimpleNamespace, conn: psycopg.Connection[Any]) -> None:
    q = gen.Queries(schema=OTHER)  # one schema is enough here: the rewritten COPY
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
    assert q.copy_jobs(conn, rows) == n
    assert q.count_jobs(conn) == n


def test_batchexec_runs_the_statement_for_every_row(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, q, conn)
    rows = [
        gen.jobs.InsertEventParams(job_id=job.id, kind=f"k{i}", detail={"i": i} if i else None)
        for i in range(5)
    ]
    with conn.transaction():
        q.insert_event(conn, rows)
    events = q.events_for_job(conn, [gen.jobs.EventsForJobParams(job_id=job.id)])[0]
    assert [(e.kind, e.detail) for e in events] == [(r.kind, r.detail) for r in rows]
    q.insert_event(conn, [])  # nothing to do


def test_batchone_returns_a_row_or_none_per_input(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    state = gen.models.JobState
    leased = _job(gen, q, conn, state=state.LEASED)
    queued = _job(gen, q, conn)
    params = gen.jobs.AckJobParams
    got = q.ack_job(conn, [params(id=leased.id), params(id=queued.id), params(id=uuid.uuid4())])
    assert got == [gen.jobs.AckJobRow(id=leased.id, state=state.SUCCEEDED), None, None]
    assert q.ack_job(conn, []) == []


def test_batchmany_returns_the_rows_of_every_input(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    a, b = _job(gen, q, conn), _job(gen, q, conn)
    ids = q.insert_events_unnest(conn, job_ids=[a.id, a.id, b.id], kinds=["x", "y", "z"])
    assert len(ids) == 3 and all(isinstance(i, int) for i in ids)
    params = gen.jobs.EventKindsParams
    got = q.event_kinds(
        conn, [params(job_id=a.id), params(job_id=uuid.uuid4()), params(job_id=b.id)]
    )
    assert got == [["x", "y"], [], ["z"]]
    events = q.events_for_job(conn, [gen.jobs.EventsForJobParams(job_id=b.id)])
    assert [[type(e).__name__ for e in es] for es in events] == [["JobEvent"]]


def test_renamed_parameters_and_other_schemas(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    row = q.add_numbers(conn, param_1=2, param_2=3, class_="c", rows_=4)
    assert (row.total, row.class_, row.rows) == (5, "c", 4)
    entry = q.add_audit_entry(conn, note="hello")
    assert isinstance(entry, gen.models.AuditEntry)
    assert q.list_audit_entries(conn) == [entry]


def test_queries_ignore_the_connection_row_factory(
    gen: SimpleNamespace, q: Any, fixture_dsn: str
) -> None:
    with psycopg.connect(
        fixture_dsn, autocommit=True, row_factory=dict_row, options=NO_SEARCH_PATH
    ) as conn:
        job = _job(gen, q, conn)
        assert q.get_job(conn, id=job.id) == job
        assert q.count_jobs(conn) == 1
        assert q.ack_job(conn, [gen.jobs.AckJobParams(id=job.id)]) == [None]


# --------------------------------------------------------------------------- schemas


def test_the_connections_find_no_table_without_its_schema(
    conn: psycopg.Connection[Any],
) -> None:
    # What makes every test here prove that its statements name their schema.
    with pytest.raises(psycopg.errors.UndefinedTable):
        conn.execute("SELECT count(*) FROM jobs")


def test_each_schema_holds_its_own_rows(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    home, other = gen.Queries(), gen.Queries(schema=OTHER)
    state = gen.models.JobState
    a = _job(gen, home, conn, queue="home")
    b = _job(gen, other, conn, queue="other")
    copied = gen.jobs.CopyJobsParams(
        id=uuid.uuid4(), queue="other", payload={}, priority=0, state=state.QUEUED, detail=None
    )
    assert other.copy_jobs(conn, [copied]) == 1
    assert (home.count_jobs(conn), other.count_jobs(conn)) == (1, 2)
    assert home.get_job(conn, id=b.id) is None
    assert other.get_job(conn, id=a.id) is None
    assert conn.execute(f"SELECT count(*) FROM {DEFAULT}.jobs").fetchone() == (1,)
    assert conn.execute(f"SELECT count(*) FROM {OTHER}.jobs").fetchone() == (2,)
    claimed = other.claim_jobs(conn, owner="w", queues=["home", "other"], max_jobs=10)
    assert sorted(r.id for r in claimed) == sorted([b.id, copied.id])
    assert home.get_state(conn, id=a.id) is state.QUEUED
    # Each schema has its own enum types: the casts name the bound schema's.
    assert home.jobs_in_states(conn, states=[state.LEASED]) == []
    assert len(other.jobs_in_states(conn, states=[state.LEASED])) == 2


def test_strings_keep_the_schema_name_in_every_schema(
    gen: SimpleNamespace, q: Any, conn: psycopg.Connection[Any]
) -> None:
    job = _job(gen, q, conn)
    q.insert_event(
        conn,
        [gen.jobs.InsertEventParams(job_id=job.id, kind=k, detail=None) for k in ("a", "b")],
    )
    row = q.schema_names(conn)
    assert (row.literal, row.escaped, row.dollar_quoted) == (
        "jobrun.jobs",
        "it's jobrun.jobs",
        "jobrun.jobs",
    )
    # The quoted and the upper-case qualifiers count the bound schema's rows.
    assert (row.jobs, row.events) == (1, 2)


def test_a_schema_named_like_an_sql_keyword_works(
    gen: SimpleNamespace, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(ddl_in('"user"').encode())
    q = gen.Queries(schema="user")
    job = _job(gen, q, conn, queue="kw")
    assert q.get_job(conn, id=job.id) == job
    params = gen.jobs.CopyJobsParams(
        id=uuid.uuid4(), queue="kw", payload=[1], priority=1, state=job.state, detail=None
    )
    assert q.copy_jobs(conn, [params]) == 1
    assert conn.execute('SELECT count(*) FROM "user".jobs').fetchone() == (2,)


# --------------------------------------------------------------------------- asyncio


@pytest.fixture
def aq(gen: SimpleNamespace, schema: str, q: Any) -> Any:
    """The asyncio twins of ``q``, bound to the same schema (and checked the same way)."""
    return gen.AsyncQueries() if schema == DEFAULT else gen.AsyncQueries(schema=schema)


@pytest.fixture
def on_async_conn(fixture_dsn: str) -> Callable[[Callable[[Any], Awaitable[Any]]], Any]:
    """Run ``fn(aconn)`` on an autocommit AsyncConnection with an empty search_path."""

    def run(fn: Callable[[Any], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            async with await psycopg.AsyncConnection.connect(
                fixture_dsn, autocommit=True, options=NO_SEARCH_PATH
            ) as aconn:
                return await fn(aconn)

        return asyncio.run(main())

    return run


def test_async_one_many_exec_and_execrows_answer_as_the_sync_queries(
    gen: SimpleNamespace,
    q: Any,
    aq: Any,
    conn: psycopg.Connection[Any],
    on_async_conn: Callable[..., Any],
) -> None:
    state = gen.models.JobState

    async def scenario(aconn: Any) -> None:
        for values in (all_values(gen), null_values(gen)):
            row = await aq.insert_all_types(aconn, **values)
            assert isinstance(row, gen.models.AllType)
            got = as_dict(row)
            del got["id"], got["c_serial"]
            assert got == expected_row(values)
        assert await aq.list_all_types(aconn) == q.list_all_types(conn)
        assert _timeless(await aq.expressions(aconn)) == _timeless(q.expressions(conn))
        job = await aq.insert_job(
            aconn,
            id=uuid.uuid4(),
            queue="a",
            payload={"p": 1},
            priority=3,
            state=state.QUEUED,
            detail=None,
        )
        assert await aq.get_job(aconn, id=job.id) == q.get_job(conn, id=job.id) == job
        assert await aq.get_job(aconn, id=uuid.uuid4()) is None
        assert await aq.count_jobs(aconn) == 1
        assert await aq.get_state(aconn, id=job.id) is state.QUEUED
        assert await aq.get_payload(aconn, id=job.id) == {"p": 1}
        assert await aq.get_lease_owner(aconn, id=job.id) is None
        assert await aq.max_priority(aconn, state=state.QUEUED) == 3
        assert await aq.list_job_ids(aconn, queue="a") == [job.id]
        assert [r.id for r in await aq.jobs_in_states(aconn, states=[state.QUEUED])] == [job.id]
        claimed = await aq.claim_jobs(aconn, owner="w", queues=["a"], max_jobs=5)
        assert [(type(r).__name__, r.state, r.lease_owner) for r in claimed] == [
            ("ClaimJobsRow", state.LEASED, "w")
        ]
        assert await aq.set_state(aconn, new_state=state.DEAD, ids=[job.id, uuid.uuid4()]) == 1
        await aq.set_detail(aconn, detail={"k": "v"}, id=job.id)
        assert q.get_job(conn, id=job.id).detail == {"k": "v"}
        assert await aq.notify_one(aconn, channel="fixture_channel", message="x") is None
        await aq.delete_job(aconn, id=job.id)
        assert await aq.count_jobs(aconn) == 0
        row = await aq.add_numbers(aconn, param_1=2, param_2=3, class_="c", rows_=4)
        assert (row.total, row.class_, row.rows) == (5, "c", 4)
        entry = await aq.add_audit_entry(aconn, note="hello")
        assert await aq.list_audit_entries(aconn) == [entry]

    on_async_conn(scenario)


def _timeless(row: Any) -> Any:
    """A row of Expressions without what differs between two calls: now() and a random uuid."""
    return dataclasses.replace(row, a_now=None, a_timestamp=None, a_date=None, a_uuid=None)


def test_async_copyfrom_writes_every_type_in_binary_and_enum_arrays_in_text(
    gen: SimpleNamespace,
    q: Any,
    aq: Any,
    schema: str,
    conn: psycopg.Connection[Any],
    on_async_conn: Callable[..., Any],
) -> None:
    state = gen.models.JobState
    jobs = [
        gen.jobs.CopyJobsParams(
            id=uuid.UUID(int=i + 1),
            queue=f"q{i}",
            payload=payload,
            priority=i,
            state=list(state)[i % len(state)],
            detail=None if i % 2 else {"i": i},
        )
        for i, payload in enumerate([{"a": [1, None]}, [1, 2], "text", 0, None])
    ]
    copy_params = gen.all_types.CopyAllTypesParams
    copy_fields = set(copy_params.__dataclass_fields__)
    mood_params = gen.all_types.CopyMoodsParams
    mood_fields = set(mood_params.__dataclass_fields__)

    async def scenario(aconn: Any) -> None:
        assert await aq.copy_jobs(aconn, iter(jobs)) == len(jobs)
        values = all_values(gen)
        assert (
            await aq.copy_all_types(
                aconn, [copy_params(**{k: v for k, v in values.items() if k in copy_fields})]
            )
            == 1
        )
        assert (
            await aq.copy_moods(
                aconn, [mood_params(**{k: v for k, v in values.items() if k in mood_fields})]
            )
            == 1
        )

    on_async_conn(scenario)
    for params in jobs:
        job = q.get_job(conn, id=params.id)
        assert (job.queue, job.payload, job.priority, job.state, job.detail) == (
            params.queue,
            params.payload,
            params.priority,
            params.state,
            params.detail,
        )
    types = conn.execute(f"SELECT jsonb_typeof(payload) FROM {schema}.jobs ORDER BY id").fetchall()
    assert [t for (t,) in types] == ["object", "array", "string", "number", "null"]
    copied, moods = q.list_all_types(conn)
    assert {k: as_dict(copied)[k] for k in copy_fields} == {
        k: v for k, v in expected_row(all_values(gen)).items() if k in copy_fields
    }
    assert moods.c_mood_array == all_values(gen)["c_mood_array"]


def test_async_batches_send_one_statement_per_row_and_read_every_result(
    gen: SimpleNamespace,
    q: Any,
    aq: Any,
    conn: psycopg.Connection[Any],
    on_async_conn: Callable[..., Any],
) -> None:
    state = gen.models.JobState
    leased = _job(gen, q, conn, state=state.LEASED)
    queued = _job(gen, q, conn)

    async def scenario(aconn: Any) -> None:
        events = [
            gen.jobs.InsertEventParams(
                job_id=leased.id, kind=f"k{i}", detail={"i": i} if i else None
            )
            for i in range(3)
        ]
        async with aconn.transaction():
            await aq.insert_event(aconn, events)
        await aq.insert_event(aconn, [])
        got = await aq.events_for_job(aconn, [gen.jobs.EventsForJobParams(job_id=leased.id)])
        assert [[(e.kind, e.detail) for e in es] for es in got] == [
            [(e.kind, e.detail) for e in events]
        ]
        kinds = gen.jobs.EventKindsParams
        assert await aq.event_kinds(
            aconn, [kinds(job_id=leased.id), kinds(job_id=uuid.uuid4())]
        ) == [["k0", "k1", "k2"], []]
        ack = gen.jobs.AckJobParams
        assert await aq.ack_job(
            aconn, [ack(id=leased.id), ack(id=queued.id), ack(id=uuid.uuid4())]
        ) == [gen.jobs.AckJobRow(id=leased.id, state=state.SUCCEEDED), None, None]
        assert await aq.ack_job(aconn, []) == []
        assert await aq.event_kinds(aconn, []) == []

    on_async_conn(scenario)


def test_async_queries_run_in_the_async_connections_transaction(
    gen: SimpleNamespace,
    q: Any,
    aq: Any,
    conn: psycopg.Connection[Any],
    on_async_conn: Callable[..., Any],
) -> None:
    class Rollback(Exception):
        pass

    async def scenario(aconn: Any) -> None:
        with pytest.raises(Rollback):
            async with aconn.transaction():
                await aq.insert_job(
                    aconn,
                    id=uuid.uuid4(),
                    queue="gone",
                    payload={},
                    priority=0,
                    state=gen.models.JobState.QUEUED,
                    detail=None,
                )
                await aq.copy_jobs(
                    aconn,
                    [
                        gen.jobs.CopyJobsParams(
                            id=uuid.uuid4(),
                            queue="gone",
                            payload={},
                            priority=0,
                            state=gen.models.JobState.QUEUED,
                            detail=None,
                        )
                    ],
                )
                assert await aq.count_jobs(aconn) == 2
                raise Rollback

    on_async_conn(scenario)
    assert q.count_jobs(conn) == 0
