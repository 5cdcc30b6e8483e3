"""One synchronous face for both stores, so that one test body runs on either.

The sync flavour calls the Store, the Client and psycopg's ``Connection``
directly. The async flavour runs every coroutine of the AsyncStore, the
AsyncClient and psycopg's ``AsyncConnection`` on one event loop of its own,
in a thread of its own (:class:`LoopThread`): a test blocks on each call as
it would on the sync store, several threads may call at once (their
coroutines then run concurrently on that loop), and every connection,
pooled or the caller's, is opened on the loop that uses it.

Only public methods are reached: :class:`Driven` forwards any attribute,
and awaits what the async side returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg

from jobrun.postgres.async_store import open_async_pool
from jobrun.postgres.pool import open_pool

T = TypeVar("T")

Run = Callable[[Awaitable[T]], T]


class LoopThread:
    """An event loop running for ever in a daemon thread; :meth:`run` blocks on a coroutine."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="conformance-loop", daemon=True
        )
        self._thread.start()

    def run(self, awaitable: Awaitable[T]) -> T:
        async def main() -> T:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(main(), self.loop).result()

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _plain(value: Any) -> Any:
    """A test's argument as the store wants it: a :class:`Caller` is its connection."""
    return value.raw if isinstance(value, Caller) else value


class Driven:
    """Any object with the sync calling convention: awaitables returned are run to their end."""

    def __init__(self, target: Any, run: Callable[[Awaitable[Any]], Any] | None) -> None:
        self.target = target
        self._run = run

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            result = attr(*map(_plain, args), **{k: _plain(v) for k, v in kwargs.items()})
            if inspect.isawaitable(result):
                assert self._run is not None, f"{name} returned an awaitable on the sync side"
                return self._run(result)
            return result

        return call


class Caller:
    """The caller's own connection (sync, or async on the loop): statements, commit, rollback."""

    def __init__(self, raw: Any, run: Callable[[Awaitable[Any]], Any] | None) -> None:
        self.raw = raw
        self._run = run

    def _do(self, value: Any) -> Any:
        return self._run(value) if self._run is not None and inspect.isawaitable(value) else value

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run ``query``; its rows (none for a statement that returns none)."""
        if self._run is None:
            cur = self.raw.execute(query, params)
            return list(cur.fetchall()) if cur.description is not None else []

        async def go() -> list[tuple[Any, ...]]:
            cur = await self.raw.execute(query, params)
            return list(await cur.fetchall()) if cur.description is not None else []

        rows: list[tuple[Any, ...]] = self._run(go())
        return rows

    def commit(self) -> None:
        self._do(self.raw.commit())

    def rollback(self) -> None:
        self._do(self.raw.rollback())

    def close(self) -> None:
        self._do(self.raw.close())


class Flavour:
    """What differs between the sync and the async side: how a call is run, how
    things are opened. ``name`` is "sync" or "async"."""

    def __init__(self, name: str, loop: LoopThread | None) -> None:
        self.name = name
        self.loop = loop
        self.run: Callable[[Awaitable[Any]], Any] | None = None if loop is None else loop.run

    def drive(self, target: Any) -> Driven:
        return Driven(target, self.run)

    def call(self, fn: Callable[[], Any]) -> Any:
        """``fn()``, awaited on the loop when it returns an awaitable."""
        if self.run is None:
            return fn()

        async def go() -> Any:
            value = fn()
            return await value if inspect.isawaitable(value) else value

        return self.run(go())

    def open_pool(self, conninfo: str, **options: Any) -> Any:
        """A pool from the flavour's own opener (``open_pool`` or ``open_async_pool``)."""
        if self.run is None:
            return open_pool(conninfo, **options)
        return self.run(open_async_pool(conninfo, **options))

    def close_pool(self, pool: Any) -> None:
        self._maybe_run(pool.close())

    @contextlib.contextmanager
    def pooled(self, pool: Any) -> Iterator[Caller]:
        """A connection lent by ``pool`` (a pooled session), as a :class:`Caller`."""
        manager = pool.connection()
        if self.run is None:
            with manager as conn:
                yield Caller(conn, None)
            return
        conn = self.run(manager.__aenter__())
        try:
            yield Caller(conn, self.run)
        except BaseException as exc:
            if not self.run(manager.__aexit__(type(exc), exc, exc.__traceback__)):
                raise
        else:
            self.run(manager.__aexit__(None, None, None))

    def getconn(self, pool: Any) -> Any:
        """A connection taken from ``pool`` (give it back with :meth:`putconn`)."""
        return self._maybe_run(pool.getconn())

    def putconn(self, pool: Any, conn: Any) -> None:
        self._maybe_run(pool.putconn(conn))

    def connect_of(self, raw: Any) -> Caller:
        """``raw`` (a connection of this flavour) as a :class:`Caller`."""
        return Caller(raw, self.run)

    def connect(self, conninfo: str, *, autocommit: bool = False) -> Caller:
        """A caller's connection of this flavour (close it, or let the fixture do it)."""
        if self.run is None:
            return Caller(psycopg.connect(conninfo, autocommit=autocommit), None)
        return Caller(
            self.run(psycopg.AsyncConnection.connect(conninfo, autocommit=autocommit)), self.run
        )

    def _maybe_run(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            assert self.run is not None
            return self.run(value)
        return value
