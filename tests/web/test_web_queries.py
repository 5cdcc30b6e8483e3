"""The dashboard's reads (jobrun.postgres.web): right against plain SQL, and cheap on a big table.

Cheap means: on a table of many finished rows (ANALYZEd), no statement of
db/query/web.sql reads ``jobs`` or ``job_events`` by a sequential scan, in
the custom plan a fresh statement gets nor in the generic plan a prepared
one may switch to (psycopg prepares a statement after a few executions).
The check is shown to see a sequential scan when index scans are off.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql

from bench.plan import scans
from jobrun.job.errors import ValidationError
from jobrun.job.model import DEFAULT_BACKOFF, NewJob, State
from jobrun.postgres.sqlc import web as wq
from jobrun.postgres.store import Store
from jobrun.postgres.web import SCAN_ROWS, DashboardReads, JobFilter, normalize_id_prefix

TTL = dt.timedelta(seconds=30)
FINISHED = 200_000

# Ids are time-ordered like UUIDv7: 48 bits of milliseconds, then noise. The
# finished jobs are spread over the last week (as a 7-day retention keeps
# them), the queued ones are the newest.
ID = (
    "(lpad(to_hex((extract(epoch FROM {t}) * 1000)::bigint), 12, '0') || '7'"
    " || substr(md5({n}), 1, 19))::uuid"
)

SEED = f"""
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at,
                         created_at, idempotency_key)
SELECT {ID.format(t="now() - g * interval '3 s'", n="'s' || g")},
       CASE WHEN g %% 2 = 0 THEN 'a' ELSE 'b' END, CASE WHEN g %% 7 = 0 THEN 'rare' ELSE 't' END,
       '{{}}', %(backoff)s, 'succeeded', 1, now() - g * interval '3 s', now() - g * interval '3 s',
       CASE WHEN g %% 10 = 0 THEN 'key-' || g END
FROM generate_series(1, %(finished)s) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at,
                         created_at)
SELECT {ID.format(t="now() - g * interval '2000 s'", n="'d' || g")},
       CASE WHEN g %% 2 = 0 THEN 'a' ELSE 'c' END, 't', '{{}}', %(backoff)s, 'dead', 25,
       now() - g * interval '2000 s', now() - g * interval '2000 s'
FROM generate_series(1, 300) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at,
                         created_at)
SELECT {ID.format(t="now() - g * interval '3000 s'", n="'c' || g")},
       'a', 't', '{{}}', %(backoff)s, 'cancelled', 0,
       now() - g * interval '3000 s', now() - g * interval '3000 s'
FROM generate_series(1, 200) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, run_at, created_at)
SELECT {ID.format(t="now() - g * interval '10 ms'", n="'q' || g")},
       CASE WHEN g %% 3 = 0 THEN 'b' ELSE 'a' END, 't', '{{}}', %(backoff)s,
       now() + (CASE WHEN g %% 5 = 0 THEN 1 ELSE -1 END) * g * interval '1 s',
       now() - g * interval '10 ms'
FROM generate_series(1, 20000) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, lease_owner,
                         lease_token, lease_expires_at, started_at)
SELECT {ID.format(t="now() - g * interval '1 ms'", n="'l' || g")},
       'a', 't', '{{}}', %(backoff)s, 'leased', 1, 'w' || (g %% 4), gen_random_uuid(),
       now() + interval '30 s', CASE WHEN g %% 5 <> 0 THEN now() END
FROM generate_series(1, 40) g;
INSERT INTO jobrun.job_events (job_id, kind, attempt, at)
SELECT gen_random_uuid(), CASE WHEN g %% 50 = 0 THEN 'retrying' ELSE 'succeeded' END, 1,
       now() - g * interval '3 s'
