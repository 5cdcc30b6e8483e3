"""Shared fixtures: a real PostgreSQL for the session, a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.support.database import TestServer, test_server


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    with test_server() as server:
        server.create_template()
        yield server


@pytest.fixture
def dsn(pg_server: TestServer) -> Iterator[str]:
    """A connection string to a freshly migrated database of this test's own."""
    name = pg_server.create_database()
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def empty_dsn(pg_server: TestServer) -> Iterator[str]:
    """A connection string to an empty database (no migrations applied)."""
    name = pg_server.create_database(template=None)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def conn(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to the test's database, for setup and assertions."""
    with psycopg.connect(dsn, autocommit=True) as c:
        yield c
