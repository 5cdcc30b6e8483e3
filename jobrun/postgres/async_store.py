"""AsyncStore: the client half of the Store on psycopg's asyncio API.

What :class:`~jobrun.AsyncClient` needs of :class:`~jobrun.postgres.store.Store`
(enqueue one job or a batch, on the pool or on the caller's connection; get,
list, events, cancel, retry; watch and wait), on an
``AsyncConnectionPool``. Nothing is decided differently from the sync
Store; only the waiting is ``await``:

- the statements are the generated asyncio twins
  (:mod:`jobrun.postgres.sqlc.aio`) of the ones Store runs, made by the
  code generator from the same ``db/query/*.sql``;
- the parameters, the batch order and the replay verdicts come from the same
  pure helpers (:mod:`jobrun.postgres.plans` and store.py's), and the errors
  from the same translator (:func:`~jobrun.postgres.convert.translate_errors`);
- the transaction boundaries are Store's: a lone statement on the autocommit
  pool is its own transaction, enqueue_batch/cancel/retry one transaction
  each (a deadlock retried once), and on the caller's connection a savepoint
  inside the caller's transaction (so a failure does not abort it, and the
  job exists only if the caller commits), which a connection not in
  autocommit mode is in from its first statement on; an autocommit
  connection gets a transaction of its own;
- every call on a pooled connection is bounded by ``call_timeout`` through
  the same watchdog as Store's (:mod:`jobrun.postgres.deadline`): a call past
  its deadline has its socket shut, fails as a connection fault, and the
  pool drops the connection.

The tracing producer of :mod:`jobrun.job.propagation` is synchronous and is
not called here: an async enqueue stores the trace context the NewJob brings
(``NewJob(trace_context=...)``) and no producer span. Claims, leases and
completion stay with the (threaded) worker and its sync Store.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import datetime as dt
import inspect
import itertools
import logging
import math
import select
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import psycopg
from psycopg import sql
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from jobrun.job import outage, validate
from jobrun.job.errors import (
    AlreadyExists,
    DatabaseError,
    InvalidState,
    NotFound,
    SchemaMismatch,
    TransientError,
    ValidationError,
    WaitTimeout,
)
from jobrun.job.model import BatchResult, Event, EventKind, Job, NewJob, State
from jobrun.postgres import dsn as dsn_text
from jobrun.postgres import reconnect
from jobrun.postgres.convert import (
    event_from_row,
    is_retryable,
    job_from_insert,
    job_from_row,
    statement_timeout_setting,
    translate_errors,
)
from jobrun.postgres.deadline import WATCHDOG
from jobrun.postgres.events import EventMode, EventRow
from jobrun.postgres.notify import DEFAULT_CHANNEL, validate_channel
from jobrun.postgres.plans import (
    enqueue_args,
    enqueued_event_rows,
    enqueued_events,
    keyed_insert_args,
    list_args,
    wait_args,
    wanted_events,
)
from jobrun.postgres.pool import (
    DEFAULT_POOL_TIMEOUT,
    DEFAULT_POOLER,
    RESERVED_CONNECTIONS,
    connection_kwargs,
    conninfo_with,
    describe,
    pooler_mode,
    pooler_of,
    resolve_pooler,
)
from jobrun.postgres.reconnect import AsyncReconnectingPool
from jobrun.postgres.schema import DEFAULT_SCHEMA, SCHEMA_VERSION, schema_name
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import models
from jobrun.postgres.sqlc.aio import AsyncQueries
from jobrun.postgres.store import (
    BATCH_CHUNK,
    DEFAULT_CALL_TIMEOUT,
    MAX_NOTIFY_QUEUE_USAGE,
    NOTIFY_WARNING_INTERVAL,
    BatchSplit,
    BatchWakeups,
    _check_batch,
    _check_id,
    _chunks,
    _copy_row,
    _other_unique_violation,
    _replay,
    _same_job_or_conflict,
    _trace_json,
    _unique_violations,
    raw_json,
)
from jobrun.postgres.wait import DEFAULT_POLL_INTERVAL

log = logging.getLogger(__name__)

T = TypeVar("T")

AsyncPool = AsyncConnectionPool[psycopg.AsyncConnection[Any]]
_CALL = object()  # "the store's call_timeout"


# -- the pool ------------------------------------------------------------------------


async def ping(conninfo: str, *, application_name: str = "jobrun-pool") -> bool:
    """Connect once; a clear, password-free TransientError if that fails. Whether a
    pooler answers (see :func:`jobrun.postgres.pool.ping`)."""
    full = conninfo_with(conninfo, application_name=application_name)
    try:
        async with await psycopg.AsyncConnection.connect(full, prepare_threshold=None) as conn:
            cur = await conn.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            return row is not None and row[0] != conn.info.backend_pid
    except psycopg.OperationalError as exc:
        text = str(exc).strip()
        reason = dsn_text.redact_for(
            conninfo, text.splitlines()[-1] if text else type(exc).__name__
        )
    raise TransientError(f"cannot connect to PostgreSQL at {describe(conninfo)}: {reason}")


async def _configure(conn: psycopg.AsyncConnection[Any]) -> None:
    # Timestamps come back in UTC whatever the server's or role's TimeZone.
    await conn.execute("SET TIME ZONE 'UTC'")


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
    settings (autocommit, UTC sessions, connect timeout and TCP keepalives, sized for
    ``concurrency`` plus the reserve, ``timeout`` to wait for a connection, the
    ``pooler`` mode, reconnecting within half a second of the server's return:
    :mod:`jobrun.postgres.reconnect`) for asyncio."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValidationError("concurrency", "must be a positive int")
    mode = pooler_mode(pooler, "pooler")
    full = conninfo_with(conninfo, application_name=application_name)
    pooled = await ping(conninfo, application_name=application_name)
    mode = resolve_pooler(conninfo, mode, pooled=pooled)
    if max_size is None:
        max_size = concurrency + RESERVED_CONNECTIONS
    pool = AsyncReconnectingPool(
        full,
        kwargs={"autocommit": True, **connection_kwargs(mode)},
        # Behind a transaction pooler no session state (see jobrun.postgres.pool).
        configure=None if mode == "transaction" else _configure,
        min_size=min(min_size if min_size is not None else 4, max_size),
        max_size=max_size,
        timeout=timeout,
        name="jobrun-async",
        open=False,
        reconnect_timeout=reconnect.RECONNECT_TIMEOUT,
    )
    pool.jobrun_pooler = mode  # type: ignore[attr-defined]
    pool.outage = outage.for_database(describe(conninfo))
    await pool.open(wait=True, timeout=max(timeout, 5.0))
    return pool


def _stale(conn: psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection has been hung up on (as store._stale: no round trip)."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _watched(conn: psycopg.AsyncConnection[Any]) -> psycopg.Connection[Any]:
    """``conn`` for the watchdog, which only shuts its socket down (``conn.pgconn``):
    a coroutine awaiting on it then fails at once, as a blocked thread does."""
    return cast("psycopg.Connection[Any]", conn)


# -- the store ------------------------------------------------------------------------


class AsyncStore:
    """The client side of the Store on an ``AsyncConnectionPool`` (see the module docstring).

    The options are :class:`~jobrun.postgres.store.Store`'s of the same names,
    and must match the workers' (the schema, the event mode, the channel).
    """

    def __init__(
        self,
        pool: AsyncPool,
        *,
        event_mode: EventMode | str = EventMode.ALL,
        notify_channel: str = DEFAULT_CHANNEL,
        call_timeout: dt.timedelta | None = DEFAULT_CALL_TIMEOUT,
        schema: str = DEFAULT_SCHEMA,
        direct_url: str | None = None,
    ) -> None:
        if not isinstance(pool, AsyncConnectionPool):
            raise ValidationError("pool", "must be a psycopg_pool.AsyncConnectionPool")
        self.schema = schema_name(schema)
        self.direct_url = direct_url
        """A connection string to PostgreSQL itself (JOBRUN_DIRECT_URL), for
        :meth:`wait`'s LISTEN when the pool goes through a transaction pooler."""
        self.q = AsyncQueries(schema=self.schema)
        try:
            self.event_mode = EventMode(event_mode)
        except ValueError:
            raise ValidationError("event_mode", "must be 'all' or 'terminal'") from None
        if call_timeout is not None:
            validate.positive_duration("call_timeout", call_timeout)
        self.call_timeout = None if call_timeout is None else call_timeout.total_seconds()
        self.notify_channel = validate_channel(notify_channel, "notify_channel")
        self.finish_channel = validate_channel(f"{notify_channel}_done", "notify_channel")
        """Where the end of a watched job is announced (see :meth:`watch`)."""
        self.pool = pool
        self.outage = reconnect.outage_of(pool)
        """Where this store's database faults are reported (:mod:`jobrun.job.outage`):
        the pool's own reporter, shared by the loops that use this store."""
        self._notify_warned_at = -math.inf
        self._notify_warn_lock = threading.Lock()
        self._background: set[asyncio.Task[None]] = set()

    # -- transactions ---------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(
        self, timeout: float | None
    ) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        """A live pooled connection, bounded by ``timeout`` s (see Store._connection)."""
        started = time.monotonic()
        for _ in range(self.pool.max_size + 1):
            wait = reconnect.connection_wait(self.pool.timeout, timeout, started)
            async with contextlib.AsyncExitStack() as stack:
                try:
                    conn = await stack.enter_async_context(self.pool.connection(timeout=wait))
                except PoolTimeout:
                    waited = time.monotonic() - started
                    raise reconnect.unavailable(self.pool, waited, timeout) from None
                if _stale(conn):
                    await conn.close()
                    continue
                with WATCHDOG.watch(_watched(conn), timeout):
                    yield conn
                return
        raise TransientError("every pooled connection was dead")  # pragma: no cover

    def _bound(self, timeout: float | object | None) -> float | None:
        if timeout is _CALL:
            return self.call_timeout
        assert timeout is None or isinstance(timeout, float)
        return timeout

    async def _with_tx(
        self,
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
        *,
        timeout: float | object | None = _CALL,
    ) -> T:
        """Run ``fn`` in one transaction on a pooled connection (see Store._with_tx).

        A deadlock or serialization failure is retried once; a connection lost
        during COMMIT raises OutcomeUnknown.
        """
        for attempt in (1, 2):
            committing = [False]
            try:
                with translate_errors(committing=committing):
                    async with self._connection(self._bound(timeout)) as conn:
                        async with conn.transaction():
                            result = await fn(conn)
                            committing[0] = True
                        return result
            except DatabaseError as exc:
                if attempt == 1 and is_retryable(exc.__cause__ or exc):
                    log.info("retrying a transaction after %s", exc)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _on_pool(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """Run statements each their own transaction (the pool is autocommit)."""
        for attempt in (1, 2):
            committing = [True]  # a lone statement commits as it returns
            try:
                with translate_errors(committing=committing):
                    async with self._connection(self.call_timeout) as conn:
                        return await fn(conn)
            except DatabaseError as exc:
                if attempt == 1 and is_retryable(exc.__cause__ or exc):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def _on_pool_read(self, fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]]) -> T:
        """A read: no commit outcome to be unsure about."""
        with translate_errors():
            async with self._connection(self.call_timeout) as conn:
                return await fn(conn)

    @staticmethod
    async def _in_caller_tx(
        conn: psycopg.AsyncConnection[Any],
        fn: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]],
    ) -> T:
        """Run ``fn`` on the caller's async connection (see Store._in_caller_tx).

        Inside the caller's transaction it runs in a savepoint (a failure does
        not abort the caller's transaction), and everything it wrote,
        notifications included, exists only if the caller commits. A
        connection not in autocommit mode is in the caller's transaction from
        its first statement on (psycopg sends BEGIN with it): the enqueue
        opens that transaction, the caller's, and leaves it to the caller to
        commit. Only an autocommit connection gets a transaction of its own,
        committed before this returns.
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

    async def schema_version(self) -> int | None:
        """The version of the jobrun schema in the database; None when there is none."""
        try:
            return await self._on_pool_read(self._bounded_schema_version)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        except psycopg.errors.InsufficientPrivilege:
            raise DatabaseError(
                f"this role may not read {self.schema}.schema_version: grant it USAGE on "
                f"schema {self.schema} and SELECT on its tables"
            ) from None

    async def _bounded_schema_version(self, conn: psycopg.AsyncConnection[Any]) -> int | None:
        """The schema check under the call bound (see Store._bounded_schema_version)."""
        async with conn.transaction():
            await conn.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                [statement_timeout_setting(self.call_timeout)],
            )
            return await self.q.schema_version(conn)

    async def check_schema(self) -> None:
        """Raise SchemaMismatch unless the database holds the schema version this code needs."""
        found = await self.schema_version()
        if found != SCHEMA_VERSION:
            raise SchemaMismatch(self.schema, found, SCHEMA_VERSION)

    async def now(self) -> dt.datetime:
        """The database's clock."""
        value = await self._on_pool_read(self.q.db_now)
        assert value is not None
        return value

    # -- enqueue ----------------------------------------------------------------

    async def enqueue(
        self, job: NewJob, *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> Job:
        """Insert a job, or return the stored one on an identical idempotent replay.

        With ``conn``, the job is part of the caller's transaction (see
        :meth:`_in_caller_tx`).
        """
        if not isinstance(job, NewJob):
            raise ValidationError("job", f"must be a jobrun.NewJob, not {type(job).__name__}")
        if conn is not None:
            return await self._in_caller_tx(conn, lambda c: self._enqueue_on(c, job))
        return await self._on_pool(lambda c: self._enqueue_on(c, job))

    async def _enqueue_on(self, conn: psycopg.AsyncConnection[Any], job: NewJob) -> Job:
        # As Store._enqueue_on: the insert does nothing when the key is taken or
        # the client's id is already stored; a replay whose stored job is purged
        # in between finds no row, and the next round inserts.
        trace = _trace_json(job, None)
        for _ in range(3):
            args = enqueue_args(job, trace, event_mode=self.event_mode, channel=self.notify_channel)
            with _unique_violations(job):
                if job.idempotency_key is None:
                    row: q.EnqueueJobRow | q.EnqueueKeyedJobRow | None = await self.q.enqueue_job(
                        conn, **args
                    )
                else:
                    row = await self.q.enqueue_keyed_job(
                        conn, idempotency_key=job.idempotency_key, **args
                    )
            if row is not None:
                self._notified(row.notify_queue_usage)
                return job_from_insert(job, row, job.trace_context)
            if job.idempotency_key is not None:
                stored = await self.q.get_job_by_key(
                    conn, queue=job.queue, idempotency_key=job.idempotency_key
                )
                if stored is not None:
                    found = job_from_row(stored)
                    return _replay(job, found, await self._same_payloads(conn, [(job, found)]))
                continue
            same_id = await self.q.get_job(conn, id=job.id)
            if same_id is not None:
                found = job_from_row(same_id)
                return _same_job_or_conflict(
                    job, found, await self._same_payloads(conn, [(job, found)])
                )
        raise DatabaseError(f"idempotency key {job.idempotency_key!r} kept changing hands")

    async def enqueue_batch(
        self, jobs: Iterable[NewJob], *, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> BatchResult:
        """Insert many jobs in one transaction, all or nothing, streamed through COPY.

        As :meth:`Store.enqueue_batch <jobrun.postgres.store.Store.enqueue_batch>`:
        unkeyed jobs are COPYed in chunks (bounded memory for any iterable);
        keyed jobs go last, in (queue, key) order; a stored identical key is a
        replay (in ``replayed``), a different body IdempotencyConflict; an
        empty batch or a key twice in it a ValidationError.
        """
        if isinstance(jobs, Sequence):
            _check_batch(jobs)
        iterator = iter(jobs)
        first = next(iterator, None)
        if first is None:
            raise ValidationError("jobs", "the batch is empty")
        stream = itertools.chain([first], iterator)

        async def run(c: psycopg.AsyncConnection[Any]) -> BatchResult:
            return await self._enqueue_batch_on(c, stream)

        if conn is not None:
            return await self._in_caller_tx(conn, run)
        # Unbounded client-side, as Store's: a streamed batch may take minutes.
        return await self._with_tx(run, timeout=None)

    async def _enqueue_batch_on(
        self, conn: psycopg.AsyncConnection[Any], jobs: Iterator[NewJob]
    ) -> BatchResult:
        db_now = await self.q.db_now(conn)
        assert db_now is not None
        write_events = self.event_mode is EventMode.ALL
        shared: Jsonb | None = None  # no producer span: no carrier shared by the batch
        split = BatchSplit()
        wakeups = BatchWakeups(db_now)
        inserted = 0
        replayed: list[Job] = []
        for chunk in _chunks(jobs, BATCH_CHUNK):
            plain = split.plain(chunk)
            if not plain:
                continue
            fresh_plain = await self._copy_chunk(conn, plain, db_now, replayed, shared)
            if write_events and fresh_plain:
                await self.q.copy_events(conn, enqueued_events(fresh_plain))
            wakeups.add(fresh_plain)
            inserted += len(fresh_plain)
        for chunk in _chunks(iter(split.keyed()), BATCH_CHUNK):
            new_ids = set(await self._insert_keyed(conn, chunk, db_now, shared))
            taken = [j for j in chunk if j.id not in new_ids]
            if taken:
                stored = {
                    (s.queue, s.idempotency_key): job_from_row(s)
                    for s in await self.q.get_jobs_by_keys(
                        conn,
                        queues=[j.queue for j in taken],
                        idempotency_keys=[j.idempotency_key or "" for j in taken],
                    )
                }
                pairs = [(j, stored[(j.queue, j.idempotency_key)]) for j in taken]
                same = await self._same_payloads(conn, pairs)
                replayed.extend(_replay(j, found, same) for j, found in pairs)
            fresh = [j for j in chunk if j.id in new_ids]
            if fresh and write_events:
                await self._record(conn, enqueued_event_rows(fresh))
            wakeups.add(fresh)
            inserted += len(fresh)
        for queue, run_at in wakeups.plan():
            await self._notify(conn, queue, run_at)
        return BatchResult(inserted=inserted, replayed=tuple(replayed))

    async def _insert_keyed(
        self,
        conn: psycopg.AsyncConnection[Any],
        chunk: builtins.list[NewJob],
        db_now: dt.datetime,
        shared: Jsonb | None,
    ) -> builtins.list[uuid.UUID]:
        """Insert keyed jobs; the ids inserted (see Store._insert_keyed)."""
        try:
            async with conn.transaction():
                return await self.q.insert_keyed_jobs(
                    conn, **keyed_insert_args(chunk, db_now, shared)
                )
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise _other_unique_violation(exc) from exc
        taken = {row.id for row in await self.q.get_jobs_by_ids(conn, ids=[j.id for j in chunk])}
        clash = next(j for j in chunk if j.id in taken)
        raise AlreadyExists("job", clash.id)

    async def _copy_chunk(
        self,
        conn: psycopg.AsyncConnection[Any],
        plain: builtins.list[NewJob],
        db_now: dt.datetime,
        replayed: builtins.list[Job],
        shared: Jsonb | None,
    ) -> builtins.list[NewJob]:
        """COPY unkeyed jobs; the ones whose id is already stored are replays
        (see Store._copy_chunk: COPY runs in a savepoint)."""
        try:
            async with conn.transaction():
                await self.q.copy_jobs(conn, (_copy_row(j, db_now, shared) for j in plain))
            return plain
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise _other_unique_violation(exc) from exc
        stored = {
            row.id: job_from_row(row)
            for row in await self.q.get_jobs_by_ids(conn, ids=[j.id for j in plain])
        }
        fresh = [j for j in plain if j.id not in stored]
        pairs = [(j, stored[j.id]) for j in plain if j.id in stored]
        same = await self._same_payloads(conn, pairs)
        replayed.extend(_same_job_or_conflict(j, found, same) for j, found in pairs)
        if fresh:
            await self.q.copy_jobs(conn, (_copy_row(j, db_now, shared) for j in fresh))
        return fresh

    async def _same_payloads(
        self, conn: psycopg.AsyncConnection[Any], pairs: Sequence[tuple[NewJob, Job]]
    ) -> set[uuid.UUID]:
        """The stored jobs whose payload equals the one sent, compared as jsonb
        by PostgreSQL (see store._same_payloads)."""
        if not pairs:
            return set()
        return set(
            await self.q.same_payloads(
                conn,
                ids=[stored.id for _, stored in pairs],
                payloads=[raw_json(job.payload_json) for job, _ in pairs],
            )
        )

    async def _record(self, conn: psycopg.AsyncConnection[Any], rows: Iterable[EventRow]) -> None:
        """Insert the event rows the event mode wants, in one statement."""
        args = wanted_events(self.event_mode, rows)
        if args is not None:
            await self.q.insert_events(conn, **args)

    async def _notify(
        self, conn: psycopg.AsyncConnection[Any], queue: str, run_at: dt.datetime | None = None
    ) -> None:
        """Wake the workers of ``queue`` when this transaction commits (if the
        queue has room); with ``run_at``, carrying the delay (see Store._notify)."""
        usage = await self.q.notify(
            conn,
            run_at=run_at,
            channel=self.notify_channel,
            payload=queue,
            max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
        )
        self._notified(usage or 0.0)

    def _notified(self, usage: float) -> None:
        """Warn (at most every NOTIFY_WARNING_INTERVAL) when a wake-up was skipped."""
        if usage < MAX_NOTIFY_QUEUE_USAGE:
            return
        with self._notify_warn_lock:
            now = time.monotonic()
            if now - self._notify_warned_at < NOTIFY_WARNING_INTERVAL:
                return
            self._notify_warned_at = now
        # A task of its own on a pooled connection: never inside the caller's
        # transaction, never holding up the enqueue that noticed it.
        task = asyncio.get_running_loop().create_task(self._warn_notify_queue_full(usage))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _warn_notify_queue_full(self, usage: float) -> None:
        try:
            blockers = await self._on_pool_read(self.q.notify_queue_blockers)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not fail anything
            named = f"(sessions not listed: {exc})"
        else:
            named = (
                ", ".join(
                    f"PID {b.pid} ({b.application_name or 'no application_name'}, "
                    f"{b.state} since {b.xact_start:%Y-%m-%d %H:%M:%S%z})"
                    for b in blockers
                )
                or "none visible to this role"
            )
        log.warning(
            "the PostgreSQL NOTIFY queue is %.0f%% full (pg_notification_queue_usage()): "
            "jobrun sends no wake-ups until it drains, jobs are still written and workers "
            "find them by polling. A session LISTENing while idle in a long transaction "
            "holds it; sessions idle in a transaction, oldest first: %s",
            usage * 100,
            named,
        )

    async def aclose(self) -> None:
        """Wait for the diagnostics still running (the pool is the caller's to close)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # -- inspect and administer ---------------------------------------------------

    async def get(self, job_id: uuid.UUID) -> Job:
        _check_id(job_id)
        row = await self._on_pool_read(lambda c: self.q.get_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    async def list(
        self,
        *,
        queue: str | None = None,
        state: State | str | None = None,
        type: str | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first; pass a page's last id as ``after``."""
        args = list_args(queue=queue, state=state, type=type, after=after, limit=limit)
        rows = await self._on_pool_read(lambda c: self.q.list_jobs(c, **args))
        return [job_from_row(r) for r in rows]

    async def events(self, job_id: uuid.UUID) -> builtins.list[Event]:
        _check_id(job_id)
        rows = await self._on_pool_read(lambda c: self.q.list_events(c, job_id=job_id))
        return [event_from_row(r) for r in rows]

    async def cancel(self, job_id: uuid.UUID) -> Job:
        """Queued: cancelled now. Leased: cancel requested (the worker stops the
        handler at its next heartbeat). Terminal: unchanged."""
        _check_id(job_id)

        async def run(c: psycopg.AsyncConnection[Any]) -> Job:
            row = await self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.QUEUED:
                done = await self.q.cancel_queued_job(
                    c, id=job_id, finish_channel=self.finish_channel
                )
                assert done is not None
                await self._record(
                    c, [EventRow(job_id, EventKind.CANCELLED, row.attempts, {"via": "cancel"})]
                )
                return job_from_row(done)
            if row.state == models.JobState.LEASED and not row.cancel_requested:
                done = await self.q.request_cancel(c, id=job_id)
                assert done is not None
                await self._record(c, [EventRow(job_id, EventKind.CANCEL_REQUESTED, row.attempts)])
                return job_from_row(done)
            return job_from_row(row)

        return await self._with_tx(run)

    async def retry(self, job_id: uuid.UUID) -> Job:
        """Make a job runnable now: from dead, cancelled or succeeded with attempts
        reset; a queued job just moves up to now. A leased job is InvalidState."""
        _check_id(job_id)

        async def run(c: psycopg.AsyncConnection[Any]) -> Job:
            row = await self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.LEASED:
                raise InvalidState(job_id, str(row.state), "retry")
            done = await self.q.requeue_job(c, id=job_id)
            assert done is not None
            await self._record(
                c, [EventRow(job_id, EventKind.RETRIED, done.attempts, {"from": str(row.state)})]
            )
            await self._notify(c, done.queue)
            return job_from_row(done)

        return await self._with_tx(run)

    # -- waiting --------------------------------------------------------------------

    async def watch(self, job_id: uuid.UUID) -> Job:
        """Ask for the end of the job to be announced on :attr:`finish_channel`; the job now.

        LISTEN on the channel *before* calling this (see Store.watch).
        """
        _check_id(job_id)
        row = await self._on_pool(lambda c: self.q.watch_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    async def wait(
        self,
        job_id: uuid.UUID,
        timeout: float | None = None,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> Job:
        """The job once it has finished (succeeded, dead or cancelled); WaitTimeout
        (carrying the job as it stood) after ``timeout`` s, None waiting for ever.

        As :func:`jobrun.postgres.wait.wait_finished`: one connection of its own
        (``jobrun-waiter``) LISTENs on the finish channel before the job is
        watched, so the notification, sent in the transaction that ends the
        job, can be neither missed nor early; the row is re-read on each
        notification and every ``poll_interval`` s (the row is the truth).
        Behind a transaction pooler the LISTEN goes to :attr:`direct_url`, and
        without one the row is re-read every ``poll_interval`` (at most 1 s
        apart) instead: a LISTEN there would stay on whichever server session
        ran it.
        """
        _check_id(job_id)
        wait_args(timeout, poll_interval)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        target = self.direct_url
        if target is None and pooler_of(self.pool) == "transaction":
            every = min(poll_interval, 1.0)
            job = await self.watch(job_id)
            while not job.state.terminal:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    raise WaitTimeout(job, float(timeout or 0))
                await asyncio.sleep(every if left is None else min(every, left))
                job = await self.get(job_id)
            return job
        conninfo = conninfo_with(target or await self._conninfo(), application_name="jobrun-waiter")
        with translate_errors():
            async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
                await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self.finish_channel)))
                job = await self.watch(job_id)
                wanted = str(job_id)
                while not job.state.terminal:
                    left = None if deadline is None else deadline - loop.time()
                    if left is not None and left <= 0:
                        raise WaitTimeout(job, float(timeout or 0))
                    slice_ = poll_interval if left is None else min(poll_interval, left)
                    await _wait_for(conn, wanted, slice_)
                    job = await self.get(job_id)
                return job

    async def _conninfo(self) -> str:
        """The pool's connection string (the pool may hold a callable making it)."""
        given: Any = self.pool.conninfo
        text = given() if callable(given) else given
        if inspect.isawaitable(text):
            text = await text
        return str(text)


async def _wait_for(conn: psycopg.AsyncConnection[Any], payload: str, seconds: float) -> None:
    """Return when ``payload`` is notified or ``seconds`` have passed."""
    # aclosing: the generator holds the connection's lock until it is closed.
    async with contextlib.aclosing(conn.notifies(timeout=seconds)) as notes:
        async for note in notes:
            if note.payload == payload:
                return
