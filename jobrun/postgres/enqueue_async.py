"""Enqueue: one job, a batch, many payloads of one template, keyed replays.

The source of :mod:`jobrun.postgres.enqueue` (``make generate``): edit this
file, never the generated one.

One job is one statement (INSERT ... ON CONFLICT DO NOTHING, its event and
its pg_notify), then a re-read on a replay. A batch is one transaction: its
unkeyed jobs stream through COPY chunk by chunk (bounded memory for any
iterable), its keyed ones go last in (queue, key) order so that two batches
with overlapping keys never deadlock, and one wake-up per queue is sent (one
more carrying the delay of its soonest delayed job). COPY has no ON
CONFLICT: it runs in a savepoint, and only a client id already stored (a
batch retried after its COMMIT reply was lost) sends it back for a lookup.

Idempotency: ``jobs_idem_uniq`` (queue, idempotency_key) is the conflict
target. A replay with the same body (type, payload compared as jsonb by
PostgreSQL, priority, max_attempts, backoff, concurrency key) returns the
stored job; a different body raises IdempotencyConflict. The trace context
is not part of the body.
"""

from __future__ import annotations

import builtins
import datetime as dt
import itertools
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobrun.job import propagation
from jobrun.job.errors import AlreadyExists, DatabaseError
from jobrun.job.model import BatchResult, Job, NewJob
from jobrun.postgres.convert import (
    backoff_json,
    carrier_json,
    copy_row,
    job_from_insert,
    job_from_row,
    raw_json,
    run_at,
    trace_json,
)
from jobrun.postgres.events import EventMode, EventRow
from jobrun.postgres.plans import (
    BATCH_CHUNK,
    END,
    MAX_NOTIFY_QUEUE_USAGE,
    BatchSplit,
    BatchWakeups,
    chunks,
    enqueue_args,
    enqueued_event_rows,
    enqueued_events,
    keyed_insert_args,
    many_rows,
    other_unique_violation,
    replay,
    same_job_or_conflict,
    unique_violations,
    wanted_events,
)
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.transactions_async import AsyncConn, AsyncTransactions

Carrier = propagation.Carrier | None


