"""Fixtures for the adapter tests: a Store on its own pool and database."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.model import NewJob
from jobrun.postgres.events import EventMode
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store


@pytest.fixture
def pool(dsn: str) -> Iterator[Any]:
    p = open_pool(dsn, concurrency=8)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def store(pool: Any) -> Store:
    return Store(pool)


@pytest.fixture
def terminal_store(pool: Any) -> Store:
    return Store(pool, event_mode=EventMode.TERMINAL)


@pytest.fixture
def make_store(pool: Any) -> Callable[..., Store]:
    def make(**options: Any) -> Store:
        return Store(pool, **options)

    return make


def new_job(**fields: Any) -> NewJob:
    fields.setdefault("type", "test.job")
    return NewJob(**fields)


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """Rows in (jobs, job_events, processed_effects): nothing-written checks compare these."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM job_events), "
        "(SELECT count(*) FROM processed_effects)"
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


TTL = dt.timedelta(seconds=30)
