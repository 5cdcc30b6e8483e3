"""The fault-injection tools: real worker processes, targeted kills, parked statements.

- :class:`WorkerProc`: ``jobrun worker --app tests.faults.app:registry`` as a
  subprocess that a test can ``kill -9``, SIGTERM, SIGSTOP and SIGCONT
  (H-proc);
- :func:`terminate_role` / :func:`backends`: ``pg_terminate_backend`` on the
  connections of one ``application_name`` role in the test's database (H-kill);
- :func:`parked`: a test connection holding ``SELECT ... FOR UPDATE`` on a
  job row, so a jobrun statement that needs the row waits at that point
  (H-interleave); :func:`waiting_on_lock` tells when one does;
- :class:`InProcess`: the real :class:`jobrun.runtime.Runtime` wiring (worker
  pool, listener, leader, reaper pool) in the test process, for scenarios
  that look at threads;
- :class:`NetNamespace` (from :mod:`tests.support.netns`, shared with the
  scale test's hosts): a worker in a network namespace behind a veth pair
  whose cable a test can pull (every packet silently dropped: a kernel-level
  half-open network, which the user-space proxy cannot fake);
- the TCP proxy lives in :mod:`tests.support.proxy` (H-proxy); PostgreSQL
  restarts use :func:`jobrun.postgres.embedded.throwaway_cluster` (H-pg).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from jobrun.config import Settings
from jobrun.job.model import Backoff
from jobrun.runtime import Runtime
from tests.faults.app import LOG_ENV, registry
from tests.support.netns import NetNamespace  # noqa: F401 (re-exported for the fault suite)

ROOT = Path(__file__).resolve().parents[2]

QUICK_RETRY = Backoff(kind="constant", base=0.0, jitter=0.0)
"""Retries at once: scenarios wait for recoveries, not for backoff."""

FAST_ENV = {
    "JOBRUN_LEASE_TTL": "3s",
    "JOBRUN_HEARTBEAT_INTERVAL": "500ms",
    "JOBRUN_POLL_INTERVAL": "200ms",
    "JOBRUN_SHUTDOWN_GRACE": "20s",
    "JOBRUN_RETENTION": "off",
    "JOBRUN_EVENTS_RETENTION": "off",
}
TTL = dt.timedelta(seconds=3)

FAST_SETTINGS: dict[str, Any] = {
    "lease_ttl": TTL,
    "heartbeat_interval": dt.timedelta(milliseconds=500),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
    "retention": None,
    "events_retention": None,
}


class WorkerProc:
    """One ``jobrun worker`` process; its stdout and stderr go to ``log``."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path, name: str) -> None:
        self.proc = proc
        self.log = log
        self.name = name

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def kill9(self) -> None:
        self.signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        self.signal(signal.SIGSTOP)

    def cont(self) -> None:
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def __repr__(self) -> str:
        return f"<WorkerProc {self.name} pid {self.pid}>"


class Workers:
    """Starts worker processes for a test and kills whatever is left at the end."""

    def __init__(self, url: str, tmp: Path, log_dir: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.log_dir = log_dir
        self.procs: list[WorkerProc] = []

    def start(
        self,
        *args: str,
        url: str | None = None,
        env: dict[str, str] | None = None,
        scheduler: bool = False,
        concurrency: int = 4,
        netns: str | None = None,
    ) -> WorkerProc:
        name = f"w{len(self.procs)}"
        log = self.tmp / f"worker-{name}.log"
        environ = {
            **os.environ,
            **FAST_ENV,
            "DATABASE_URL": url or self.url,
            LOG_ENV: str(self.log_dir),
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        command = [
            *(["ip", "netns", "exec", netns] if netns else []),
            sys.executable,
            "-m",
            "jobrun.cli",
            "worker",
            "--app",
            "tests.faults.app:registry",
            "--concurrency",
            str(concurrency),
            "--log-level",
            "info",
            *([] if scheduler else ["--no-scheduler"]),
            *args,
        ]
        with open(log, "wb") as handle:
            proc = subprocess.Popen(
                command, stdout=handle, stderr=subprocess.STDOUT, env=environ, cwd=ROOT
            )
        worker = WorkerProc(proc, log, name)
        self.procs.append(worker)
        return worker

    def outputs(self) -> str:
        return "\n".join(
            f"--- {w.name} (pid {w.pid}) ---\n{w.output()[-4000:]}" for w in self.procs
        )

    def kill_all(self) -> None:
        for w in self.procs:
            if w.alive():
                w.signal(signal.SIGCONT)
                w.signal(signal.SIGKILL)
        for w in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(30)


class InProcess:
    """The real Runtime (worker + scheduler candidate) inside the test process."""

    def __init__(self, url: str, *, scheduler: bool = True, **settings: Any) -> None:
        config = Settings(database_url=url, **{**FAST_SETTINGS, **settings})
        self.runtime = Runtime(config, registry, database_url=url, scheduler=scheduler)
        self.runtime.start()
        assert self.runtime.worker is not None
        self.worker = self.runtime.worker
        self._stopped = False

    def threads_alive(self) -> dict[str, bool]:
        """Every worker and scheduler thread, by name: alive or not."""
        threads = [*self.worker._threads, *self.worker._handlers]
        if self.runtime.scheduler is not None and self.runtime.scheduler.started:
            threads.append(self.runtime.scheduler.thread)
        return {t.name: t.is_alive() for t in threads}

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.runtime.stop()


# -- the database side -----------------------------------------------------------------


def backends(conn: psycopg.Connection[Any], role: str) -> list[int]:
    """Backend pids of ``role`` (an application_name) in the current database."""
    rows = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        " AND datname = current_database() AND pid <> pg_backend_pid() ORDER BY pid",
        [role],
    ).fetchall()
    return [r[0] for r in rows]


def terminate_role(conn: psycopg.Connection[Any], role: str) -> list[int]:
    """``pg_terminate_backend`` every connection of ``role`` in the current database."""
    # Materialised first: pg_terminate_backend must only ever see the chosen pids.
    rows = conn.execute(
        "WITH victims AS MATERIALIZED ("
        "  SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        "  AND datname = current_database() AND pid <> pg_backend_pid())"
        " SELECT pid FROM victims WHERE pg_terminate_backend(pid)",
        [role],
    ).fetchall()
    return [r[0] for r in rows]


