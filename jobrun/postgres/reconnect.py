"""Pools that follow the server back: reconnection attempts at most half a second apart.

Why
---
psycopg_pool retries a connection that failed with an exponential backoff
(1 s, 2 s, 4 s, ... until ``reconnect_timeout``), so after an outage of T
seconds its next attempt may come up to about T seconds after the server
is back. Measured before this module: a job enqueued the moment a 20 s
outage ended finished 10 s later, and after a 110 s outage a worker
claimed nothing for about 90 s. Meanwhile every failed attempt was a
multi-line WARNING of psycopg_pool's (libpq's message and its hint).

How
---
psycopg_pool keeps the state of a retried connection attempt in an
``AttemptWithBackoff`` that ``_add_connection`` creates when its task
brings none. :class:`ReconnectingPool` and :class:`AsyncReconnectingPool`
hand it a :class:`FollowingAttempt` instead: the same policy, starting at
:data:`RECONNECT_DELAY_INITIAL` and never waiting more than
:data:`RECONNECT_DELAY_MAX` (jittered) between attempts, so the pool
reconnects within that of the server accepting connections, however long
the outage was. A refused connection costs the server next to nothing; a
network that drops packets costs a pool worker thread per attempt for up
to ``connect_timeout`` (psycopg_pool runs them on its few worker threads,
so they do not pile up). :func:`~jobrun.postgres.pool.open_pool` gives no
slot up (:data:`RECONNECT_TIMEOUT`): with psycopg_pool's 300 s, a slot
given up came back only at a caller's next request, seconds after the
server did when a caller was already waiting.

Two private methods of psycopg_pool are overridden, ``_add_connection``
(the attempt) and ``_connect`` (to report each attempt): the only places
jobrun reaches into its internals, with signatures stable since
psycopg_pool 3.1; tests/postgres/test_reconnect.py measures the behaviour
end to end, so an upgrade that changes them fails there.

Waiting for a connection
------------------------
The stores bound a call's wait for a pooled connection by the call's own
bound (:func:`connection_wait`), and a call that gets none raises
:class:`~jobrun.job.errors.ConnectionUnavailable` saying why
(:func:`unavailable`: the database unavailable since when, and the last
connection error; or the pool exhausted).

Logs
----
These pools report each connection attempt to their database's
:class:`~jobrun.job.outage.Outage` (``pool.outage``; failures and successes),
which says "unavailable", "still unavailable" and "available again" in one
line each. psycopg_pool's own WARNINGs about connection faults (a failed
attempt, a slot given up, a broken connection discarded) are then noise:
a filter on the ``psycopg.pool`` logger drops them while the code of one
of these pools runs (a context variable says so), and lets every other
line, and every other pool's, through.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import random
import time
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from psycopg_pool.base import AttemptWithBackoff

from jobrun.job import outage
from jobrun.job.errors import ConnectionUnavailable
from jobrun.job.outage import Outage
from jobrun.postgres import dsn

__all__ = [
    "RECONNECT_DELAY_INITIAL",
    "RECONNECT_DELAY_MAX",
    "RECONNECT_TIMEOUT",
    "AsyncReconnectingPool",
    "FollowingAttempt",
    "ReconnectingPool",
    "connection_wait",
    "outage_of",
    "unavailable",
]

RECONNECT_DELAY_INITIAL = 0.1
"""Seconds before the second attempt to connect a pool slot (then doubling)."""
RECONNECT_DELAY_MAX = 0.5
"""The longest pause between two attempts to connect a pool slot (jittered down to half)."""
RECONNECT_TIMEOUT = math.inf
"""psycopg_pool's ``reconnect_timeout`` for jobrun's pools: a slot is never given up.
A slot given up comes back only when a caller next asks for a connection, so
a caller already waiting (the claim loop, for up to its call bound) would
see the server's return seconds late after an outage longer than that."""


class FollowingAttempt(AttemptWithBackoff):
    """psycopg_pool's backoff, short at first and capped at :data:`RECONNECT_DELAY_MAX`."""

    INITIAL_DELAY = RECONNECT_DELAY_INITIAL

    def update_delay(self, now: float) -> None:
        super().update_delay(now)  # doubling, and never past the give-up time
        if self.delay > RECONNECT_DELAY_MAX:
            # Jittered, so that the slots of many pools do not all knock at once.
            self.delay = random.uniform(RECONNECT_DELAY_MAX / 2, RECONNECT_DELAY_MAX)


