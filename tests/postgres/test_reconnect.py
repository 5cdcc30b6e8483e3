"""Reconnection that follows the server: a PostgreSQL of the test's own stopped for 8 s.

While it is away: a call waiting for a connection gets ConnectionUnavailable
within its bound, readiness and the dashboard answer 503 within 2 s, and
the log says it once. When it accepts connections again: the worker's
claims and heartbeats, a sync and an asyncio enqueue, the listener and the
leader come back within 2 s (psycopg_pool's own backoff had grown to 8 s
by then: its next attempt came seconds late), with one INFO line.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from starlette.testclient import TestClient

from jobrun.config import Settings
from jobrun.job.errors import ConnectionUnavailable, TransientError
from jobrun.job.model import NewJob
from jobrun.observe.health import Health
from jobrun.postgres.async_store import AsyncStore, open_async_pool
from jobrun.postgres.embedded import LocalCluster, throwaway_cluster
from jobrun.postgres.migrate import migrate
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.runtime import Runtime
from jobrun.web import create_app
from jobrun.worker.context import JobContext
from jobrun.worker.hooks import StoreCall, WorkerHooks
from jobrun.worker.registry import Registry

OUTAGE = 8.0
"""Seconds the server is away: psycopg_pool's doubling backoff (1, 2, 4, 8 s) then
leaves its next attempt several seconds after the return."""
RESUME = 2.0
"""Seconds within which everything must be back once the server accepts connections."""

pytestmark = pytest.mark.slow


class Recorder(WorkerHooks):
    """When each of the worker's store calls succeeded (time.monotonic)."""

    def __init__(self) -> None:
        self.ok: list[tuple[str, float]] = []
        self._lock = threading.Lock()

    def store_call(self, call: StoreCall) -> None:
        if call.error is None:
            with self._lock:
                self.ok.append((call.operation, time.monotonic()))

    def first_after(self, operation: str, since: float) -> float | None:
        with self._lock:
            return next((t for op, t in self.ok if op == operation and t >= since), None)


def registry(finished: dict[str, float], release: threading.Event) -> Registry:
    reg = Registry()

    @reg.handler("reconnect.hold")
    def hold(ctx: JobContext, job: Any) -> None:
        release.wait(120)  # runs through the outage: its lease needs heartbeats

    @reg.handler("reconnect.work")
    def work(ctx: JobContext, job: Any) -> None:
        finished[job.payload["name"]] = time.monotonic()

    return reg


def accepting(cluster: LocalCluster) -> bool:
    try:
        with psycopg.connect(cluster.dsn("jobrun"), connect_timeout=1):
            return True
    except psycopg.OperationalError:
        return False


class AcceptWatch:
    """Polls the server every 20 ms from another thread: when it first accepts connections."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.at: float | None = None
        self._cluster = cluster
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if accepting(self._cluster):
                self.at = time.monotonic()
                return
            time.sleep(0.02)

    def wait(self) -> float:
        self._thread.join(130)
        assert self.at is not None, "the server never accepted connections again"
        return self.at


def until(predicate: Any, timeout: float) -> float | None:
    """When ``predicate()`` first held (time.monotonic), polling every 10 ms."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(0.01)
    return None


@contextlib.contextmanager
def database() -> Iterator[tuple[LocalCluster, str]]:
    with throwaway_cluster({"max_connections": "100"}) as cluster:
        cluster.ensure_database("jobrun")
        url = cluster.dsn("jobrun")
        migrate(url)
        yield cluster, url


def async_enqueue_during_outage(
    url: str, started: threading.Event, stopped: threading.Event
) -> Any:
    """In a thread of its own: an asyncio pool opened before the outage enqueues
    during it, waiting for a connection as long as it takes (up to 60 s)."""

    async def run() -> float:
        pool = await open_async_pool(url, min_size=2, timeout=60.0)
        try:
            store = AsyncStore(pool, call_timeout=dt.timedelta(seconds=60))
            await store.enqueue(NewJob(type="reconnect.work", payload={"name": "async-before"}))
            started.set()
            await asyncio.to_thread(stopped.wait, 60)
            await store.enqueue(NewJob(type="reconnect.work", payload={"name": "async-during"}))
            return time.monotonic()
        finally:
            await pool.close()

    return run


class Result:
    def __init__(self) -> None:
        self.value: Any = None
        self.error: BaseException | None = None


def in_thread(fn: Any) -> tuple[threading.Thread, Result]:
    result = Result()

    def run() -> None:
        try:
            result.value = fn()
        except BaseException as exc:
            result.error = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, result


