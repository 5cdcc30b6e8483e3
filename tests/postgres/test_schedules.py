"""Schedules: definitions, due_schedules + materialize, DST, misfires; synthetic now."""

from __future__ import annotations

import datetime as dt
import threading
import zoneinfo
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import AlreadyExists, NotFound, ValidationError
from jobrun.job.model import Backoff, ScheduleSpec, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store

UTC = dt.UTC
NY = "America/New_York"


def spec(**fields: Any) -> ScheduleSpec:
    fields.setdefault("id", "nightly")
    fields.setdefault("cron", "0 3 * * *")
    fields.setdefault("type", "report.build")
    return ScheduleSpec(**fields)


def set_next_run(conn: psycopg.Connection[Any], schedule_id: str, at: dt.datetime) -> None:
    conn.execute("UPDATE jobrun.schedules SET next_run_at = %s WHERE id = %s", [at, schedule_id])


def tick(store: Store, now: dt.datetime) -> list[Any]:
    """One leader tick at a synthetic ``now``: what it enqueued."""
    return [j for s in store.due_schedules(now, 100) if (j := store.materialize(s, now))]


def run_ticks(
    store: Store, start: dt.datetime, end: dt.datetime, step: dt.timedelta
) -> list[dt.datetime]:
    """Tick from start to end; the occurrences (run_at of the enqueued jobs), in UTC."""
    now, runs = start, []
    while now <= end:
        runs.extend(j.run_at for j in tick(store, now))
        now += step
    return runs


def local(at: dt.datetime, tz: str = NY) -> str:
    return at.astimezone(zoneinfo.ZoneInfo(tz)).strftime("%m-%d %H:%M %Z")


# -- definitions ----------------------------------------------------------------


def test_create_computes_the_first_run_from_the_database_clock(store: Store) -> None:
    created = store.create_schedule(spec(cron="*/5 * * * *"))
    now = store.now()
    assert now < created.next_run_at <= now + dt.timedelta(minutes=5)
    assert created.next_run_at.minute % 5 == 0 and created.next_run_at.second == 0
    assert store.get_schedule("nightly") == created


def test_create_with_a_taken_id_is_already_exists_and_changes_nothing(store: Store) -> None:
    first = store.create_schedule(spec())
    with pytest.raises(AlreadyExists):
        store.create_schedule(spec(cron="0 4 * * *"))
    assert store.get_schedule("nightly") == first


def test_upsert_replaces_the_template_and_keeps_an_unchanged_next_run(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec())
    kept = dt.datetime(2026, 1, 1, 3, tzinfo=UTC)
    set_next_run(conn, "nightly", kept)
    updated = store.upsert_schedule(spec(payload={"v": 2}, priority=3))
    assert updated.payload == {"v": 2} and updated.priority == 3
    assert updated.next_run_at == kept
    changed = store.upsert_schedule(spec(cron="0 4 * * *"))
    assert changed.next_run_at > store.now() and changed.next_run_at.hour == 4


def test_upsert_creates_when_missing(store: Store) -> None:
    assert store.upsert_schedule(spec()).id == "nightly"


def test_list_get_delete(store: Store) -> None:
    store.create_schedule(spec(id="b"))
    store.create_schedule(spec(id="a"))
    assert [s.id for s in store.list_schedules()] == ["a", "b"]
    store.delete_schedule("a")
    assert [s.id for s in store.list_schedules()] == ["b"]
    with pytest.raises(NotFound):
        store.delete_schedule("a")
    with pytest.raises(NotFound):
        store.get_schedule("a")


