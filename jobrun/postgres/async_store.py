"""AsyncStore: the client half of the Store on psycopg's asyncio API.

What :class:`~jobrun.AsyncClient` needs of the Store (enqueue one job, a
batch or many payloads, on the pool or on the caller's connection; get,
list, events, cancel, retry; watch and wait), on an ``AsyncConnectionPool``.
Nothing is decided differently from the sync Store, because it is the same
code: the transactions, enqueue and admin halves are written once, as the
asyncio modules ``transactions_async``, ``enqueue_async``, ``admin_async``
and ``wait_async``, and the sync Store's are generated from them
(``tools/async_to_sync.py``, checked fresh by ``tools/check_generated.py``).

The tracing producer of :mod:`jobrun.job.propagation` is synchronous and is
not called here: an async enqueue stores the trace context the NewJob brings
(``NewJob(trace_context=...)``) and no producer span. Claims, leases and
completion stay with the (threaded) worker and its sync Store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from jobrun.job import outage
from jobrun.job.errors import ValidationError
from jobrun.job.model import BatchResult, Job, NewJob
from jobrun.postgres.plans import batch_stream, many_stream
from jobrun.postgres.pool import (
    DEFAULT_POOL_TIMEOUT,
    DEFAULT_POOLER,
    PING,
    PING_ATTEMPTS,
    check_pool_args,
    conninfo_with,
    describe,
    ping_again,
    ping_failure,
    pool_options,
)
from jobrun.postgres.reconnect import AsyncReconnectingPool
from jobrun.postgres.session import configure_pooled_async
from jobrun.postgres.sqlc.aio import AsyncQueries
from jobrun.postgres.workflows_async import AsyncWorkflows

AsyncPool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]


# -- the pool ------------------------------------------------------------------------


async def ping(conninfo: str, *, application_name: str = "jobrun-pool") -> bool:
    """Connect once; a clear, password-free TransientError if that fails. Whether a
    pooler answers (see :func:`jobrun.postgres.pool.ping`)."""
    full = conninfo_with(conninfo, application_name=application_name)
    for attempt in range(PING_ATTEMPTS):
        try:
            async with await psycopg.AsyncConnection.connect(full, prepare_threshold=None) as conn:
                cur = await conn.execute(PING)
                cur.nextset()
                row = await cur.fetchone()
                return row is not None and row[0] != conn.info.backend_pid
        except psycopg.OperationalError as exc:
            failure = ping_failure(conninfo, exc)
            if not ping_again(exc, attempt):
                break
    raise failure


async def open_async_pool(
    conninfo: str,
    *,
    concurrency: int = 1,
    min_size: int | None = None,
    max_size: int | None = None,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    application_name: str = "jobrun-pool",
    pooler: str = DEFAULT_POOLER,
) -> AsyncPool:
    """An open ``AsyncConnectionPool``, after a ping: :func:`jobrun.postgres.pool.open_pool`'s
    settings (autocommit, UTC sessions guarded against a tiny statement_timeout,
    connect timeout and TCP keepalives, sized for ``concurrency`` plus the
    reserve, ``timeout`` to wait for a connection, the ``pooler`` mode,
    reconnecting within half a second of the server's return:
    :mod:`jobrun.postgres.reconnect`) for asyncio."""
    mode = check_pool_args(concurrency, pooler)
    pooled = await ping(conninfo, application_name=application_name)
    sizes = (concurrency, min_size, max_size)
    mode, options = pool_options(conninfo, mode, pooled, sizes, application_name, timeout=timeout)
    pool = AsyncReconnectingPool(
        # Behind a transaction pooler no session state (see jobrun.postgres.pool).
        configure=None if mode == "transaction" else configure_pooled_async,
        name="jobrun-async",
        **options,
    )
    pool.jobrun_pooler = mode  # type: ignore[attr-defined]
    pool.outage = outage.for_database(describe(conninfo))
    await pool.open(wait=True, timeout=max(timeout, 5.0))
    return pool


# -- the store ------------------------------------------------------------------------


class AsyncStore(AsyncWorkflows):
    """The client side of the Store on an ``AsyncConnectionPool`` (see the module docstring).

    Made as ``AsyncStore(pool, event_mode=..., notify_channel=..., call_timeout=...,
    schema=..., direct_url=...)``: the options are :class:`~jobrun.postgres.store.Store`'s
    of the same names (see :class:`~jobrun.postgres.base.StoreBase`), and must match the
    workers' (the schema, the event mode, the channel).
    """

    pool: AsyncPool

    def _accept(self, pool: Any) -> None:
        if not isinstance(pool, AsyncConnectionPool):
            raise ValidationError("pool", "must be a psycopg_pool.AsyncConnectionPool")

    def _setup(self) -> None:
        self.q = AsyncQueries(schema=self.schema)
        self._background: set[asyncio.Task[None]] = set()

    def _warn_apart(self, usage: float) -> None:
        task = asyncio.get_running_loop().create_task(self._warn_notify_queue_full(usage))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        """Wait for the diagnostics still running (the pool is the caller's to close)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    async def enqueue(
        self, job: NewJob, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> Job:
        """Insert a job, or return the stored one on an identical idempotent replay.

        With ``conn``, the job is part of the caller's transaction (see
        :meth:`_in_caller_tx`).
        """
        if not isinstance(job, NewJob):
            raise ValidationError("job", f"must be a jobrun.NewJob, not {type(job).__name__}")
        return await self._enqueue(job, conn, None)

    async def enqueue_batch(
        self, jobs: Iterable[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> BatchResult:
        """Insert many jobs in one transaction, all or nothing, streamed through COPY
        (as :meth:`Store.enqueue_batch <jobrun.postgres.store.Store.enqueue_batch>`)."""
        return await self._send_batch(batch_stream(jobs), conn, None)

    async def enqueue_many(
        self,
        template: NewJob,
        payloads: Iterable[Any],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> BatchResult:
        """One job like ``template`` per payload, each with a new id, in one transaction
        (as :meth:`Store.enqueue_many <jobrun.postgres.store.Store.enqueue_many>`)."""
        return await self._send_many(template, many_stream(template, payloads), conn, None)


__all__ = ["AsyncPool", "AsyncStore", "open_async_pool", "ping"]