class AsyncEnqueue(AsyncTransactions):
    """The enqueue half of a store (see the module docstring)."""

    async def _enqueue(self, job: NewJob, conn: AsyncConn | None, carrier: Carrier) -> Job:
        """Insert ``job`` on the caller's ``conn`` (see ``_in_caller_tx``) or the pool."""
        if conn is not None:
            return await self._in_caller_tx(conn, lambda c: self._enqueue_on(c, job, carrier))
        return await self._on_pool(lambda c: self._enqueue_on(c, job, carrier))

    async def _enqueue_on(self, conn: AsyncConn, job: NewJob, carrier: Carrier = None) -> Job:
        # The insert does nothing when the key is taken (EnqueueKeyedJob) or
        # the client's id is already stored (EnqueueJob: a retry whose first
        # COMMIT reply was lost). A replay whose stored job is purged in
        # between finds no row; the next round then inserts.
        trace = trace_json(job, carrier_json(carrier))
        for _ in range(3):
            args = enqueue_args(job, trace, event_mode=self.event_mode, channel=self.notify_channel)
            with unique_violations(job):
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
                context = job.trace_context if job.trace_context is not None else carrier
                return job_from_insert(job, row, dict(context) if context else None)
            if job.idempotency_key is not None:
                stored = await self.q.get_job_by_key(
                    conn, queue=job.queue, idempotency_key=job.idempotency_key
                )
                if stored is not None:
                    found = job_from_row(stored)
                    return replay(job, found, await self._same_payloads(conn, [(job, found)]))
                continue
            same_id = await self.q.get_job(conn, id=job.id)
            if same_id is not None:
                found = job_from_row(same_id)
                same = await self._same_payloads(conn, [(job, found)])
                return same_job_or_conflict(job, found, same)
        raise DatabaseError(f"idempotency key {job.idempotency_key!r} kept changing hands")

    async def _send_batch(
        self, jobs: Iterator[NewJob], conn: AsyncConn | None, carrier: Carrier
    ) -> BatchResult:
        """A checked batch stream in one transaction, on ``conn`` or the pool."""

        async def run(c: AsyncConn) -> BatchResult:
            return await self._enqueue_batch_on(c, jobs, carrier)

        if conn is not None:
            return await self._in_caller_tx(conn, run)
        # Unbounded client-side: a streamed batch may take minutes; a dead
        # link is still caught by TCP keepalives and tcp_user_timeout.
        return await self._with_tx(run, timeout=None)

    async def _send_many(
        self, template: NewJob, payloads: Iterator[Any], conn: AsyncConn | None, carrier: Carrier
    ) -> BatchResult:
        """A checked enqueue_many in one transaction, on ``conn`` or the pool."""

        async def run(c: AsyncConn) -> BatchResult:
            return await self._enqueue_many_on(c, template, payloads, carrier)

        if conn is not None:
            return await self._in_caller_tx(conn, run)
        return await self._with_tx(run, timeout=None)  # unbounded, as a batch's

    async def _enqueue_many_on(
        self, conn: AsyncConn, template: NewJob, payloads: Iterator[Any], carrier: Carrier
    ) -> BatchResult:
        db_now = await self.q.db_now(conn)
        assert db_now is not None
        write_events = self.event_mode is EventMode.ALL
        due = run_at(template, db_now)
        shared = dict(
            queue=template.queue,
            type=template.type,
            priority=template.priority,
            max_attempts=template.max_attempts,
            backoff=backoff_json(template.backoff),
            run_at=due,
            trace_context=trace_json(template, carrier_json(carrier)),
            concurrency_key=template.concurrency_key,
        )
        inserted = 0
        while (first := next(payloads, END)) is not END:
            ids: list[uuid.UUID] = []
            read = itertools.chain([first], itertools.islice(payloads, BATCH_CHUNK - 1))
            await self.q.copy_jobs(conn, many_rows(read, inserted, ids, shared))
            if write_events:
                await self.q.copy_events(conn, enqueued_events(ids))
            inserted += len(ids)
        await self._notify(conn, template.queue, None if due <= db_now else due)
        return BatchResult(inserted=inserted)

    async def _enqueue_batch_on(
        self, conn: AsyncConn, jobs: Iterator[NewJob], carrier: Carrier
    ) -> BatchResult:
        db_now = await self.q.db_now(conn)
        assert db_now is not None
        write_events = self.event_mode is EventMode.ALL
        shared = carrier_json(carrier)  # serialised once for the whole batch
        split = BatchSplit()
        wakeups = BatchWakeups(db_now)
        inserted = 0
        replayed: list[Job] = []
        while (first := next(jobs, END)) is not END:
            # A chunk streams into its COPY as it is read: building the jobs
            # overlaps the server's inserts instead of coming before them.
            # Keyed jobs are set aside for the end, as they come.
            plain: list[NewJob] = []
            read = itertools.chain([first], itertools.islice(jobs, BATCH_CHUNK - 1))
            rows = (copy_row(j, db_now, shared) for j in split.stream(read, plain))
            fresh_plain = await self._copy_chunk(conn, plain, db_now, replayed, shared, rows=rows)
            if write_events and fresh_plain:
                await self.q.copy_events(conn, enqueued_events(j.id for j in fresh_plain))
            wakeups.add(fresh_plain)
            inserted += len(fresh_plain)
        for chunk in chunks(iter(split.keyed()), BATCH_CHUNK):
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
                replayed.extend(replay(j, found, same) for j, found in pairs)
            fresh = [j for j in chunk if j.id in new_ids]
            if fresh and write_events:
                await self._record(conn, enqueued_event_rows(fresh))
            wakeups.add(fresh)
            inserted += len(fresh)
        for queue, when in wakeups.plan():
            await self._notify(conn, queue, when)
        return BatchResult(inserted=inserted, replayed=tuple(replayed))

    async def _insert_keyed(
        self,
        conn: AsyncConn,
        chunk: builtins.list[NewJob],
        db_now: dt.datetime,
        shared: Jsonb | None,
    ) -> builtins.list[uuid.UUID]:
        """Insert keyed jobs; the ids inserted. A taken key is no insert (a replay or a
        conflict); an id taken by another job is AlreadyExists, and the chunk writes nothing."""
        try:
            async with conn.transaction():
                return await self.q.insert_keyed_jobs(
                    conn, **keyed_insert_args(chunk, db_now, shared)
                )
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise other_unique_violation(exc) from exc
        taken = {row.id for row in await self.q.get_jobs_by_ids(conn, ids=[j.id for j in chunk])}
        clash = next(j for j in chunk if j.id in taken)
        raise AlreadyExists("job", clash.id)

    async def _copy_chunk(
        self,
        conn: AsyncConn,
        plain: builtins.list[NewJob],
        db_now: dt.datetime,
        replayed: builtins.list[Job],
        shared: Jsonb | None,
        *,
        rows: Iterator[q.CopyJobsParams] | None = None,
    ) -> builtins.list[NewJob]:
        """COPY unkeyed jobs; the ones whose id is already stored are replays.

        COPY runs in a savepoint, and only when a client id is already stored
        are the existing ones looked up, compared and left out. With ``rows``,
        the COPY streams them, and they fill ``plain`` as they are read; a
        chunk the COPY did not read to its end is read out first.
        """
        try:
            async with conn.transaction():
                await self.q.copy_jobs(
                    conn,
                    rows if rows is not None else (copy_row(j, db_now, shared) for j in plain),
                )
            return plain
        except psycopg.errors.UniqueViolation as exc:
            if exc.diag.constraint_name != "jobs_pkey":
                raise other_unique_violation(exc) from exc
        if rows is not None:
            for _ in rows:
                pass
        stored = {
            row.id: job_from_row(row)
            for row in await self.q.get_jobs_by_ids(conn, ids=[j.id for j in plain])
        }
        fresh = [j for j in plain if j.id not in stored]
        pairs = [(j, stored[j.id]) for j in plain if j.id in stored]
        same = await self._same_payloads(conn, pairs)
        replayed.extend(same_job_or_conflict(j, found, same) for j, found in pairs)
        if fresh:
            await self.q.copy_jobs(conn, (copy_row(j, db_now, shared) for j in fresh))
        return fresh

    async def _same_payloads(
        self, conn: AsyncConn, pairs: Sequence[tuple[NewJob, Job]]
    ) -> set[uuid.UUID]:
        """The stored jobs whose payload equals the one sent, compared as jsonb by PostgreSQL.

        jsonb is the judge of "the same payload": 1 and 1.0 are one number, a
        float of 1e16 or more comes back as an int, -0.0 as 0, and key order is
        irrelevant; comparing in the database cannot disagree with what is stored.
        """
        if not pairs:
            return set()
        return set(
            await self.q.same_payloads(
                conn,
                ids=[stored.id for _, stored in pairs],
                payloads=[raw_json(job.payload_json) for job, _ in pairs],
            )
        )

    async def _record(self, conn: AsyncConn, rows: Iterable[EventRow]) -> None:
        """Insert the event rows the event mode wants, in one statement."""
        args = wanted_events(self.event_mode, rows)
        if args is not None:
            await self.q.insert_events(conn, **args)

    async def _notify(self, conn: AsyncConn, queue: str, when: dt.datetime | None = None) -> None:
        """Wake the workers of ``queue`` when this transaction commits (if the queue has room).

        With ``when`` (a delayed job's run_at), the wake-up carries the time
        left until then, by the database clock (see Notify).
        """
        usage = await self.q.notify(
            conn,
            run_at=when,
            channel=self.notify_channel,
            payload=queue,
            max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
        )
        self._notified(usage or 0.0)