FROM generate_series(1, %(finished)s) g;
"""


@pytest.fixture
def big(admin_dsn: str) -> Any:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        params = {"backoff": json.dumps(DEFAULT_BACKOFF.to_json()), "finished": FINISHED}
        for statement in SEED.split(";"):
            if statement.strip():
                conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE jobrun.jobs")
        conn.execute("VACUUM ANALYZE jobrun.job_events")
        yield conn


HIGH = uuid.UUID(int=(1 << 128) - 1)
LOW = uuid.UUID(int=0)
DEEP = uuid.UUID("00000000-0000-7000-8000-000000000000")


# (SQL, parameters in order) for every statement of web.sql, several times for
# the page queries: with no filter, with filters, and a deep page.
STATEMENTS: dict[str, tuple[str, tuple[Any, ...]]] = {
    # WebScanJobs: (id_low, state, queue, type, max_rows, id_high, scan_rows)
    "page": (wq.WEB_SCAN_JOBS, (LOW, None, None, None, 51, HIGH, SCAN_ROWS)),
    "page-succeeded-queue": (wq.WEB_SCAN_JOBS, (LOW, "succeeded", "a", None, 51, HIGH, SCAN_ROWS)),
    "page-cancelled": (wq.WEB_SCAN_JOBS, (LOW, "cancelled", None, None, 51, HIGH, SCAN_ROWS)),
    "page-rare-type": (wq.WEB_SCAN_JOBS, (LOW, None, None, "rare", 51, HIGH, SCAN_ROWS)),
    "page-rare-queue": (wq.WEB_SCAN_JOBS, (LOW, None, "c", None, 51, HIGH, SCAN_ROWS)),
    "page-deep": (wq.WEB_SCAN_JOBS, (LOW, None, None, None, 51, DEEP, SCAN_ROWS)),
    "queued": (wq.WEB_QUEUED_JOBS_PAGE, (LOW, HIGH, None, None, 51)),
    "queued-queue": (wq.WEB_QUEUED_JOBS_PAGE, (LOW, HIGH, "b", "t", 51)),
    "leased": (wq.WEB_LEASED_JOBS_PAGE, (LOW, HIGH, None, None, 51)),
    "dead": (wq.WEB_DEAD_JOBS_PAGE, (LOW, HIGH, None, None, 51)),
    "dead-queue": (wq.WEB_DEAD_JOBS_PAGE, (LOW, HIGH, "c", None, 51)),
    "keyed": (wq.WEB_KEYED_JOBS_PAGE, ("key-10", LOW, HIGH, None, None, None, 51)),
    "throughput": (wq.WEB_THROUGHPUT, ()),
    "owners": (wq.WEB_LEASE_OWNERS, ()),
    "waiting": (wq.WEB_WAITING_BY_QUEUE, ()),
    "running": (wq.WEB_RUNNING_JOBS, (200,)),
    "schedules": (wq.WEB_SCHEDULES, ()),
    "effect": (wq.WEB_EFFECT, ("job:t", "x")),
    "id-prefix": (wq.WEB_SCAN_JOBS, (DEEP, None, None, None, 2, HIGH, 1001)),
    "short-ids": (wq.WEB_JOB_ID_NEIGHBOURS, ([DEEP, HIGH],)),
}


def explain(conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]) -> Any:
    with psycopg.RawCursor(conn) as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        row = cur.fetchone()
    assert row is not None
    return row[0]


def explain_generic(conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...]) -> Any:
    """The generic plan of the PREPAREd statement (what a prepared statement may switch to)."""
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(sql.SQL("PREPARE web_generic AS ") + sql.SQL(statement))  # type: ignore[arg-type]
        with psycopg.ClientCursor(conn) as cur:
            if params:
                marks = sql.SQL(", ").join(sql.Placeholder() * len(params))
                cur.execute(
                    sql.SQL("EXPLAIN (FORMAT JSON) EXECUTE web_generic ({})").format(marks),
                    [str(p) if isinstance(p, uuid.UUID) else p for p in params],
                )
            else:
                cur.execute("EXPLAIN (FORMAT JSON) EXECUTE web_generic")
            row = cur.fetchone()
        conn.execute("DEALLOCATE web_generic")
    assert row is not None
    return row[0]


def seq_scans(plan: Any) -> list[str]:
    return [
        f"{s.node} on {s.relation}"
        for s in scans(plan)
        if s.node == "Seq Scan" and s.relation in ("jobs", "job_events")
    ]


def test_no_dashboard_query_scans_jobs_or_events_sequentially(big: psycopg.Connection[Any]) -> None:
    for name, (statement, params) in STATEMENTS.items():
        for mode, plan in (
            ("custom", explain(big, statement, params)),
            ("generic", explain_generic(big, statement, params)),
        ):
            found = [f"{s.node} {s.relation} {s.index}" for s in scans(plan)]
            assert seq_scans(plan) == [], (name, mode, found)


def test_each_state_with_a_partial_index_is_read_through_it(big: psycopg.Connection[Any]) -> None:
    expected = {
        "dead": "jobs_dead_idx",
        "leased": "jobs_leased_queue_idx",
        "keyed": "jobs_idem_uniq",
        "throughput": "jobs_finished_at_idx",
    }
    for name, index in expected.items():
        statement, params = STATEMENTS[name]
        for plan in (explain(big, statement, params), explain_generic(big, statement, params)):
            indexes = {s.index for s in scans(plan) if s.index}
            assert index in indexes, (name, indexes)
    statement, params = STATEMENTS["throughput"]
    assert "job_events_at_idx" in {s.index for s in scans(explain(big, statement, params))}
    # A deep page starts at its bound in the primary key, as page 1 does at the top.
    for plan in (
        explain(big, *STATEMENTS["page-deep"]),
        explain_generic(big, *STATEMENTS["page-deep"]),
    ):
        assert "jobs_pkey" in {s.index for s in scans(plan)}


def test_the_plan_check_sees_a_seq_scan_when_there_is_one(big: psycopg.Connection[Any]) -> None:
    """Not vacuous: with index scans off, the same check finds the sequential scans."""
    with big.transaction(force_rollback=True):
        for knob in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            big.execute(f"SET LOCAL {knob} = off")
        assert seq_scans(explain(big, *STATEMENTS["dead"]))
        assert len(seq_scans(explain(big, *STATEMENTS["throughput"]))) == 2


BRUTE = """
SELECT id FROM jobrun.jobs
WHERE (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(state)s::jobrun.job_state IS NULL OR state = %(state)s::jobrun.job_state)
  AND (%(type)s::text IS NULL OR type = %(type)s)
  AND (%(key)s::text IS NULL OR idempotency_key = %(key)s)
  AND id::text LIKE %(prefix)s
  AND (%(before)s::uuid IS NULL OR id < %(before)s::uuid)
