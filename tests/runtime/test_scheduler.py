"""The scheduler service: election, cron, reaping and retention, one tick at a time."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from typing import Any

import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob, ScheduleSpec, State
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store
from jobrun.scheduler import SchedulerConfig, SchedulerService
from tests.support.waiting import wait_for


@pytest.fixture
def services(store: Store, dsn: str) -> Iterator[list[SchedulerService]]:
    made: list[SchedulerService] = []

    def make(**config: Any) -> SchedulerService:
        service = SchedulerService(
            store,
            AdvisoryLocker(dsn, name="test"),
            SchedulerConfig(
                reap_interval=dt.timedelta(milliseconds=1),
                retention_interval=dt.timedelta(milliseconds=1),
                **config,
            ),
        )
        made.append(service)
        return service

    yield make  # type: ignore[misc]
    for s in made:
        s.stop()


def test_only_one_of_two_schedulers_leads(services: Any) -> None:
    a, b = services(), services()
    assert a.run_once().leader
    assert not b.run_once().leader
    assert a.is_leader and not b.is_leader


def test_the_leader_materialises_due_schedules(services: Any, store: Store, conn: Any) -> None:
    store.create_schedule(ScheduleSpec(id="s", cron="* * * * *", type="t"))
    conn.execute("UPDATE jobrun.schedules SET next_run_at = now() - interval '5 minutes'")
    leader = services()
    assert leader.run_once().materialized == 1
    assert leader.run_once().materialized == 0
    (job,) = store.list(type="t")
    assert job.idempotency_key is not None and job.idempotency_key.startswith("sched:s:")


def test_the_leader_reaps_expired_leases(services: Any, store: Store, conn: Any) -> None:
    store.enqueue(NewJob(type="t"))
    (job,) = store.claim("w", ["default"], 1, dt.timedelta(seconds=30))
    conn.execute("UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 s'")
    assert services().run_once().reaped == 1
    assert store.get(job.id).state is State.QUEUED


def test_the_leader_applies_retention(services: Any, store: Store, conn: Any) -> None:
    job = store.enqueue(NewJob(type="t"))
    store.cancel(job.id)
    conn.execute("UPDATE jobrun.jobs SET finished_at = now() - interval '10 days'")
    conn.execute("UPDATE jobrun.job_events SET at = now() - interval '10 days'")
    report = services(
        finished_retention=dt.timedelta(days=7), events_retention=dt.timedelta(days=7)
    ).run_once()
    assert (report.purged, report.pruned) == (1, 2)


def test_retention_off_keeps_everything(services: Any, store: Store, conn: Any) -> None:
    job = store.enqueue(NewJob(type="t"))
    store.cancel(job.id)
    conn.execute("UPDATE jobrun.jobs SET finished_at = now() - interval '100 days'")
    report = services(finished_retention=None, events_retention=None).run_once()
    assert (report.purged, report.pruned) == (0, 0)


def test_a_leader_whose_lock_connection_dies_steps_down_and_the_other_takes_over(
    services: Any, conn: Any
) -> None:
    a, b = services(), services()
    assert a.run_once().leader
    pid = a.locker.backend_pid
    conn.execute("SELECT pg_terminate_backend(%s)", [pid])
    assert not a.run_once().leader
    assert not a.is_leader
    wait_for(lambda: b.run_once().leader, timeout=30)


def test_a_stopped_leader_releases_leadership(services: Any) -> None:
    a, b = services(), services()
    assert a.run_once().leader
    a.stop()
    assert b.run_once().leader


def test_the_service_thread_ticks_on_its_own(services: Any, store: Store, conn: Any) -> None:
    store.create_schedule(ScheduleSpec(id="s", cron="* * * * * *", type="t"))
    service = services(tick_interval=dt.timedelta(milliseconds=100))
    service.start()
    service.start()  # twice is fine
    wait_for(lambda: len(store.list(type="t")) >= 2)
    service.stop()
    service.stop()


def test_invalid_scheduler_configuration_fails() -> None:
    with pytest.raises(ValidationError):
        SchedulerConfig(tick_interval=dt.timedelta(0))
    with pytest.raises(ValidationError):
        SchedulerConfig(batch=0)
    with pytest.raises(ValidationError):
        SchedulerConfig(finished_retention=dt.timedelta(seconds=-1))