_in_jobrun_pool: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "jobrun_in_pool", default=False
)

_FAULT_MESSAGES = frozenset(
    {
        "error connecting in %r: %s",
        "reconnection attempt in pool %r failed after %s sec",
        "discarding closed connection: %s",
        "discarding broken connection: %s",
    }
)
"""psycopg_pool's WARNINGs about connection faults (psycopg_pool 3.1 to 3.3)."""


class _QuietConnectionFaults(logging.Filter):
    """Drops psycopg_pool's connection-fault lines of jobrun's pools (see the module docs)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_in_jobrun_pool.get() and record.msg in _FAULT_MESSAGES)


def _install_filter() -> None:
    logger = logging.getLogger("psycopg.pool")
    if not any(isinstance(f, _QuietConnectionFaults) for f in logger.filters):
        logger.addFilter(_QuietConnectionFaults())


_install_filter()


class ReconnectingPool(ConnectionPool[psycopg.Connection[Any]]):
    """A ConnectionPool that reconnects within half a second of the server's return.

    Takes ConnectionPool's arguments. ``outage`` (set by
    :func:`jobrun.postgres.pool.open_pool`) hears of every connection attempt.
    """

    outage: Outage | None = None

    def _connect(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        began = self.outage.mark() if self.outage is not None else None
        try:
            conn = super()._connect(timeout)
        except Exception as exc:
            if self.outage is not None:
                self.outage.failed(exc, "connecting")
            raise
        if self.outage is not None:
            self.outage.ok(began)
        return conn

    def _add_connection(self, attempt: AttemptWithBackoff | None, growing: bool = False) -> None:
        token = _in_jobrun_pool.set(True)
        try:
            super()._add_connection(
                attempt or FollowingAttempt(timeout=self.reconnect_timeout), growing
            )
        finally:
            _in_jobrun_pool.reset(token)

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        token = _in_jobrun_pool.set(True)
        try:
            super().putconn(conn)
        finally:
            _in_jobrun_pool.reset(token)


class AsyncReconnectingPool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """:class:`ReconnectingPool` for asyncio."""

    outage: Outage | None = None

    async def _connect(self, timeout: float | None = None) -> psycopg.AsyncConnection[Any]:
        began = self.outage.mark() if self.outage is not None else None
        try:
            conn = await super()._connect(timeout)
        except Exception as exc:
            if self.outage is not None:
                self.outage.failed(exc, "connecting")
            raise
        if self.outage is not None:
            self.outage.ok(began)
        return conn

    async def _add_connection(
        self, attempt: AttemptWithBackoff | None, growing: bool = False
    ) -> None:
        token = _in_jobrun_pool.set(True)
        try:
            await super()._add_connection(
                attempt or FollowingAttempt(timeout=self.reconnect_timeout), growing
            )
        finally:
            _in_jobrun_pool.reset(token)

    async def putconn(self, conn: psycopg.AsyncConnection[Any]) -> None:
        token = _in_jobrun_pool.set(True)
        try:
            await super().putconn(conn)
        finally:
            _in_jobrun_pool.reset(token)


def outage_of(pool: object) -> Outage:
    """The outage reporter of ``pool``: its own (``open_pool``'s pools), else that of
    the database its conninfo names, else the process's default one."""
    reporter = getattr(pool, "outage", None)
    if isinstance(reporter, Outage):
        return reporter
    conninfo = getattr(pool, "conninfo", None)
    if isinstance(conninfo, str):
        with contextlib.suppress(Exception):
            return outage.for_database(dsn.describe(conninfo))
    return outage.of(None)


def connection_wait(pool_timeout: float, bound: float | None, started: float) -> float:
    """Seconds left to wait for a pooled connection: the pool's timeout, or the call's
    ``bound`` when shorter (a call never waits past its bound for a connection)."""
    wait = pool_timeout if bound is None else min(pool_timeout, bound)
    # Never 0: psycopg_pool refuses a zero timeout even with a connection ready.
    return max(0.001, started + wait - time.monotonic())


def unavailable(pool: Any, waited: float, bound: float | None) -> ConnectionUnavailable:
    """The error of a call that got no pooled connection in ``waited`` seconds: why."""
    why = outage_of(pool).describe()
    if why is None:
        why = f"all {pool.max_size} connections of the pool in use"
    limit = "its bound" if bound is not None and bound < pool.timeout else "the pool's timeout"
    return ConnectionUnavailable(
        f"no database connection available within {waited:.1f} s ({limit}): {why}"
    )
