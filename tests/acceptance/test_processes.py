"""Real worker processes, real signals, real PostgreSQL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.job.model import Backoff, NewJob, ScheduleSpec, State
from jobrun.postgres.embedded import throwaway_cluster
from jobrun.postgres.migrate import migrate
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.acceptance.conftest import FAST_ENV, TABLES, WorkerProcess
from tests.support.proxy import TcpProxy
from tests.support.waiting import wait_for

QUICK_RETRY = Backoff(kind="constant", base=0.0, jitter=0.0)
ROOT = Path(__file__).resolve().parents[2]


def observed(conn: Any, what: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT job_id, attempt, pid FROM observed WHERE what = %s ORDER BY at", [what]
    ).fetchall()


def test_a_worker_killed_mid_job_is_reaped_and_another_finishes_with_one_effect(
    store: Store, conn: Any, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    job = store.enqueue(NewJob(type="tx", payload={"sleep": 60}, backoff=QUICK_RETRY))
    first = start_worker("--no-scheduler")
    wait_for(lambda: observed(conn, "started"))
    first.signal(signal.SIGKILL)
    first.wait(10)
    assert store.get(job.id).state is State.LEASED  # nobody finished it
    conn.execute("UPDATE jobrun.jobs SET payload = '{\"sleep\": 0}' WHERE id = %s", [job.id])
    second = start_worker()  # its scheduler reaps the expired lease
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED, timeout=60)
    stored = store.get(job.id)
    assert stored.attempts == 2  # the killed worker burned exactly one
    effects = conn.execute("SELECT job_id, attempt, pid FROM effects").fetchall()
    assert effects == [(job.id, 2, second.pid)]
    kinds = [str(e.kind) for e in store.events(job.id)]
    assert kinds == ["enqueued", "claimed", "reaped", "claimed", "succeeded"]


def test_sigterm_lets_running_jobs_finish_and_leaves_nothing_leased(
    store: Store, conn: Any, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    jobs = [store.enqueue(NewJob(type="sleep", payload={"seconds": 2})) for _ in range(3)]
    worker = start_worker("--concurrency", "3", "--no-scheduler")
    wait_for(lambda: len(observed(conn, "started")) == 3)
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    assert [store.get(j.id).state for j in jobs] == [State.SUCCEEDED] * 3
    assert len(observed(conn, "finished")) == 3
    assert conn.execute("SELECT count(*) FROM jobrun.jobs WHERE state = 'leased'").fetchone() == (
        0,
    )


def test_a_second_sigterm_stops_at_once(
    store: Store, conn: Any, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    job = store.enqueue(NewJob(type="sleep", payload={"seconds": 60}))
    worker = start_worker("--no-scheduler", env={"JOBRUN_SHUTDOWN_GRACE": "120s"})
    wait_for(lambda: observed(conn, "started"))
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "stopping gracefully" in worker.output())
    worker.signal(signal.SIGTERM)
    worker.wait(15)  # far less than the job's 60 s or the 120 s grace
    assert observed(conn, "finished") == []
    assert store.get(job.id).state is State.LEASED  # its lease expires; the reaper takes it


@pytest.mark.parametrize(
    ("second", "code"),
    [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_forced_stop_exits_with_128_plus_the_second_signal(
    store: Store,
    conn: Any,
    tables: None,
    start_worker: Callable[..., WorkerProcess],
    second: signal.Signals,
    code: int,
) -> None:
    store.enqueue(NewJob(type="sleep", payload={"seconds": 60}))
    worker = start_worker("--no-scheduler", env={"JOBRUN_SHUTDOWN_GRACE": "120s"})
    wait_for(lambda: observed(conn, "started"))
    worker.signal(signal.SIGTERM)
    wait_for(lambda: "stopping gracefully" in worker.output())
    worker.signal(second)
    assert worker.wait(30) == code, worker.output()  # the job was cut short: not a success
    assert observed(conn, "finished") == []


@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGINT, 130)],
    ids=["SIGTERM", "SIGINT"],
)
def test_a_signal_while_the_runtime_opens_its_pools_stops_it_there(
    dsn: str, start_worker: Callable[..., WorkerProcess], sig: signal.Signals, code: int
) -> None:
    with TcpProxy(dsn) as proxy:
        proxy.hold_new()  # the server accepts and never answers: opening the pools hangs
        url = f"{proxy.url()} connect_timeout=300"  # longer than this test waits
        worker = start_worker(env={"DATABASE_URL": url})
        wait_for(lambda: proxy.held() > 0)  # the worker is connecting
        worker.signal(sig)
        assert worker.wait(30) == code, worker.output()
    lines = worker.output().splitlines()
    assert lines[-1] == f"jobrun: interrupted by {sig.name} while starting", lines
    assert "Traceback" not in worker.output()


def test_cancel_from_the_cli_reaches_the_running_handler_and_ends_the_job_cancelled(
    store: Store, conn: Any, dsn: str, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    job = store.enqueue(NewJob(type="wait_cancel"))
    start_worker("--no-scheduler")
    wait_for(lambda: observed(conn, "started"))
    subprocess.run(
        [sys.executable, "-m", "jobrun.cli", "--database-url", dsn, "cancel", str(job.id)],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    # One heartbeat interval (500 ms) plus scheduling slack.
    wait_for(lambda: observed(conn, "cancelled"), timeout=10)
    wait_for(lambda: store.get(job.id).state is State.CANCELLED)


def test_two_workers_elect_one_leader_and_materialise_each_occurrence_once(
    store: Store, conn: Any, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    store.create_schedule(ScheduleSpec(id="every-second", cron="* * * * * *", type="tick"))
    a = start_worker()
    b = start_worker()
    wait_for(lambda: len(observed(conn, "tick")) >= 4, timeout=60)

    def leader_pid() -> int | None:
        row = conn.execute(
            "SELECT a.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'jobrun-leader'"
        ).fetchall()
        assert len(row) <= 1
        return row[0][0] if row else None

    assert leader_pid() is not None
    leader, follower = (a, b) if "elected leader" in a.output() else (b, a)
    leader.signal(signal.SIGKILL)
    leader.wait(10)
    before = len(observed(conn, "tick"))
    wait_for(lambda: "elected leader" in follower.output(), timeout=60)
    wait_for(lambda: len(observed(conn, "tick")) >= before + 3, timeout=60)
    keys = [
        r[0]
        for r in conn.execute(
            "SELECT idempotency_key FROM jobrun.jobs WHERE type = 'tick'"
        ).fetchall()
    ]
    assert len(keys) == len(set(keys))
    ticks = [r[0] for r in observed(conn, "tick")]
    assert len(ticks) == len(set(ticks))  # no occurrence ran twice


def test_a_postgres_restart_under_a_running_worker_loses_nothing_and_runs_nothing_twice(
    tmp_path: Path,
) -> None:
    with throwaway_cluster({"max_connections": "100"}) as cluster:
        cluster.ensure_database("jobrun")
        url = cluster.dsn("jobrun")
        migrate(url)
        with psycopg.connect(url, autocommit=True) as c:
            c.execute(TABLES)
        pool = open_pool(url, concurrency=1)
        store = Store(pool)
        try:
            store.enqueue_batch(
                NewJob(type="tx", payload={"sleep": 0.01}, backoff=QUICK_RETRY) for _ in range(300)
            )
            worker = _spawn(url, tmp_path)
            try:
                wait_for(lambda: _count(url, "SELECT count(*) FROM effects") >= 50, timeout=60)
                cluster.restart("fast")
                wait_for(lambda: _count(url, "SELECT count(*) FROM effects") >= 150, timeout=90)
                cluster.restart("immediate")
                store.enqueue_batch(NewJob(type="tx", backoff=QUICK_RETRY) for _ in range(100))
                wait_for(
                    lambda: (
                        _count(url, "SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'")
                        == 400
                    ),
                    timeout=120,
                )
            finally:
                worker.send_signal(signal.SIGTERM)
                worker.wait(30)
            assert _count(url, "SELECT count(*) FROM effects") == 400
            assert _count(url, "SELECT count(DISTINCT job_id) FROM effects") == 400
            assert _count(url, "SELECT count(*) FROM jobrun.jobs WHERE state <> 'succeeded'") == 0
        finally:
            pool.close()


def _count(url: str, query: str) -> int:
    try:
        with psycopg.connect(url, connect_timeout=3) as c:
            row = c.execute(query).fetchone()
            return int(row[0]) if row else 0
    except psycopg.OperationalError:
        return -1


def _spawn(url: str, tmp_path: Path) -> subprocess.Popen[str]:
    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115
    env = {**os.environ, **FAST_ENV, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobrun.cli",
            "worker",
            "--concurrency",
            "4",
            "--app",
            "tests.acceptance.lifecycle_app:registry",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )
    log.close()
    return proc


def test_graceful_stop_puts_a_job_that_ignores_cancellation_back_in_its_queue_at_once(
    store: Store, conn: Any, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    """A grace period shorter than the job, whose handler ignores its cancellation:
    the worker exits, and the job is queued again as it does (its attempt kept), not
    left leased until its lease expires and a scheduler reaps it."""
    job = store.enqueue(NewJob(type="sleep", payload={"seconds": 30}, backoff=QUICK_RETRY))
    worker = start_worker("--no-scheduler", env={"JOBRUN_SHUTDOWN_GRACE": "1s"})
    wait_for(lambda: observed(conn, "started"))
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0
    stored = store.get(job.id)
    assert stored.state is State.QUEUED, stored
    assert stored.attempts == 1
    assert stored.lease_expires_at is None
    assert stored.run_at <= store.now()
