"""The server misbehaves: restarts, exhausted pools, tiny timeouts, read-only (6, 10, 11, 13)."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobrun.job.errors import DatabaseError, OutcomeUnknown, TransientError
from jobrun.job.model import NewJob, State
from jobrun.postgres.embedded import LocalCluster, throwaway_cluster
from jobrun.postgres.migrate import migrate
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.faults.harness import (
    QUICK_RETRY,
    Background,
    InProcess,
    Workers,
    backends,
    leader_backend,
    scalar,
    states,
    terminate_role,
    wait_until,
)
from tests.faults.oracle import EFFECTS_DDL, Oracle


@contextlib.contextmanager
def cluster_db(oracle: Oracle) -> Iterator[tuple[LocalCluster, str]]:
    """A throwaway cluster with a migrated ``jobrun`` database and the effects table.

    The oracle checks it before it goes away (when the test body passed).
    """
    with throwaway_cluster({"max_connections": "200"}) as cluster:
        cluster.ensure_database("jobrun")
        url = cluster.dsn("jobrun")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(EFFECTS_DDL)
        try:
            yield cluster, url
            oracle.verify(url)
        finally:
            oracle.watch(url).verified = True  # gone with the cluster


class Enqueuer:
    """Enqueues keyed jobs at a steady rate, retrying through faults with the same job."""

    def __init__(self, url: str, rate: float, **payload: Any) -> None:
        self.pool = open_pool(url, concurrency=1, timeout=5.0, application_name="jobrun-test")
        self.store = Store(self.pool)
        self.rate = rate
        self.payload = payload
        self.acked: list[NewJob] = []
        self.acked_at: list[float] = []  # time.monotonic() of each acknowledgement
        self.unknown: list[NewJob] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-enqueuer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            job = NewJob(
                type="tx.work",
                payload=self.payload,
                idempotency_key=f"load-{n}",
                backoff=QUICK_RETRY,
            )
            n += 1
            while not self._stop.is_set():
                try:
                    self.store.enqueue(job)
                    self.acked.append(job)
                    self.acked_at.append(time.monotonic())
                    break
                except OutcomeUnknown:
                    self.unknown.append(job)  # retried with the same key below
                except DatabaseError as exc:
                    self.errors.append(str(exc))
                self._stop.wait(0.2)
            self._stop.wait(1 / self.rate)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.pool.close()


# -- 6. PostgreSQL restarts under load ------------------------------------------------------


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_postgres_restart_under_load_loses_nothing_and_everything_recovers(
    mode: str, tmp_path: Path, side_log: Path, oracle: Oracle
) -> None:
    with cluster_db(oracle) as (cluster, url):
        workers = Workers(url, tmp_path, side_log)
        try:
            procs = [workers.start(scheduler=True, concurrency=4) for _ in range(2)]
            load = Enqueuer(url, rate=100, sleep=0.02)
            try:
                with psycopg.connect(url, autocommit=True) as c:
                    wait_until(lambda: leader_backend(c), 30, "a leader")
                    wait_until(lambda: len(backends(c, "jobrun-listener")) == 2, 30, "listeners")
                wait_until(
                    lambda: scalar(url, "SELECT count(*) FROM effects") >= 100, 60, "progress"
                )
                cluster.restart(mode)
                time.sleep(3)  # keep enqueueing through the recovery
            finally:
                load.stop()
            oracle.enqueued(load.acked, url=url)
            oracle.maybe(load.unknown, url=url)
            total = len({j.idempotency_key for j in load.acked})
            wait_until(
                lambda: (
                    scalar(url, "SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'")
                    == total
                ),
                90,
                f"all {total} jobs succeed\n{workers.outputs()}",
            )
            with psycopg.connect(url, autocommit=True) as c:
                # The pools, both listeners and the leadership came back.
                wait_until(lambda: len(backends(c, "jobrun-listener")) == 2, 30, "listeners back")
                wait_until(lambda: leader_backend(c), 30, "a leader again")
                assert states(c) == {"succeeded": total}
            assert all(p.alive() for p in procs)
            oracle.watch(url, settled=True)
        finally:
            workers.kill_all()


# -- a long outage: the worker follows the server back (issue 25) ---------------------------

OUTAGE = 90.0


@pytest.mark.slow
def test_after_a_90_s_outage_a_worker_process_resumes_within_seconds_and_says_so_in_few_lines(
    tmp_path: Path, side_log: Path, oracle: Oracle
) -> None:
    """psycopg_pool's doubling backoff left a worker claiming nothing for most of a
    minute after such an outage, and wrote a multi-line warning per attempt."""
    with cluster_db(oracle) as (cluster, url):
        workers = Workers(url, tmp_path, side_log)
        pool = open_pool(url, concurrency=1, timeout=OUTAGE * 2, application_name="jobrun-test")
        store = Store(pool, call_timeout=dt.timedelta(seconds=OUTAGE * 2))
        try:
            proc = workers.start(scheduler=True, concurrency=4)
            warm = store.enqueue(NewJob(type="plain.work", payload={"sleep": 0}))
            oracle.enqueued([warm], url=url)
            wait_until(lambda: store.get(warm.id).state is State.SUCCEEDED, 60, "a first job")
            with psycopg.connect(url, autocommit=True) as c:
                wait_until(lambda: leader_backend(c), 30, "a leader")

            cluster.stop("fast")
            time.sleep(OUTAGE)
            cluster.start()
            back = time.monotonic()  # pg_ctl -w: the server accepts connections (at most this)
            job = store.enqueue(NewJob(type="plain.work", payload={"sleep": 0}))
            enqueued = time.monotonic() - back
            oracle.enqueued([job], url=url)
            wait_until(
                lambda: store.get(job.id).state is State.SUCCEEDED, 60, "the job after the outage"
            )
            done = time.monotonic() - back
            print(f"after {OUTAGE:g} s: enqueued in {enqueued:.3f} s, done in {done:.3f} s")
            assert enqueued < 2.0, workers.outputs()
            assert done < 3.0, workers.outputs()
            with psycopg.connect(url, autocommit=True) as c:
                wait_until(lambda: len(backends(c, "jobrun-listener")) == 1, 10, "listener back")
                wait_until(lambda: leader_backend(c), 10, "a leader again")
            assert proc.alive()
            time.sleep(1.0)  # the log lines of the return are written
            out = proc.output()
            lines = out.splitlines()
            began = next(i for i, line in enumerate(lines) if " unavailable: " in line)
            assert sum(" unavailable: " in line for line in lines) == 1, out[-6000:]
            summaries = sum("still unavailable after" in line for line in lines)
            assert 2 <= summaries <= 3, out[-6000:]
            assert sum("available again after" in line for line in lines) == 1, out[-6000:]
            noisy = ("error connecting in", "claim failed", "heartbeat failed", "will reconnect")
            assert not [line for line in lines if any(n in line for n in noisy)], out[-6000:]
            # No multi-line warning (libpq's hint on a line of its own) since the outage began.
            assert not [ln for ln in lines[began:] if ln.startswith(("\t", " "))], out[-6000:]
            oracle.watch(url, settled=True)
        finally:
            pool.close()
            workers.kill_all()


# -- 10. pool exhaustion --------------------------------------------------------------------


def test_enqueuers_beyond_the_pool_get_a_bounded_wait_and_a_clear_error(
    dsn: str, admin_dsn: str, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    pool = open_pool(dsn, concurrency=1, max_size=2, timeout=1.0, application_name="jobrun-test")
    store = Store(pool)
    try:
        # Another transaction holds the key: every enqueue of it waits on the
        # server holding its pooled connection, and the pool runs dry.
        with psycopg.connect(admin_dsn) as blocker:
            blocker.execute("SELECT 1")  # open the caller's transaction
            held = NewJob(type="tx.work", idempotency_key="hot", backoff=QUICK_RETRY)
            store.enqueue(held, conn=blocker)  # uncommitted: the key is in flight
            timings: list[float] = []
            outcomes: list[Any] = []

            def enqueue() -> None:
                started = time.monotonic()
                try:
                    outcomes.append(
                        store.enqueue(
                            NewJob(type="tx.work", idempotency_key="hot", backoff=QUICK_RETRY)
                        )
                    )
                except Exception as exc:
                    outcomes.append(exc)
                timings.append(time.monotonic() - started)

            callers = [Background(enqueue, f"enqueuer-{i}") for i in range(16)]
            time.sleep(2.5)
            blocker.rollback()
            for caller in callers:
                caller.join(30)
        errors = [o for o in outcomes if isinstance(o, Exception)]
        assert errors, "16 callers on 2 connections: some must time out"
        for exc in errors:
            assert isinstance(exc, TransientError), repr(exc)
            assert "no database connection available" in str(exc)
        timed_out = sorted(timings)[: len(errors)]
        assert max(timed_out) < 1.0 + 1.5  # the pool timeout, not forever
        jobs = [o for o in outcomes if not isinstance(o, Exception)]
        assert len({j.id for j in jobs}) <= 1
        oracle.enqueued(jobs)
        assert scalar(conn, "SELECT count(*) FROM jobrun.jobs") == (1 if jobs else 0)
    finally:
        pool.close()


def test_heartbeats_and_the_reaper_are_not_starved_while_every_handler_holds_a_connection(
    store: Store,
    conn: psycopg.Connection[Any],
    in_process: Any,
    oracle: Oracle,
) -> None:
    # Two handlers sit in Complete for longer than the lease TTL (3 s), two
    # more run long handlers: all four handler threads hold a connection or work.
    committing = [
        store.enqueue(NewJob(type="tx.work", payload={"commit_pg_sleep": 5}, backoff=QUICK_RETRY))
        for _ in range(2)
    ]
    working = [
        store.enqueue(NewJob(type="tx.work", payload={"sleep": 6}, backoff=QUICK_RETRY))
        for _ in range(2)
    ]
    oracle.enqueued(committing + working)
    runtime: InProcess = in_process(concurrency=4)
    wait_until(lambda: states(conn).get("leased") == 4, 30, "all four handler threads busy")
    # A dead owner's lease: the reaper must still get to it meanwhile.
    ghost = store.enqueue(NewJob(type="tx.work", queue="ghost", backoff=QUICK_RETRY))
    oracle.enqueued([ghost])
    store.claim("ghost-owner", ["ghost"], 1, dt.timedelta(seconds=1))
    wait_until(
        lambda: store.get(ghost.id).state is State.QUEUED, 20, "the reaper requeues the ghost"
    )
    wait_until(
        lambda: states(conn) == {"succeeded": 4, "queued": 1},
        60,
        lambda: (
            "the busy jobs finish: "
            + repr(
                conn.execute(
                    "SELECT queue, state, attempts, last_error FROM jobrun.jobs"
                ).fetchall()
            )
        ),
    )
    assert all(runtime.threads_alive().values()), runtime.threads_alive()
    for job in committing + working:
        stored = store.get(job.id)
        assert stored.attempts == 1, f"{job.id} lost its lease while its worker was busy"
    reaped = conn.execute(
        "SELECT job_id FROM jobrun.job_events WHERE kind = 'reaped' AND job_id <> %s", [ghost.id]
    ).fetchall()
    assert reaped == []


# -- 11. tiny statement_timeout and idle_in_transaction_session_timeout --------------------


def test_tiny_global_timeouts_give_clear_errors_kill_no_thread_and_keep_exactly_once(
    store: Store,
    conn: psycopg.Connection[Any],
    database: str,
    in_process: Any,
    oracle: Oracle,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    jobs = [
        store.enqueue(
            NewJob(
                type="tx.work",
                payload={"commit_py_sleep": 0.3, "commit_sleep_attempts": [1]},
                backoff=QUICK_RETRY,
            )
        )
        for _ in range(10)
    ] + [store.enqueue(NewJob(type="plain.work", backoff=QUICK_RETRY)) for _ in range(10)]
    oracle.enqueued(jobs)
    db = sql.Identifier(database)
    try:
        conn.execute(sql.SQL("ALTER DATABASE {} SET statement_timeout = '2ms'").format(db))
        conn.execute(
            sql.SQL("ALTER DATABASE {} SET idle_in_transaction_session_timeout = '100ms'").format(
                db
            )
        )
        runtime: InProcess = in_process(concurrency=4)
        time.sleep(8)
        assert all(runtime.threads_alive().values()), runtime.threads_alive()
    finally:
        conn.execute(sql.SQL("ALTER DATABASE {} RESET ALL").format(db))
    for role in ("jobrun-worker", "jobrun-reaper"):
        terminate_role(conn, role)  # new sessions get the normal settings
    wait_until(lambda: states(conn) == {"succeeded": 20}, 60, f"every job succeeds: {states(conn)}")
    assert all(runtime.threads_alive().values()), runtime.threads_alive()
    # The errors say what happened (in the jobs' last error, or the logs).
    text = "\n".join(r.getMessage() for r in caplog.records) + "\n".join(
        r[0] or "" for r in conn.execute("SELECT last_error FROM jobrun.jobs").fetchall()
    )
    assert "idle-in-transaction" in text or "statement timeout" in text, text[-2000:]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


# -- 13. a read-only primary ----------------------------------------------------------------


def test_a_read_only_primary_is_a_connection_fault_and_no_job_is_failed_for_it(
    tmp_path: Path, side_log: Path, oracle: Oracle
) -> None:
    with cluster_db(oracle) as (_cluster, url):
        store_pool = open_pool(url, concurrency=1, application_name="jobrun-test")
        store = Store(store_pool)
        workers = Workers(url, tmp_path, side_log)
        try:
            jobs = [
                store.enqueue(
                    NewJob(
                        type="tx.work",
                        payload={"sleep": 0.5},
                        max_attempts=1,  # a failure for read-only would make it dead
                        backoff=QUICK_RETRY,
                    )
                )
                for _ in range(24)
            ]
            oracle.enqueued(jobs, url=url)
            # Leases outlive the read-only window (heartbeats cannot write meanwhile);
            # the window outlasts any single call's retries.
            workers.start(
                scheduler=True,
                concurrency=4,
                env={"JOBRUN_LEASE_TTL": "20s", "JOBRUN_HEARTBEAT_INTERVAL": "1s"},
            )
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("SET default_transaction_read_only = off")
                wait_until(lambda: states(admin).get("succeeded", 0) >= 4, 30, "progress")
                admin.execute("ALTER SYSTEM SET default_transaction_read_only = on")
                admin.execute("SELECT pg_reload_conf()")
                try:
                    time.sleep(1)
                    with pytest.raises(TransientError):
                        store.enqueue(NewJob(type="tx.work"))  # a clear, retryable error
                    time.sleep(7)
                finally:
                    admin.execute("ALTER SYSTEM RESET default_transaction_read_only")
                    admin.execute("SELECT pg_reload_conf()")
                wait_until(
                    lambda: not states(admin).keys() - {"succeeded", "dead", "cancelled"},
                    60,
                    "every job finishes",
                )
                finished = states(admin)
                failed = admin.execute(
                    "SELECT id, last_error FROM jobrun.jobs WHERE state <> 'succeeded'"
                ).fetchall()
                assert finished == {"succeeded": 24}, failed
            oracle.watch(url, settled=True)
        finally:
            workers.kill_all()
            store_pool.close()
