"""Store: the job.Store port on PostgreSQL.

Transaction boundaries
----------------------
A transaction opens only here, through :meth:`Store._with_tx`, and every
mutating method is exactly one transaction. Where the spec's statements can
be folded into one statement (data-modifying CTEs), they are: one statement
is one transaction and one round trip.

========================  =====================================================
enqueue                   one statement: INSERT ... ON CONFLICT DO NOTHING +
                          its event + pg_notify (then a re-read on a replay)
enqueue_batch             SELECT now() + COPY jobs + COPY job_events, the keyed
                          jobs by INSERT ... ON CONFLICT in key order, one
                          pg_notify per distinct queue (and one more carrying
                          the delay of its soonest delayed job)
claim                     one statement: the FOR UPDATE SKIP LOCKED claim CTE,
                          attempts + 1 for the jobs it starts, new lease
                          token, claimed events
start_jobs                one statement: the jobs a claim did not start,
                          started (attempts + 1), fenced
complete                  BEGIN; one statement: set_config(statement_timeout,
                          local) + SELECT FOR UPDATE (owner + token check) +
                          INSERT processed_effects; the commit callable
                          (skipped when the effect row existed); one statement:
                          guarded UPDATE + event, pipelined with COMMIT. Three
                          round trips plus the callable's own statements
complete_many             one statement: lock owned rows in id order + effect
                          rows + UPDATE + events
complete_many_tx          the transactional path in batches: BEGIN; one
                          statement locking the batch in id order with its
                          ledger rows; each new effect's commit callable; one
                          finishing statement pipelined with COMMIT (one
                          COMMIT for the batch; a failing callable sends the
                          batch back through complete one job at a time)
fail                      one statement: the guarded UPDATE with its verdict +
                          event
reap_expired              SELECT expired FOR UPDATE SKIP LOCKED + one pipelined
                          batch of guarded per-row UPDATEs + batched events
cancel / retry            SELECT FOR UPDATE + UPDATE + event (+ pg_notify)
========================  =====================================================

heartbeat, purge, depth, get, list, events, prune_events and effect_done are
single statements on the pool. The pool is autocommit, so a single statement
is its own transaction and one round trip; a pooled connection the server
hung up on (restart, failover) is spotted at checkout without a round trip
and replaced (:meth:`Store._connection`).

Leases and fencing
------------------
A claim flips queued -> leased and gives the job a fresh ``lease_token``
made by the database. An attempt counts when it starts: the claim starts
(attempts + 1, ``started_at``) the first ``start`` of its jobs (None: all,
what the worker asks for: it claims no more jobs than it can run at once);
the others are leased to wait for a thread, and :meth:`Store.start_jobs`
starts them just before they run. A process that dies burns the attempt of
the jobs it started and of no other: the reaper requeues a lease that never
started at once, its attempts unchanged. Complete, Fail and Heartbeat match
owner *and* token: after the reaper requeued a job and anyone (the same
worker included) claimed it again, the old claim's token no longer matches,
so its Complete/Fail raise LeaseLost and change nothing, and its Heartbeat
omits the id. Owner and token are cleared whenever a job leaves ``leased``.
Complete and Fail never raise NotFound: a job that vanished (purged) is a
lost lease too. A Complete retried with the same claim after its COMMIT
reply was lost answers success (the job succeeded at this claim's attempt)
and runs nothing again.

Claims and heartbeats commit asynchronously (``synchronous_commit`` off for
their own transaction): a claim lost in a server crash is a job that was
never claimed, a heartbeat lost is a lease that looks shorter, and both are
covered by the fence. Everything that finishes a job commits synchronously,
and flushes the WAL of the claim before it.

Cancel wins: a job whose cancel was requested ends ``cancelled`` whichever of
Complete, complete_many, Fail or the reaper comes next; Complete then runs no
commit callable and writes no effect row.

The clock rule
--------------
Every default and comparison uses the database clock; the time arguments
(``until``, ``now``, ``retry_at``) are "db now as read by the caller"
(:meth:`now`). Naive datetimes are refused; results are aware UTC.

Idempotency
-----------
``jobs_idem_uniq`` (queue, idempotency_key) is the ON CONFLICT target. A
replay with the same type, payload (as JSON), priority, max_attempts and
backoff returns the stored job (its id differs from the one sent); a
different body raises IdempotencyConflict. A key stays taken as long as its
job exists (until purge), whatever the job's state. The trace context is
not part of the body: a replay from another trace is still a replay, and
the stored job keeps the context it was enqueued with.

Retry and effects: a retried job whose effect already committed completes
without running its commit callable again.
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import datetime as dt
import itertools
import json
import logging
import math
import select
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, cast

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from jobrun.job import propagation, validate
from jobrun.job.errors import (
    AlreadyExists,
    DatabaseError,
    IdempotencyConflict,
    InvalidState,
    LeaderLost,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    SchemaMismatch,
    TransientError,
    ValidationError,
)
from jobrun.job.model import (
    KEEP,
    Backoff,
    BatchResult,
    CompleteManyResult,
    EffectKey,
    Event,
    EventKind,
    Job,
    Keep,
    LeaderTerm,
    NewJob,
    QueueDepth,
    QueueLimits,
    RateLimit,
    ReapResult,
    State,
    StateCount,
    new_job_id,
)
from jobrun.job.ports import CommitCallable
from jobrun.postgres import effects, forksafe, reconnect
from jobrun.postgres.convert import (
    event_from_row,
    is_retryable,
    job_from_insert,
    job_from_row,
    statement_timeout_setting,
    translate_errors,
    utc,
)
from jobrun.postgres.deadline import WATCHDOG
from jobrun.postgres.events import EventMode, EventRow, record
from jobrun.postgres.notify import DEFAULT_CHANNEL, validate_channel
from jobrun.postgres.schedules import SchedulesMixin
from jobrun.postgres.schema import DEFAULT_SCHEMA, SCHEMA_VERSION, schema_name
from jobrun.postgres.sqlc import Queries, models
from jobrun.postgres.sqlc import events as eq
from jobrun.postgres.sqlc import jobs as q

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_NOTIFY_CHANNEL = DEFAULT_CHANNEL
DEFAULT_COMMIT_TIMEOUT = dt.timedelta(seconds=30)
DEFAULT_CALL_TIMEOUT = dt.timedelta(seconds=10)
"""Client-side bound of one store call (a Complete adds commit_timeout)."""
_CALL = object()  # "the store's call_timeout"
BATCH_CHUNK = 5000
MAX_HEARTBEAT_IDS = 100_000
"""The most ids one heartbeat or completion call sends (arrays, before any SQL)."""
MAX_LIST_LIMIT = 10_000


LIMITED_QUEUES_TTL = 1.0
"""Seconds a store trusts what it last read about which queues have limits.

Only the claim's route depends on it, never a limit's exactness: a claim sent
the lock-free way skips every limited queue it sees (see ClaimJobs), so a
limit set meanwhile holds that queue back for up to this long, never lets it
overshoot."""
MAX_NOTIFY_QUEUE_USAGE = 0.5
"""Above this share of the server's notification queue, no wake-up is sent.

