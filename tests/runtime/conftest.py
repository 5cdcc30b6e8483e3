"""Fixtures for the runtime tests: a real Store, Notifier and Worker in this process."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobrun.postgres.notify import Notifier
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker, WorkerConfig

FAST = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=200),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def notifier(dsn: str) -> Iterator[Notifier]:
    n = Notifier(dsn)
    n.start()
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture
def make_worker(store: Store, registry: Registry) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(*, dispatcher: Any = None, hooks: Any = (), **config: Any) -> Worker:
        settings = {**FAST, **config}
        worker = Worker(
            store, registry, WorkerConfig(**settings), dispatcher=dispatcher, hooks=hooks
        )
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for w in workers:
        w.stop(timeout=5)
