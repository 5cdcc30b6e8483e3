"""AsyncClient: enqueue and inspect jobs from asyncio code (FastAPI, Starlette, aiohttp).

::

    import jobrun

    async with await jobrun.AsyncClient.connect() as jobs:   # DATABASE_URL, JOBRUN_SCHEMA, ...
        job = await jobs.enqueue("email.send", {"to": "a@example.com"}, queue="emails")
        # inside your own transaction: the job exists iff you commit
        async with await psycopg.AsyncConnection.connect(dsn) as conn, conn.transaction():
            await conn.execute("INSERT INTO orders ...")
            await jobs.enqueue("order.ship", {"order": 7}, conn=conn)
        done = await jobs.wait(job.id, timeout=30)           # woken by a notification
        done.result                                          # the handler's return value

The asyncio twin of :class:`jobrun.Client`, for the producer side: the same
arguments, defaults, settings and errors (ValidationError before any SQL;
NotFound, IdempotencyConflict, AlreadyExists, TransientError, OutcomeUnknown
from the same translation), every method a coroutine on an
``AsyncConnectionPool``. ``conn=`` takes the caller's
``psycopg.AsyncConnection``: the enqueue runs in a savepoint of the caller's
transaction (a failure leaves it usable) and the job, its event and its
wake-up exist only if the caller commits. A connection not in autocommit
mode is in the caller's transaction from its first statement on, the
enqueue's own included; only an autocommit connection gets a transaction
of its own, committed before the call returns. Handlers still run in a worker
(``jobrun worker``); a job enqueued here is claimed like any other.

:meth:`AsyncClient.connect` reads :meth:`jobrun.Settings.from_env` unless
given ``settings=``, like ``Client.connect``: the database URL is the
argument, else ``DATABASE_URL``, else the embedded PostgreSQL (started in a
thread, announced by a WARNING). The schema version is checked once.

The queries are the generated asyncio twins of the sync ones
(:mod:`jobrun.postgres.sqlc.aio`, from the same ``db/query/*.sql``); the
Store logic is :class:`jobrun.postgres.async_store.AsyncStore`. The client
wires them in and runs no SQL itself. ``import jobrun`` does not import this
module: ``jobrun.AsyncClient`` loads it on first use.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import uuid
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import psycopg

from jobrun.client import _uuid
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.model import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    Backoff,
    BatchResult,
    Event,
    Job,
    JSONValue,
    NewJob,
    State,
    jobs_like,
    new_job_id,
)
from jobrun.postgres.async_store import AsyncPool, AsyncStore, open_async_pool
from jobrun.postgres.wait import DEFAULT_POLL_INTERVAL

__all__ = ["AsyncClient", "make_async_store"]


def make_async_store(pool: AsyncPool, settings: Settings) -> AsyncStore:
    """An AsyncStore on ``pool`` with the store settings of ``settings`` (as ``make_store``)."""
    return AsyncStore(
        pool,
        event_mode=settings.job_events,
        notify_channel=settings.notify_channel,
        call_timeout=settings.call_timeout,
        schema=settings.schema,
        direct_url=settings.direct_url,
    )


class AsyncClient:
    """Enqueue and inspect jobs through an AsyncStore (usually from :meth:`connect`)."""

    def __init__(self, store: AsyncStore, *, owns_pool: bool = False) -> None:
        self.store = store
        self._owns_pool = owns_pool

    @classmethod
    async def connect(
        cls,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        check_schema: bool = True,
        application_name: str = "jobrun-client",
    ) -> AsyncClient:
        """Open an AsyncConnectionPool (``pool_size`` + the reserve) and a store on it.

        Close it when done (``async with``, or :meth:`close`). The arguments
        are :meth:`jobrun.Client.connect`'s.
        """
        if settings is None:
            settings = Settings.from_env()
        url = database_url or settings.database_url
        if not url:
            from jobrun.runtime import resolve_database_url  # noqa: PLC0415 - the fallback only

            url = await asyncio.to_thread(resolve_database_url, settings)
        pool = await open_async_pool(
            url,
            concurrency=pool_size,
            min_size=1,
            application_name=application_name,
            pooler=settings.pooler,
        )
        try:
            store = make_async_store(pool, settings)
            if check_schema:
                await store.check_schema()
        except BaseException:
            await pool.close()
            raise
        return cls(store, owns_pool=True)

    async def close(self) -> None:
        await self.store.aclose()
        if self._owns_pool:
            await self.store.pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- enqueue -------------------------------------------------------------------

    async def enqueue(
        self,
        type: str,
        payload: JSONValue = None,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = DEFAULT_BACKOFF,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | None = None,
        idempotency_key: str | None = None,
        id: uuid.UUID | None = None,
        concurrency_key: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> Job:
        """Enqueue one job; with ``conn``, inside that connection's transaction.

        With an ``idempotency_key`` already used in the queue, an identical
        job returns the stored one (its id differs from ``id``), a different
        one raises IdempotencyConflict (see :meth:`jobrun.Client.enqueue`).
        """
        job = NewJob(
            type=type,
            payload={} if payload is None else payload,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            run_at=run_at,
            delay=delay,
            idempotency_key=idempotency_key,
            id=id or new_job_id(),
            concurrency_key=concurrency_key,
        )
        return await self.store.enqueue(job, conn=conn)

    async def enqueue_job(
        self, job: NewJob, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> Job:
        return await self.store.enqueue(job, conn=conn)

    async def enqueue_many(
        self,
        type: str,
        payloads: Iterable[JSONValue],
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = DEFAULT_BACKOFF,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | None = None,
        concurrency_key: str | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
    ) -> BatchResult:
        """Enqueue one job of ``type`` per payload (COPY), all or nothing.

        The fast form of a batch whose jobs differ only in their payload: the
        other fields are checked once, each payload as in :meth:`enqueue`
        (a bad one is a ValidationError naming its position, ``payloads[3]``).
        The payloads stream into the COPY as they are checked (bounded memory,
        and the checks overlap the server's work): a bad one rolls back what
        was sent, so nothing of the batch is written. Each job gets a new id:
        a batch you may have to retry after OutcomeUnknown is safer as NewJobs
        through :meth:`enqueue_batch`, where the ids you chose make the retry
        a replay.
        """
        if not isinstance(type, str):
            raise ValidationError(
                "type",
                "enqueue_many takes a job type and its payloads; NewJobs go through enqueue_batch",
            )
        template = NewJob(
            type=type,
            queue=queue,
            priority=priority,
            max_attempts=max_attempts,
            backoff=backoff,
            run_at=run_at,
            delay=delay,
            concurrency_key=concurrency_key,
        )
        jobs = jobs_like(template, payloads)
        return await self.store.enqueue_batch(jobs, conn=conn)

    async def enqueue_batch(
        self, jobs: Iterable[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> BatchResult:
        """Enqueue many jobs at once (COPY), all or nothing; streams any iterable."""
        return await self.store.enqueue_batch(jobs, conn=conn)

    # -- inspect and administer ------------------------------------------------------

    async def get(self, job_id: uuid.UUID | str) -> Job:
        return await self.store.get(_uuid(job_id))

    async def wait(
        self,
        job_id: uuid.UUID | str,
        timeout: float | None = None,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> Job:
        """The job once it has finished (succeeded, dead or cancelled).

        Woken by a notification sent in the transaction that ends the job (the
        row re-read every ``poll_interval`` s as a fallback); other coroutines
        run meanwhile. ``job.result`` is the handler's return value. Raises
        WaitTimeout (a TimeoutError carrying the job as it stood) after
        ``timeout`` seconds; None waits for ever. Uses one connection of its
        own while waiting.
        """
        return await self.store.wait(_uuid(job_id), timeout, poll_interval=poll_interval)

    async def list(
        self,
        *,
        queue: str | None = None,
        state: State | str | None = None,
        type: str | None = None,
        after: uuid.UUID | str | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first; pass a page's last id as ``after``."""
        return await self.store.list(
            queue=queue,
            state=state,
            type=type,
            after=None if after is None else _uuid(after),
            limit=limit,
        )

    async def cancel(self, job_id: uuid.UUID | str) -> Job:
        return await self.store.cancel(_uuid(job_id))

    async def retry(self, job_id: uuid.UUID | str) -> Job:
        return await self.store.retry(_uuid(job_id))

    async def events(self, job_id: uuid.UUID | str) -> builtins.list[Event]:
        return await self.store.events(_uuid(job_id))

    async def now(self) -> dt.datetime:
        return await self.store.now()
