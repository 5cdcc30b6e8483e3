"""Cluster statistics (jobrun.postgres.stats): right against count(*), and cheap.

Cheap means: on a table of many finished rows (ANALYZEd) none of the
statements reads ``jobs`` by a sequential scan; each count goes through the
partial index of its state. The plan check is the same as the claim's
(tests/bench/test_claim_plan.py), and it is shown to see a sequential scan
when index scans are switched off.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import psycopg
import pytest

from bench.plan import scans
from jobrun.job.model import DEFAULT_BACKOFF, NewJob, ScheduleSpec
from jobrun.postgres.leader import LeaseLocker, election_name
from jobrun.postgres.lock import AdvisoryLocker, lock_key
from jobrun.postgres.sqlc import stats as sq
from jobrun.postgres.stats import ClusterStats
from jobrun.postgres.store import Store

TTL = dt.timedelta(seconds=30)

FINISHED = 200_000

SEED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at)
SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN 'a' ELSE 'b' END, 't', '{}',
       %(backoff)s, 'succeeded', 1, now() - g * interval '1 ms'
FROM generate_series(1, %(finished)s) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, run_at)
SELECT gen_random_uuid(), CASE WHEN g %% 3 = 0 THEN 'b' ELSE 'a' END, 't', '{}', %(backoff)s,
       now() + (CASE WHEN g %% 5 = 0 THEN 1 ELSE -1 END) * g * interval '1 s'
FROM generate_series(1, 2000) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, lease_owner,
                         lease_token, lease_expires_at)
SELECT gen_random_uuid(), 'a', 't', '{}', %(backoff)s, 'leased', 1, 'w', gen_random_uuid(),
       now() + interval '30 s'
FROM generate_series(1, 40) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at)
SELECT gen_random_uuid(), CASE WHEN g %% 2 = 0 THEN 'a' ELSE 'c' END, 't', '{}', %(backoff)s,
       'dead', 25, now()
FROM generate_series(1, 300) g;
"""

COUNTS = """
SELECT queue,
       count(*) FILTER (WHERE state = 'queued' AND run_at <= now()),
       count(*) FILTER (WHERE state = 'queued' AND run_at > now()),
       count(*) FILTER (WHERE state = 'leased'),
       count(*) FILTER (WHERE state = 'dead'),
       extract(epoch FROM now() - min(run_at) FILTER (WHERE state = 'queued' AND run_at <= now()))
FROM jobrun.jobs GROUP BY queue
"""


@pytest.fixture
def big(admin_dsn: str) -> Any:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        params = {"backoff": json.dumps(DEFAULT_BACKOFF.to_json()), "finished": FINISHED}
        for statement in SEED.split(";"):
            if statement.strip():
                conn.execute(statement, params)
        conn.execute("VACUUM ANALYZE jobrun.jobs")
        yield conn


def explain(conn: psycopg.Connection[Any], statement: str, params: tuple[Any, ...] = ()) -> Any:
    with psycopg.RawCursor(conn) as cur:
        cur.execute("EXPLAIN (FORMAT JSON) " + statement, params)
        row = cur.fetchone()
    assert row is not None
    return row[0]


STATEMENTS = {
    "queue_stats": (sq.CLUSTER_QUEUE_STATS, ()),
    "leader": (sq.CLUSTER_LEADER, (*lock_key(), election_name(None))),
    "schedules": (sq.CLUSTER_SCHEDULES, ()),
    "notify_usage": (sq.CLUSTER_NOTIFY_USAGE, ()),
}


def seq_scans_on_jobs(plan: Any) -> list[str]:
    return [
        f"{s.node} on {s.relation}"
        for s in scans(plan)
        if s.node == "Seq Scan" and s.relation == "jobs"
    ]


def test_no_statistics_query_scans_the_jobs_table(big: psycopg.Connection[Any]) -> None:
    for name, (statement, params) in STATEMENTS.items():
        plan = explain(big, statement, params)
        found = [f"{s.node} {s.relation} {s.index}" for s in scans(plan)]
        assert seq_scans_on_jobs(plan) == [], (name, found)
    # Each state is counted through its own partial index (leased jobs through
    # either of theirs: by id, or by queue and concurrency key).
    indexes = {s.index for s in scans(explain(big, sq.CLUSTER_QUEUE_STATS)) if s.index}
    assert {"jobs_claim_idx", "jobs_dead_idx"} <= indexes, indexes
    assert "jobs_leased_queue_idx" in indexes, indexes


def test_the_plan_check_sees_a_seq_scan_when_there_is_one(big: psycopg.Connection[Any]) -> None:
    """Not vacuous: with index scans off, the same check finds the sequential scans."""
    with big.transaction(force_rollback=True):
        for knob in ("enable_indexscan", "enable_bitmapscan", "enable_indexonlyscan"):
            big.execute(f"SET LOCAL {knob} = off")
        plan = explain(big, sq.CLUSTER_QUEUE_STATS)
    assert len(seq_scans_on_jobs(plan)) >= 3


def test_a_snapshot_matches_count_star_on_a_big_table(
    big: psycopg.Connection[Any], store: Store
) -> None:
    snapshot = ClusterStats(store).snapshot()
    expected = {}
    for queue, ready, scheduled, leased, dead, age in big.execute(COUNTS).fetchall():
        if ready or scheduled or leased or dead:
            expected[queue] = (ready, scheduled, leased, dead, float(age or 0))
    got = {
        q.queue: (q.ready, q.scheduled, q.leased, q.dead, q.oldest_ready_seconds)
        for q in snapshot.queues
    }
    assert set(got) == set(expected) == {"a", "b", "c"}
    for queue, (ready, scheduled, leased, dead, age) in expected.items():
        assert got[queue][:4] == (ready, scheduled, leased, dead), queue
        # Read a moment later by the test: the same clock, a little older.
        assert got[queue][4] <= age < got[queue][4] + 60, queue
    assert got["a"][4] > 1000  # the oldest ready job of 'a' is ~2000 s overdue