def test_a_paused_schedule_is_not_due_and_resumes_after_now(store: Store, conn: Any) -> None:
    store.create_schedule(spec(cron="* * * * *"))
    past = store.now() - dt.timedelta(hours=1)
    set_next_run(conn, "nightly", past.replace(second=0, microsecond=0))
    assert store.pause_schedule("nightly").paused
    assert store.due_schedules(store.now(), 10) == []
    resumed = store.resume_schedule("nightly")
    assert not resumed.paused
    assert resumed.next_run_at > store.now()
    with pytest.raises(NotFound):
        store.pause_schedule("missing")
    with pytest.raises(NotFound):
        store.resume_schedule("missing")


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "* * * *"}, "cron"),
        ({"cron": "60 * * * *"}, "cron"),
        ({"cron": "*/0 * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "0-99999999 * * * *"}, "cron"),
        ({"cron": "0 0 31 2,4 *"}, "cron"),
        ({"cron": ""}, "cron"),
        ({"cron": "* " * 200}, "cron"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone"),
        ({"timezone": "../../etc/passwd"}, "timezone"),
        ({"timezone": ""}, "timezone"),
        ({"id": "a:b"}, "id"),
        ({"id": ""}, "id"),
        ({"id": "x" * 101}, "id"),
        ({"id": "with space"}, "id"),
        ({"queue": "Bad"}, "queue"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_bad_schedules_are_validation_errors_and_write_nothing(
    store: Store, conn: Any, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as info:
        store.create_schedule(spec(**fields))
    assert info.value.field == field
    assert conn.execute("SELECT count(*) FROM jobrun.schedules").fetchone() == (0,)


def test_a_six_field_expression_has_a_leading_seconds_field(store: Store, conn: Any) -> None:
    store.create_schedule(spec(cron="*/20 * * * * *"))
    set_next_run(conn, "nightly", dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC))
    runs = run_ticks(
        store,
        dt.datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC),
        dt.datetime(2026, 5, 1, 12, 0, 59, tzinfo=UTC),
        dt.timedelta(seconds=10),
    )
    assert [r.second for r in runs] == [0, 20, 40]


# -- materialize ------------------------------------------------------------------


def test_a_due_occurrence_enqueues_its_job_keyed_by_the_occurrence(store: Store, conn: Any) -> None:
    store.create_schedule(
        spec(
            payload={"r": 1}, queue="reports", priority=2, max_attempts=4, backoff=Backoff(base=2.0)
        )
    )
    occurrence = dt.datetime(2026, 6, 1, 3, tzinfo=UTC)
    set_next_run(conn, "nightly", occurrence)
    (job,) = tick(store, occurrence + dt.timedelta(seconds=1))
    assert job.idempotency_key == "sched:nightly:2026-06-01T03:00:00Z"
    assert (job.type, job.payload, job.queue, job.priority, job.max_attempts) == (
        "report.build",
        {"r": 1},
        "reports",
        2,
        4,
    )
    assert job.backoff == Backoff(base=2.0)
    assert job.run_at == occurrence
    assert store.get_schedule("nightly").next_run_at == dt.datetime(2026, 6, 2, 3, tzinfo=UTC)


def test_nothing_is_due_before_the_next_run(store: Store, conn: Any) -> None:
    store.create_schedule(spec())
    set_next_run(conn, "nightly", dt.datetime(2026, 6, 1, 3, tzinfo=UTC))
    assert tick(store, dt.datetime(2026, 6, 1, 2, 59, 59, tzinfo=UTC)) == []


def test_after_five_missed_periods_the_schedule_fires_once_for_the_latest(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec(cron="0 * * * *"))
    set_next_run(conn, "nightly", dt.datetime(2026, 6, 1, 10, tzinfo=UTC))
    now = dt.datetime(2026, 6, 1, 15, 30, tzinfo=UTC)  # 10, 11, 12, 13, 14, 15 are due
    jobs = tick(store, now)
    assert [j.run_at for j in jobs] == [dt.datetime(2026, 6, 1, 15, tzinfo=UTC)]
    assert tick(store, now) == []
    assert store.get_schedule("nightly").next_run_at == dt.datetime(2026, 6, 1, 16, tzinfo=UTC)
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


def test_a_misfire_is_keyed_by_the_stored_next_run_whatever_now_each_leader_read(
    store: Store, conn: Any, dsn: str
) -> None:
    """Two leaders materialise the same stored row at nows on either side of 16:00.

    The one that reads 16:00:00.1 would run the 16:00 occurrence, the other
    the 15:00 one; both key the misfire by the stored next run (10:00), so
    whichever commits, it is one job under one key that any materialiser of
    this row computes.
    """
    other_pool = open_pool(dsn, concurrency=2)
    other = Store(other_pool)
    try:
        store.create_schedule(spec(cron="0 * * * *"))
        stored = dt.datetime(2026, 6, 1, 10, tzinfo=UTC)
        set_next_run(conn, "nightly", stored)
        boundary = dt.datetime(2026, 6, 1, 16, tzinfo=UTC)
        step = dt.timedelta(milliseconds=100)
        nows = (boundary - step, boundary + step)
        row = store.get_schedule("nightly")  # both read the row before either materialises
        barrier = threading.Barrier(2)
        errors: list[BaseException] = []

        def leader(s: Store, now: dt.datetime) -> None:
            try:
                barrier.wait()
                s.materialize(row, now)
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=leader, args=(s, now))
            for s, now in zip((store, other), nows, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert errors == []
        keys = [r[0] for r in conn.execute("SELECT idempotency_key FROM jobrun.jobs")]
        assert keys == ["sched:nightly:2026-06-01T10:00:00Z"]
    finally:
        other_pool.close()


def test_the_key_alone_keeps_a_misfire_single_when_the_advance_is_undone(
    store: Store, conn: Any
) -> None:
    """The same due row materialised at two nows straddling a cron boundary.

    With the compare-and-set out of the way (the schedule put back where it
    was, as a restored row or a materialiser whose advance never landed would
    leave it), the occurrence's idempotency key is the only guard left, and
    it holds: the second materialisation is a replay of the first.
    """
    store.create_schedule(spec(cron="0 * * * *"))
    stored = dt.datetime(2026, 6, 1, 10, tzinfo=UTC)
    set_next_run(conn, "nightly", stored)
    (row,) = store.due_schedules(dt.datetime(2026, 6, 1, 15, 59, 59, tzinfo=UTC), 10)
    first = store.materialize(row, dt.datetime(2026, 6, 1, 15, 59, 59, 900000, tzinfo=UTC))
    set_next_run(conn, "nightly", stored)
    again = store.materialize(row, dt.datetime(2026, 6, 1, 16, 0, 0, 100000, tzinfo=UTC))
    assert first is not None and again is not None
    assert again.id == first.id
    assert first.idempotency_key == "sched:nightly:2026-06-01T10:00:00Z"
    assert first.run_at == dt.datetime(2026, 6, 1, 15, tzinfo=UTC)  # the latest due, coalesced
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


def test_a_crash_between_enqueue_and_advance_loses_and_repeats_nothing(
    store: Store, conn: Any
) -> None:
    """The enqueue and the advance commit together: a failure in between rolls both back."""
    store.create_schedule(spec())
    occurrence = dt.datetime(2026, 6, 1, 3, tzinfo=UTC)
    set_next_run(conn, "nightly", occurrence)
    conn.execute(
        "CREATE FUNCTION fail_advance() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RAISE EXCEPTION 'crash before commit'; END $$"
    )
    conn.execute(
        "CREATE TRIGGER crash BEFORE UPDATE ON jobrun.schedules FOR EACH ROW "
        "EXECUTE FUNCTION fail_advance()"
    )
    now = occurrence + dt.timedelta(minutes=1)
    (due,) = store.due_schedules(now, 10)
    with pytest.raises(psycopg.errors.RaiseException):
        store.materialize(due, now)
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (0,)
    conn.execute("DROP TRIGGER crash ON jobrun.schedules")
    (job,) = tick(store, now)  # the next tick enqueues the same occurrence, once
    assert job.run_at == occurrence
    assert tick(store, now) == []


def test_two_schedulers_materialising_the_same_schedule_for_10_ticks_create_each_once(
    store: Store, conn: Any, dsn: str
) -> None:
    other_pool = open_pool(dsn, concurrency=2)
    other = Store(other_pool)
    try:
        store.create_schedule(spec(cron="* * * * *"))
        start = dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
        set_next_run(conn, "nightly", start)
        errors: list[BaseException] = []
        for minute in range(10):
            now = start + dt.timedelta(minutes=minute, seconds=5)
            barrier = threading.Barrier(2)

            def leader(
                s: Store, now: dt.datetime = now, barrier: threading.Barrier = barrier
            ) -> None:
                try:
                    barrier.wait()
                    # Bypass the row locks too: both read the schedule first.
                    sched = s.get_schedule("nightly")
                    if sched.next_run_at <= now:
                        s.materialize(sched, now)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=leader, args=(s,)) for s in (store, other)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
        assert errors == []
        keys = [
            r[0] for r in conn.execute("SELECT idempotency_key FROM jobrun.jobs ORDER BY run_at")
        ]
        assert keys == [f"sched:nightly:2026-06-01T12:{m:02d}:00Z" for m in range(10)]
    finally:
        other_pool.close()


def test_an_occurrence_whose_job_already_ran_is_not_enqueued_again(store: Store, conn: Any) -> None:
    store.create_schedule(spec())
    occurrence = dt.datetime(2026, 6, 1, 3, tzinfo=UTC)
    set_next_run(conn, "nightly", occurrence)
    schedule = store.get_schedule("nightly")
    (job,) = tick(store, occurrence)
    claimed = store.claim("w", ["default"], 1, dt.timedelta(seconds=30))[0]
    store.complete(claimed)
    # A stale leader still holding the old schedule row:
    assert store.materialize(schedule, occurrence) is None
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)
    assert store.get(job.id).state is State.SUCCEEDED


# -- DST ----------------------------------------------------------------------------


def test_spring_forward_a_missing_local_time_runs_at_the_first_instant_after_the_gap(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec(cron="30 2 * * *", timezone=NY))
    set_next_run(conn, "nightly", dt.datetime(2026, 3, 7, 7, 30, tzinfo=UTC))  # 03-07 02:30 EST
    runs = run_ticks(
        store,
        dt.datetime(2026, 3, 7, 0, tzinfo=UTC),
        dt.datetime(2026, 3, 10, 12, tzinfo=UTC),
        dt.timedelta(minutes=15),
    )
    assert [local(r) for r in runs] == [
        "03-07 02:30 EST",
        "03-08 03:00 EDT",  # 02:30 does not exist that night
        "03-09 02:30 EDT",
        "03-10 02:30 EDT",
    ]


def test_fall_back_a_repeated_local_time_runs_once_at_its_first_occurrence(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec(cron="30 1 * * *", timezone=NY))
    set_next_run(conn, "nightly", dt.datetime(2026, 10, 31, 5, 30, tzinfo=UTC))
    runs = run_ticks(
        store,
        dt.datetime(2026, 10, 31, 0, tzinfo=UTC),
        dt.datetime(2026, 11, 2, 12, tzinfo=UTC),
        dt.timedelta(minutes=15),
    )
    assert [local(r) for r in runs] == ["10-31 01:30 EDT", "11-01 01:30 EDT", "11-02 01:30 EST"]


def test_hourly_schedule_across_fall_back_runs_each_local_hour_once(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec(cron="0 * * * *", timezone=NY))
    set_next_run(conn, "nightly", dt.datetime(2026, 11, 1, 4, tzinfo=UTC))  # 00:00 EDT
    runs = run_ticks(
        store,
        dt.datetime(2026, 11, 1, 4, tzinfo=UTC),
        dt.datetime(2026, 11, 1, 8, 30, tzinfo=UTC),
        dt.timedelta(minutes=10),
    )
    assert [local(r) for r in runs] == [
        "11-01 00:00 EDT",
        "11-01 01:00 EDT",
        "11-01 02:00 EST",
        "11-01 03:00 EST",
    ]


def test_quarter_hourly_schedule_across_spring_forward_runs_once_at_the_gap_end(
    store: Store, conn: Any
) -> None:
    store.create_schedule(spec(cron="*/15 * * * *", timezone=NY))
    set_next_run(conn, "nightly", dt.datetime(2026, 3, 8, 6, 30, tzinfo=UTC))  # 01:30 EST
    runs = run_ticks(
        store,
        dt.datetime(2026, 3, 8, 6, 30, tzinfo=UTC),
        dt.datetime(2026, 3, 8, 7, 20, tzinfo=UTC),
        dt.timedelta(minutes=5),
    )
    assert [local(r) for r in runs] == [
        "03-08 01:30 EST",
        "03-08 01:45 EST",
        "03-08 03:00 EDT",
        "03-08 03:15 EDT",
    ]
