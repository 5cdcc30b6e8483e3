"""The workers' registry on the Store: register, refresh, list, prune, leader, leave.

Every statement runs as the application's role (the ``dsn`` fixture: the
DML-only runtime role under JOBRUN_TEST_RUNTIME_ROLE=1); the clock is the
database's, moved back by the superuser ``conn`` where a test needs age.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob
from jobrun.job.workers import PRUNE_FACTOR, WorkerInfo
from jobrun.postgres.leader import LeaseLocker, leader_election, leader_lock_name
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store
from jobrun.scheduler import SchedulerConfig, SchedulerService

TTL = dt.timedelta(seconds=30)


def info(worker_id: str = "host:1:aa", **fields: Any) -> WorkerInfo:
    values: dict[str, Any] = {
        "id": worker_id,
        "host": "host",
        "pid": 1,
        "version": "1.2.3",
        "queues": ("default",),
        "concurrency": 4,
        "types": ("a",),
        "lease_ttl": TTL,
    }
    return WorkerInfo(**{**values, **fields})


def age(conn: psycopg.Connection[Any], worker_id: str, seconds: float) -> None:
    conn.execute(
        "UPDATE jobrun.workers SET last_seen_at = now() - make_interval(secs => %s) WHERE id = %s",
        [seconds, worker_id],
    )


def test_a_registered_idle_worker_is_listed_with_what_it_said(store: Store) -> None:
    store.register_worker(info(types=("a", "b"), queues=("q1", "q2")))
    [w] = store.workers(leader_election(store.schema))
    assert w.info == info(types=("a", "b"), queues=("q1", "q2"))
    assert w.live and w.leased == 0 and not w.leader
    assert w.started_at <= w.last_seen_at <= w.db_now


def test_registering_again_refreshes_last_seen_and_keeps_started(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.register_worker(info())
    age(conn, "host:1:aa", 60)
    [old] = store.workers(leader_election(store.schema))
    assert not old.live  # not seen within its lease TTL
    store.register_worker(info(concurrency=8))
    [new] = store.workers(leader_election(store.schema))
    assert new.live and new.info.concurrency == 8
    assert new.started_at == old.started_at and new.last_seen_at > old.last_seen_at


def test_the_heartbeat_statement_refreshes_a_busy_worker(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.register_worker(info(types=("test.job",)))
    store.enqueue(NewJob(type="test.job"))
    [job] = store.claim("host:1:aa", ["default"], 1, TTL)
    age(conn, "host:1:aa", 60)
    assert job.lease_token is not None
    store.heartbeat("host:1:aa", [(job.id, job.lease_token)], store.now() + TTL)
    [w] = store.workers(leader_election(store.schema))
    assert w.live and w.leased == 1


def test_registration_prunes_workers_gone_for_ten_lease_ttls(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    for n in (1, 2, 3):
        store.register_worker(info(f"host:{n}:aa"))
    age(conn, "host:1:aa", PRUNE_FACTOR * TTL.total_seconds() + 1)  # gone for long
    age(conn, "host:2:aa", PRUNE_FACTOR * TTL.total_seconds() - 5)  # gone, not for long
    assert store.register_worker(info("host:3:aa")) == 1
    assert [w.info.id for w in store.workers(leader_election(store.schema))] == [
        "host:2:aa",
        "host:3:aa",
    ]


def test_a_worker_that_stops_takes_its_row_away(store: Store) -> None:
    store.register_worker(info("host:1:aa"))
    store.register_worker(info("host:2:aa"))
    store.unregister_worker("host:1:aa")
    assert [w.info.id for w in store.workers(leader_election(store.schema))] == ["host:2:aa"]


def test_bad_registrations_are_refused_before_any_sql() -> None:
    with pytest.raises(ValidationError):
        info("")
    with pytest.raises(ValidationError):
        info(pid=-1)
    with pytest.raises(ValidationError):
        info(types=["a"])
    with pytest.raises(ValidationError):
        info(lease_ttl=dt.timedelta(0))


def test_the_claim_of_a_registered_worker_leaves_types_a_live_peer_knows(store: Store) -> None:
    store.register_worker(info("me", types=("a",)))
    store.register_worker(info("peer", types=("b",)))
    a, b, c = (store.enqueue(NewJob(type=t)) for t in ("a", "b", "c"))
    claimed = {j.id for j in store.claim("me", ["default"], 10, TTL)}
    assert claimed == {a.id, c.id}  # c: no live worker knows it, so the release path stays
    assert {j.id for j in store.claim("peer", ["default"], 10, TTL)} == {b.id}


def test_a_peer_gone_or_on_another_queue_does_not_hold_its_types_back(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.register_worker(info("me", types=("a",)))
    store.register_worker(info("gone", types=("b",)))
    store.register_worker(info("elsewhere", types=("c",), queues=("other",)))
    age(conn, "gone", 31)
    b, c = (store.enqueue(NewJob(type=t)) for t in ("b", "c"))
    assert {j.id for j in store.claim("me", ["default"], 10, TTL)} == {b.id, c.id}


def test_an_unregistered_owner_claims_every_type(store: Store) -> None:
    store.register_worker(info("peer", types=("b",)))
    job = store.enqueue(NewJob(type="b"))
    assert [j.id for j in store.claim("anyone", ["default"], 10, TTL)] == [job.id]


def test_the_advisory_leader_is_shown_as_its_worker(store: Store, dsn: str) -> None:
    store.register_worker(info("leader"))
    store.register_worker(info("follower"))
    locker = AdvisoryLocker(dsn, leader_lock_name(store.schema))
    try:
        assert locker.try_acquire()
        store.mark_leader("leader", locker.backend_pid)
        store.mark_leader("follower", None)
        assert {w.info.id: w.leader for w in store.workers(leader_election(store.schema))} == {
            "leader": True,
            "follower": False,
        }
        locker.release()  # a stale pid on the row shows no leader
        assert not any(w.leader for w in store.workers(leader_election(store.schema)))
    finally:
        locker.close()


def test_the_lease_row_leader_is_shown_as_its_worker(store: Store) -> None:
    store.register_worker(info("leader"))
    store.register_worker(info("follower"))
    locker = LeaseLocker(store, leader_lock_name(store.schema), holder="leader")
    try:
        assert locker.try_acquire()
        assert {w.info.id: w.leader for w in store.workers(leader_election(store.schema))} == {
            "leader": True,
            "follower": False,
        }
    finally:
        locker.close()
    assert not any(w.leader for w in store.workers(leader_election(store.schema)))


def test_a_leader_elected_before_its_worker_registered_is_named_once_it_has(
    store: Store, dsn: str
) -> None:
    """The scheduler and the worker of one process start side by side: an
    election that reaches the database first finds no row to mark, says so,
    and the scheduler marks the row at a later tick."""
    election = leader_election(store.schema)
    locker = AdvisoryLocker(dsn, leader_lock_name(store.schema))
    service = SchedulerService(store, locker, SchedulerConfig(), worker_id="late")
    try:
        assert store.mark_leader("late", None) is False  # no row: nothing noted
        assert service.run_once().leader
        store.register_worker(info("late"))
        assert not any(w.leader for w in store.workers(election))
        service.run_once()
        assert [(w.info.id, w.leader) for w in store.workers(election)] == [("late", True)]
    finally:
        service.stop()
        locker.close()
