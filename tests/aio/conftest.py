"""Fixtures for the asyncio client: an event loop per test, and an AsyncStore on it.

pytest here has no asyncio plugin: each test drives its coroutines through
``aio`` (an ``asyncio.Runner`` kept for the whole test, so that a pool opened
in one call serves the next), from a plain sync test function.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from jobrun.aio import AsyncClient
from jobrun.postgres.async_store import AsyncPool, AsyncStore, open_async_pool


@pytest.fixture
def aio() -> Iterator[Callable[[Awaitable[Any]], Any]]:
    """``aio(coro)`` runs ``coro`` to its end on this test's event loop."""
    with asyncio.Runner() as runner:
        yield runner.run


@pytest.fixture
def apool(aio: Callable[[Awaitable[Any]], Any], dsn: str) -> Iterator[AsyncPool]:
    pool: AsyncPool = aio(open_async_pool(dsn, concurrency=4))
    try:
        yield pool
    finally:
        aio(pool.close())


@pytest.fixture
def astore(apool: AsyncPool) -> AsyncStore:
    return AsyncStore(apool)


@pytest.fixture
def make_astore(apool: AsyncPool) -> Callable[..., AsyncStore]:
    def make(**options: Any) -> AsyncStore:
        return AsyncStore(apool, **options)

    return make


@pytest.fixture
def aclient(aio: Callable[[Awaitable[Any]], Any], dsn: str) -> Iterator[AsyncClient]:
    """An AsyncClient from AsyncClient.connect on the test's database."""
    client: AsyncClient = aio(AsyncClient.connect(dsn))
    try:
        yield client
    finally:
        aio(client.close())