def leader_backend(conn: psycopg.Connection[Any]) -> int | None:
    """The backend that holds the scheduler's leader lock in this database, if any."""
    rows = conn.execute(
        "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'jobrun-leader'"
        " AND a.datname = current_database()"
    ).fetchall()
    assert len(rows) <= 1, f"two sessions hold the leader lock: {rows}"
    return rows[0][0] if rows else None


@contextlib.contextmanager
def parked(url: str, job_id: Any) -> Iterator[psycopg.Connection[Any]]:
    """Hold a row lock on a job (``SELECT ... FOR UPDATE``) until the block ends."""
    with psycopg.connect(url, application_name="test-park") as c:
        c.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s FOR UPDATE", [job_id])
        try:
            yield c
        finally:
            c.rollback()


def waiting_on_lock(conn: psycopg.Connection[Any], role: str | None = None) -> int:
    """How many sessions (of ``role``) wait for a lock right now."""
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database() AND (%s::text IS NULL OR application_name = %s)",
        [role, role],
    ).fetchone()
    assert row is not None
    return int(row[0])


def scalar(url_or_conn: str | psycopg.Connection[Any], query: str, *args: Any) -> Any:
    """One value; -1 when the server cannot be reached (during restarts)."""
    if isinstance(url_or_conn, psycopg.Connection):
        row = url_or_conn.execute(query, list(args)).fetchone()
        return row[0] if row else None
    try:
        with psycopg.connect(url_or_conn, connect_timeout=3, autocommit=True) as c:
            row = c.execute(query, list(args)).fetchone()
            return row[0] if row else None
    except psycopg.OperationalError:
        return -1


def states(conn: psycopg.Connection[Any]) -> dict[str, int]:
    return {
        r[0]: r[1]
        for r in conn.execute("SELECT state::text, count(*) FROM jobrun.jobs GROUP BY 1").fetchall()
    }


def wait_until(
    condition: Callable[[], Any],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.1,
) -> Any:
    """Poll ``condition`` until truthy; fail naming ``what`` after ``timeout`` seconds.

    ``what`` may be a callable, evaluated only on failure (for diagnostics).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what() if callable(what) else what}")
        time.sleep(interval)


class Background:
    """Run ``fn`` in a thread and keep its result or exception."""

    def __init__(self, fn: Callable[[], Any], name: str = "test-background") -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:
                self.error = exc
            finally:
                self.done.set()

        self.thread = threading.Thread(target=run, name=name, daemon=True)
        self.thread.start()

    def join(self, timeout: float) -> Any:
        if not self.done.wait(timeout):
            raise AssertionError(f"{self.thread.name} did not return within {timeout} s")
        if self.error is not None:
            raise self.error
        return self.result


class Reaper:
    """``Store.reap_expired`` every ``interval`` seconds in a thread (the leader's
    job, done by the test so that an expired lease is requeued within a fraction
    of a second instead of the scheduler's 5 s); errors (a restarting server)
    are counted and the loop goes on."""

    def __init__(self, store: Any, interval: float = 0.2) -> None:
        self.store = store
        self.interval = interval
        self.requeued = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-reaper", daemon=True)

    def __enter__(self) -> Reaper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.requeued += self.store.reap_expired(self.store.now(), 500).total
            except Exception:
                self.errors += 1
