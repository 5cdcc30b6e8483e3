"""Wiring: a worker process from Settings and a Registry.

One process holds, each on connections of its own role::

    jobrun-worker    the worker's pool: concurrency + 8 connections
    jobrun-listener  the Notifier's LISTEN connection
    jobrun-leader    the scheduler's advisory-lock connection
    jobrun-reaper    the scheduler's small pool (never starved by handlers)

``Runtime.run()`` starts everything and blocks until SIGTERM/SIGINT; the
shutdown order is: stop claiming and drain the worker, stop the scheduler
(releasing leadership), stop the listener, close the pools.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from psycopg_pool import ConnectionPool

from jobrun.config import Settings
from jobrun.postgres import dsn
from jobrun.postgres.embedded import EMBEDDED_DATABASE, ensure_embedded
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.notify import Notifier, NullDispatcher
from jobrun.postgres.pool import describe, open_pool
from jobrun.postgres.store import Store
from jobrun.scheduler.service import SchedulerService
from jobrun.worker.registry import Registry
from jobrun.worker.worker import Worker

log = logging.getLogger("jobrun")


def resolve_database_url(settings: Settings, *, announce: bool = True) -> str:
    """DATABASE_URL, or the embedded PostgreSQL (started or reused; said on stderr)."""
    if settings.database_url:
        return settings.database_url
    cluster, started = ensure_embedded()
    url = cluster.url(EMBEDDED_DATABASE)
    if announce:
        what = "started" if started else "reusing"
        sys.stderr.write(
            f"jobrun: no DATABASE_URL; {what} the embedded PostgreSQL at {url} "
            f"(data in {cluster.datadir})\n"
        )
    return url


def make_store(pool: ConnectionPool[Any], settings: Settings) -> Store:
    return Store(
        pool,
        event_mode=settings.job_events,
        commit_timeout=settings.commit_timeout,
        notify_channel=settings.notify_channel,
        call_timeout=settings.call_timeout,
    )


class Runtime:
    """A worker (and, by default, a scheduler candidate) in this process."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None,
        *,
        database_url: str | None = None,
        worker: bool = True,
        scheduler: bool = True,
    ) -> None:
        self.settings = settings
        url = dsn.normalize(database_url or resolve_database_url(settings))
        self._pools: list[ConnectionPool[Any]] = []
        self.worker: Worker | None = None
        self.scheduler: SchedulerService | None = None
        self.notifier: Notifier | NullDispatcher | None = None
        try:
            if worker:
                if registry is None:
                    raise ValueError("a worker needs a registry of handlers")
                pool = open_pool(
                    url, concurrency=settings.concurrency, application_name="jobrun-worker"
                )
                self._pools.append(pool)
                if settings.notifications:
                    self.notifier = Notifier(url, channel=settings.notify_channel)
                else:
                    self.notifier = NullDispatcher()
                self.worker = Worker(
                    make_store(pool, settings),
                    registry,
                    settings.worker_config(),
                    dispatcher=self.notifier,
                )
            if scheduler:
                spool = open_pool(
                    url, concurrency=1, min_size=1, max_size=3, application_name="jobrun-reaper"
                )
                self._pools.append(spool)
                self.scheduler = SchedulerService(
                    make_store(spool, settings), AdvisoryLocker(url), settings.scheduler_config()
                )
        except BaseException:
            self.close()
            raise
        log.info("jobrun runtime on %s", describe(url))

    def start(self) -> None:
        if self.notifier is not None:
            self.notifier.start()
        if self.scheduler is not None:
            self.scheduler.start()
        if self.worker is not None:
            self.worker.start()

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.close()

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.notifier is not None:
            self.notifier.stop()
        for pool in self._pools:
            pool.close()
        self._pools.clear()

    def run(self) -> None:
        """Run until SIGTERM/SIGINT (a second signal stops at once)."""
        try:
            if self.notifier is not None:
                self.notifier.start()
            if self.scheduler is not None:
                self.scheduler.start()
            if self.worker is not None:
                self.worker.run()
            else:
                _wait_for_signal()
        finally:
            self.close()


def _wait_for_signal() -> None:
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for number, old in previous.items():
            signal.signal(number, old)
