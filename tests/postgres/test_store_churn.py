"""What a drained job writes, and what the worker's statements cost to plan (issue 27).

Each test here fails without the change it covers: complete_many writing a
ledger row only for a job with an idempotency key, the leased rows in one
index (migration 0012), and the tables' storage parameters. (The claim is
planned anew on every call: see ClaimJobs' comment.)
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import psycopg
import pytest

from jobrun.job.model import EffectKey
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import signals as signals_q
from jobrun.postgres.sqlc import steps as steps_q
from jobrun.postgres.sqlc import workflows as workflows_q
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job

OWNER = "churn-worker"


def test_complete_many_writes_a_ledger_row_only_for_a_job_with_an_idempotency_key(
    store: Store, conn: Any
) -> None:
    plain, keyed = store.enqueue(new_job()), store.enqueue(new_job(idempotency_key="order-7"))
    jobs = store.claim(OWNER, ["default"], 2, TTL)
    result = store.complete_many(jobs)
    assert result.completed == {plain.id, keyed.id}
    ledger = conn.execute("SELECT scope, key, job_id FROM jobrun.processed_effects").fetchall()
    assert ledger == [("job:test.job", "order-7", keyed.id)]
    # The plain job's effect is done all the same: its key is its own id.
    assert store.effect_done(store.get(plain.id)) and store.effect_done(store.get(keyed.id))
    assert store.effect_done(EffectKey("job:test.job", str(plain.id)))
    # ... but not under another type's scope, nor once it is queued again.
    assert not store.effect_done(EffectKey("job:other", str(plain.id)))
    store.retry(plain.id)
    assert not store.effect_done(store.get(plain.id))


def test_effect_done_answers_false_for_a_key_that_is_not_a_job_id(store: Store) -> None:
    assert not store.effect_done(EffectKey("job:test.job", "not-a-uuid"))
    assert not store.effect_done(EffectKey("job:test.job", "00000000-0000-0000-0000-000000000000"))


def test_complete_many_of_a_cancelled_job_writes_no_ledger_row(store: Store, conn: Any) -> None:
    store.enqueue(new_job(idempotency_key="k1"))
    (job,) = store.claim(OWNER, ["default"], 1, TTL)
    store.cancel(job.id)
    assert store.complete_many([job]).cancelled == {job.id}
    assert conn.execute("SELECT count(*) FROM jobrun.processed_effects").fetchone() == (0,)
    assert not store.effect_done(job)


def test_a_complete_many_retried_after_its_commit_reports_what_it_did(store: Store) -> None:
    # The replay check reads only the ids the update did not take.
    store.enqueue_batch([new_job() for _ in range(3)])
    jobs = store.claim(OWNER, ["default"], 3, TTL)
    first = store.complete_many(jobs)
    again = store.complete_many(jobs)
    assert first.completed == again.completed == {j.id for j in jobs}
    assert again.lease_lost == frozenset()


def _jobs_indexes(conn: Any) -> dict[str, str]:
    rows = conn.execute(
        "SELECT indexrelid::regclass::text, pg_get_indexdef(indexrelid) FROM pg_index"
        " WHERE indrelid = 'jobrun.jobs'::regclass"
    ).fetchall()
    return {name.removeprefix("jobrun."): definition for name, definition in rows}


def test_a_claimed_row_enters_one_index_of_leased_rows(conn: Any) -> None:
    # A state change is never HOT: the claim's new version enters every index
    # whose predicate it meets. Two indexes of the leased rows cost every
    # claim an entry more than one; jobs_leased_queue_idx serves them all.
    leased = {n for n, d in _jobs_indexes(conn).items() if "'leased'" in d}
    assert leased == {"jobs_leased_queue_idx"}


def test_the_reaper_reads_expired_leases_through_the_leased_index(store: Store, conn: Any) -> None:
    conn.execute(
        "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at)"
        " SELECT gen_random_uuid(), 'default', 't', '{}', '{}', 'succeeded', 1, now()"
        " FROM generate_series(1, 20000)"
    )
    store.enqueue_batch([new_job() for _ in range(20)])
    store.claim(OWNER, ["default"], 10, TTL)
    conn.execute("VACUUM ANALYZE jobrun.jobs")
    with psycopg.RawCursor(conn) as cur:
        cur.execute(
            "EXPLAIN (FORMAT JSON) " + q.SELECT_EXPIRED_LEASES,
            (dt.datetime.now(dt.UTC), 100),
        )
        row = cur.fetchone()
    plan = str(row[0]) if row else ""
    assert "jobs_leased_queue_idx" in plan and "Seq Scan" not in plan, plan


# The statements that find leased jobs by id (and token): a worker's own,
# an operator's cancel, the reaper's per-job update.
_BY_ID = (
    (q, "COMPLETE_JOBS"),
    (q, "COMPLETE_BEGIN_MANY"),
    (q, "COMPLETE_FINISH_MANY"),
    (q, "COMPLETE_BEGIN"),
    (q, "COMPLETE_FINISH"),
    (q, "HEARTBEAT_JOBS"),
    (q, "START_JOBS"),
    (q, "UNCLAIM_JOBS"),
    (q, "FAIL_JOB"),
    (q, "RELEASE_JOB"),
    (q, "RECORD_PROGRESS"),
    (q, "REAP_JOB"),
    (q, "REQUEST_CANCEL"),
    (signals_q, "AWAIT_STEP"),
    (signals_q, "LOCK_LEASE"),
    (signals_q, "PARK_JOB"),
    (steps_q, "RECORD_STEP"),
    (steps_q, "HOLD_STEP_LEASE"),
    (steps_q, "ISSUE_FENCING_TOKEN"),
    (workflows_q, "REQUEST_CANCELS"),
)


def _generic_plan(conn: Any, sql: str) -> str:
    """The plan a pooled session keeps after five calls of ``sql``: generic,
    blind to the ids it is given."""
    params = max(int(n) for n in re.findall(r"\$(\d+)", sql))
    conn.execute("SET plan_cache_mode = force_generic_plan")
    try:
        conn.execute(f"PREPARE by_id AS {sql}")
        nulls = ", ".join(["NULL"] * params)
        row = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE by_id({nulls})").fetchone()
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET plan_cache_mode")
    return str(row[0]) if row else ""


@pytest.mark.parametrize(("queries", "statement"), _BY_ID, ids=[n for _, n in _BY_ID])
def test_a_lease_statement_finds_its_jobs_by_id_whatever_the_statistics_say(
    store: Store, conn: Any, queries: Any, statement: str
) -> None:
    # Analyzed at a quiet moment (nothing leased), the leased rows' index
    # looks nearly empty; a statement whose generic plan then reads it
    # scans every leased row of every worker to find its own few: what
    # CompleteJobs did, per batch, until its state test stopped matching
    # the index's predicate.
    store.enqueue_batch([new_job() for _ in range(2000)])
    conn.execute("VACUUM ANALYZE jobrun.jobs")
    for _ in range(2):
        store.claim("other-worker", ["default"], 995, TTL)
    plan = _generic_plan(conn, getattr(queries, statement))
    assert "jobs_leased_queue_idx" not in plan and "Seq Scan on jobs" not in plan, plan


@pytest.mark.parametrize("statement", ["SEND_SIGNAL", "SEND_WORKFLOW_SIGNAL"])
def test_a_signal_finds_its_parked_job_by_id_whatever_the_statistics_say(
    store: Store, conn: Any, statement: str
) -> None:
    # Analyzed with an empty queue, the claim's index looks empty; a signal's
    # generic plan then read the whole backlog in it to find the one parked
    # job it wakes.
    store.enqueue_batch([new_job() for _ in range(2000)])
    conn.execute("UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now()")
    conn.execute("VACUUM ANALYZE jobrun.jobs")
    store.enqueue_batch([new_job() for _ in range(2000)])
    plan = _generic_plan(conn, getattr(signals_q, statement))
    assert "jobs_claim_idx" not in plan and "Seq Scan on jobs" not in plan, plan


def test_the_tables_carry_storage_parameters_for_a_queues_churn(conn: Any) -> None:
    rows = conn.execute(
        "SELECT relname, reloptions FROM pg_class"
        " WHERE relnamespace = 'jobrun'::regnamespace AND relkind = 'r'"
    ).fetchall()
    options = {name: dict(o.split("=", 1) for o in opts or []) for name, opts in rows}
    assert options["jobs"] == {
        "fillfactor": "70",
        "autovacuum_vacuum_scale_factor": "0.02",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_analyze_scale_factor": "0.05",
        "autovacuum_vacuum_cost_limit": "2000",
    }
    assert options["job_events"] == {
        "autovacuum_vacuum_scale_factor": "0.05",
        "autovacuum_vacuum_threshold": "1000",
        "autovacuum_vacuum_cost_limit": "2000",
    }
    assert options["queue_starts"] == {
        "autovacuum_vacuum_scale_factor": "0",
        "autovacuum_vacuum_threshold": "500",
    }
    assert options["processed_effects"] == {}
    # Migration 0022: room for each edge's one update (done), a HOT update.
    assert options["job_dependencies"] == {"fillfactor": "50"}


def test_most_starts_are_hot_updates_on_pages_with_room(store: Store, dsn: str) -> None:
    # A start changes no indexed column, so it can be a HOT update, but only
    # while the row's page has room for the new version: fillfactor 70
    # (migration 0012) keeps that room next to the claim's versions (at 85
    # about a third of the starts were HOT here, at 70 three quarters).
    store.enqueue_batch([new_job() for _ in range(400)])
    updates = hot = 0
    for _ in range(4):
        jobs = store.claim(OWNER, ["default"], 100, TTL, start=0)
        with psycopg.connect(dsn) as conn:
            started = store.q.start_jobs(
                conn,
                ids=[j.id for j in jobs],
                tokens=[j.lease_token for j in jobs if j.lease_token is not None],
                owner=OWNER,
            )
            assert len(started) == 100
            row = conn.execute(
                "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
                " WHERE relid = 'jobrun.jobs'::regclass"
            ).fetchone()
            assert row is not None
            conn.commit()
        updates, hot = updates + row[0], hot + row[1]
        store.complete_many([store.get(j.id) for j in jobs])
    assert updates == 400
    assert hot / updates > 0.6, f"only {hot} of {updates} starts were HOT"
