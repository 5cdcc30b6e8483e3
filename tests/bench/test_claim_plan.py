"""The claim reads jobs through jobs_claim_idx, never by a sequential scan.

A queue table only grows in finished rows; a claim that scanned the table
would slow down with its history. The EXPLAIN is taken on a table of 200,000
finished and 20,000 queued rows (ANALYZEd), both for the custom plan (the
parameters bound) and the generic plan a server may switch to once the
statement is prepared.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from typing import Any

import psycopg
import pytest

from bench.plan import explain_claim, scans
from jobrun.job.model import DEFAULT_BACKOFF
from jobrun.postgres.sqlc import Queries
from jobrun.postgres.sqlc.jobs import CLAIM_JOBS, CLAIM_LIMITED_JOBS

FINISHED = 200_000
QUEUED = 20_000
WAITING = int(os.environ.get("JOBRUN_PLAN_WAITING", "50000"))
"""Blocked jobs beside the runnable ones: 50,000 in make test, 1,000,000 in
``make test-plan-large`` (issue 29's figure)."""

SEED_FINISHED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at)
SELECT gen_random_uuid(), 'default', 't', '{}', %(backoff)s, 'succeeded', 1,
       now() - g * interval '1 ms'
FROM generate_series(1, %(finished)s) g
"""
SEED_QUEUED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, run_at)
SELECT gen_random_uuid(), CASE WHEN g %% 4 = 0 THEN 'other' ELSE 'default' END, 't', '{}',
       %(backoff)s, now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, %(queued)s) g
"""


@pytest.fixture
def big(admin_dsn: str) -> Any:
    # The superuser's: explain_claim loads auto_explain.
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        params = {
            "backoff": json.dumps(DEFAULT_BACKOFF.to_json()),
            "finished": FINISHED,
            "queued": QUEUED,
        }
        conn.execute(SEED_FINISHED, params)
        conn.execute(SEED_QUEUED, params)
        conn.execute("VACUUM ANALYZE jobrun.jobs")
        yield conn


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("queues", [["default"], ["default", "other"]], ids=["one", "two"])
def test_claim_uses_the_claim_index_and_never_scans_jobs(
    big: psycopg.Connection[Any], generic: bool, queues: list[str]
) -> None:
    plan = explain_claim(big, queues, 10, generic=generic)
    assert plan.seq_scans_on_jobs == 0, plan.summary()
    assert plan.uses_claim_index, plan.summary()
    assert not any(s.node == "Seq Scan" and s.relation == "jobs" for s in plan.scans)


def test_explain_changes_nothing(big: psycopg.Connection[Any]) -> None:
    explain_claim(big, ["default"], 10)
    explain_claim(big, ["default"], 10, generic=True)
    row = big.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'leased'").fetchone()
    assert row == (0,)
    assert big.execute("SELECT count(*) FROM jobrun.job_events").fetchone() == (0,)


def test_the_check_sees_a_seq_scan_when_there_is_one(admin_dsn: str) -> None:
    """The assertion above is not vacuous: with index scans off, the same check fails.

    Index scans are turned off for the session (the calling statement) and,
    in the rolled-back transaction, for the claim function's body, which
    otherwise sets its own planner settings (migration 0021).
    """
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute("SET enable_indexscan = off")
        conn.execute("SET enable_bitmapscan = off")
        conn.execute("SET enable_indexonlyscan = off")
        body = (
            "ALTER FUNCTION jobrun.claim_jobs(text[], text, int8, int8, float8, boolean)"
            " SET enable_seqscan = on SET enable_indexscan = off SET enable_indexonlyscan = off"
        )
        plan = explain_claim(conn, ["default"], 10, setup=[body])
    assert plan.seq_scans_on_jobs >= 1, plan.summary()
    assert not plan.uses_claim_index


def test_scans_walks_nested_plans() -> None:
    plan = [
        {
            "Plan": {
                "Node Type": "CTE Scan",
                "CTE Name": "claimed",
                "Plans": [
                    {
                        "Node Type": "Limit",
                        "Plans": [
                            {
                                "Node Type": "Bitmap Heap Scan",
                                "Relation Name": "jobs",
                                "Plans": [
                                    {
                                        "Node Type": "Bitmap Index Scan",
                                        "Index Name": "jobs_claim_idx",
                                    }
                                ],
                            },
                            {"Node Type": "Seq Scan", "Relation Name": "jobs"},
                        ],
                    }
                ],
            }
        }
    ]
    found = scans(json.dumps(plan))
    assert [s.node for s in found] == [
        "CTE Scan",
        "Bitmap Heap Scan",
        "Bitmap Index Scan",
        "Seq Scan",
    ]


LIMITS = {
    "concurrency": "concurrency = 50",
    "per_key": "per_key = 1",
    "rate": "rate_limit = 1000000, rate_period_seconds = 1",
}


@pytest.mark.parametrize("limit", sorted(LIMITS))
def test_the_limited_claim_uses_the_claim_index_and_never_scans_jobs(
    big: psycopg.Connection[Any], limit: str
) -> None:
    columns, values = zip(*(part.split(" = ") for part in LIMITS[limit].split(", ")), strict=True)
    setup = [
        f"INSERT INTO jobrun.queue_limits (queue, {', '.join(columns)}) "
        f"VALUES ('default', {', '.join(values)})",
        "SELECT set_config('jobrun.claim_locks', '{default}', true)",
    ]
    # The store runs the limited claim with its generic plan (plan_cache_mode).
    plan = explain_claim(
        big, ["default"], 10, generic=True, statement=CLAIM_LIMITED_JOBS, setup=setup
    )
    assert plan.seq_scans_on_jobs == 0, plan.summary()
    assert plan.uses_claim_index, plan.summary()


