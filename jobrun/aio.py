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
from typing import Any, Unpack

from jobrun import producer, workflow
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.model import BatchResult, Event, Job, JSONValue, NewJob
from jobrun.job.signals import SignalSent
from jobrun.job.workflow import (
    EnqueuedWorkflow,
    OnParentFailure,
    WorkflowCancelled,
    WorkflowGraph,
    WorkflowRetried,
    WorkflowSummary,
)
from jobrun.postgres.async_store import AsyncPool, AsyncStore, open_async_pool
from jobrun.postgres.connect import AsyncConnection, database_url_or_embedded
from jobrun.postgres.pool import DEFAULT_POOL_TIMEOUT
from jobrun.postgres.wait import DEFAULT_POLL_INTERVAL
from jobrun.producer import EnqueueOptions, JobOptions, ListFilters, WorkflowFilters
from jobrun.workflow import Workflow

__all__ = ["AsyncClient", "make_async_store"]

_uuid = producer.job_id


def make_async_store(pool: AsyncPool, settings: Settings) -> AsyncStore:
    """An AsyncStore on ``pool`` with the store settings of ``settings`` (as ``make_store``)."""
    return AsyncStore(pool, **producer.store_options(settings))


class AsyncClient:
    """Enqueue and inspect jobs through an AsyncStore (usually from :meth:`connect`)."""

    def __init__(self, store: AsyncStore, *, owns_pool: bool = False) -> None:
        if isinstance(store, (str, bytes)):  # a URL where a store belongs: say so now
            raise ValidationError(
                "store",
                "AsyncClient takes an AsyncStore; for a URL use await AsyncClient.connect(url)",
            )
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
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> AsyncClient:
        """Open an AsyncConnectionPool (``pool_size`` + the reserve) and a store on it.

        Close it when done (``async with``, or :meth:`close`). The arguments
        are :meth:`jobrun.Client.connect`'s.
        """
        if settings is None:
            settings = Settings.from_env()
        url = database_url or settings.database_url
        if not url:  # the embedded fallback starts a server: not on the event loop
            url = await asyncio.to_thread(database_url_or_embedded, None)
        pool = await open_async_pool(
            url,
            concurrency=pool_size,
            min_size=1,
            application_name=application_name,
            pooler=settings.pooler,
            timeout=pool_timeout,
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
        conn: AsyncConnection[Any] | None = None,
        after: Iterable[uuid.UUID | Job | str] | uuid.UUID | Job | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue one job; with ``conn``, inside that connection's transaction.

        The options (``after`` and ``on_parent_failure`` too) are
        :meth:`jobrun.Client.enqueue`'s. With an
        ``idempotency_key`` already used in the queue, an identical job
        returns the stored one (its id differs from ``id``), a different one
        raises IdempotencyConflict.
        """
        job = producer.new_job(type, payload, options)
        return await self.enqueue_job(
            job, conn=conn, after=after, on_parent_failure=on_parent_failure
        )

    async def enqueue_job(
        self,
        job: NewJob,
        *,
        conn: AsyncConnection[Any] | None = None,
        after: Iterable[uuid.UUID | Job | str] | uuid.UUID | Job | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
    ) -> Job:
        """Enqueue a NewJob; ``after`` and ``on_parent_failure`` as in :meth:`enqueue`."""
        if after is not None:
            nodes = workflow.single(job, workflow.parent_ids(after), on_parent_failure)
            return workflow.job_of(await self.store.enqueue_graph(nodes, conn=conn))
        return await self.store.enqueue(job, conn=conn)

    async def enqueue_many(
        self,
        type: str,
        payloads: Iterable[JSONValue],
        *,
        conn: AsyncConnection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> BatchResult:
        """Enqueue one job of ``type`` per payload (COPY), all or nothing.

        As :meth:`jobrun.Client.enqueue_many`: the shared fields checked
        once, each payload as it streams into the COPY (a bad one is a
        ValidationError naming its position and writes nothing); each job
        a new id (for a batch you may retry, give NewJobs to
        :meth:`enqueue_batch`).
        """
        return await self.store.enqueue_many(producer.template(type, options), payloads, conn=conn)

    async def enqueue_batch(
        self, jobs: Iterable[NewJob], *, conn: AsyncConnection[Any] | None = None
    ) -> BatchResult:
        """Enqueue many jobs at once (COPY), all or nothing; streams any iterable."""
        return await self.store.enqueue_batch(jobs, conn=conn)

    async def enqueue_workflow(
        self, flow: Workflow, *, conn: AsyncConnection[Any] | None = None
    ) -> EnqueuedWorkflow:
        """:meth:`jobrun.Client.enqueue_workflow`: every job of ``flow`` in one transaction."""
        if not isinstance(flow, Workflow):
            raise ValidationError("flow", f"must be a jobrun.Workflow, not {type(flow).__name__}")
        return await self.store.enqueue_graph(
            flow.nodes, name=flow.name, workflow_id=flow.id, conn=conn
        )

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

    async def list(self, **filters: Unpack[ListFilters]) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first; pass a page's last id as ``after``."""
        return await self.store.list(**producer.list_filters(filters))

    async def cancel(self, job_id: uuid.UUID | str) -> Job:
        return await self.store.cancel(_uuid(job_id))

    async def retry(self, job_id: uuid.UUID | str) -> Job:
        return await self.store.retry(_uuid(job_id))

    async def signal(
        self,
        job_id: uuid.UUID | str,
        name: str,
        payload: JSONValue = None,
        *,
        key: str | None = None,
    ) -> SignalSent:
        """:meth:`jobrun.Client.signal`, awaited."""
        return await self.store.signal(_uuid(job_id), name, payload, key=key)

    async def events(self, job_id: uuid.UUID | str) -> builtins.list[Event]:
        return await self.store.events(_uuid(job_id))

    # -- operating workflows -----------------------------------------------------------

    async def workflows(self, **filters: Unpack[WorkflowFilters]) -> builtins.list[WorkflowSummary]:
        """:meth:`jobrun.Client.workflows`: newest first, a page at a time."""
        return await self.store.workflows(**producer.workflow_filters(filters))

    async def workflow(self, workflow_id: uuid.UUID | str) -> WorkflowGraph:
        """:meth:`jobrun.Client.workflow`: its summary, jobs and edges."""
        return await self.store.workflow(producer.workflow_id(workflow_id))

    async def cancel_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowCancelled:
        """:meth:`jobrun.Client.cancel_workflow`, awaited."""
        return await self.store.cancel_workflow(producer.workflow_id(workflow_id))

    async def retry_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowRetried:
        """:meth:`jobrun.Client.retry_workflow`, awaited."""
        return await self.store.retry_workflow(producer.workflow_id(workflow_id))

    async def now(self) -> dt.datetime:
        return await self.store.now()