ORDER BY id DESC LIMIT %(limit)s
"""


def brute(
    conn: psycopg.Connection[Any], where: JobFilter, before: uuid.UUID | None, limit: int
) -> list[uuid.UUID]:
    prefix = where.id_prefix or ""
    dashed = "-".join(
        part
        for part in (prefix[:8], prefix[8:12], prefix[12:16], prefix[16:20], prefix[20:])
        if part
    )
    rows = conn.execute(
        BRUTE,
        {
            "queue": where.queue,
            "state": None if where.state is None else where.state.value,
            "type": where.type,
            "key": where.idempotency_key,
            "prefix": dashed + "%",
            "before": before,
            "limit": limit,
        },
    ).fetchall()
    return [r[0] for r in rows]


def test_pages_match_plain_sql_newest_first_on_the_big_table(
    big: psycopg.Connection[Any], store: Store
) -> None:
    reads = DashboardReads(store)
    newest = big.execute("SELECT id FROM jobrun.jobs ORDER BY id DESC LIMIT 1").fetchone()[0]
    filters = [
        JobFilter(),
        JobFilter(state=State.QUEUED, queue="b"),
        JobFilter(state=State.LEASED),
        JobFilter(state=State.DEAD, queue="c"),
        JobFilter(state=State.CANCELLED),
        JobFilter(state=State.SUCCEEDED, type="rare"),
        JobFilter(idempotency_key="key-20"),
        JobFilter(id_prefix=str(newest)[:4]),
    ]
    for where in filters:
        collected: list[uuid.UUID] = []
        before = None
        for _ in range(40):  # pages, each starting where the last one said
            page = reads.jobs(where, before=before, limit=50)
            assert len(page.jobs) <= 50
            assert page.scanned is None or page.scanned <= SCAN_ROWS
            if before is not None:
                assert all(j.id < before for j in page.jobs), where
            collected.extend(j.id for j in page.jobs)
            if page.next_before is None or len(collected) >= 120:
                break
            before = page.next_before
        expected = brute(big, where, None, len(collected) + 1)
        assert collected == expected[: len(collected)], where
        if page.next_before is None:
            assert len(expected) == len(collected), where  # nothing older was missed
        else:
            assert len(collected) >= 120, where


def test_throughput_counts_the_last_hour_by_minute_like_plain_sql(
    big: psycopg.Connection[Any], store: Store
) -> None:
    minutes = DashboardReads(store).overview().throughput
    assert len(minutes) == 60
    assert [m.minute for m in minutes] == sorted(m.minute for m in minutes)
    first = minutes[0].minute
    succeeded, failed = big.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded' AND finished_at >= %s),"
        " (SELECT count(*) FROM jobrun.job_events WHERE kind IN ('retrying', 'dead') AND at >= %s)",
        (first, first),
    ).fetchone()
    assert sum(m.succeeded for m in minutes) == succeeded > 1000
    assert sum(m.failed for m in minutes) == failed > 10


def test_lease_owners_and_their_running_jobs(big: psycopg.Connection[Any], store: Store) -> None:
    overview = DashboardReads(store).overview()
    # Every fifth lease is claimed ahead, not started: two of each owner's ten.
    assert [(w.owner, w.running, w.waiting) for w in overview.workers] == [
        ("w0", 8, 2),
        ("w1", 8, 2),
        ("w2", 8, 2),
        ("w3", 8, 2),
    ]
    for w in overview.workers:
        assert {j.lease_owner for j in w.jobs} == {w.owner} and len(w.jobs) == 10
        assert [j.started for j in w.jobs] == [True] * 8 + [False] * 2  # running ones first
        assert w.lease_expires_at > overview.db_now
    assert overview.running_listed == 40
    assert overview.waiting_by_queue == {"a": 8}


# -- small, exact cases -----------------------------------------------------------


def test_an_id_prefix_is_hex_with_or_without_dashes_in_any_case() -> None:
    assert normalize_id_prefix(" 01A2-3b ") == "01a23b"
    assert normalize_id_prefix("") is None
    assert JobFilter(id_prefix="0193-AB").id_prefix == "0193ab"
    for bad in ("xyz", "g", "0" * 33, "01 02"):
        with pytest.raises(ValidationError):
            normalize_id_prefix(bad)


def test_an_id_prefix_is_a_range_of_ids_that_a_page_bound_narrows() -> None:
    where = JobFilter(id_prefix="01")
    low, high = where.id_range()
    assert str(low) == "01000000-0000-0000-0000-000000000000"
    assert str(high) == "01ffffff-ffff-ffff-ffff-ffffffffffff"
    bound = uuid.UUID("01800000-0000-0000-0000-000000000000")
    assert where.id_range(bound) == (low, uuid.UUID(int=bound.int - 1))
    assert where.id_range(uuid.UUID("00ffffff-0000-0000-0000-000000000000")) is None
    assert JobFilter().id_range(uuid.UUID(int=0)) is None


def test_matching_walks_every_job_up_to_a_bound_newest_first(store: Store) -> None:
    jobs = [store.enqueue(NewJob(type="t", queue="walk")) for _ in range(7)]
    store.enqueue(NewJob(type="t", queue="other"))
    reads = DashboardReads(store)
    where = JobFilter(queue="walk", state=State.QUEUED)
    ids = [j.id for j in jobs]
    assert [j.id for j in reads.matching(where, page=3)] == ids[::-1]
    assert [j.id for j in reads.matching(where, upto=ids[4], page=2)] == ids[4::-1]


def test_a_job_with_its_events_and_the_ledger_row_of_its_effect(store: Store) -> None:
    job = store.enqueue(NewJob(type="fx", queue="q", idempotency_key="k1"))
    (claim,) = store.claim("w", ["q"], 1, TTL)
    reads = DashboardReads(store)
    before = reads.job(job.id)
    assert before.effect is None and before.effect_key.key == "k1"
    store.complete(claim, lambda conn: None)
    detail = reads.job(job.id)
    assert detail.job.state is State.SUCCEEDED
    assert [e.kind.value for e in detail.events] == ["enqueued", "claimed", "succeeded"]
    assert detail.effect is not None and detail.effect.job_id == job.id
    assert detail.effect.created_at <= detail.db_now
