"""AdvisoryLocker (scheduler leader election) against a real PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobrun.job.errors import ValidationError
from jobrun.job.ports import Locker
from jobrun.postgres.embedded import free_port, throwaway_cluster
from jobrun.postgres.lock import LOCK_LEADER, AdvisoryLocker, lock_key
from jobrun.postgres.migrate import LOCK_NAMESPACE
from tests.postgres.test_notify import DEADLINE, eventually
from tests.support.proxy import TcpProxy


@pytest.fixture
def lockers() -> Iterator[list[AdvisoryLocker]]:
    """A factory list: append lockers to have them closed after the test."""
    made: list[AdvisoryLocker] = []
    yield made
    for locker in made:
        locker.close()


def make(made: list[AdvisoryLocker], conninfo: str, **kwargs: Any) -> AdvisoryLocker:
    kwargs.setdefault("name", "test")
    locker = AdvisoryLocker(conninfo, **kwargs)
    made.append(locker)
    return locker


def leader_pids(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = 'jobrun-leader' AND datname = current_database()"
    ).fetchall()
    return [r[0] for r in rows]


def terminate(conn: psycopg.Connection[Any], pid: int | None) -> None:
    assert pid is not None
    assert conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)


def test_only_one_of_two_lockers_holds_the_lock(dsn: str, lockers: list[AdvisoryLocker]) -> None:
    a, b = make(lockers, dsn), make(lockers, dsn)
    port: Locker = b  # the scheduler sees only the port
    assert a.try_acquire()
    assert not port.try_acquire()
    assert a.held(force=True) and not port.held()
    assert a.try_acquire()  # holding already: still True, not a second lock
    assert a.terms == 1


def test_after_release_the_other_acquires(dsn: str, lockers: list[AdvisoryLocker]) -> None:
    a, b = make(lockers, dsn), make(lockers, dsn)
    assert a.try_acquire()
    a.release()
    assert not a.held(force=True)
    assert b.try_acquire()
    assert not a.try_acquire()
    b.release()
    assert a.try_acquire()


def test_the_default_key_is_the_jobrun_leader_key_in_pg_locks(
    dsn: str, conn: psycopg.Connection[Any], lockers: list[AdvisoryLocker]
) -> None:
    leader = make(lockers, dsn, name=None)
    assert leader.key == (LOCK_NAMESPACE, LOCK_LEADER) == (0x6A6F62, 2)
    assert leader.try_acquire()
    row = conn.execute(
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
        " WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s"
        " AND l.objsubid = 2 AND l.granted",
        [LOCK_NAMESPACE, LOCK_LEADER],
    ).fetchone()
    assert row == ("jobrun-leader",)


def test_different_names_are_different_locks(dsn: str, lockers: list[AdvisoryLocker]) -> None:
    blue, green = make(lockers, dsn, name="blue"), make(lockers, dsn, name="green")
    assert blue.key != green.key
    assert blue.try_acquire() and green.try_acquire()
    assert lock_key(LOCK_LEADER, "blue") == blue.key  # stable across processes
    assert blue.key[1] >= 1024  # never one of the reserved purposes


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"purpose": -1}, "purpose"),
        ({"purpose": 1024}, "purpose"),
        ({"purpose": True}, "purpose"),
        ({"purpose": "2"}, "purpose"),
        ({"name": ""}, "name"),
        ({"name": "x" * 256}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"name": 7}, "name"),
        ({"check_interval": -1}, "check_interval"),
        ({"probe_timeout": 0}, "probe_timeout"),
    ],
)
def test_invalid_lock_arguments_are_rejected(dsn: str, kwargs: Any, field: str) -> None:
    with pytest.raises(ValidationError) as info:
        AdvisoryLocker(dsn, **kwargs)
    assert info.value.field == field


def test_a_terminated_holder_reports_the_loss_and_the_other_acquires(
    dsn: str, conn: psycopg.Connection[Any], lockers: list[AdvisoryLocker]
) -> None:
    a = make(lockers, dsn, check_interval=0.2)
    b = make(lockers, dsn)
    assert a.try_acquire()
    terminate(conn, a.backend_pid)
    # The session is gone server-side, so the lock is free for b ...
    assert eventually(b.try_acquire)
    # ... and a learns it at its next probe, without being forced.
    assert eventually(lambda: not a.held())
    assert a.losses == 1
    assert a.last_error
    assert not a.held(force=True)
    # a is a follower again: it reconnects, but b leads.
    assert not a.try_acquire()
    assert a.backend_pid is not None
    b.release()
    assert a.try_acquire()
    assert a.terms == 2


def test_a_forced_check_notices_a_terminated_holder_at_once(
    dsn: str, conn: psycopg.Connection[Any], lockers: list[AdvisoryLocker]
) -> None:
    a = make(lockers, dsn, check_interval=3600)
    assert a.try_acquire()
    pid = a.backend_pid
    terminate(conn, pid)
    assert eventually(lambda: pid not in leader_pids(conn))
    assert a.held()  # the cached answer: at most check_interval old
    assert not a.held(force=True)
    assert not a.held()


def test_release_is_safe_twice_and_after_the_connection_died(
    dsn: str, conn: psycopg.Connection[Any], lockers: list[AdvisoryLocker]
) -> None:
    a = make(lockers, dsn)
    a.release()  # never held, never connected
    assert a.try_acquire()
    a.release()
    a.release()
    assert a.try_acquire()
    terminate(conn, a.backend_pid)
    assert eventually(lambda: leader_pids(conn) == [])
    a.release()  # the connection is dead: no error
    a.release()
    assert not a.held(force=True)
    assert a.try_acquire()  # reconnects
    a.close()
    a.close()
    assert eventually(lambda: leader_pids(conn) == [])


def test_a_released_lock_keeps_its_connection_for_the_next_term(
    dsn: str, lockers: list[AdvisoryLocker]
) -> None:
    a = make(lockers, dsn)
    assert a.try_acquire()
    pid = a.backend_pid
    a.release()
    assert a.try_acquire()
    assert a.backend_pid == pid


def test_the_lock_survives_idle_time_even_under_idle_session_timeout(
    dsn: str, conn: psycopg.Connection[Any], lockers: list[AdvisoryLocker]
) -> None:
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET idle_session_timeout = '300ms'").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    a, b = make(lockers, dsn), make(lockers, dsn)
    assert a.try_acquire()
    pid = a.backend_pid
    time.sleep(1.5)
    assert a.held(force=True)
    assert a.backend_pid == pid
    assert not b.try_acquire()
    assert a.losses == 0


def test_a_connection_fault_means_not_acquired(lockers: list[AdvisoryLocker]) -> None:
    nowhere = f"host=127.0.0.1 port={free_port()} dbname=x user=x password=canary-secret"
    a = make(lockers, nowhere)
    assert a.try_acquire() is False
    assert not a.held(force=True)
    assert a.last_error
    assert "canary-secret" not in a.last_error
    a.release()


def test_a_half_open_holder_steps_down_before_anyone_else_can_lead(
    dsn: str, lockers: list[AdvisoryLocker]
) -> None:
    proxy = TcpProxy(dsn)
    try:
        a = make(lockers, proxy.conninfo, probe_timeout=1.0)
        b = make(lockers, dsn)
        assert a.try_acquire()
        proxy.blackhole()
        # a cannot reach the server: its bounded probe fails and it steps down ...
        assert not a.held(force=True)
        assert "ProbeTimeout" in (a.last_error or "")
        # ... while the server still sees a's session holding the lock: no second leader.
        assert not b.try_acquire()
        proxy.cut()  # the server finally gives up on the dead client
        assert eventually(b.try_acquire)
    finally:
        proxy.close()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_after_a_postgres_restart_the_holder_reports_loss_and_reacquires(
    mode: str, lockers: list[AdvisoryLocker]
) -> None:
    with throwaway_cluster() as cluster:
        a = make(lockers, cluster.dsn())
        b = make(lockers, cluster.dsn())
        assert a.try_acquire()
        assert not b.try_acquire()
        cluster.restart(mode)
        assert not a.held(force=True)
        assert a.losses == 1
        # Either may lead the new term, never both.
        deadline = time.monotonic() + DEADLINE
        winners: list[AdvisoryLocker] = []
        while not winners and time.monotonic() < deadline:
            winners = [x for x in (a, b) if x.try_acquire()]
            time.sleep(0.05)
        assert len(winners) == 1
        assert winners[0].held(force=True)
        for locker in (a, b):
            locker.close()
