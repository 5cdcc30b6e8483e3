"""Fixtures for the integrations: an application table, SQLAlchemy engines, a Worker."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.client import Client
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST


@pytest.fixture
def client(store: Store) -> Client:
    return Client(store)


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def make_worker(store: Store, registry: Registry) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(**config: Any) -> Worker:
        worker = Worker(store, registry, WorkerConfig(**{**FAST, **config}))
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for w in workers:
        w.stop(timeout=5)


def job_types(conn: psycopg.Connection[Any]) -> list[str]:
    """The types of the jobs stored, sorted (through the test's own superuser connection)."""
    return sorted(row[0] for row in conn.execute("SELECT type FROM jobrun.jobs"))
