"""The conformance suite's fixtures: every test runs once per store flavour.

``flavour`` is "sync" (the Store, the Client, ``open_pool``) or "async" (the
AsyncStore, the AsyncClient, ``open_async_pool``, driven through
:mod:`tests.conformance.drive`). ``store``, ``make_store``, ``client`` and
``caller`` are the flavour's; ``worker_store`` is the sync Store standing in
for the worker side of the queue (claims, completions), which has no async
twin. The database, its DSNs and the superuser ``conn`` are the repository's
(tests/conftest.py).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.aio import AsyncClient
from jobrun.client import Client
from jobrun.postgres.async_store import AsyncStore
from jobrun.postgres.store import Store
from tests.conformance.drive import Caller, Driven, Flavour, LoopThread


@pytest.fixture(params=["sync", "async"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    if request.param == "sync":
        yield Flavour("sync", None)
        return
    loop = LoopThread()
    try:
        yield Flavour("async", loop)
    finally:
        loop.close()


@pytest.fixture
def flavour_pool(flavour: Flavour, dsn: str) -> Iterator[Any]:
    """The flavour's pool on the test's database (a ConnectionPool or an AsyncConnectionPool)."""
    pool = flavour.open_pool(dsn, concurrency=8, min_size=1)
    try:
        yield pool
    finally:
        flavour.close_pool(pool)


@pytest.fixture
def store_on(flavour: Flavour) -> Iterator[Callable[..., Driven]]:
    """``store_on(pool, **options)``: a Store or an AsyncStore on ``pool``."""
    made: list[Driven] = []

    def make(pool: Any, **options: Any) -> Driven:
        cls = Store if flavour.name == "sync" else AsyncStore
        store = flavour.drive(cls(pool, **options))
        made.append(store)
        return store

    yield make
    if flavour.name == "async":
        for store in made:  # diagnostics still running (AsyncStore.aclose)
            store.aclose()


@pytest.fixture
def make_store(store_on: Callable[..., Driven], flavour_pool: Any) -> Callable[..., Driven]:
    """``make_store(**options)``: a Store or an AsyncStore on the flavour's pool."""
    return lambda **options: store_on(flavour_pool, **options)


@pytest.fixture
def store(make_store: Callable[..., Driven]) -> Driven:
    return make_store()


@pytest.fixture
def client(flavour: Flavour, store: Driven) -> Driven:
    """A Client, or an AsyncClient, on ``store``."""
    cls: Any = Client if flavour.name == "sync" else AsyncClient
    return flavour.drive(cls(store.target))


@pytest.fixture
def worker_store(pool: Any) -> Store:
    """The sync Store on a pool of its own: the worker's side (claim, complete)."""
    return Store(pool)


@pytest.fixture
def caller(flavour: Flavour, dsn: str) -> Iterator[Callable[..., Caller]]:
    """``caller(autocommit=False)``: the application's own connection, of the flavour's kind."""
    opened: list[Caller] = []

    def connect(*, autocommit: bool = False) -> Caller:
        c = flavour.connect(dsn, autocommit=autocommit)
        opened.append(c)
        return c

    yield connect
    for c in opened:
        c.close()


class Listener:
    """A LISTENing connection (sync psycopg, whatever the flavour): what was notified."""

    def __init__(self, dsn: str, channel: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(f"LISTEN {channel}")

    def payloads(self, wait: float = 0.3) -> list[str]:
        return [n.payload for n in self.conn.notifies(timeout=wait)]


@pytest.fixture
def listen(dsn: str) -> Iterator[Callable[..., Listener]]:
    """``listen(channel="jobrun_jobs")``: a Listener, closed after the test."""
    made: list[Listener] = []

    def make(channel: str = "jobrun_jobs") -> Listener:
        made.append(Listener(dsn, channel))
        return made[-1]

    yield make
    for listener in made:
        listener.conn.close()


def delays(payloads: list[str], queue: str = "default") -> list[int]:
    """The milliseconds of ``<queue>@<ms>`` payloads (a delayed job's wake-up)."""
    return [int(p.split("@")[1]) for p in payloads if p.startswith(f"{queue}@")]


TTL = dt.timedelta(seconds=30)