# -- small, exact cases -----------------------------------------------------------


def test_queues_ages_and_paused_queues_by_the_database_clock(store: Store, conn: Any) -> None:
    now = store.now()
    store.enqueue(NewJob(type="t", queue="q1", run_at=now - dt.timedelta(minutes=10)))
    store.enqueue(NewJob(type="t", queue="q1"))
    store.enqueue(NewJob(type="t", queue="q1", run_at=now + dt.timedelta(hours=1)))
    store.enqueue(NewJob(type="t", queue="q2"))
    (claimed,) = store.claim("w", ["q2"], 1, TTL)
    doomed = store.enqueue(NewJob(type="t", queue="q3"))
    (claim3,) = store.claim("w", ["q3"], 1, TTL)
    store.fail(claim3, "no", None, permanent=True)
    store.pause_queue("idle")

    snapshot = ClusterStats(store).snapshot()
    after = store.now()
    by_queue = {q.queue: q for q in snapshot.queues}
    assert sorted(by_queue) == ["idle", "q1", "q2", "q3"]
    q1, q2, q3, idle = by_queue["q1"], by_queue["q2"], by_queue["q3"], by_queue["idle"]
    assert (q1.ready, q1.scheduled, q1.leased, q1.dead) == (2, 1, 0, 0)
    assert 600 <= q1.oldest_ready_seconds <= (after - now).total_seconds() + 600
    assert (q2.ready, q2.leased, q2.oldest_ready_seconds) == (0, 1, 0.0)
    assert (q3.dead, q3.ready) == (1, 0) and store.get(doomed.id).state.value == "dead"
    assert idle.paused and not q1.paused
    assert (idle.ready, idle.scheduled, idle.leased, idle.dead) == (0, 0, 0, 0)
    assert claimed.queue == "q2"
    assert snapshot.db_now >= now and snapshot.db_now <= after
    assert 0.0 <= snapshot.notify_queue_usage < 1.0


def test_the_leader_is_the_session_holding_the_leader_lock_in_this_database(
    store: Store, dsn: str
) -> None:
    stats = ClusterStats(store, leader_key=lock_key(name="stats-test"))
    assert stats.snapshot().leaders == ()
    with AdvisoryLocker(dsn, "stats-test") as locker:
        assert locker.try_acquire()
        (leader,) = stats.snapshot().leaders
        assert leader.pid == locker.backend_pid
        assert leader.application_name == "jobrun-leader"
        # Another lock (the default schema's leader key) is not this one.
        assert ClusterStats(store).snapshot().leaders == ()
        locker.release()
        assert stats.snapshot().leaders == ()


def test_a_lease_row_leader_is_the_leader_with_its_holder_and_term(store: Store) -> None:
    """Workers behind a transaction pooler elect with the lease row (no session lock)."""
    stats = ClusterStats(store, election=election_name("stats-lease"))
    assert stats.snapshot().leaders == ()
    locker = LeaseLocker(store, "stats-lease")
    assert locker.try_acquire()
    (leader,) = stats.snapshot().leaders
    assert (leader.pid, leader.holder, leader.term) == (None, locker.holder, 1)
    assert ClusterStats(store).snapshot().leaders == ()  # another election
    locker.release()
    assert stats.snapshot().leaders == ()  # resigned: the row's lease has run out
    other = LeaseLocker(store, "stats-lease")
    assert other.try_acquire()
    assert [(s.holder, s.term) for s in stats.snapshot().leaders] == [(other.holder, 2)]
    other.release()


def test_a_leader_of_another_database_is_not_this_databases_leader(
    store: Store, pg_server: Any
) -> None:
    other = pg_server.create_database()
    try:
        with AdvisoryLocker(pg_server.app_dsn(other), "stats-other") as locker:
            assert locker.try_acquire()
            stats = ClusterStats(store, leader_key=lock_key(name="stats-other"))
            assert stats.snapshot().leaders == ()
    finally:
        pg_server.drop_database(other)


def test_schedules_report_their_next_run_and_last_fire(store: Store, conn: Any) -> None:
    store.create_schedule(ScheduleSpec(id="every-minute", cron="* * * * *", type="t"))
    store.create_schedule(ScheduleSpec(id="yearly", cron="0 0 1 1 *", type="t"))
    (fresh, yearly) = ClusterStats(store).snapshot().schedules
    assert (fresh.id, yearly.id) == ("every-minute", "yearly")
    assert fresh.last_fired_at is None and not fresh.paused
    assert fresh.next_run_at == store.get_schedule("every-minute").next_run_at

    conn.execute(
        "UPDATE jobrun.schedules SET next_run_at = now() - interval '1 minute' "
        "WHERE id = 'every-minute'"
    )
    now = store.now()
    (due,) = store.due_schedules(now, 10)
    assert store.materialize(due, now) is not None
    (fired, yearly_again) = ClusterStats(store).snapshot().schedules
    row = conn.execute(
        "SELECT last_fired_at, next_run_at FROM jobrun.schedules WHERE id = 'every-minute'"
    ).fetchone()
    assert fired.last_fired_at is not None and fired.last_fired_at == row[0]
    assert now - dt.timedelta(seconds=5) <= fired.last_fired_at <= store.now()
    assert fired.next_run_at == row[1] > now
    assert yearly_again.last_fired_at is None
