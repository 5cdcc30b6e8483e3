"""Cron across DST changes and after missed periods (scenario 15)."""

from __future__ import annotations

import datetime as dt
import itertools
import time
import zoneinfo
from typing import Any

import psycopg

from jobrun.job.model import ScheduleSpec
from jobrun.postgres.store import Store
from tests.faults.harness import Workers, leader_backend, scalar, wait_until
from tests.faults.oracle import Oracle

UTC = dt.UTC
NEW_YORK = zoneinfo.ZoneInfo("America/New_York")


def drive(
    store: Store, conn: psycopg.Connection[Any], start: dt.datetime, hours: int, step_min: int = 15
) -> list[dt.datetime]:
    """Run the leader's materialisation at every ``step_min`` from ``start`` (a simulated
    database clock) for ``hours``; returns the run_at of every job it enqueued."""
    for schedule in store.list_schedules():  # each starts at its first occurrence after start
        conn.execute(
            "UPDATE jobrun.schedules SET next_run_at = %s WHERE id = %s",
            [schedule.cron_schedule.next_after(start), schedule.id],
        )
    for n in range(hours * 60 // step_min):
        now = start + dt.timedelta(minutes=step_min * n)
        for schedule in store.due_schedules(now, 10):
            store.materialize(schedule, now)
    return [r[0] for r in conn.execute("SELECT run_at FROM jobrun.jobs ORDER BY run_at").fetchall()]


def local(at: dt.datetime) -> str:
    return at.astimezone(NEW_YORK).strftime("%Y-%m-%d %H:%M %Z")


def test_spring_forward_runs_once_per_local_day_and_the_missing_time_at_the_gap_end(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    store.create_schedule(
        ScheduleSpec(id="nightly", cron="30 2 * * *", timezone="America/New_York", type="tx.tick")
    )
    runs = drive(store, conn, dt.datetime(2026, 3, 6, 17, 0, tzinfo=UTC), hours=4 * 24)
    assert [local(r) for r in runs] == [
        "2026-03-07 02:30 EST",
        "2026-03-08 03:00 EDT",  # 02:30 does not exist that night
        "2026-03-09 02:30 EDT",
        "2026-03-10 02:30 EDT",
    ]
    oracle.enqueued(r[0] for r in conn.execute("SELECT id FROM jobrun.jobs"))


def test_fall_back_runs_the_repeated_local_time_once(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    store.create_schedule(
        ScheduleSpec(id="early", cron="30 1 * * *", timezone="America/New_York", type="tx.tick")
    )
    store.create_schedule(
        ScheduleSpec(id="hourly", cron="0 * * * *", timezone="America/New_York", type="tx.tick")
    )
    drive(store, conn, dt.datetime(2026, 10, 31, 16, 0, tzinfo=UTC), hours=2 * 24)
    early = [
        local(r[0])
        for r in conn.execute(
            "SELECT run_at FROM jobrun.jobs"
            " WHERE idempotency_key LIKE 'sched:early:%' ORDER BY run_at"
        )
    ]
    assert early == ["2026-11-01 01:30 EDT", "2026-11-02 01:30 EST"]
    hourly = [
        r[0]
        for r in conn.execute(
            "SELECT run_at FROM jobrun.jobs"
            " WHERE idempotency_key LIKE 'sched:hourly:%' ORDER BY run_at"
        )
    ]
    on_the_night = [local(r) for r in hourly if local(r).startswith("2026-11-01 01:")]
    assert on_the_night == ["2026-11-01 01:00 EDT"]  # local 01:00 once, not again in EST
    assert len(hourly) == len(set(hourly))
    oracle.enqueued(r[0] for r in conn.execute("SELECT id FROM jobrun.jobs"))


def test_after_five_missed_periods_a_schedule_fires_once_for_the_latest(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    store.create_schedule(ScheduleSpec(id="minutely", cron="* * * * *", type="tx.tick"))
    now = store.now()
    conn.execute(
        "UPDATE jobrun.schedules SET next_run_at = date_trunc('minute', now()) - '5 min'::interval"
    )
    [schedule] = store.due_schedules(now, 10)
    job = store.materialize(schedule, now)
    assert job is not None
    assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == 1  # coalesced, never a burst
    assert job.run_at == now.replace(second=0, microsecond=0)  # the latest due occurrence
    assert store.get_schedule("minutely").next_run_at > now
    assert store.due_schedules(now, 10) == []
    oracle.enqueued([job])


def test_a_frozen_leader_catches_up_once_and_never_bursts(
    store: Store, conn: psycopg.Connection[Any], workers: Workers, oracle: Oracle
) -> None:
    store.create_schedule(ScheduleSpec(id="every-second", cron="* * * * * *", type="tx.tick"))
    leader = workers.start(scheduler=True, concurrency=2)
    wait_until(lambda: leader_backend(conn), 30, "the leader")
    wait_until(lambda: scalar(conn, "SELECT count(*) FROM effects") >= 3, 30, "cron runs")
    leader.stop()  # SIGSTOP: its session (and the lock) stays, nobody materialises
    time.sleep(6)  # more than five periods
    resumed_at = store.now()
    leader.cont()
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM jobrun.jobs WHERE run_at > %s", resumed_at) >= 3,
        30,
        "cron resumes",
    )
    runs = [r[0] for r in conn.execute("SELECT run_at FROM jobrun.jobs ORDER BY run_at").fetchall()]
    gaps = [b - a for a, b in itertools.pairwise(runs)]
    assert len(runs) == len(set(runs))
    # One jump over the frozen stretch (the latest due occurrence), no burst of
    # the missed ones: every other gap is one period.
    assert sum(g > dt.timedelta(seconds=1) for g in gaps) >= 1
    missed = [
        r
        for r in runs
        if resumed_at - dt.timedelta(seconds=6) < r < resumed_at - dt.timedelta(seconds=1)
    ]
    assert len(missed) <= 1, [r.time() for r in missed]
    wait_until(
        lambda: scalar(conn, "SELECT count(*) FROM jobrun.jobs WHERE state <> 'succeeded'") == 0,
        30,
        "every occurrence runs",
    )
    oracle.enqueued(r[0] for r in conn.execute("SELECT id FROM jobrun.jobs"))
