"""The Notifier (LISTEN/NOTIFY dispatcher) against a real PostgreSQL.

Faults are real: backends are terminated with ``pg_terminate_backend``,
clusters restarted with ``pg_ctl``, and a half-open network is a TCP proxy
that stops forwarding without closing anything.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from jobrun.job.errors import ValidationError
from jobrun.job.ports import Dispatcher
from jobrun.postgres.embedded import LocalCluster, free_port, throwaway_cluster
from jobrun.postgres.notify import DEFAULT_CHANNEL, Notifier, NullDispatcher, Waiter
from tests.support.database import TestServer
from tests.support.proxy import TcpProxy

DEADLINE = 20.0
QUIET = 0.5  # how long "nothing arrives" is watched for


def eventually(predicate: Callable[[], bool], timeout: float = DEADLINE) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def notify(conn: psycopg.Connection[Any], payload: str, channel: str = DEFAULT_CHANNEL) -> None:
    conn.execute("SELECT pg_notify(%s, %s)", [channel, payload])


@contextlib.contextmanager
def listening(conninfo: str, **kwargs: Any) -> Iterator[Notifier]:
    kwargs.setdefault("backoff_max", 0.5)
    notifier = Notifier(conninfo, **kwargs)
    notifier.start()
    try:
        assert notifier.wait_connected(DEADLINE), notifier.last_error
        yield notifier
    finally:
        notifier.stop()


def subscribed(notifier: Notifier, *queues: str) -> Waiter:
    waiter = notifier.subscribe(queues)
    waiter.wait(0)  # a reconnect wake-up from before the test proper
    return waiter


def listener_pids(conn: psycopg.Connection[Any]) -> list[int]:
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = 'jobrun-listener' AND datname = current_database()"
    ).fetchall()
    return [r[0] for r in rows]


def terminate_listener(conn: psycopg.Connection[Any]) -> None:
    assert eventually(lambda: len(listener_pids(conn)) == 1)
    conn.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'jobrun-listener' AND datname = current_database()"
    )


@pytest.fixture
def proxy(dsn: str) -> Iterator[TcpProxy]:
    p = TcpProxy(dsn)
    try:
        yield p
    finally:
        p.close()


# -- delivery -------------------------------------------------------------------


def test_a_notification_reaches_the_waiter_only_after_commit(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    job_id = uuid.uuid4()
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        with conn.transaction():
            conn.execute(
                "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff)"
                " VALUES (%s, 'default', 'test.job', '{}', '{}')",
                [job_id],
            )
            notify(conn, "default")
            assert not waiter.wait(QUIET), "woken before COMMIT"
        assert waiter.wait(DEADLINE)
        # The wake-up comes after the commit: the row is visible to anyone now.
        with psycopg.connect(dsn) as other:
            assert other.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s", [job_id]).fetchone()


def test_a_rolled_back_notify_wakes_no_one(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        with conn.transaction(force_rollback=True):
            notify(conn, "default")
        assert not waiter.wait(1.0)
        assert notifier.stats.received == 0
        notify(conn, "default")  # the listener was listening all along
        assert waiter.wait(DEADLINE)
        assert notifier.stats.received == 1


def test_waiters_are_woken_only_for_their_own_queues(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listening(dsn) as notifier:
        a = subscribed(notifier, "alpha")
        bc = subscribed(notifier, "beta", "gamma")
        notify(conn, "gamma")
        assert bc.wait(DEADLINE)
        assert not a.wait(QUIET)
        notify(conn, "alpha")
        assert a.wait(DEADLINE)
        assert not bc.wait(QUIET)
        notify(conn, "unknown_queue")  # a valid name nobody waits for
        assert eventually(lambda: notifier.stats.received == 3)
        assert not a.wait(QUIET)
        assert not bc.wait(0)


def test_a_burst_of_10000_notifications_costs_one_wakeup(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "burst")
        bystander = subscribed(notifier, "other")
        # One transaction each: PostgreSQL folds identical notifications
        # within a transaction, so this really delivers 10,000 of them.
        with conn.pipeline() as pipeline:
            for _ in range(10_000):
                notify(conn, "burst")
                pipeline.sync()
        assert eventually(lambda: notifier.stats.received == 10_000, timeout=60)
        wakeups = 0
        while waiter.wait(QUIET):
            wakeups += 1
        assert wakeups == 1
        assert waiter.wakeups == 1
        assert bystander.wakeups == 0
        assert not bystander.wait(0)


def test_a_notification_arriving_while_the_worker_is_busy_is_kept(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        notify(conn, "default")  # nobody is inside wait() right now
        assert eventually(lambda: notifier.stats.received == 1)
        assert waiter.pending()
        assert waiter.wait(0)
        assert not waiter.pending()
        # The port's wait(queues, timeout) keeps a waiter per thread and queue set.
        assert not notifier.wait(["default"], 0)
        notify(conn, "default")
        assert eventually(lambda: notifier.stats.received == 2)
        assert notifier.wait(["default"], 0)


def test_a_delayed_jobs_notification_wakes_the_waiter_when_the_job_is_due(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """``<queue>@<ms>`` (a delayed job's enqueue) wakes the waiter ``ms`` after it
    arrived, never before; a sooner due time re-arms a wait in progress, and a
    plain wake-up in between leaves the due times for later."""
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        other = subscribed(notifier, "other")
        started = time.monotonic()
        notify(conn, "default@3000")
        assert eventually(lambda: notifier.stats.received == 1)
        assert not waiter.pending()
        notify(conn, "default@400")
        assert waiter.wait(DEADLINE)
        assert 0.4 <= time.monotonic() - started < 2.5
        notify(conn, "default")
        assert waiter.wait(DEADLINE)  # the plain wake-up, at once
        assert time.monotonic() - started < 2.5
        assert waiter.wait(DEADLINE)  # the 3 s one is still there
        assert 3.0 <= time.monotonic() - started < 3.0 + DEADLINE / 2
        assert not waiter.wait(QUIET)
        assert not other.pending()
        assert notifier.stats.ignored == 0


def test_malformed_delayed_payloads_are_ignored(dsn: str, conn: psycopg.Connection[Any]) -> None:
    garbage = [
        "default@",
        "@100",
        "default@-5",
        "default@1e3",
        "default@1.5",
        "Default@100",
        "default@100@100",
        "default@ 100",
        "default@" + "9" * 16,
    ]
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        for payload in garbage:
            notify(conn, payload)
        assert eventually(lambda: notifier.stats.received == len(garbage))
        assert notifier.stats.ignored == len(garbage)
        assert not waiter.wait(QUIET)


def test_garbage_payloads_are_ignored_and_the_listener_survives(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    garbage = [
        "",
        " ",
        "x" * 7999,  # just under PostgreSQL's payload limit
        "'; DROP TABLE jobrun.jobs; --",
        "DEFAULT",
        "default\n",
        " default",
        '{"queue": "default"}',
        "dé\u00e9\u2603",
        "\u0001\u0002",
        "a" * 64,
    ]
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        for payload in garbage:
            notify(conn, payload)
        assert eventually(lambda: notifier.stats.received == len(garbage))
        assert notifier.stats.ignored == len(garbage)
        assert not waiter.wait(QUIET)
        assert notifier.running and notifier.connected
        assert notifier.stats.faults == 0
        notify(conn, "default")
        assert waiter.wait(DEADLINE)
        assert conn.execute("SELECT to_regclass('jobrun.jobs') IS NOT NULL").fetchone() == (True,)


def test_an_undecodable_payload_costs_a_reconnect_not_the_listener(
    pg_server: TestServer,
) -> None:
    # Only a SQL_ASCII database lets a NOTIFY payload carry bytes that are not
    # valid in the client encoding; the driver cannot decode them.
    name = f"jobrun_ascii_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        admin.execute(
            sql.SQL(
                "CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C'"
                " TEMPLATE template0"
            ).format(sql.Identifier(name))
        )
    try:
        dsn = pg_server.dsn(name)
        with listening(dsn) as notifier, psycopg.connect(dsn, autocommit=True) as conn:
            waiter = subscribed(notifier, "default")
            conn.execute("SELECT pg_notify(%s, E'\\xff\\xfe')", [DEFAULT_CHANNEL])
            assert eventually(lambda: notifier.reconnects == 1 and notifier.connected)
            assert notifier.running
            assert waiter.wait(DEADLINE)  # woken once by the reconnect
            notify(conn, "default")
            assert waiter.wait(DEADLINE)
    finally:
        pg_server.drop_database(name)


# -- faults -----------------------------------------------------------------------


def test_the_listener_survives_a_terminated_backend_and_wakes_waiters_once(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        old_pid = notifier.backend_pid()
        terminate_listener(conn)
        assert eventually(lambda: notifier.reconnects == 1 and notifier.connected)
        assert notifier.backend_pid() != old_pid
        assert notifier.stats.faults >= 1
        # Notifications sent during the gap are lost: every waiter polls once.
        assert waiter.wait(DEADLINE)
        assert not waiter.wait(QUIET)
        notify(conn, "default")
        assert waiter.wait(DEADLINE)
        assert listener_pids(conn) == [notifier.backend_pid()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_listener_survives_a_postgres_restart(mode: str) -> None:
    with throwaway_cluster() as cluster, listening(cluster.dsn()) as notifier:
        waiter = subscribed(notifier, "default")
        cluster.restart(mode)
        assert eventually(lambda: notifier.reconnects >= 1 and notifier.connected, timeout=60)
        assert waiter.wait(DEADLINE)
        while waiter.wait(0):
            pass
        with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
            notify(conn, "default")
        assert waiter.wait(DEADLINE)


@pytest.mark.slow
def test_the_listener_keeps_retrying_while_the_server_is_down() -> None:
    with throwaway_cluster() as cluster:
        cluster.stop("fast")
        notifier = Notifier(cluster.dsn(), backoff_initial=0.05, backoff_max=0.2)
        notifier.start()
        try:
            waiter = notifier.subscribe(["default"])
            assert eventually(lambda: notifier.stats.faults >= 3)
            assert notifier.running and not notifier.connected
            assert notifier.last_error
            cluster.start()
            assert notifier.wait_connected(60)
            assert waiter.wait(DEADLINE)  # the first connect wakes everyone too
            with psycopg.connect(cluster.dsn(), autocommit=True) as conn:
                notify(conn, "default")
            assert waiter.wait(DEADLINE)
        finally:
            notifier.stop()


@pytest.mark.slow
def test_a_standby_in_recovery_is_a_connection_fault_until_promoted() -> None:
    """LISTEN fails on a hot standby; the listener backs off and retries, never dies."""
    with throwaway_cluster() as primary:
        owner = primary.datadir.stat()
        standby_dir = primary.datadir.parent / "standby"
        standby_dir.mkdir(mode=0o700)
        os.chown(standby_dir, owner.st_uid, owner.st_gid)
        standby = LocalCluster(datadir=standby_dir, port=free_port(), bindir=primary.bindir)
        standby._run(
            str(standby.bindir / "pg_basebackup"),
            *("-D", str(standby_dir), "-h", str(primary.datadir), "-p", str(primary.port)),
            *("-U", "postgres", "-R", "-X", "stream", "--no-password"),
            timeout=60,
        )
        standby.start()
        try:
            with psycopg.connect(standby.dsn()) as probe:
                assert probe.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
            notifier = Notifier(standby.dsn(), backoff_initial=0.05, backoff_max=0.2)
            notifier.start()
            try:
                assert eventually(lambda: notifier.stats.faults >= 3)
                assert "recovery" in (notifier.last_error or "")
                assert notifier.running and not notifier.connected
                with psycopg.connect(standby.dsn(), autocommit=True) as promote:
                    assert promote.execute("SELECT pg_promote()").fetchone() == (True,)
                assert notifier.wait_connected(60)
                waiter = subscribed(notifier, "default")
                with psycopg.connect(standby.dsn(), autocommit=True) as conn:
                    notify(conn, "default")
                assert waiter.wait(DEADLINE)
            finally:
                notifier.stop()
        finally:
            standby.destroy()


def test_the_liveness_probe_notices_a_half_open_connection(
    proxy: TcpProxy, conn: psycopg.Connection[Any]
) -> None:
    with listening(proxy.conninfo, liveness_interval=0.2, probe_timeout=1.0) as notifier:
        waiter = subscribed(notifier, "default")
        proxy.blackhole()  # no error, no EOF: the connection just goes silent
        assert eventually(lambda: notifier.reconnects == 1 and notifier.connected)
        assert "ProbeTimeout" in (notifier.last_error or "")
        assert waiter.wait(DEADLINE)
        notify(conn, "default")
        assert waiter.wait(DEADLINE)


def test_the_liveness_probe_notices_a_session_that_stopped_listening(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    with listening(dsn, liveness_interval=0.2) as notifier:
        waiter = subscribed(notifier, "default")
        # The session survives but no longer listens (what a pooler in
        # transaction mode, or an UNLISTEN by a bug, would leave behind).
        listener_conn = notifier._conn
        assert listener_conn is not None
        listener_conn.execute("UNLISTEN *")
        assert eventually(lambda: notifier.reconnects == 1 and notifier.connected)
        assert "no longer listens" in (notifier.last_error or "")
        assert waiter.wait(DEADLINE)
        notify(conn, "default")
        assert waiter.wait(DEADLINE)


def test_the_listener_session_is_immune_to_idle_session_timeout(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    conn.execute(
        sql.SQL("ALTER DATABASE {} SET idle_session_timeout = '300ms'").format(
            sql.Identifier(conn.info.dbname)
        )
    )
    with listening(dsn, liveness_interval=2.0) as notifier:
        waiter = subscribed(notifier, "default")
        time.sleep(1.5)
        assert notifier.reconnects == 0
        notify(conn, "default")
        assert waiter.wait(DEADLINE)


# -- configuration and lifecycle ------------------------------------------------------


@pytest.mark.parametrize(
    "channel",
    [
        "'; DROP TABLE x; --",
        "a" * 64,
        "Jobs",
        "JOBRUN_JOBS",
        "",
        "1jobs",
        "job-run",
        "jobs\n",
        'jobs"',
        "jöbs",
        None,
        42,
    ],
)
def test_invalid_channel_names_are_rejected(dsn: str, channel: Any) -> None:
    with pytest.raises(ValidationError) as info:
        Notifier(dsn, channel=channel)
    assert info.value.field == "channel"


def test_a_63_byte_channel_name_works_end_to_end(dsn: str, conn: psycopg.Connection[Any]) -> None:
    channel = "c" * 63
    with listening(dsn, channel=channel) as notifier:
        waiter = subscribed(notifier, "default")
        notify(conn, "default")  # the default channel: not ours
        assert not waiter.wait(QUIET)
        notify(conn, "default", channel=channel)
        assert waiter.wait(DEADLINE)


@pytest.mark.parametrize("queues", [[], ["Default"], ["ok", ""], "default", [None]])
def test_invalid_queue_subscriptions_are_rejected(dsn: str, queues: Any) -> None:
    notifier = Notifier(dsn, enabled=False)
    with pytest.raises(ValidationError):
        notifier.subscribe(queues)


@pytest.mark.parametrize("timeout", [-1, float("nan"), float("inf"), True, "1"])
def test_invalid_wait_timeouts_are_rejected(dsn: str, timeout: Any) -> None:
    notifier = Notifier(dsn, enabled=False)
    with pytest.raises(ValidationError):
        notifier.wait(["default"], timeout)


def test_disabled_mode_opens_no_connection_and_waits_out_the_timeout(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    dispatchers: list[Dispatcher] = [Notifier(dsn, enabled=False), NullDispatcher()]
    for dispatcher in dispatchers:
        assert isinstance(dispatcher, Notifier | NullDispatcher)
        dispatcher.start()
        try:
            started = time.monotonic()
            assert dispatcher.wait(["default"], 0.3) is False
            assert time.monotonic() - started >= 0.25
            notify(conn, "default")
            assert dispatcher.wait(["default"], 0.2) is False
        finally:
            dispatcher.close()
    assert listener_pids(conn) == []


def test_stop_is_safe_twice_and_closes_the_connection(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    notifier = Notifier(dsn)
    notifier.stop()  # before start: harmless
    notifier = Notifier(dsn)
    notifier.start()
    notifier.start()  # a second start does not start a second thread
    assert notifier.wait_connected(DEADLINE)
    assert eventually(lambda: len(listener_pids(conn)) == 1)
    notifier.stop()
    notifier.stop()
    notifier.close()
    assert not notifier.running and not notifier.connected
    assert eventually(lambda: listener_pids(conn) == [])
    notifier.start()  # a stopped notifier stays stopped
    assert not notifier.running
    assert notifier.wait(["default"], 0.05) is False  # after stop: polling only


def test_stop_wakes_a_blocked_waiter(dsn: str) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        result: list[bool] = []
        thread = threading.Thread(target=lambda: result.append(waiter.wait(60)))
        thread.start()
        time.sleep(0.1)
        notifier.stop()
        thread.join(DEADLINE)
        assert result == [True]


def test_a_closed_waiter_is_no_longer_woken(dsn: str, conn: psycopg.Connection[Any]) -> None:
    with listening(dsn) as notifier:
        waiter = subscribed(notifier, "default")
        waiter.close()
        waiter.close()
        notify(conn, "default")
        assert eventually(lambda: notifier.stats.received == 1)
        assert not waiter.pending()
