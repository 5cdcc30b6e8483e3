"""Store: the job.Store port on PostgreSQL, composed of its concerns.

Each concern is a module of its own, stacked into this one class:
:mod:`~jobrun.postgres.transactions` (the only place a transaction opens,
and its retry loop), :mod:`~jobrun.postgres.enqueue`,
:mod:`~jobrun.postgres.admin` (get, list, events, cancel, retry, watch,
wait), :mod:`~jobrun.postgres.limits`, :mod:`~jobrun.postgres.leases`
(claim to reap), :mod:`~jobrun.postgres.completion`, :mod:`~jobrun.postgres.schedules`
and :mod:`~jobrun.postgres.steps` (with :mod:`~jobrun.postgres.waits`); what is
left here is what only the sync
store does: the producer span around an enqueue, the leader's fence, fork
safety, the housekeeping reads and writes.

The first four are generated from the same asyncio source as
:class:`~jobrun.postgres.async_store.AsyncStore` (``tools/async_to_sync.py``),
so the two stores cannot drift apart.

Every mutating method is exactly one transaction, and every default and
comparison uses the database clock: the time arguments (``until``, ``now``,
``retry_at``) are "db now as read by the caller" (:meth:`Store.now`). Naive
datetimes are refused; results are aware UTC.
"""

from __future__ import annotations

import copy
import datetime as dt
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobrun.job import propagation, validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import (
    BatchResult,
    Job,
    LeaderTerm,
    NewJob,
)
from jobrun.postgres import forksafe
from jobrun.postgres.base import DEFAULT_CALL_TIMEOUT
from jobrun.postgres.events import EventMode
from jobrun.postgres.exchange import Exchange
from jobrun.postgres.limits import (
    _LIMITED_CLAIM_IDLE_TIMEOUT,
    LIMITED_CLAIM_IDLE_SECONDS,
    LIMITED_QUEUES_TTL,
)
from jobrun.postgres.plans import (
    BATCH_CHUNK,
    MAX_HEARTBEAT_IDS,
    MAX_LIST_LIMIT,
    MAX_NOTIFY_QUEUE_USAGE,
    NOTIFY_WARNING_INTERVAL,
    batch_stream,
    many_stream,
)
from jobrun.postgres.schedules import SchedulesMixin
from jobrun.postgres.schema import DEFAULT_SCHEMA
from jobrun.postgres.session import DEFAULT_CHANNEL
from jobrun.postgres.sqlc import Queries
from jobrun.postgres.waits import Waits
from jobrun.postgres.workers import Workers
from jobrun.postgres.workflows import Workflows

DEFAULT_NOTIFY_CHANNEL = DEFAULT_CHANNEL
DEFAULT_COMMIT_TIMEOUT = dt.timedelta(seconds=30)


class Store(SchedulesMixin, Workers, Exchange, Waits, Workflows):
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
        super().__init__(
            pool,
            event_mode=event_mode,
            notify_channel=notify_channel,
            call_timeout=call_timeout,
            schema=schema,
            direct_url=direct_url,
        )
        self.q = Queries(schema=self.schema)
        if commit_timeout is not None:
            validate.positive_duration("commit_timeout", commit_timeout)
        self.commit_timeout = commit_timeout
        self._limited = {}

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

    def _check_pool(self) -> None:
        """A pool inherited through ``fork()`` never serves this process: an
        ``open_pool`` pool has reopened itself, any other raises InheritedPool
        before a byte is sent (:mod:`jobrun.postgres.forksafe`)."""
        forksafe.check_pool(self.pool)

    def _track(self, conn: psycopg.Connection[Any]) -> None:
        """Every connection checked out is one a later child will sever."""
        forksafe.track(conn)

    def _warn_apart(self, usage: float) -> None:
        threading.Thread(
            target=self._warn_notify_queue_full,
            args=(usage,),
            name="jobrun-notify-queue-warning",
            daemon=True,
        ).start()

    # -- enqueue (the producer span around the shared half) ---------------------

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
        stream = batch_stream(jobs)
        producer = propagation.producer
        if producer is not None:
            given = jobs if isinstance(jobs, Sequence) else None
            return producer.enqueue_batch(
                given, conn is not None, lambda carrier: self._send_batch(stream, conn, carrier)
            )
        return self._send_batch(stream, conn, None)

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
        stream = many_stream(template, payloads)
        producer = propagation.producer
        if producer is not None:
            return producer.enqueue_batch(
                None,
                conn is not None,
                lambda carrier: self._send_many(template, stream, conn, carrier),
            )
        return self._send_many(template, stream, conn, None)


__all__ = [
    "BATCH_CHUNK",
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_COMMIT_TIMEOUT",
    "DEFAULT_NOTIFY_CHANNEL",
    "LIMITED_CLAIM_IDLE_SECONDS",
    "LIMITED_QUEUES_TTL",
    "MAX_HEARTBEAT_IDS",
    "MAX_LIST_LIMIT",
    "MAX_NOTIFY_QUEUE_USAGE",
    "NOTIFY_WARNING_INTERVAL",
    "_LIMITED_CLAIM_IDLE_TIMEOUT",
    "Store",
]