# The type-aware claim (issue 28): the owner's registry row names the types it
# knows, and other live workers of the queue know others. The type filter is
# a condition of the same index scan (the worker's row read once, by its
# primary key; the other workers only for a row of a type the claimer does
# not know): the claim still reads jobs through jobs_claim_idx alone.
WORKERS = """
INSERT INTO jobrun.workers (id, host, pid, version, queues, concurrency, types,
                            lease_ttl_seconds)
VALUES ('bench-explain', 'h', 1, 'v', '{default,other}', 8, '{t}', 30),
       ('peer', 'h', 2, 'v', '{default}', 8, '{u,v}', 30)
"""


@pytest.mark.parametrize("generic", [False, True], ids=["custom", "generic"])
@pytest.mark.parametrize("statement", ["plain", "limited"])
def test_the_type_aware_claim_stays_on_the_claim_index(
    big: psycopg.Connection[Any], generic: bool, statement: str
) -> None:
    setup = [WORKERS]
    claim = CLAIM_JOBS
    if statement == "limited":
        claim = CLAIM_LIMITED_JOBS
        setup += [
            "INSERT INTO jobrun.queue_limits (queue, concurrency) VALUES ('default', 50)",
            "SELECT set_config('jobrun.claim_locks', '{default}', true)",
        ]
    big.execute("ANALYZE jobrun.jobs")
    plan = explain_claim(
        big, ["default", "other"], 10, generic=generic, statement=claim, setup=setup
    )
    assert plan.seq_scans_on_jobs == 0, plan.summary()
    assert plan.uses_claim_index, plan.summary()
    workers = [s for s in plan.scans if s.relation == "workers"]
    assert workers, plan.summary()  # the filter is in the plan: the worker's row is read


def test_the_type_aware_claim_takes_only_known_types_and_orphans(
    big: psycopg.Connection[Any],
) -> None:
    # The plan above claims the right rows: known type t, orphan type w (no
    # live worker knows it), never u (a live peer knows it).
    big.execute(WORKERS)
    big.execute(
        "UPDATE jobrun.jobs SET type = CASE WHEN id::text < '4' THEN 'u' "
        "WHEN id::text < '8' THEN 'w' ELSE 't' END WHERE state = 'queued'"
    )
    rows = Queries().claim_jobs(
        big,
        queues=["default"],
        owner="bench-explain",
        max_jobs=500,
        start=500,
        ttl_seconds=30.0,
        write_events=False,
    )
    types = {r.type for r in rows}
    assert len(rows) == 500
    assert types == {"t", "w"}


def test_waiting_jobs_are_outside_the_claim_index_and_its_plan(
    big: psycopg.Connection[Any],
) -> None:
    """``WAITING`` jobs waiting for parents (migration 0016) beside the
    runnable ones: the claim's plan is the same, and jobs_claim_idx holds
    only the queued rows, so a blocked job costs nothing to a claim."""
    before = [_claim_run(big) for _ in range(CLAIM_RUNS)]
    seeded = time.monotonic()
    big.execute(
        "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, pending_parents,"
        " on_parent_failure)"
        " SELECT gen_random_uuid(), 'default', 't', '{}', %s, 'waiting', 1, 'cancel'"
        " FROM generate_series(1, %s)",
        [json.dumps(DEFAULT_BACKOFF.to_json()), WAITING],
    )
    big.execute("VACUUM ANALYZE jobrun.jobs")
    seeded = time.monotonic() - seeded
    for generic in (False, True):
        plan = explain_claim(big, ["default", "other"], 10, generic=generic)
        assert plan.seq_scans_on_jobs == 0, plan.summary()
        assert plan.uses_claim_index, plan.summary()
    row = big.execute(
        "SELECT reltuples::int8 FROM pg_class WHERE oid = 'jobrun.jobs_claim_idx'::regclass"
    ).fetchone()
    # An estimate (ANALYZE samples): about the 20,000 queued rows, never the waiting ones.
    assert row is not None and row[0] < QUEUED * 1.5
    # The claim run for real (EXPLAIN ANALYZE, rolled back) before and after: the
    # pages it touches do not grow with the blocked jobs; its time is for the record.
    after = [_claim_run(big) for _ in range(CLAIM_RUNS)]
    pages = (min(p for _, p in before), min(p for _, p in after))
    ms = (statistics.median(t for t, _ in before), statistics.median(t for t, _ in after))
    print(
        f"{WAITING:,} waiting jobs seeded in {seeded:.1f} s; a claim of 10 (median of"
        f" {CLAIM_RUNS}): {ms[0]:.2f} ms and {pages[0]} buffers before,"
        f" {ms[1]:.2f} ms and {pages[1]} buffers with them"
    )
    # A few pages more (a larger heap's free-space map for the claim's new row
    # versions), never in proportion to the blocked jobs.
    assert pages[1] <= pages[0] * 1.25, (before, after)


CLAIM_RUNS = 5


def _claim_run(conn: psycopg.Connection[Any]) -> tuple[float, int]:
    """One claim of 10 by its own statement, rolled back: (ms, shared buffers touched)."""
    with conn.transaction(force_rollback=True), psycopg.RawCursor(conn) as cur:
        cur.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + CLAIM_JOBS,
            (["default", "other"], "test-explain", 10, 10, 30.0, True),
        )
        row = cur.fetchone()
    assert row is not None
    top = row[0][0]
    plan = top["Plan"]
    return float(top["Execution Time"]), int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])