def test_after_an_outage_everything_resumes_within_two_seconds_and_says_so_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="psycopg.pool")
    caplog.set_level(logging.INFO, logger="jobrun.outage")  # last: it sets the handler's level
    finished: dict[str, float] = {}
    release = threading.Event()
    recorder = Recorder()
    with database() as (cluster, url):
        settings = Settings(
            database_url=url,
            lease_ttl=dt.timedelta(seconds=60),
            heartbeat_interval=dt.timedelta(milliseconds=300),
            poll_interval=dt.timedelta(milliseconds=200),
            retention=None,
            events_retention=None,
        )
        runtime = Runtime(settings, registry(finished, release), database_url=url, hooks=[recorder])
        runtime.start()
        client_pool = open_pool(url, concurrency=1, min_size=1, application_name="jobrun-test")
        # Waits for a connection as long as its call may last (60 s): the enqueue
        # made during the outage goes through once the server is back.
        patient = Store(client_pool, call_timeout=dt.timedelta(seconds=60))
        # Bounded at 2 s, while its pool would wait 30 s for a connection.
        hasty = Store(client_pool, call_timeout=dt.timedelta(seconds=2))
        async_started, server_stopped = threading.Event(), threading.Event()
        async_thread, async_result = in_thread(
            lambda: asyncio.run(async_enqueue_during_outage(url, async_started, server_stopped)())
        )
        dashboard = TestClient(create_app(url), raise_server_exceptions=False)
        try:
            assert dashboard.get("/").status_code == 200  # opens its pool
            health = Health(patient)
            assert health.readiness().ok
            assert async_started.wait(30), async_result.error
            patient.enqueue(NewJob(type="reconnect.hold"))
            assert until(lambda: recorder.first_after("heartbeat", 0) is not None, 30)
            assert until(lambda: runtime.scheduler is not None and runtime.scheduler.is_leader, 30)
            assert runtime.notifier is not None
            assert until(lambda: runtime.notifier.connected, 30)  # type: ignore[union-attr]
            caplog.clear()

            cluster.stop("fast")
            stopped = time.monotonic()
            server_stopped.set()
            _, enqueued = in_thread(
                lambda: (
                    patient.enqueue(NewJob(type="reconnect.work", payload={"name": "sync-during"})),
                    time.monotonic(),
                )[1]
            )
            time.sleep(1.0)  # every loop has met the outage

            # A caller bounded at 2 s gets a clear TransientError within its bound.
            t = time.monotonic()
            with pytest.raises(TransientError) as raised:
                hasty.enqueue(NewJob(type="reconnect.work", payload={"name": "hasty"}))
            assert time.monotonic() - t < 2.0 + 0.5
            assert isinstance(raised.value, ConnectionUnavailable)
            assert "unavailable" in str(raised.value), raised.value

            # Readiness and the dashboard: 503 within 2 s, saying why.
            t = time.monotonic()
            verdict = health.readiness()
            assert time.monotonic() - t < 2.0
            assert not verdict.ok
            assert "unavailable" in str(verdict), verdict
            t = time.monotonic()
            response = dashboard.get("/")
            assert time.monotonic() - t < 2.0
            assert response.status_code == 503

            time.sleep(max(0.0, stopped + OUTAGE - time.monotonic()))
            assert not runtime.scheduler.is_leader  # type: ignore[union-attr]
            watch = AcceptWatch(cluster)
            cluster.start()
            back = watch.wait()

            resumed = {
                "claim": until(lambda: recorder.first_after("claim", back) is not None, 30),
                "heartbeat": until(lambda: recorder.first_after("heartbeat", back) is not None, 30),
                "sync enqueue": until(lambda: enqueued.value is not None, 30),
                "sync job done": until(lambda: "sync-during" in finished, 30),
                "listener": until(lambda: runtime.notifier.connected, 30),  # type: ignore[union-attr]
                "leader": until(lambda: runtime.scheduler.is_leader, 30),  # type: ignore[union-attr]
            }
            async_thread.join(30)
            assert async_result.error is None, async_result.error
            resumed["async enqueue"] = async_result.value
            resumed["async job done"] = until(lambda: "async-during" in finished, 30)
            resumed["claim"] = recorder.first_after("claim", back)
            resumed["heartbeat"] = recorder.first_after("heartbeat", back)
            resumed["sync enqueue"] = enqueued.value
            resumed["sync job done"] = finished.get("sync-during")
            resumed["async job done"] = finished.get("async-during")
            # (the listener and the leader are polled one after the other: at most late)
            late = {
                what: None if at is None else round(at - back, 3) for what, at in resumed.items()
            }
            print(f"seconds from the server accepting connections: {late}")
            assert all(s is not None and s < RESUME for s in late.values()), late
            assert dashboard.get("/").status_code == 200
            assert health.readiness().ok
        finally:
            release.set()
            dashboard.close()
            runtime.stop()
            client_pool.close()

    lines = [r for r in caplog.records if r.levelno >= logging.INFO]
    said = [(r.name, r.levelname, r.getMessage()) for r in lines if r.name == "jobrun.outage"]
    warnings = [s for s in said if s[1] == "WARNING"]
    infos = [s for s in said if s[1] == "INFO"]
    assert len(warnings) == 1 and "unavailable" in warnings[0][2], said
    assert infos and "available again" in infos[0][2], said
    assert len(infos) == 1, said
    pool_lines = [r.getMessage() for r in lines if r.name.startswith("psycopg")]
    assert not [m for m in pool_lines if "\n" in m], pool_lines
    assert not [r for r in lines if r.name == "psycopg.pool" and r.levelno >= logging.WARNING]
    repeated = [
        r.getMessage()
        for r in lines
        if r.levelno >= logging.WARNING
        and r.name != "jobrun.outage"
        and any(s in r.getMessage() for s in ("claim failed", "heartbeat failed", "listener"))
    ]
    assert not repeated, repeated