A wake-up is an optimisation; the job row is the truth. A session that
LISTENs while idle in a long transaction keeps the queue from draining, and
once it is full every COMMIT that notifies fails ("too many notifications in
the NOTIFY queue"): enqueues would stop while workers could still drain by
polling. PostgreSQL itself warns at half full, so jobrun stops notifying
there (workers find new jobs by polling, within their poll interval), logs a
WARNING naming the sessions that may hold the queue, and notifies again as
soon as it has drained. The other half is headroom for notifications already
sent inside open transactions, the caller's included.
"""
NOTIFY_WARNING_INTERVAL = 30.0
"""Seconds between two warnings about a full notification queue (per Store)."""


LIMITED_CLAIM_IDLE_SECONDS = 2.0
"""How long a limited claim's transaction may wait for its client's COMMIT
while it holds the queue's limits row before the server ends the session
(idle_in_transaction_session_timeout): the longest a frozen worker can hold
up the other claims of a limited queue. The claim is rolled back, so nothing
is leased to the frozen worker."""
_LIMITED_CLAIM_IDLE_TIMEOUT = (
    f"SET LOCAL idle_in_transaction_session_timeout = {int(LIMITED_CLAIM_IDLE_SECONDS * 1000)}"
)


class Store(SchedulesMixin):
    """Durable job storage on a psycopg pool (see the module docstring)."""

    def __init__(
        self,
        pool: ConnectionPool[Any],
        *,
        event_mode: EventMode | str = EventMode.ALL,
        commit_timeout: dt.timedelta | None = DEFAULT_COMMIT_TIMEOUT,
        notify_channel: str = DEFAULT_NOTIFY_CHANNEL,
        call_timeout: dt.timedelta | None = DEFAULT_CALL_TIMEOUT,
        schema: str = DEFAULT_SCHEMA,
        direct_url: str | None = None,
    ) -> None:
        self.schema = schema_name(schema)
        self.direct_url = direct_url
        """A connection string to PostgreSQL itself (JOBRUN_DIRECT_URL), for
        :meth:`wait`'s LISTEN when the pool goes through a transaction pooler."""
        self._fence: LeaderTerm | None = None
        self.q = Queries(schema=self.schema)
        try:
            self.event_mode = EventMode(event_mode)
        except ValueError:
            raise ValidationError("event_mode", "must be 'all' or 'terminal'") from None
        if commit_timeout is not None:
            validate.positive_duration("commit_timeout", commit_timeout)
        self.commit_timeout = commit_timeout
        if call_timeout is not None:
            validate.positive_duration("call_timeout", call_timeout)
        self.call_timeout = None if call_timeout is None else call_timeout.total_seconds()
        self.notify_channel = validate_channel(notify_channel, "notify_channel")
        self.finish_channel = validate_channel(f"{notify_channel}_done", "notify_channel")
        """Where the end of a watched job is announced (the job's id; see :meth:`watch`)."""
        self.pool = pool
        self.outage = reconnect.outage_of(pool)
        """Where this store's database faults are reported (:mod:`jobrun.job.outage`):
        the pool's own reporter, shared by the loops that use this store."""
        self._notify_warned_at = -math.inf
        self._notify_warn_lock = threading.Lock()
        self._limited: dict[tuple[str, ...], tuple[float, dict[str, int | None]]] = {}
        self._bounds = threading.local()  # .until: this thread's deadline (see bounded)

    # -- transactions ---------------------------------------------------------

    @contextlib.contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        """Give up on the calls this thread makes inside the block ``seconds`` from now.

        Each call's client-side bound (the watchdog, the wait for a pooled
        connection) and a Complete's statement_timeout are cut to what is
        left; a call begun past it raises TransientError before anything is
        sent. The worker completes jobs within their leases this way: a
        completion stuck on a half-open connection is given up when the
        lease it completes runs out, not after ``commit_timeout`` and
        ``call_timeout``. Nested blocks keep the earlier deadline.
        """
        until = time.monotonic() + seconds
        outer: float | None = getattr(self._bounds, "until", None)
        self._bounds.until = until if outer is None else min(until, outer)
        try:
            yield
        finally:
            self._bounds.until = outer

    def _left(self, timeout: float | None) -> float | None:
        """``timeout`` cut to this thread's deadline (see :meth:`bounded`)."""
        until: float | None = getattr(self._bounds, "until", None)
        if until is None:
            return timeout
        left = until - time.monotonic()
        if left <= 0:
            raise TransientError("the caller's deadline passed before the call was sent")
        return left if timeout is None else min(timeout, left)

    def fenced(self, term: LeaderTerm) -> Store:
        """This store (same pool and settings) with every transaction fenced by ``term``.

        Each mutating call's transaction first locks the term's lease row
        FOR SHARE (FenceLeader), while holder and term match and the lease
        has not expired by the database clock, and raises LeaderLost, having
        done nothing, when the term is over. A takeover updates that row, so
        it waits for every fenced transaction in flight: an old term's
        action commits before the next term begins, or not at all (see
        jobrun.postgres.leader). Reads are not fenced.
        """
        if not isinstance(term, LeaderTerm):
            raise ValidationError("term", "must be a LeaderTerm")
        clone = copy.copy(self)
        clone._fence = term
        return clone

    def _check_fence(self, conn: psycopg.Connection[Any]) -> None:
        """The fence (see :meth:`fenced`): the first statement of a fenced transaction."""
        fence = self._fence
        if fence is None:
            return
        got = self.q.fence_leader(conn, name=fence.name, holder=fence.holder, term=fence.term)
        if got is None:
            raise LeaderLost(fence.name, fence.term)

    @contextlib.contextmanager
    def _connection(self, timeout: float | None) -> Iterator[psycopg.Connection[Any]]:
        """A live pooled connection.

        An idle pooled connection whose server went away (restart, failover,
        pg_terminate_backend) has bytes waiting on its socket: the FATAL
        message or EOF. One non-blocking poll per checkout (no round trip)
        spots it; it is closed, so the pool replaces it, and the next one is
        tried. After a restart every caller gets a fresh connection instead
        of one failure per stale connection. The call is bounded client-side
        by ``timeout`` seconds (see :mod:`jobrun.postgres.deadline`), and so
        is the wait for a connection (or by the pool's timeout, when shorter):
        a call that gets none raises ConnectionUnavailable, saying why (the
        database unavailable since when, or the pool exhausted).

        A pool inherited through ``fork()`` never serves this process: an
        ``open_pool`` pool has reopened itself, any other raises
        InheritedPool before a byte is sent, and every connection checked
        out here is one a later child will sever (:mod:`jobrun.postgres.forksafe`).
        """
        forksafe.check_pool(self.pool)
        timeout = self._left(timeout)
        started = time.monotonic()
        for _ in range(self.pool.max_size + 1):
            wait = reconnect.connection_wait(self.pool.timeout, timeout, started)
            with contextlib.ExitStack() as stack:
                try:
                    conn = stack.enter_context(self.pool.connection(timeout=wait))
                except PoolTimeout:
                    waited = time.monotonic() - started
                    raise reconnect.unavailable(self.pool, waited, timeout) from None
                forksafe.track(conn)
                if _stale(conn):
                    conn.close()
                    continue
                with WATCHDOG.watch(conn, timeout):
                    yield conn
                return
        raise TransientError("every pooled connection was dead")  # pragma: no cover

    def _with_tx(
        self, fn: Callable[[psycopg.Connection[Any]], T], *, timeout: float | object | None = _CALL
    ) -> T:
        """Run ``fn`` in one transaction on a pooled connection.

        A deadlock or serialization failure is retried once (the whole
        transaction again); a connection lost during COMMIT raises
        OutcomeUnknown.
        """
        for attempt in (1, 2):
            committing = [False]
            try:
                with (
                    translate_errors(committing=committing),
                    self._connection(self._bound(timeout)) as conn,
                ):
                    with conn.transaction():
                        self._check_fence(conn)
                        result = fn(conn)
                        committing[0] = True
                    return result
            except DatabaseError as exc:
                if attempt == 1 and is_retryable(exc.__cause__ or exc):
                    log.info("retrying a transaction after %s", exc)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _with_explicit_tx(
        self,
        fn: Callable[[psycopg.Connection[Any], list[bool]], T],
        *,
        timeout: float | object | None = _CALL,
    ) -> T:
        """Like :meth:`_with_tx`, for a ``fn`` that sends BEGIN and COMMIT itself.

        Complete pipelines COMMIT with its last statement, saving a round
        trip. ``fn`` sets the flag it is given just before COMMIT leaves, so
        that a connection lost then is OutcomeUnknown; a transaction ``fn``
        left open is committed here (the paths that only read), an aborted
        one rolled back. Deadlocks are retried once.
        """
        for attempt in (1, 2):
            committing = [False]
            try:
                with (
                    translate_errors(committing=committing),
                    self._connection(self._bound(timeout)) as conn,
                ):
                    try:
                        if self._fence is not None:
                            # fn's own BEGIN would then be a no-op warning: fenced
                            # explicit transactions are the leader's, never Complete's.
                            raise ValidationError("fenced", "a fenced store cannot complete jobs")
                        result = fn(conn, committing)
                        status = conn.info.transaction_status
                        if status == TransactionStatus.INERROR:
                            # An error swallowed inside: COMMIT would quietly roll back.
                            raise DatabaseError("the transaction was aborted before COMMIT")
                        if status == TransactionStatus.INTRANS:
                            committing[0] = True
                            conn.execute("COMMIT")
                        return result
                    except BaseException:
                        if (
                            not conn.closed
                            and not conn.broken
                            and conn.info.transaction_status != TransactionStatus.IDLE
                        ):
                            with contextlib.suppress(psycopg.Error):
                                conn.execute("ROLLBACK")
                        raise
            except DatabaseError as exc:
                if attempt == 1 and is_retryable(exc.__cause__ or exc):
                    log.info("retrying a transaction after %s", exc)
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _on_pool(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """Run a single statement (its own transaction: the pool is autocommit).

        Fenced (:meth:`fenced`), the statement runs in a transaction after the fence.
        """
        for attempt in (1, 2):
            committing = [True]  # a lone statement commits as it returns
            try:
                with (
                    translate_errors(committing=committing),
                    self._connection(self.call_timeout) as conn,
                ):
                    if self._fence is not None:
                        with conn.transaction():
                            self._check_fence(conn)
                            return fn(conn)
                    return fn(conn)
            except DatabaseError as exc:
                if attempt == 1 and is_retryable(exc.__cause__ or exc):
                    continue
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _on_pool_read(self, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        """A read: no commit outcome to be unsure about."""
        with translate_errors(), self._connection(self.call_timeout) as conn:
            return fn(conn)

    @staticmethod
    def _in_caller_tx(
        conn: psycopg.Connection[Any], fn: Callable[[psycopg.Connection[Any]], T]
    ) -> T:
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
        if not isinstance(conn, psycopg.Connection):
            raise ValidationError("conn", "must be a psycopg.Connection")
        status = conn.info.transaction_status
        if status == TransactionStatus.INERROR:
            raise ValidationError("conn", "the caller's transaction is already aborted")
        with translate_errors():
            if status == TransactionStatus.IDLE and not conn.autocommit:
                # psycopg sends the caller's BEGIN before this first statement;
                # the savepoint below then nests inside it.
                conn.execute("SELECT 1")
            with conn.transaction():
                return fn(conn)

    def _bound(self, timeout: float | object | None) -> float | None:
        if timeout is _CALL:
            return self.call_timeout
        assert timeout is None or isinstance(timeout, float)
        return timeout

    def _commit_bound(self) -> float | None:
        """The client-side bound of a Complete: its commit callables may take
        commit_timeout per statement, on top of the ordinary call bound."""
        if self.commit_timeout is None or self.call_timeout is None:
            return None
        return self.call_timeout + self.commit_timeout.total_seconds()

    def schema_version(self) -> int | None:
        """The version of the jobrun schema in the database; None when there is none."""
        try:
            return self._on_pool_read(self._bounded_schema_version)
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            return None
        except psycopg.errors.InsufficientPrivilege:
            raise DatabaseError(
                f"this role may not read {self.schema}.schema_version: grant it USAGE on "
                f"schema {self.schema} and SELECT on its tables (GRANT SELECT, INSERT, UPDATE, "
                f"DELETE ON ALL TABLES IN SCHEMA {self.schema} TO <role>)"
            ) from None

    def _bounded_schema_version(self, conn: psycopg.Connection[Any]) -> int | None:
        """The schema check, under jobrun's call bound rather than the role's
        ``statement_timeout``: a role- or database-wide timeout of a few
        milliseconds must not stop a worker from starting on a cold session,
        where this first read loads the catalog (the notifier's probes do the
        same, see notify.configure_session)."""
        with conn.transaction():
            conn.execute(
                "SELECT set_config('statement_timeout', %s, true)",
                [statement_timeout_setting(self.call_timeout)],
            )
            return self.q.schema_version(conn)

    def check_schema(self) -> None:
        """Raise SchemaMismatch unless the database holds the schema version this code needs.

        Every entry point calls it once at start: one clear line instead of a
        traceback per query when ``jobrun migrate`` was not run.
        """
        found = self.schema_version()
        if found != SCHEMA_VERSION:
            raise SchemaMismatch(self.schema, found, SCHEMA_VERSION)

    def now(self) -> dt.datetime:
        """The database's clock: the only "now" any decision may use."""
        value = self._on_pool_read(self.q.db_now)
        assert value is not None
        # In UTC even on a session whose TimeZone jobrun did not set (behind
        # a transaction pooler the pool sets no session state).
        return utc(value)

    # -- enqueue ----------------------------------------------------------------

    def enqueue(self, job: NewJob, *, conn: psycopg.Connection[Any] | None = None) -> Job:
        """Insert a job, or return the stored one on an identical idempotent replay.

        With ``conn``, the job is part of the caller's transaction (see
        :meth:`_in_caller_tx`).
        """
        if not isinstance(job, NewJob):
            raise ValidationError("job", f"must be a jobrun.NewJob, not {type(job).__name__}")
        producer = propagation.producer
        if producer is not None:
            return producer.enqueue(
                job, conn is not None, lambda carrier: self._enqueue(job, conn, carrier)
            )
        return self._enqueue(job, conn, None)

    def _enqueue(
        self,
        job: NewJob,
        conn: psycopg.Connection[Any] | None,
        carrier: propagation.Carrier | None,
    ) -> Job:
        if conn is not None:
            return self._in_caller_tx(conn, lambda c: self._enqueue_on(c, job, carrier))
        return self._on_pool(lambda c: self._enqueue_on(c, job, carrier))

    def _enqueue_on(
        self,
        conn: psycopg.Connection[Any],
        job: NewJob,
        carrier: propagation.Carrier | None = None,
    ) -> Job:
        # The insert does nothing when the key is taken (EnqueueKeyedJob) or
        # the client's id is already stored (EnqueueJob: a retry whose first
        # COMMIT reply was lost). A replay whose stored job is purged in
        # between finds no row; the next round then inserts.
        trace = _trace_json(job, _carrier_json(carrier))
        for _ in range(3):
            args: dict[str, Any] = dict(
                id=job.id,
                queue=job.queue,
                type=job.type,
                payload=raw_json(job.payload_json),
                priority=job.priority,
                max_attempts=job.max_attempts,
                backoff=backoff_json(job.backoff),
                run_at=job.run_at,
                delay_seconds=job.delay_seconds,
                trace_context=trace,
                concurrency_key=job.concurrency_key,
                write_event=self.event_mode is EventMode.ALL,
                channel=self.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
            with _unique_violations(job):
                if job.idempotency_key is None:
                    row: q.EnqueueJobRow | q.EnqueueKeyedJobRow | None = self.q.enqueue_job(
                        conn, **args
                    )
                else:
                    row = self.q.enqueue_keyed_job(
                        conn, idempotency_key=job.idempotency_key, **args
                    )
            if row is not None:
                self._notified(row.notify_queue_usage)
                context = job.trace_context if job.trace_context is not None else carrier
                return job_from_insert(job, row, dict(context) if context else None)
            if job.idempotency_key is not None:
                stored = self.q.get_job_by_key(
                    conn, queue=job.queue, idempotency_key=job.idempotency_key
                )
                if stored is not None:
                    found = job_from_row(stored)
                    return _replay(job, found, _same_payloads(self.q, conn, [(job, found)]))
                continue
            same_id = self.q.get_job(conn, id=job.id)
            if same_id is not None:
                found = job_from_row(same_id)
                return _same_job_or_conflict(
                    job, found, _same_payloads(self.q, conn, [(job, found)])
                )
        raise DatabaseError(f"idempotency key {job.idempotency_key!r} kept changing hands")

    def _notified(self, usage: float) -> None:
        """Warn (at most every NOTIFY_WARNING_INTERVAL) when a wake-up was skipped."""
        if usage < MAX_NOTIFY_QUEUE_USAGE:
            return
        with self._notify_warn_lock:
            now = time.monotonic()
            if now - self._notify_warned_at < NOTIFY_WARNING_INTERVAL:
                return
            self._notify_warned_at = now
        threading.Thread(
            target=self._warn_notify_queue_full,
            args=(usage,),
            name="jobrun-notify-queue-warning",
            daemon=True,
        ).start()

    def _warn_notify_queue_full(self, usage: float) -> None:
        # On its own thread and pooled connection: never inside the caller's
        # transaction, never holding up the enqueue that noticed it.
        try:
            blockers = self._on_pool_read(self.q.notify_queue_blockers)
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

    def enqueue_batch(
        self, jobs: Iterable[NewJob], *, conn: psycopg.Connection[Any] | None = None
    ) -> BatchResult:
        """Insert many jobs in one transaction, all or nothing, streamed through COPY.

        Jobs without an idempotency key are streamed in chunks (bounded
        memory, whatever the iterable's length). Keyed jobs are held back and
        inserted last, sorted by (queue, key), so that two batches with
        overlapping keys never deadlock; a key already stored with an
        identical body is a replay (the stored job comes back in
        ``replayed``), a different body fails the whole batch with
        IdempotencyConflict. An empty batch and a key repeated inside the
        batch are ValidationErrors.
        """
        if isinstance(jobs, Sequence):
            _check_batch(jobs)
        iterator = iter(jobs)
        first = next(iterator, None)
        if first is None:
            raise ValidationError("jobs", "the batch is empty")
        stream = itertools.chain([first], iterator)

        def send(carrier: propagation.Carrier | None) -> BatchResult:
            def run(c: psycopg.Connection[Any]) -> BatchResult:
                return self._enqueue_batch_on(c, stream, carrier)

            if conn is not None:
                return self._in_caller_tx(conn, run)
            # Unbounded client-side: a streamed batch may take minutes; a dead
            # link is still caught by TCP keepalives and tcp_user_timeout.
            return self._with_tx(run, timeout=None)

        producer = propagation.producer
        if producer is not None:
            given = jobs if isinstance(jobs, Sequence) else None
            return producer.enqueue_batch(given, conn is not None, send)
        return send(None)

    def enqueue_many(
        self,
        template: NewJob,
        payloads: Iterable[Any],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> BatchResult:
        """One job like ``template`` per payload, each with a new id, in one transaction.

        The columnar batch (``Client.enqueue_many``): ``template`` was checked
        when it was made, each payload is checked here as an enqueue checks
        one (a bad one a ValidationError naming its position, rolling back
        what was sent), and the rows go to COPY as they are made: no NewJob
        per job, no replay to look for (the ids are new), chunks of
        BATCH_CHUNK with their "enqueued" events, one wake-up per batch.
        ``template`` may have no idempotency key; an empty batch is a
        ValidationError, before any SQL.
        """
        if not isinstance(template, NewJob):
            raise ValidationError("template", "must be a jobrun.NewJob")
        if template.idempotency_key is not None:
            raise ValidationError(
                "idempotency_key", "one key cannot name many jobs: give each its own NewJob"
            )
        iterator = iter(payloads)
        first = next(iterator, _END)
        if first is _END:
            raise ValidationError("payloads", "the batch is empty")
        stream = itertools.chain([first], iterator)

        def send(carrier: propagation.Carrier | None) -> BatchResult:
            def run(c: psycopg.Connection[Any]) -> BatchResult:
                return self._enqueue_many_on(c, template, stream, carrier)

            if conn is not None:
                return self._in_caller_tx(conn, run)
            return self._with_tx(run, timeout=None)  # unbounded, as enqueue_batch's

        producer = propagation.producer
        if producer is not None:
            return producer.enqueue_batch(None, conn is not None, send)
        return send(None)

    def _enqueue_many_on(
        self,
        conn: psycopg.Connection[Any],
        template: NewJob,
        payloads: Iterator[Any],
        carrier: propagation.Carrier | None,
    ) -> BatchResult:
        db_now = self.q.db_now(conn)
        assert db_now is not None
        write_events = self.event_mode is EventMode.ALL
        run_at = _run_at(template, db_now)
        shared = dict(
            queue=template.queue,
            type=template.type,
            priority=template.priority,
            max_attempts=template.max_attempts,
            backoff=backoff_json(template.backoff),
            run_at=run_at,
            trace_context=_trace_json(template, _carrier_json(carrier)),
            concurrency_key=template.concurrency_key,
        )
        inserted = 0
        while (first := next(payloads, _END)) is not _END:
            ids: list[uuid.UUID] = []
            read = itertools.chain([first], itertools.islice(payloads, BATCH_CHUNK - 1))
            self.q.copy_jobs(conn, _many_rows(read, inserted, ids, shared))
            if write_events:
                self.q.copy_events(
                    conn,
                    (eq.CopyEventsParams(job_id=i, kind="enqueued", attempt=0) for i in ids),
                )
            inserted += len(ids)
        self._notify(conn, template.queue, None if run_at <= db_now else run_at)
        return BatchResult(inserted=inserted)

    def _enqueue_batch_on(
        self,
        conn: psycopg.Connection[Any],
        jobs: Iterator[NewJob],
        carrier: propagation.Carrier | None,
    ) -> BatchResult:
        db_now = self.q.db_now(conn)
        assert db_now is not None
        write_events = self.event_mode is EventMode.ALL
        shared = _carrier_json(carrier)  # serialised once for the whole batch
        split = BatchSplit()
        wakeups = BatchWakeups(db_now)
        inserted = 0
        replayed: list[Job] = []
        while (first := next(jobs, _END)) is not _END:
            # A chunk streams into its COPY as it is read: building the jobs
            # (their payloads' checks and serialisation, for enqueue_many)
            # overlaps the server's inserts instead of coming before them.
            # Keyed jobs are set aside for the end, as they come.
            plain: list[NewJob] = []
            read = itertools.chain([first], itertools.islice(jobs, BATCH_CHUNK - 1))
            rows = (_copy_row(j, db_now, shared) for j in split.stream(read, plain))
            fresh_plain = self._copy_chunk(conn, plain, db_now, replayed, shared, rows=rows)
            if write_events and fresh_plain:
                self.q.copy_events(
                    conn,
                    (
                        eq.CopyEventsParams(job_id=j.id, kind="enqueued", attempt=0)
                        for j in fresh_plain
                    ),
                )
            wakeups.add(fresh_plain)
            inserted += len(fresh_plain)
        for chunk in _chunks(iter(split.keyed()), BATCH_CHUNK):
            new_ids = set(self._insert_keyed(conn, chunk, db_now, shared))
            taken = [j for j in chunk if j.id not in new_ids]
            if taken:
                stored = {
                    (s.queue, s.idempotency_key): job_from_row(s)
                    for s in self.q.get_jobs_by_keys(
                        conn,
                        queues=[j.queue for j in taken],
                        idempotency_keys=[j.idempotency_key or "" for j in taken],
                    )
                }
                pairs = [(j, stored[(j.queue, j.idempotency_key)]) for j in taken]
                same = _same_payloads(self.q, conn, pairs)
                replayed.extend(_replay(j, found, same) for j, found in pairs)
            fresh = [j for j in chunk if j.id in new_ids]
            if fresh and write_events:
                record(
                    self.q,
                    conn,
                    self.event_mode,
                    (EventRow(j.id, EventKind.ENQUEUED, 0) for j in fresh),
                )
            wakeups.add(fresh)
            inserted += len(fresh)
        for queue, run_at in wakeups.plan():
            self._notify(conn, queue, run_at)
        return BatchResult(inserted=inserted, replayed=tuple(replayed))

    def _notify(
        self, conn: psycopg.Connection[Any], queue: str, run_at: dt.datetime | None = None
    ) -> None:
        """Wake the workers of ``queue`` when this transaction commits (if the queue has room).

        With ``run_at`` (a delayed job's), the wake-up carries the time left
        until then, by the database clock (see Notify).
        """
        usage = self.q.notify(
            conn,
            run_at=run_at,
            channel=self.notify_channel,
            payload=queue,
            max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
        )
        self._notified(usage or 0.0)

    def _insert_keyed(
        self,
        conn: psycopg.Connection[Any],
        chunk: builtins.list[NewJob],
        db_now: dt.datetime,
        shared: Jsonb | None,
    ) -> builtins.list[uuid.UUID]:
        """Insert keyed jobs; the ids inserted. A taken key is no insert (a replay or a
        conflict); an id taken by another job is AlreadyExists, and the chunk writes nothing."""
        try:
            with conn.transaction():
                return self.q.insert_keyed_jobs(
                    conn,
                    ids=[j.id for j in chunk],
                    queues=[j.queue for j in chunk],
                    types=[j.type for j in chunk],
                    payloads=[raw_json(j.payload_json) for j in chunk],
                    priorities=[j.priority for j in chunk],
                    max_attempts=[j.max_attempts for j in chunk],
                    backoffs=[backoff_json(j.backoff) for j in chunk],
                    run_ats=[_run_at(j, db_now) for j in chunk],
                    idempotency_keys=[j.idempotency_key or "" for j in chunk],
                    trace_contexts=[_trace_json(j, shared) for j in chunk],
                    # NULL elements where a job has no key (the array type
                    # the generator writes says str).
                    concurrency_keys=cast(builtins.list[str], [j.concurrency_key for j in chunk]),
                )
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise _other_unique_violation(exc) from exc
        taken = {row.id for row in self.q.get_jobs_by_ids(conn, ids=[j.id for j in chunk])}
        clash = next(j for j in chunk if j.id in taken)
        raise AlreadyExists("job", clash.id)

    def _copy_chunk(
        self,
        conn: psycopg.Connection[Any],
        plain: builtins.list[NewJob],
        db_now: dt.datetime,
        replayed: builtins.list[Job],
        shared: Jsonb | None,
        *,
        rows: Iterator[q.CopyJobsParams] | None = None,
    ) -> builtins.list[NewJob]:
        """COPY unkeyed jobs; the ones whose id is already stored are replays.

        COPY has no ON CONFLICT: it runs in a savepoint, and only when a
        client id is already stored (a batch retried after its COMMIT reply
        was lost) are the existing ones looked up, compared and left out.
        With ``rows``, the COPY streams them, and they fill ``plain`` as they
        are read; a chunk the COPY did not read to its end is read out first.
        """
        try:
            with conn.transaction():
                self.q.copy_jobs(
                    conn,
                    rows if rows is not None else (_copy_row(j, db_now, shared) for j in plain),
                )
            return plain
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise _other_unique_violation(exc) from exc
        if rows is not None:
            for _ in rows:
                pass
        stored = {
            row.id: job_from_row(row)
            for row in self.q.get_jobs_by_ids(conn, ids=[j.id for j in plain])
        }
        fresh = [j for j in plain if j.id not in stored]
        pairs = [(j, stored[j.id]) for j in plain if j.id in stored]
        same = _same_payloads(self.q, conn, pairs)
        replayed.extend(_same_job_or_conflict(j, found, same) for j, found in pairs)
        if fresh:
            self.q.copy_jobs(conn, (_copy_row(j, db_now, shared) for j in fresh))
        return fresh

    # -- leases -----------------------------------------------------------------

    def claim(
        self,
        owner: str,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        *,
        start: int | None = None,
    ) -> builtins.list[Job]:
        """Lease up to ``limit`` runnable jobs of ``queues`` to ``owner`` for ``ttl``.

        The first ``start`` of them (claim order; None: all) start at once:
        their attempt is counted. The others are leased with their attempt
        uncounted (``started_at`` None) until :meth:`start_jobs` starts them;
        a lease that expires first gives the job back without burning one.
        """
        names, args = self._claim_args(owner, queues, limit, ttl, start)
        if not self._any_limited(names):
            rows = self._on_pool(lambda c: self.q.claim_jobs(c, **args))
        else:

            def locked(c: psycopg.Connection[Any], committing: list[bool]) -> list[models.Job]:
                with c.pipeline():
                    c.execute("BEGIN")
                    claimed = self._limited_claim(c, names, args, committing, commit_async=True)
                    return claimed()

            rows = self._with_explicit_tx(locked)
        return [job_from_row(r) for r in rows]

    def _claim_args(
        self,
        owner: str,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start: int | None,
    ) -> tuple[builtins.list[str], dict[str, Any]]:
        """The queues' names and a claim statement's arguments, all checked."""
        validate.owner(owner)
        if isinstance(queues, str) or not queues:
            raise ValidationError("queues", "must be a non-empty list of queue names")
        names = [validate.queue_name(name, "queues") for name in queues]
        validate.claim_limit(limit)
        starting = validate.claim_start(start, limit)
        validate.positive_duration("ttl", ttl)
        return names, dict(
            queues=names,
            max_jobs=limit,
            start=starting,
            owner=owner,
            ttl_seconds=ttl.total_seconds(),
            write_events=self.event_mode is EventMode.ALL,
        )

    def _limited_claim(
        self,
        c: psycopg.Connection[Any],
        names: builtins.list[str],
        args: dict[str, Any],
        committing: list[bool],
        *,
        commit_async: bool,
    ) -> Callable[[], builtins.list[models.Job]]:
        """Send the rest of a limited claim's transaction, in the pipeline its
        caller opened with BEGIN, and COMMIT; the claim's rows come later.

        A generic plan for the claim (planning it afresh costs more than
        running it), the limits rows' lock, then the claim (a statement of its
        own: its snapshot is taken once the lock is granted), sent deferred
        so that COMMIT leaves with it: one round trip in all. The queue's
        lock is held until COMMIT arrives; a client frozen in between (a
        stopped process, a dead link) must not stall every claim of the
        queue, so the server ends such a transaction (rolling the claim back)
        after a while.
        """
        c.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        c.execute(_LIMITED_CLAIM_IDLE_TIMEOUT)
        self.q.lock_queue_limits(c, queues=names)
        claimed = self.q.claim_limited_jobs_deferred(c, **args, commit_async=commit_async)
        committing[0] = True
        c.execute("COMMIT")
        return claimed

    def _any_limited(self, names: builtins.list[str]) -> bool:
        """Whether a limit applies to one of the queues (cached, see _limits_of)."""
        return bool(self._limits_of(names))

    def _limits_of(self, names: builtins.list[str]) -> dict[str, int | None]:
        """The limited queues among ``names``, each with its global concurrency
        (None: not limited that way), read at most every LIMITED_QUEUES_TTL
        seconds per list of queues."""
        key = tuple(names)
        now = time.monotonic()
        cached = self._limited.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        rows = self._on_pool_read(lambda c: self.q.limited_queues(c, queues=names))
        limits = {row.queue: row.concurrency for row in rows}
        if len(self._limited) > 1024:
            self._limited.clear()
        self._limited[key] = (now + LIMITED_QUEUES_TTL, limits)
        return limits

    def queues_limited(self, queues: Sequence[str]) -> bool:
        """Whether a limit applies to one of ``queues``, as this store last read
        it (at most LIMITED_QUEUES_TTL seconds ago): no round trip most times."""
        return bool(self.limited_queues(queues))

    def limited_queues(self, queues: Sequence[str]) -> Mapping[str, int | None]:
        """The limited queues among ``queues``, each with its global
        concurrency limit (None: limited otherwise), as this store last read
        them (at most LIMITED_QUEUES_TTL seconds ago, or since this store last
        changed a limit): no round trip most times."""
        names = [validate.queue_name(name, "queues") for name in queues]
        return self._limits_of(names) if names else {}

    def limits_hold_back(self, queues: Sequence[str]) -> float | None:
        """Whether a limit (not a lack of work) holds back ready jobs of ``queues``.

        For a worker whose claim came back short. None: no limit holds work
        back. Otherwise the seconds until a claim may get some: until the
        oldest start leaves a full rate window, or 0 when that cannot be told
        (a slot frees when a job finishes, here or on another worker). Either
        way no wake-up comes, so the worker claims again by itself.
        """
        names = [validate.queue_name(name, "queues") for name in queues]
        if not names or not self._any_limited(names):
            return None
        wait: float | None = self._on_pool_read(lambda c: self.q.limits_hold_back(c, queues=names))
        return None if wait is None else max(float(wait), 0.0)

    def set_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: RateLimit | str | None = None,
    ) -> QueueLimits:
        """Replace every limit of ``queue``; None removes that limit.

        The limits live in the database, so every worker on every host applies
        them to its next claim (within LIMITED_QUEUES_TTL for a queue that had
        none). Exact, because claims of a limited queue take turns on its
        limits row and count with a snapshot taken after the previous claim
        committed:

        - ``concurrency``: never more than this many of the queue's jobs
          leased at once. A lease counts until its job leaves the leased
          state: a killed worker's jobs hold their slots until the reaper
          requeues them after their lease expires.
        - ``per_key``: never more than this many leased at once with the same
          ``concurrency_key`` (jobs without a key count only against
          ``concurrency``). A busy key never holds back the keys behind it.
        - ``rate`` (``RateLimit`` or text such as ``"100/s"``): in any window
          of ``rate.period``, at most ``rate.limit`` jobs started, where a
          start is a claim, timed by the database clock
          (``statement_timestamp()`` once the claim holds the queue's lock).
          A sliding window, not a bucket: no burst above the limit, ever.

        Leases taken before a limit was set or lowered are not revoked; the
        limit holds for every claim after it. Raising or setting a limit wakes
        the queue's workers.
        """
        if isinstance(rate, str):
            rate = RateLimit.parse(rate)
        limits = QueueLimits(queue=queue, concurrency=concurrency, per_key=per_key, rate=rate)
        if concurrency is None and per_key is None and rate is None:
            raise ValidationError(
                "limits",
                "give at least one of concurrency, per_key, rate (clear_queue_limits lifts them)",
            )
        self._on_pool(
            lambda c: self.q.set_queue_limits(
                c,
                queue=limits.queue,
                concurrency=concurrency,
                per_key=per_key,
                rate_limit=None if rate is None else rate.limit,
                rate_period_seconds=None if rate is None else rate.period.total_seconds(),
                channel=self.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
        )
        self._limited.clear()
        return self.queue_limits(limits.queue)

    def change_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        per_key: int | Keep | None = KEEP,
        rate: RateLimit | str | Keep | None = KEEP,
    ) -> QueueLimits:
        """Change only the limits named (None removes one); the others stay.

        What ``jobrun queues limit`` does: atomic against another change of
        the same queue (two operators each setting a different limit both
        land). Removing the last limit lifts them all. The guarantees are
        :meth:`set_queue_limits`'s.
        """
        validate.queue_name(queue)
        if isinstance(rate, str):
            rate = RateLimit.parse(rate)
        QueueLimits(
            queue=queue,
            concurrency=None if isinstance(concurrency, Keep) else concurrency,
            per_key=None if isinstance(per_key, Keep) else per_key,
            rate=None if isinstance(rate, Keep) else rate,
        )  # every value checked before any SQL runs
        if all(isinstance(v, Keep) for v in (concurrency, per_key, rate)):
            return self.queue_limits(queue)
        if any(v is not None and not isinstance(v, Keep) for v in (concurrency, per_key, rate)):
            # A limit is set, so the row can never be left empty: one upsert.
            rate_value = None if isinstance(rate, Keep) else rate
            self._on_pool(
                lambda c: self.q.change_queue_limits(
                    c,
                    queue=queue,
                    concurrency=None if isinstance(concurrency, Keep) else concurrency,
                    per_key=None if isinstance(per_key, Keep) else per_key,
                    rate_limit=None if rate_value is None else rate_value.limit,
                    rate_period_seconds=None
                    if rate_value is None
                    else rate_value.period.total_seconds(),
                    keep_concurrency=isinstance(concurrency, Keep),
                    keep_per_key=isinstance(per_key, Keep),
                    keep_rate=isinstance(rate, Keep),
                    channel=self.notify_channel,
                    max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                )
            )
        else:
            # Only removals: rewrite (or delete) the row while holding it.
            def remove(c: psycopg.Connection[Any]) -> None:
                row = self.q.lock_queue_limits_row(c, queue=queue)
                if row is None:
                    return
                left_concurrency = None if concurrency is None else row.concurrency
                left_per_key = None if per_key is None else row.per_key
                left_rate = None if rate is None else row.rate_limit
                left_period = None if rate is None else row.rate_period_seconds
                if left_concurrency is None and left_per_key is None and left_rate is None:
                    self.q.delete_queue_limits(
                        c,
                        queue=queue,
                        channel=self.notify_channel,
                        max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                    )
                else:
                    self.q.set_queue_limits(
                        c,
                        queue=queue,
                        concurrency=left_concurrency,
                        per_key=left_per_key,
                        rate_limit=left_rate,
                        rate_period_seconds=left_period,
                        channel=self.notify_channel,
                        max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                    )

            self._with_tx(remove)
        self._limited.clear()
        return self.queue_limits(queue)

    def clear_queue_limits(self, queue: str) -> bool:
        """Lift every limit of ``queue``; False when it had none."""
        validate.queue_name(queue)
        removed = self._on_pool(
            lambda c: self.q.delete_queue_limits(
                c, queue=queue, channel=self.notify_channel, max_notify_usage=MAX_NOTIFY_QUEUE_USAGE
            )
        )
        self._limited.clear()
        return bool(removed)

    def queue_limits(self, queue: str) -> QueueLimits:
        """The queue's limits and what they hold now (all None: no limits)."""
        validate.queue_name(queue)
        found = [lim for lim in self.all_queue_limits() if lim.queue == queue]
        return found[0] if found else QueueLimits(queue=queue)

    def all_queue_limits(self) -> builtins.list[QueueLimits]:
        """Every limited queue's limits and what they hold now, by queue name.

        A row no jobrun call could have written (a queue name or a limit out
        of range, put there by hand) is left out with a WARNING, rather than
        making every reader fail: no worker can claim such a queue anyway.
        """
        found: builtins.list[QueueLimits] = []
        for r in self._on_pool_read(self.q.list_queue_limits):
            try:
                found.append(
                    QueueLimits(
                        queue=r.queue,
                        concurrency=r.concurrency,
                        per_key=r.per_key,
                        rate=None
                        if r.rate_limit is None or r.rate_period_seconds is None
                        else RateLimit(r.rate_limit, dt.timedelta(seconds=r.rate_period_seconds)),
                        leased=r.leased or 0,
                        started_in_window=r.started_in_window or 0,
                        updated_at=utc(r.updated_at),
                    )
                )
            except ValidationError as exc:
                log.warning("ignoring the queue_limits row of queue %r: %s", r.queue, exc)
        return found

    def record_progress(self, job: Job, progress: float, message: str | None = None) -> dt.datetime:
        """Store a running job's progress (a fraction from 0 to 1, and a message).

        Fenced like a heartbeat: LeaseLost when the claim no longer holds the
        job. Returns when it was recorded (database clock). The worker's
        ``JobContext.progress`` throttles the calls.
        """
        owner, token = _lease_of(job)
        value = validate.progress(progress)
        text = None if message is None else validate.progress_message(message)
        at = self._on_pool(
            lambda c: self.q.record_progress(
                c, progress=value, message=text, id=job.id, owner=owner, token=token
            )
        )
        if at is None:
            raise LeaseLost(job.id)
        return utc(at)

    def heartbeat(
        self, owner: str, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], until: dt.datetime
    ) -> set[uuid.UUID]:
        """Extend the live leases among ``leases`` (id, token) to ``until``; return the kept ids.

        An id left out was not extended: its lease expired, moved to another
        claim, or its cancel was requested. The worker cancels those jobs.
        """
        validate.owner(owner)
        validate.aware_datetime("until", until)
        if not leases:
            return set()
        if len(leases) > MAX_HEARTBEAT_IDS:
            raise ValidationError("leases", f"at most {MAX_HEARTBEAT_IDS} per heartbeat")
        pairs = dict(leases)  # duplicates collapse
        kept = self._on_pool(
            lambda c: self.q.heartbeat_jobs(
                c, until=until, ids=list(pairs), tokens=list(pairs.values()), owner=owner
            )
        )
        return set(kept)

    def start_jobs(self, jobs: Sequence[Job]) -> builtins.list[Job]:
        """Start claimed jobs their claim did not start: count each one's attempt
        just before its handler runs; return the jobs started, as they now stand.

        Fenced like a heartbeat (owner + token, a live lease, no cancel
        requested): a job left out must not run (its lease is gone, or its
        cancel was requested). A job this claim already started is returned
        as it is, counted once, so a call retried after a lost reply is safe.
        One owner's jobs, at most MAX_HEARTBEAT_IDS.
        """
        if not jobs:
            return []
        if len(jobs) > MAX_HEARTBEAT_IDS:
            raise ValidationError("jobs", f"at most {MAX_HEARTBEAT_IDS} jobs per call")
        leases = [_lease_of(j) for j in jobs]
        owners = {owner for owner, _ in leases}
        if len(owners) != 1:
            raise ValidationError("jobs", "start_jobs takes the jobs of one owner")
        rows = self._on_pool(
            lambda c: self.q.start_jobs(
                c,
                ids=[j.id for j in jobs],
                tokens=[token for _, token in leases],
                owner=owners.pop(),
            )
        )
        started = {row.id: row for row in rows}
        return [
            dataclasses.replace(
                j, attempts=started[j.id].attempts, started_at=utc(started[j.id].started_at)
            )
            for j in jobs
            if j.id in started
        ]

    def complete(
        self, job: Job, commit: CommitCallable | None = None, *, result: Any = None
    ) -> Job:
        """Finish a claimed job: succeeded, or cancelled when cancel was requested.

        With ``commit``, the handler's callable runs inside this transaction
        after the effect row is inserted, and only when that row is new. A
        lost lease, a failing callable or ``commit_timeout`` rolls everything
        back, the callable's writes included. ``result`` (any JSON value, the
        handler's return value) is stored with the success, in the same
        transaction; a cancelled job keeps none.
        """
        owner, token = _lease_of(job)
        if commit is not None and not callable(commit):
            raise ValidationError("commit", "must be callable")
        result_text = validate.result(result)

        key = EffectKey.of(job)
        begin = self._begin_with_timeout()

        def run(c: psycopg.Connection[Any], committing: list[bool]) -> Job:
            # BEGIN with the timeout (one simple-protocol round trip), then one
            # statement: lock, fence check, ledger row. The timeout is in force
            # before the row lock is requested, so it bounds that wait too.
            # (Pipelining these measured slower than plain round trips: leaving
            # pipeline mode costs a Sync round trip of its own.)
            c.execute(begin)
            row = self.q.complete_begin(
                c,
                owner=owner,
                token=token,
                id=job.id,
                scope=key.scope,
                key=key.key,
            )
            if row is None:
                raise LeaseLost(job.id)  # the job is gone (purged)
            if not row.owned:
                # This very claim finished the job (its token is the row's
                # finished_token): a Complete retried after its COMMIT reply
                # was lost answers with the job as that Complete left it.
                # Any other claim, stale after a reap and a retry cycle that
                # repeated the same attempt count included, lost its lease.
                if row.finished_by_claim:
                    done = self.q.get_job(c, id=job.id)
                    assert done is not None
                    return job_from_row(done)
                raise LeaseLost(job.id)
            detail: dict[str, str] | None
            if row.cancel_requested:
                # Cancel wins: no callable, no effect row.
                state, detail = models.JobState.CANCELLED, {"via": "complete"}
            else:
                if row.effect_new and commit is not None:
                    effects.run_commit(c, commit, job)
                state = models.JobState.SUCCEEDED
                detail = (
                    None
                    if commit is None
                    else {"effect": "applied" if row.effect_new else "already_applied"}
                )
            # Round trip 3: the finishing statement and COMMIT, pipelined.
            # (The row is ours and locked: the statement matches it. Any error
            # comes back at the sync and rolls the whole transaction back.)
            state_now = State(state.value)
            committing[0] = True
            with c.pipeline():
                self.q.complete_finish(
                    c,
                    state=state,
                    id=job.id,
                    owner=owner,
                    token=token,
                    detail=detail,
                    result_json=None if result_text is None else raw_json(result_text),
                    finish_channel=self.finish_channel,
                )
                c.execute("COMMIT")
            return dataclasses.replace(
                job,
                state=state_now,
                cancel_requested=row.cancel_requested,
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                finished_at=utc(row.now),
                updated_at=utc(row.now),
                result=result if state_now is State.SUCCEEDED and result_text is not None else None,
            )

        return self._with_explicit_tx(run, timeout=self._commit_bound())

    def complete_many(
        self, jobs: Sequence[Job], *, results: Mapping[uuid.UUID, Any] | None = None
    ) -> CompleteManyResult:
        """Complete many claimed jobs (no commit callables) in one statement, each fenced.

        ``results`` maps a job's id to its handler's return value (stored with
        its success); every value is checked before any SQL runs.
        """
        if not jobs:
            return CompleteManyResult(
                completed=frozenset(), cancelled=frozenset(), lease_lost=frozenset()
            )
        args = self._complete_jobs_args(jobs, results)
        rows = self._on_pool(lambda c: self.q.complete_jobs(c, **args))
        return _completed_outcome(jobs, rows)

    def _complete_jobs_args(
        self, jobs: Sequence[Job], results: Mapping[uuid.UUID, Any] | None
    ) -> dict[str, Any]:
        """CompleteJobs' arguments for ``jobs`` (one owner's, at most
        MAX_HEARTBEAT_IDS), every result checked before any SQL runs."""
        if len(jobs) > MAX_HEARTBEAT_IDS:
            raise ValidationError("jobs", f"at most {MAX_HEARTBEAT_IDS} jobs per call")
        owners = {_lease_of(j)[0] for j in jobs}
        if len(owners) != 1:
            raise ValidationError("jobs", "complete_many takes the jobs of one owner")
        keys = [EffectKey.of(j) for j in jobs]
        return dict(
            ids=[j.id for j in jobs],
            tokens=[_lease_of(j)[1] for j in jobs],
            scopes=[k.scope for k in keys],
            keys=[k.key for k in keys],
            results=_result_texts(jobs, results),
            owner=owners.pop(),
            finish_channel=self.finish_channel,
        )

    def complete_and_claim(
        self,
        jobs: Sequence[Job],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start: int | None = None,
    ) -> tuple[CompleteManyResult, builtins.list[Job]]:
        """:meth:`complete_many` of ``jobs`` and :meth:`claim` for their owner, in
        one transaction (one round trip): the claim counts the slots of a
        queue's limits that the completions free.

        For a worker whose queue a global concurrency limit keeps full: apart,
        a completion frees slots while the previous claim is still on its way
        and the next one comes a round trip later; together, a finished job's
        slot is taken again in the statement after its completion. The
        transaction commits synchronously (the completions' durability); a
        fault leaves both undone, or (OutcomeUnknown) both unknown, and
        retrying either alone is safe. ``start`` as in :meth:`claim`.
        """
        if not jobs:
            raise ValidationError("jobs", "must not be empty (claim alone: Store.claim)")
        names, args = self._claim_args(jobs[0].lease_owner or "", queues, limit, ttl, start)
        completing = self._complete_jobs_args(jobs, results)

        def both(
            c: psycopg.Connection[Any], committing: list[bool]
        ) -> tuple[list[q.CompleteJobsRow], list[models.Job]]:
            with c.pipeline():
                c.execute("BEGIN")
                completed = self.q.complete_jobs_deferred(c, **completing)
                claimed = self._limited_claim(c, names, args, committing, commit_async=False)
                return completed(), claimed()

        rows, claimed = self._with_explicit_tx(both)
        return _completed_outcome(jobs, rows), [job_from_row(r) for r in claimed]

    def complete_many_tx(
        self,
        items: Sequence[tuple[Job, CommitCallable | None]],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
    ) -> CompleteManyResult:
        """Complete many claimed jobs of one owner, each with its commit callable, in one
        transaction: the transactional path past the one-COMMIT-per-job ceiling.

        Every job keeps Complete's guarantees: fenced by owner and token, its
        effect row inserted before its callable runs, the callable skipped
        when that row existed, cancel wins. The batch commits once. When a
        callable raises (or a statement fails), the whole batch rolls back
        and each job is completed alone with :meth:`complete`, so one bad
        callable costs the others a retry, never their effect; the jobs that
        fail alone are returned in ``failed``. Database faults
        (TransientError, OutcomeUnknown) are raised for the caller to retry:
        a retry is safe, since a job this claim completed reports completed.
        """
        if not items:
            return CompleteManyResult(
                completed=frozenset(), cancelled=frozenset(), lease_lost=frozenset()
            )
        if len(items) > MAX_HEARTBEAT_IDS:
            raise ValidationError("items", f"at most {MAX_HEARTBEAT_IDS} jobs per call")
        jobs = [job for job, _ in items]
        owners = {_lease_of(j)[0] for j in jobs}
        if len(owners) != 1:
            raise ValidationError("items", "complete_many_tx takes the jobs of one owner")
        if len({j.id for j in jobs}) != len(jobs):
            raise ValidationError("items", "a job appears twice")
        for _, commit in items:
            if commit is not None and not callable(commit):
                raise ValidationError("commit", "must be callable")
        owner = owners.pop()
        keys = [EffectKey.of(j) for j in jobs]
        texts = dict(zip((j.id for j in jobs), _result_texts(jobs, results), strict=True))
        begin = self._begin_with_timeout()

        def run(c: psycopg.Connection[Any], committing: list[bool]) -> CompleteManyResult:
            c.execute(begin)
            rows = self.q.complete_begin_many(
                c,
                ids=[j.id for j in jobs],
                tokens=[_lease_of(j)[1] for j in jobs],
                scopes=[k.scope for k in keys],
                keys=[k.key for k in keys],
                owner=owner,
            )
            by_id = {r.id: r for r in rows}
            completed: set[uuid.UUID] = set()
            cancelled: set[uuid.UUID] = set()
            lost: set[uuid.UUID] = set()
            finish: list[tuple[uuid.UUID, models.JobState, dict[str, str] | None]] = []
            for job, commit in items:
                row = by_id.get(job.id)
                if row is None or not row.owned:
                    # Finished by this very claim before (a retried batch)?
                    if row is not None and row.finished_by_claim:
                        done = row.state == models.JobState.SUCCEEDED
                        (completed if done else cancelled).add(job.id)
                    else:
                        lost.add(job.id)
                    continue
                if row.cancel_requested:
                    cancelled.add(job.id)
                    finish.append((job.id, models.JobState.CANCELLED, {"via": "complete"}))
                    continue
                if row.effect_new and commit is not None:
                    effects.run_commit(c, commit, job)
                detail = (
                    None
                    if commit is None
                    else {"effect": "applied" if row.effect_new else "already_applied"}
                )
                completed.add(job.id)
                finish.append((job.id, models.JobState.SUCCEEDED, detail))
            committing[0] = True
            with c.pipeline():
                if finish:
                    self.q.complete_finish_many(
                        c,
                        ids=[f[0] for f in finish],
                        states=[f[1] for f in finish],
                        details=[f[2] for f in finish],
                        results=[texts[f[0]] for f in finish],
                        owner=owner,
                        finish_channel=self.finish_channel,
                    )
                c.execute("COMMIT")
            return CompleteManyResult(
                completed=frozenset(completed),
                cancelled=frozenset(cancelled),
                lease_lost=frozenset(lost),
            )

        try:
            return self._with_explicit_tx(run, timeout=self._commit_bound())
        except (TransientError, OutcomeUnknown):
            raise
        except Exception as exc:  # noqa: BLE001 - a commit callable's own error, whatever it is
            log.info(
                "a batch of %d completions rolled back (%s); completing one by one", len(items), exc
            )
            return self._complete_one_by_one(items, results or {})

    def _complete_one_by_one(
        self,
        items: Sequence[tuple[Job, CommitCallable | None]],
        results: Mapping[uuid.UUID, Any],
    ) -> CompleteManyResult:
        completed: set[uuid.UUID] = set()
        cancelled: set[uuid.UUID] = set()
        lost: set[uuid.UUID] = set()
        failed: dict[uuid.UUID, BaseException] = {}
        for job, commit in items:
            try:
                done = self.complete(job, commit, result=results.get(job.id))
            except LeaseLost:
                lost.add(job.id)
            except (TransientError, OutcomeUnknown):
                raise
            except Exception as exc:  # noqa: BLE001 - reported per job, as the caller's to handle
                failed[job.id] = exc
            else:
                (cancelled if done.state is State.CANCELLED else completed).add(job.id)
        return CompleteManyResult(
            completed=frozenset(completed),
            cancelled=frozenset(cancelled),
            lease_lost=frozenset(lost),
            failed=failed,
        )

    def _begin_with_timeout(self) -> str:
        """BEGIN, with commit_timeout as the transaction's statement_timeout.

        Sent as one simple-protocol string (one round trip), so the timeout
        is in force before Complete's first statement waits for the row lock.
        """
        seconds = None if self.commit_timeout is None else self.commit_timeout.total_seconds()
        seconds = self._left(seconds)  # within the caller's deadline (see bounded)
        if seconds is None:
            return "BEGIN"
        ms = statement_timeout_setting(seconds)
        return f"BEGIN; SET LOCAL statement_timeout = {ms}"

    def fail(
        self,
        job: Job,
        error: str,
        retry_at: dt.datetime | None,
        *,
        permanent: bool = False,
    ) -> Job:
        """Fail the current attempt: queued again at ``retry_at``, dead, or cancelled.

        Dead when ``permanent`` or no attempts are left; cancelled when cancel
        was requested. ``retry_at`` is db now (as read by the caller) plus the
        job's backoff; None means now.
        """
        owner, token = _lease_of(job)
        if not isinstance(error, str):
            raise ValidationError("error", "must be a str")
        if retry_at is not None:
            validate.aware_datetime("retry_at", retry_at)
        text = validate.error_text(error)
        row = self._on_pool(
            lambda c: self.q.fail_job(
                c,
                permanent=bool(permanent),
                retry_at=retry_at,
                error=text,
                id=job.id,
                owner=owner,
                token=token,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
            )
        )
        if row is None:
            raise LeaseLost(job.id)
        return job_from_row(row)

    def release(self, job: Job, delay: dt.timedelta, reason: str, *, snooze: bool = False) -> Job:
        """Give a claimed job back without counting its attempt: queued again after
        ``delay`` (from the database clock), or cancelled when cancel was requested.

        For a worker that cannot run the job (no handler for its type, say,
        while a newer worker rolls out), so that a job is never burnt to dead
        by workers that do not know it. The caller bounds how often it does
        this; ``reason`` is kept as ``last_error`` and in the event. The
        attempt given back is the one its start counted: a job released
        before it started keeps its attempts as they are.

        ``snooze``: the handler asked to run again later (``jobrun.Snooze``).
        The attempt is given back all the same and ``snoozes`` counts it; the
        event is "snoozed" and ``last_error`` is left as it was (a snooze is
        no error).
        """
        owner, token = _lease_of(job)
        validate.delay(delay)
        if not isinstance(reason, str):
            raise ValidationError("reason", "must be a str")
        text = validate.error_text(reason)
        row = self._on_pool(
            lambda c: self.q.release_job(
                c,
                snooze=bool(snooze),
                delay_seconds=delay.total_seconds(),
                reason=text,
                id=job.id,
                owner=owner,
                token=token,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
            )
        )
        if row is None:
            raise LeaseLost(job.id)
        return job_from_row(row)

    def reap_expired(self, now: dt.datetime, limit: int) -> ReapResult:
        """Requeue, kill or cancel up to ``limit`` jobs whose lease expired before ``now``.

        The verdict and backoff come from each job's own policy: cancelled
        when cancel was requested, dead when no attempts are left, otherwise
        queued after its backoff. A lease whose attempt never started (its
        job waited for a thread of a worker that died) burned nothing: the
        job is queued again at ``now`` with its attempts and ``last_error``
        unchanged, and its "reaped" event says ``"started": false``. A job
        that finished between the SELECT and the UPDATE is left alone (the
        UPDATE re-checks the lease).
        """
        validate.aware_datetime("now", now)
        validate.batch_limit(limit)

        def run(c: psycopg.Connection[Any]) -> ReapResult:
            rows = [
                job_from_row(r) for r in self.q.select_expired_leases(c, now=now, max_jobs=limit)
            ]
            if not rows:
                return ReapResult(requeued=[], dead=[], cancelled=[])
            params = []
            for job in rows:
                assert job.lease_token is not None  # leased rows carry a lease (CHECK)
                error: str | None = f"lease expired (owner {job.lease_owner})"
                if job.cancel_requested:
                    verdict, run_at = State.CANCELLED, None
                elif not job.started:
                    # Leased, never run: no attempt was burned, none is due.
                    verdict, run_at, error = State.QUEUED, now, None
                elif job.attempts >= job.max_attempts:
                    verdict, run_at = State.DEAD, None
                else:
                    verdict, run_at = State.QUEUED, now + job.backoff.delay(job.attempts)
                params.append(
                    q.ReapJobParams(
                        state=models.JobState(verdict.value),
                        run_at=run_at,
                        last_error=error,
                        id=job.id,
                        token=job.lease_token,
                        now=now,
                        finish_channel=self.finish_channel,
                    )
                )
            reaped = self.q.reap_job(c, params)
            result = ReapResult(requeued=[], dead=[], cancelled=[])
            events: builtins.list[EventRow] = []
            for job, p, got in zip(rows, params, reaped, strict=True):
                if got is None:
                    continue
                verdict = State(p.state.value)
                {
                    State.QUEUED: result.requeued,
                    State.DEAD: result.dead,
                    State.CANCELLED: result.cancelled,
                }[verdict].append(job.id)
                detail: dict[str, Any] = {"verdict": verdict.value, "owner": job.lease_owner}
                if not job.started:
                    detail["started"] = False
                events.append(EventRow(job.id, EventKind.REAPED, job.attempts, detail))
                if verdict.terminal:
                    events.append(
                        EventRow(job.id, EventKind(verdict.value), job.attempts, {"via": "reaper"})
                    )
            record(self.q, c, self.event_mode, events)
            return result

        return self._with_tx(run)

    # -- administration ---------------------------------------------------------

    def watch(self, job_id: uuid.UUID) -> Job:
        """Ask for the end of the job to be announced on :attr:`finish_channel`; the job now.

        LISTEN on the channel *before* calling this: every transition that
        ends the job from now on sends its id there, in its own transaction.
        A job already finished is returned as it is (nothing will be sent).
        """
        _check_id(job_id)
        row = self._on_pool(lambda c: self.q.watch_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    def wait(
        self, job_id: uuid.UUID, timeout: float | None = None, *, poll_interval: float = 5.0
    ) -> Job:
        """The job once it has finished (succeeded, dead or cancelled), woken by a
        notification (see :mod:`jobrun.postgres.wait`); WaitTimeout after ``timeout`` s."""
        from jobrun.postgres.wait import wait_finished  # noqa: PLC0415 - a cycle otherwise

        _check_id(job_id)
        return wait_finished(self, job_id, timeout, poll_interval=poll_interval)

    def get(self, job_id: uuid.UUID) -> Job:
        _check_id(job_id)
        row = self._on_pool_read(lambda c: self.q.get_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    def list(
        self,
        *,
        queue: str | None = None,
        state: State | str | None = None,
        type: str | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first.

        Pass the last id of a page as ``after`` to get the next page.
        """
        if queue is not None:
            validate.queue_name(queue)
        if type is not None:
            validate.job_type(type)
        st = None
        if state is not None:
            try:
                st = models.JobState(State(state).value)
            except ValueError:
                raise ValidationError("state", f"unknown state {state!r}") from None
        if after is not None:
            _check_id(after)
        validate.batch_limit(limit, MAX_LIST_LIMIT)
        rows = self._on_pool_read(
            lambda c: self.q.list_jobs(
                c, queue=queue, state=st, type=type, after=after, max_rows=limit
            )
        )
        return [job_from_row(r) for r in rows]

    def cancel(self, job_id: uuid.UUID) -> Job:
        """Queued: cancelled now. Leased: cancel requested (the next heartbeat
        drops it and the worker stops the handler). Terminal: unchanged."""
        _check_id(job_id)

        def run(c: psycopg.Connection[Any]) -> Job:
            row = self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.QUEUED:
                done = self.q.cancel_queued_job(c, id=job_id, finish_channel=self.finish_channel)
                assert done is not None
                record(
                    self.q,
                    c,
                    self.event_mode,
                    [EventRow(job_id, EventKind.CANCELLED, row.attempts, {"via": "cancel"})],
                )
                return job_from_row(done)
            if row.state == models.JobState.LEASED and not row.cancel_requested:
                done = self.q.request_cancel(c, id=job_id)
                assert done is not None
                record(
                    self.q,
                    c,
                    self.event_mode,
                    [EventRow(job_id, EventKind.CANCEL_REQUESTED, row.attempts)],
                )
                return job_from_row(done)
            return job_from_row(row)

        return self._with_tx(run)

    def retry(self, job_id: uuid.UUID) -> Job:
        """Make a job runnable now: from dead, cancelled or succeeded with attempts
        reset; a queued job just moves up to now. A leased job is InvalidState."""
        _check_id(job_id)

        def run(c: psycopg.Connection[Any]) -> Job:
            row = self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.LEASED:
                raise InvalidState(job_id, str(row.state), "retry")
            done = self.q.requeue_job(c, id=job_id)
            assert done is not None
            record(
                self.q,
                c,
                self.event_mode,
                [EventRow(job_id, EventKind.RETRIED, done.attempts, {"from": str(row.state)})],
            )
            self._notify(c, done.queue)
            return job_from_row(done)

        return self._with_tx(run)

    def purge(self, older_than: dt.timedelta, limit: int) -> int:
        """Delete up to ``limit`` terminal jobs that finished more than ``older_than`` ago."""
        validate.delay(older_than, "older_than")
        validate.batch_limit(limit)
        return self._on_pool(
            lambda c: self.q.purge_jobs(c, age_seconds=older_than.total_seconds(), max_jobs=limit)
        )

    def depth(self) -> builtins.list[QueueDepth]:
        rows = self._on_pool_read(self.q.queue_depth)
        return [
            QueueDepth(
                queue=r.queue, ready=r.ready, scheduled=r.scheduled, leased=r.leased, dead=r.dead
            )
            for r in rows
        ]

    def events(self, job_id: uuid.UUID) -> builtins.list[Event]:
        _check_id(job_id)
        return [
            event_from_row(r)
            for r in self._on_pool_read(lambda c: self.q.list_events(c, job_id=job_id))
        ]

    def prune_events(self, older_than: dt.timedelta, limit: int) -> int:
        validate.delay(older_than, "older_than")
        validate.batch_limit(limit)
        return self._on_pool(
            lambda c: self.q.prune_events(
                c, age_seconds=older_than.total_seconds(), max_events=limit
            )
        )

    def state_counts(self, queue: str | None = None) -> dict[State, StateCount]:
        """Jobs and attempts burned per state, for ``queue`` or every queue."""
        if queue is not None:
            validate.queue_name(queue)
        rows = self._on_pool_read(lambda c: self.q.count_by_state(c, queue=queue))
        return {
            State(r.state): StateCount(state=State(r.state), jobs=r.jobs, attempts=r.attempts)
            for r in rows
        }

    def pause_queue(self, queue: str) -> None:
        """Stop every worker from claiming from ``queue``; enqueue still works."""
        validate.queue_name(queue)
        self._on_pool(lambda c: self.q.pause_queue(c, queue=queue))

    def resume_queue(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again; False when it was not paused."""
        validate.queue_name(queue)
        usage = self._on_pool(
            lambda c: self.q.resume_queue(
                c,
                queue=queue,
                channel=self.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
        )
        if usage is None:
            return False
        self._notified(usage)
        return True

    def paused_queues(self) -> builtins.list[str]:
        return self._on_pool_read(self.q.paused_queues)

    def effect_done(self, job: Job | EffectKey) -> bool:
        """Whether the job's (or key's) effect has committed."""
        key = job if isinstance(job, EffectKey) else EffectKey.of(job)
        return self._on_pool_read(lambda c: effects.effect_done(self.q, c, key))


# -- helpers ---------------------------------------------------------------------


def _stale(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection has been hung up on (see Store._connection)."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


def _same_job_or_conflict(job: NewJob, stored: Job, same_payload: set[uuid.UUID]) -> Job:
    """A job whose id is already stored: the same job again (a replay) or a clash."""
    if (
        stored.queue == job.queue
        and stored.idempotency_key == job.idempotency_key
        and same_body(job, stored, stored.id in same_payload)
    ):
        return stored
    raise AlreadyExists("job", job.id)


def _replay(job: NewJob, stored: Job, same_payload: set[uuid.UUID]) -> Job:
    """A job whose idempotency key is taken: the stored job, or IdempotencyConflict."""
    if same_body(job, stored, stored.id in same_payload):
        return stored
    assert job.idempotency_key is not None
    raise IdempotencyConflict(job.queue, job.idempotency_key, stored.id)


def same_body(job: NewJob, stored: Job, same_payload: bool) -> bool:
    """Whether a replay carries the stored job's body; ``same_payload`` is the
    database's jsonb comparison of the payloads (:func:`_same_payloads`)."""
    return (
        same_payload
        and stored.type == job.type
        and stored.priority == job.priority
        and stored.max_attempts == job.max_attempts
        and stored.backoff == job.backoff
        and stored.concurrency_key == job.concurrency_key
    )


def _same_payloads(
    queries: Queries, conn: psycopg.Connection[Any], pairs: Sequence[tuple[NewJob, Job]]
) -> set[uuid.UUID]:
    """The stored jobs whose payload equals the one sent, compared as jsonb by PostgreSQL.

    jsonb is the judge of "the same payload": 1 and 1.0 are one number, a
    float of 1e16 or more comes back as an int, -0.0 as 0, and key order is
    irrelevant. Comparing Python values read back would call those
    conflicts; comparing in the database cannot disagree with what is stored.
    """
    if not pairs:
        return set()
    return set(
        queries.same_payloads(
            conn,
            ids=[stored.id for _, stored in pairs],
            payloads=[raw_json(job.payload_json) for job, _ in pairs],
        )
    )


@contextlib.contextmanager
def _unique_violations(job: NewJob) -> Iterator[None]:
    """The client's id taken by another job is AlreadyExists; any other unique
    index (none today but the idempotency key, which is the conflict target)
    is a DatabaseError naming it, never a silent replay."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "jobs_pkey":
            raise AlreadyExists("job", job.id) from None
        raise _other_unique_violation(exc) from exc


def _other_unique_violation(exc: psycopg.errors.UniqueViolation) -> DatabaseError:
    return DatabaseError(
        f"the job violates the unique constraint {exc.diag.constraint_name!r}: "
        f"{exc.diag.message_detail or exc.diag.message_primary}"
    )


def _completed_outcome(
    jobs: Sequence[Job], rows: Sequence[q.CompleteJobsRow]
) -> CompleteManyResult:
    """CompleteJobs' rows as an outcome: the jobs finished now, and those this
    very claim finished before (a call retried after its COMMIT reply was
    lost); the others lost their lease."""
    completed = frozenset(r.id for r in rows if r.state == models.JobState.SUCCEEDED)
    cancelled = frozenset(r.id for r in rows if r.state == models.JobState.CANCELLED)
    lost = frozenset(j.id for j in jobs) - completed - cancelled
    return CompleteManyResult(completed=completed, cancelled=cancelled, lease_lost=lost)


def _result_texts(
    jobs: Sequence[Job], results: Mapping[uuid.UUID, Any] | None
) -> builtins.list[Jsonb | None]:
    """Each job's result as stored (checked, serialised once), aligned with ``jobs``."""
    if not results:
        return [None] * len(jobs)
    texts = [validate.result(results.get(j.id)) for j in jobs]
    return [None if t is None else raw_json(t) for t in texts]


def _check_id(job_id: object) -> None:
    if not isinstance(job_id, uuid.UUID):
        raise ValidationError("job_id", f"must be a uuid.UUID, not {type(job_id).__name__}")


def _lease_of(job: Job) -> tuple[str, uuid.UUID]:
    if not isinstance(job, Job):
        raise ValidationError("job", f"must be a jobrun.Job, not {type(job).__name__}")
    if job.lease_owner is None or job.lease_token is None:
        raise ValidationError("job", f"job {job.id} carries no lease (it was not claimed)")
    return job.lease_owner, job.lease_token


def _identity(text: str) -> str:
    return text


def raw_json(text: str) -> Jsonb:
    """A jsonb parameter from JSON text already made (sent as is, not serialised again)."""
    return Jsonb(text, dumps=_identity)


_backoff_json: dict[Backoff, Jsonb] = {}


def backoff_json(policy: Backoff) -> Jsonb:
    """The stored form of a policy, serialised once per distinct policy."""
    cached = _backoff_json.get(policy)
    if cached is None:
        cached = raw_json(json.dumps(policy.to_json(), separators=(",", ":")))
        if len(_backoff_json) < 1024:
            _backoff_json[policy] = cached
    return cached


def _run_at(job: NewJob, db_now: dt.datetime) -> dt.datetime:
    if job.run_at is not None:
        return job.run_at
    if job.delay is not None:
        return db_now + job.delay
    return db_now


def _carrier_json(carrier: propagation.Carrier | None) -> Jsonb | None:
    """The enqueue's trace carrier as stored: serialised once, shared by its jobs."""
    return None if carrier is None else raw_json(json.dumps(carrier, separators=(",", ":")))


def _trace_json(job: NewJob, shared: Jsonb | None) -> Jsonb | None:
    """The creation context stored with ``job``: its own if it brings one, else the enqueue's."""
    return shared if job.trace_context is None else Jsonb(job.trace_context)


def _copy_row(job: NewJob, db_now: dt.datetime, shared: Jsonb | None) -> q.CopyJobsParams:
    return q.CopyJobsParams(
        id=job.id,
        queue=job.queue,
        type=job.type,
        payload=raw_json(job.payload_json),
        priority=job.priority,
        max_attempts=job.max_attempts,
        backoff=backoff_json(job.backoff),
        run_at=_run_at(job, db_now),
        trace_context=_trace_json(job, shared),
        concurrency_key=job.concurrency_key,
    )


_END = object()
"""The end of a batch's stream (a None in it is a bad item, not its end)."""


def _many_rows(
    payloads: Iterator[Any],
    start: int,
    ids: builtins.list[uuid.UUID],
    shared: dict[str, Any],
) -> Iterator[q.CopyJobsParams]:
    """The COPY rows of enqueue_many: each payload checked (a bad one named by its
    position from ``start``), a new id for each (added to ``ids``)."""
    for _, text in validate.payloads(payloads, start):
        job_id = new_job_id()
        ids.append(job_id)
        yield q.CopyJobsParams(id=job_id, payload=raw_json(text), **shared)


class BatchWakeups:
    """The wake-ups a batch sends when it commits: per queue, one for its jobs
    due now and one for its soonest delayed job (whose payload carries the
    delay, see Notify). Later delayed jobs of the batch are found by polling
    or by the claims the soonest one's wake-up starts.
    """

    def __init__(self, db_now: dt.datetime) -> None:
        self._db_now = db_now
        self._due: set[str] = set()
        self._soonest: dict[str, dt.datetime] = {}

    def add(self, jobs: Iterable[NewJob]) -> None:
        """Count the new jobs ``jobs`` (the ones actually inserted)."""
        for job in jobs:
            run_at = _run_at(job, self._db_now)
            if run_at <= self._db_now:
                self._due.add(job.queue)
            elif (soonest := self._soonest.get(job.queue)) is None or run_at < soonest:
                self._soonest[job.queue] = run_at

    def plan(self) -> builtins.list[tuple[str, dt.datetime | None]]:
        """(queue, run_at of the soonest delayed job or None for the due ones), sorted."""
        wakeups: builtins.list[tuple[str, dt.datetime | None]] = [(q, None) for q in self._due]
        wakeups += self._soonest.items()
        return sorted(wakeups, key=lambda w: (w[0], w[1] is not None, w[1] or self._db_now))


class BatchSplit:
    """Sorts a batch as it streams by: unkeyed jobs go now, keyed ones wait.

    Unkeyed jobs are COPYed chunk by chunk as they come; keyed jobs are held
    back and inserted last in (queue, key) order, so that two batches with
    overlapping keys never deadlock. A foreign item or a key seen twice is a
    ValidationError (the batch is one transaction: nothing stays written).
    """

    def __init__(self) -> None:
        self._keyed: dict[tuple[str, str], NewJob] = {}

    def stream(self, chunk: Iterable[object], plain: builtins.list[NewJob]) -> Iterator[NewJob]:
        """The unkeyed jobs of ``chunk`` as they are read, each also added to
        ``plain``; its keyed jobs are kept for :meth:`keyed`."""
        for job in chunk:
            if not isinstance(job, NewJob):
                raise ValidationError(
                    "jobs", f"every item must be a NewJob, not {type(job).__name__}"
                )
            if job.idempotency_key is None:
                plain.append(job)
                yield job
                continue
            slot = (job.queue, job.idempotency_key)
            if slot in self._keyed:
                raise ValidationError(
                    "jobs", f"idempotency key {job.idempotency_key!r} appears twice in the batch"
                )
            self._keyed[slot] = job

    def plain(self, chunk: Iterable[object]) -> builtins.list[NewJob]:
        """The unkeyed jobs of ``chunk``; its keyed jobs are kept for :meth:`keyed`."""
        plain: builtins.list[NewJob] = []
        for _ in self.stream(chunk, plain):
            pass
        return plain

    def keyed(self) -> builtins.list[NewJob]:
        """Every keyed job seen, in (queue, key) order."""
        return [self._keyed[slot] for slot in sorted(self._keyed)]


def _chunks(items: Iterator[T], size: int) -> Iterator[builtins.list[T]]:
    while chunk := builtins.list(itertools.islice(items, size)):
        yield chunk


def _check_batch(jobs: Sequence[NewJob]) -> None:
    """Up-front checks for a batch we can see whole: before any SQL runs."""
    if not jobs:
        raise ValidationError("jobs", "the batch is empty")
    seen: set[tuple[str, str]] = set()
    for job in jobs:
        if not isinstance(job, NewJob):
            raise ValidationError("jobs", f"every item must be a NewJob, not {type(job).__name__}")
        if job.idempotency_key is not None:
            slot = (job.queue, job.idempotency_key)
            if slot in seen:
                raise ValidationError(
                    "jobs", f"idempotency key {job.idempotency_key!r} appears twice in the batch"
                )
            seen.add(slot)
