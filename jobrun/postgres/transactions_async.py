"""The transactions of a store, and their retry loop, written once.

The source of :mod:`jobrun.postgres.transactions` (``make generate`` runs
``tools/async_to_sync.py``): edit this file, never the generated one.

Every store call runs through :meth:`AsyncTransactions._run`: a live pooled
connection (one whose server hung up is replaced at checkout without a round
trip), bounded client-side (:mod:`jobrun.postgres.deadline`), its errors
translated (:func:`~jobrun.postgres.convert.translate_errors`: a connection
lost during COMMIT is OutcomeUnknown), and a deadlock or serialization
failure retried once, the whole transaction again. The shapes on top:

- ``_on_pool``: lone statements, each its own transaction (the pool is
  autocommit); ``_on_pool_read``: the same for reads, never retried;
- ``_with_tx``: one transaction, fenced first when the store is;
- ``_with_explicit_tx``: the body sends BEGIN (with options) and COMMIT
  itself, pipelined with its last statement (Complete, limited claims);
- ``_in_caller_tx``: the caller's connection, in a savepoint inside the
  caller's transaction.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import PoolTimeout

from jobrun.job.errors import (
    DatabaseError,
    LeaderLost,
    SchemaMismatch,
    TransientError,
    ValidationError,
)
from jobrun.postgres import reconnect
from jobrun.postgres.base import CALL, StoreBase, stale, warn_notify_queue_full
from jobrun.postgres.convert import (
    is_retryable,
    statement_timeout_setting,
    translate_errors,
    utc,
)
from jobrun.postgres.deadline import WATCHDOG
from jobrun.postgres.schema import SCHEMA_VERSION
from jobrun.postgres.sqlc.aio import AsyncQueries

log = logging.getLogger("jobrun.postgres.store")  # the name users filter on

T = TypeVar("T")
AsyncConn = psycopg.AsyncConnection[Any]


class AsyncTransactions(StoreBase):
    """How a store talks to its pool (see the module docstring)."""

    q: AsyncQueries

    def _check_pool(self) -> None:
        """Refuse a pool this process may not use (the sync store: after a fork)."""

    def _track(self, conn: AsyncConn) -> None:
        """Note a connection checked out (the sync store: for a later fork)."""

    @contextlib.asynccontextmanager
    async def _connection(self, timeout: float | None) -> AsyncIterator[AsyncConn]:
        """A live pooled connection, the call bounded by ``timeout`` seconds.

        An idle pooled connection whose server went away (restart, failover,
        pg_terminate_backend) is closed, so the pool replaces it, and the
        next one is tried. The wait for a connection is bounded too: a call
        that gets none raises ConnectionUnavailable, saying why.
        """
        self._check_pool()
        timeout = self._left(timeout)
        started = time.monotonic()
        for _ in range(self.pool.max_size + 1):
            wait = reconnect.connection_wait(self.pool.timeout, timeout, started)
            async with contextlib.AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(self.pool.connection(timeout=wait))
                except PoolTimeout:
                    waited = time.monotonic() - started
                    raise reconnect.unavailable(self.pool, waited, timeout) from None
                self._track(conn)
                if stale(conn):
                    await conn.close()
                    continue
                with WATCHDOG.watch(conn, timeout):
                    yield conn
                return
        raise TransientError("every pooled connection was dead")  # pragma: no cover

    async def _run(
        self,
        body: Callable[[AsyncConn, list[bool]], Awaitable[T]],
        *,
        timeout: float | None,
        committed: bool = False,
        retry: bool = True,
    ) -> T:
        """The one retry loop: ``body(conn, committing)`` on a pooled connection.

        ``body`` sets ``committing[0]`` when COMMIT leaves (``committed``: it
        is set from the start, a lone statement commits as it returns), so
        that a connection lost then is OutcomeUnknown. A deadlock or
        serialization failure runs it once more (``retry``).
        """
        for attempt in (1, 2):
            committing = [committed]
            try:
                with translate_errors(committing=committing):  # noqa: RUF100, SIM117 - async in the source
                    async with self._connection(timeout) as conn:
                        return await body(conn, committing)
            except DatabaseError as exc:
                if retry and attempt == 1 and is_retryable(exc.__cause__ or exc):
                    log.info("retrying a transaction after %s", exc)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _with_tx(
        self, fn: Callable[[AsyncConn], Awaitable[T]], *, timeout: float | object | None = CALL
    ) -> T:
        """Run ``fn`` in one transaction on a pooled connection (fenced first)."""

        async def body(conn: AsyncConn, committing: list[bool]) -> T:
            async with conn.transaction():
                await self._check_fence(conn)
                result = await fn(conn)
                committing[0] = True
            return result

        return await self._run(body, timeout=self._bound(timeout))

    async def _with_explicit_tx(
        self,
        fn: Callable[[AsyncConn, list[bool]], Awaitable[T]],
        *,
        timeout: float | object | None = CALL,
    ) -> T:
        """Like :meth:`_with_tx`, for a ``fn`` that sends BEGIN and COMMIT itself.

        ``fn`` sets the flag it is given just before COMMIT leaves; a
        transaction ``fn`` left open is committed here (the paths that only
        read), an aborted one rolled back.
        """

        async def body(conn: AsyncConn, committing: list[bool]) -> T:
            try:
                if self._fence is not None:
                    # fn's own BEGIN would then be a no-op warning: fenced
                    # explicit transactions are the leader's, never Complete's.
                    raise ValidationError("fenced", "a fenced store cannot complete jobs")
                result = await fn(conn, committing)
                status = conn.info.transaction_status
                if status == TransactionStatus.INERROR:
                    # An error swallowed inside: COMMIT would quietly roll back.
                    raise DatabaseError("the transaction was aborted before COMMIT")
                if status == TransactionStatus.INTRANS:
                    committing[0] = True
                    await conn.execute("COMMIT")
                return result
            except BaseException:
                if (
                    not conn.closed
                    and not conn.broken
                    and conn.info.transaction_status != TransactionStatus.IDLE
                ):
                    with contextlib.suppress(psycopg.Error):
                        await conn.execute("ROLLBACK")
                raise

        return await self._run(body, timeout=self._bound(timeout))

    async def _on_pool(self, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """Run a single statement (its own transaction: the pool is autocommit).

        Fenced (``fenced``), the statement runs in a transaction after the fence.
        """

        async def body(conn: AsyncConn, committing: list[bool]) -> T:
            if self._fence is not None:
                async with conn.transaction():
                    await self._check_fence(conn)
                    return await fn(conn)
            return await fn(conn)

        return await self._run(body, timeout=self.call_timeout, committed=True)

    async def _on_pool_read(self, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """A read: no commit outcome to be unsure about, nothing retried."""

        async def body(conn: AsyncConn, committing: list[bool]) -> T:
            return await fn(conn)

        return await self._run(body, timeout=self.call_timeout, retry=False)

    @staticmethod
    async def _in_caller_tx(conn: AsyncConn, fn: Callable[[AsyncConn], Awaitable[T]]) -> T:
        """Run ``fn`` on the caller's connection.

        Inside the caller's transaction it runs in a savepoint (a failure does
        not abort the caller's transaction), and everything it wrote,
        notifications included, exists only if the caller commits. A
        connection not in autocommit mode is in the caller's transaction from
        its first statement on, even before the server has seen one (psycopg,
        and the ORMs on top of it, send BEGIN with the first statement): the
        enqueue opens that transaction, the caller's, and leaves it to the
        caller to commit. Only an autocommit connection gets a transaction of
        its own, committed before this returns.
        """
        if not isinstance(conn, psycopg.AsyncConnection):
            raise ValidationError(
                "conn", f"must be a psycopg.AsyncConnection, not {type(conn).__name__}"
            )
        status = conn.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise ValidationError("conn", "the caller's transaction is already aborted")
        with translate_errors():
            if status == TransactionStatus.IDLE and not conn.autocommit:
                # psycopg sends the caller's BEGIN before this first statement;
                # the savepoint below then nests inside it.
                await conn.execute("SELECT 1")
            async with conn.transaction():
                return await fn(conn)

    async def _check_fence(self, conn: AsyncConn) -> None:
        """The fence (see ``Store.fenced``): the first statement of a fenced transaction."""
        fence = self._fence
        if fence is None:
            return
        got = await self.q.fence_leader(conn, name=fence.name, holder=fence.holder, term=fence.term)
        if got is None:
            raise LeaderLost(fence.name, fence.term)

    async def schema_version(self) -> int | None:
        """The version of the jobrun schema in the database; None when there is none."""
        try:
            return await self._on_pool_read(self._bounded_schema_version)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        except psycopg.errors.InsufficientPrivilege:
            raise DatabaseError(
                f"this role may not read {self.schema}.schema_version: grant it USAGE on "
                f"schema {self.schema} and SELECT on its tables (GRANT SELECT, INSERT, UPDATE, "
                f"DELETE ON ALL TABLES IN SCHEMA {self.schema} TO <role>)"
            ) from None

    async def _bounded_schema_version(self, conn: AsyncConn) -> int | None:
        """The schema check, under jobrun's call bound rather than the role's
        ``statement_timeout``: a role- or database-wide timeout of a few
        milliseconds must not stop a worker from starting on a cold session,
        where this first read loads the catalog (the notifier's probes do the
        same, see session.configure_session)."""
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                [statement_timeout_setting(self.call_timeout)],
            )
            return await self.q.schema_version(conn)

    async def check_schema(self) -> None:
        """Raise SchemaMismatch unless the database holds the schema version this code needs.

        Every entry point calls it once at start: one clear line instead of a
        traceback per query when ``jobrun migrate`` was not run.
        """
        found = await self.schema_version()
        if found != SCHEMA_VERSION:
            raise SchemaMismatch(self.schema, found, SCHEMA_VERSION)

    async def now(self) -> dt.datetime:
        """The database's clock: the only "now" any decision may use (aware, UTC)."""
        value = await self._on_pool_read(self.q.db_now)
        assert value is not None
        # In UTC even on a session whose TimeZone jobrun did not set (behind
        # a transaction pooler the pool sets no session state).
        return utc(value)

    async def _warn_notify_queue_full(self, usage: float) -> None:
        """Log the full notification queue with the sessions that may hold it."""
        try:
            blockers = await self._on_pool_read(self.q.notify_queue_blockers)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail anything
            warn_notify_queue_full(usage, exc)
        else:
            warn_notify_queue_full(usage, blockers)
