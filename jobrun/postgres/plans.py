"""The pure halves of the Store calls: no I/O here.

A store call is a plan (check the arguments, build the parameters of each
statement, sort a batch, judge a replay) and its execution on a connection.
Both stores execute (sync :class:`~jobrun.postgres.store.Store`, asyncio
:class:`~jobrun.postgres.async_store.AsyncStore`, the latter generated from
the same source as the former's client half), and both build their
parameters and verdicts here, so they cannot drift apart. Everything raises
ValidationError before any SQL runs.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import itertools
import struct
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import psycopg
import psycopg.postgres
from psycopg.adapt import PyFormat, Transformer
from psycopg.pq import Format
from psycopg.types.json import Jsonb

from jobrun.job import validate
from jobrun.job.errors import AlreadyExists, DatabaseError, IdempotencyConflict, ValidationError
from jobrun.job.ids import uuid7_many
from jobrun.job.model import EventKind, Job, NewJob, State
from jobrun.postgres.convert import backoff_json, raw_json, run_at, trace_json
from jobrun.postgres.events import EventMode, EventRow
from jobrun.postgres.sqlc import events as eq
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import models

T = TypeVar("T")

BATCH_CHUNK = 5000
ID_BLOCK = 256
"""Ids enqueue_many makes at once (:func:`jobrun.job.ids.uuid7_many`)."""
MAX_HEARTBEAT_IDS = 100_000
"""The most ids one heartbeat or completion call sends (arrays, before any SQL)."""
MAX_LIST_LIMIT = 10_000
MAX_NOTIFY_QUEUE_USAGE = 0.5
"""Above this share of the server's notification queue, no wake-up is sent.

A wake-up is an optimisation; the job row is the truth. A session that
LISTENs while idle in a long transaction keeps the queue from draining, and
once it is full every COMMIT that notifies fails ("too many notifications in
the NOTIFY queue"): enqueues would stop while workers could still drain by
polling. PostgreSQL itself warns at half full, so jobrun stops notifying
there, logs a WARNING naming the sessions that may hold the queue, and
notifies again as soon as it has drained.
"""
NOTIFY_WARNING_INTERVAL = 30.0
"""Seconds between two warnings about a full notification queue (per store)."""
END = object()
"""The end of a batch's stream (a None in it is a bad item, not its end)."""


def enqueue_args(
    job: NewJob, trace: Jsonb | None, *, event_mode: EventMode, channel: str
) -> dict[str, Any]:
    """The parameters of EnqueueJob (EnqueueKeyedJob adds ``idempotency_key``)."""
    return dict(
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
        write_event=event_mode is EventMode.ALL,
        channel=channel,
        max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
    )


def keyed_insert_args(
    chunk: builtins.list[NewJob], db_now: dt.datetime, shared: Jsonb | None
) -> dict[str, Any]:
    """The parameters of InsertKeyedJobs for a chunk of keyed jobs."""
    return dict(
        ids=[j.id for j in chunk],
        queues=[j.queue for j in chunk],
        types=[j.type for j in chunk],
        payloads=[raw_json(j.payload_json) for j in chunk],
        priorities=[j.priority for j in chunk],
        max_attempts=[j.max_attempts for j in chunk],
        backoffs=[backoff_json(j.backoff) for j in chunk],
        run_ats=[run_at(j, db_now) for j in chunk],
        idempotency_keys=[j.idempotency_key or "" for j in chunk],
        trace_contexts=[trace_json(j, shared) for j in chunk],
        # NULL elements where a job has no key (the array type the generator
        # writes says str).
        concurrency_keys=cast(builtins.list[str], [j.concurrency_key for j in chunk]),
    )


def enqueued_events(ids: Iterable[uuid.UUID]) -> Iterable[eq.CopyEventsParams]:
    """The "enqueued" rows of jobs just COPYed."""
    return (eq.CopyEventsParams(job_id=i, kind="enqueued", attempt=0) for i in ids)


def enqueued_event_rows(jobs: Iterable[NewJob]) -> builtins.list[EventRow]:
    """The "enqueued" events of jobs just inserted by key."""
    return [EventRow(j.id, EventKind.ENQUEUED, 0) for j in jobs]


def list_args(
    *,
    queue: str | None,
    state: State | str | None,
    type: str | None,
    after: uuid.UUID | None,
    limit: int,
) -> dict[str, Any]:
    """The parameters of ListJobs, checked the way Store.list checks them."""
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
        check_id(after)
    validate.batch_limit(limit, MAX_LIST_LIMIT)
    return dict(queue=queue, state=st, type=type, after=after, max_rows=limit)


def wait_args(timeout: object, poll_interval: object) -> None:
    """Check a wait's ``timeout`` (seconds >= 0 or None) and ``poll_interval`` (seconds > 0)."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
    ):
        raise ValidationError("timeout", "must be a number of seconds >= 0, or None")
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float):
        raise ValidationError("poll_interval", "must be a number of seconds")
    validate.positive_duration("poll_interval", dt.timedelta(seconds=poll_interval))


def check_id(job_id: object) -> None:
    if not isinstance(job_id, uuid.UUID):
        raise ValidationError("job_id", f"must be a uuid.UUID, not {type(job_id).__name__}")


def lease_of(job: Job) -> tuple[str, uuid.UUID]:
    if not isinstance(job, Job):
        raise ValidationError("job", f"must be a jobrun.Job, not {type(job).__name__}")
    if job.lease_owner is None or job.lease_token is None:
        raise ValidationError("job", f"job {job.id} carries no lease (it was not claimed)")
    return job.lease_owner, job.lease_token


def one_owners_leases(
    jobs: Sequence[Job], call: str, field: str = "jobs"
) -> tuple[str, builtins.list[uuid.UUID], builtins.list[uuid.UUID]]:
    """The owner, ids and lease tokens of ``jobs``: leased jobs of one owner, at
    most MAX_HEARTBEAT_IDS (every batch statement on leases takes them so), or
    a ValidationError on ``field`` naming ``call``, before any SQL runs."""
    if len(jobs) > MAX_HEARTBEAT_IDS:
        raise ValidationError(field, f"at most {MAX_HEARTBEAT_IDS} jobs per call")
    owners: set[str] = set()
    tokens: builtins.list[uuid.UUID] = []
    for job in jobs:
        owner, token = lease_of(job)
        owners.add(owner)
        tokens.append(token)
    if len(owners) != 1:
        raise ValidationError(field, f"{call} takes the jobs of one owner")
    return owners.pop(), [j.id for j in jobs], tokens


def same_job_or_conflict(job: NewJob, stored: Job, same_payload: set[uuid.UUID]) -> Job:
    """A job whose id is already stored: the same job again (a replay) or a clash."""
    if (
        stored.queue == job.queue
        and stored.idempotency_key == job.idempotency_key
        and same_body(job, stored, stored.id in same_payload)
    ):
        return stored
    raise AlreadyExists("job", job.id)


def replay(job: NewJob, stored: Job, same_payload: set[uuid.UUID]) -> Job:
    """A job whose idempotency key is taken: the stored job, or IdempotencyConflict."""
    if same_body(job, stored, stored.id in same_payload):
        return stored
    assert job.idempotency_key is not None
    raise IdempotencyConflict(job.queue, job.idempotency_key, stored.id)


def same_body(job: NewJob, stored: Job, same_payload: bool) -> bool:
    """Whether a replay carries the stored job's body; ``same_payload`` is the
    database's jsonb comparison of the payloads (the SamePayloads query)."""
    return (
        same_payload
        and stored.type == job.type
        and stored.priority == job.priority
        and stored.max_attempts == job.max_attempts
        and stored.backoff == job.backoff
        and stored.concurrency_key == job.concurrency_key
    )


@contextlib.contextmanager
def unique_violations(job: NewJob) -> Iterator[None]:
    """The client's id taken by another job is AlreadyExists; any other unique
    index (none today but the idempotency key, which is the conflict target)
    is a DatabaseError naming it, never a silent replay."""
    try:
        yield
    except psycopg.errors.UniqueViolation as exc:
        if exc.diag.constraint_name == "jobs_pkey":
            raise AlreadyExists("job", job.id) from None
        raise other_unique_violation(exc) from exc


def other_unique_violation(exc: psycopg.errors.UniqueViolation) -> DatabaseError:
    return DatabaseError(
        f"the job violates the unique constraint {exc.diag.constraint_name!r}: "
        f"{exc.diag.message_detail or exc.diag.message_primary}"
    )


COPY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + struct.pack("!ii", 0, 0)
"""The header of a binary COPY stream (no flags, no extension)."""
COPY_TRAILER = struct.pack("!h", -1)
"""The end of a binary COPY stream."""
ROWS_PER_WRITE = 256
"""Rows of enqueue_many joined into one write of its COPY."""
_UUID_FIELD = struct.pack("!i", 16)
_pack_length = struct.Struct("!i").pack


def _binary_fields(values: Sequence[Any], types: Sequence[str], context: Any = None) -> bytes:
    """``values`` as the fields of a binary COPY row (each its length and its
    bytes, -1 for NULL), dumped by psycopg's own binary dumpers for ``types``
    (with the adapters and encoding of ``context``, a connection, if given)."""
    tx = Transformer(context)
    tx.set_dumper_types([psycopg.postgres.types[name].oid for name in types], Format.BINARY)
    out = bytearray()
    for data in tx.dump_sequence(values, [PyFormat.BINARY] * len(values)):
        if data is None:
            out += _pack_length(-1)
        else:
            out += _pack_length(len(data)) + bytes(data)
    return bytes(out)


class ManyRows:
    """The binary COPY stream of enqueue_many's jobs, built without a row object.

    Every job of an enqueue_many shares all but its id and payload, so the
    shared fields are dumped once (by psycopg's dumpers, for CopyJobs'
    column types) and each row is its id's 16 bytes and its payload's JSON
    text between them. The column order is CopyJobs' (a test pins it).
    """

    def __init__(self, shared: dict[str, Any], context: Any = None) -> None:
        types = q.COPY_JOBS_COPY_TYPES
        self._head = struct.pack("!h", len(types)) + _UUID_FIELD  # then the id
        self._middle = _binary_fields([shared["queue"], shared["type"]], types[1:3], context)
        self._tail = _binary_fields(
            [
                shared["priority"],
                shared["max_attempts"],
                shared["backoff"],
                shared["run_at"],
                shared["trace_context"],
                shared["concurrency_key"],
            ],
            types[4:],
            context,
        )

    def blocks(
        self, payloads: Iterator[Any], start: int, ids: builtins.list[uuid.UUID]
    ) -> Iterator[bytes]:
        """The COPY stream of ``payloads`` (signature first, trailer last), a few
        hundred rows a block: each payload checked (a bad one named by its
        position from ``start``), a new id for each (added to ``ids``)."""
        head, middle, tail = self._head, self._middle, self._tail
        block: builtins.list[bytes] = [COPY_SIGNATURE]
        fresh: Iterator[uuid.UUID] = iter(())
        for _, text in validate.payloads(payloads, start):
            job_id = next(fresh, None)
            if job_id is None:
                # Ids made a block at a time (one random read per block); the
                # ones a short batch leaves unused are simply never stored.
                fresh = iter(uuid7_many(ID_BLOCK))
                job_id = next(fresh)
            ids.append(job_id)
            data = text.encode()
            # jsonb's binary form: version 1, then the JSON text.
            block.append(
                head + job_id.bytes + middle + _pack_length(len(data) + 1) + b"\x01" + data + tail
            )
            if len(block) >= ROWS_PER_WRITE:
                yield b"".join(block)
                block = []
        block.append(COPY_TRAILER)
        yield b"".join(block)


_EVENT_HEAD = struct.pack("!h", 3) + _UUID_FIELD


def enqueued_events_copy(ids: Sequence[uuid.UUID]) -> bytes:
    """The binary COPY stream of CopyEvents for the "enqueued" events of ``ids``."""
    tail = _binary_fields(["enqueued", 0], eq.COPY_EVENTS_COPY_TYPES[1:])
    head = _EVENT_HEAD
    return b"".join([COPY_SIGNATURE, *[head + i.bytes + tail for i in ids], COPY_TRAILER])


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
            due = run_at(job, self._db_now)
            if due <= self._db_now:
                self._due.add(job.queue)
            elif (soonest := self._soonest.get(job.queue)) is None or due < soonest:
                self._soonest[job.queue] = due

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


def chunks(items: Iterator[T], size: int) -> Iterator[builtins.list[T]]:
    while chunk := builtins.list(itertools.islice(items, size)):
        yield chunk


def check_batch(jobs: Sequence[NewJob]) -> None:
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


def batch_stream(jobs: Iterable[NewJob]) -> Iterator[NewJob]:
    """A batch's jobs as a stream, checked up front as far as can be seen:
    a batch we can see whole entirely, any other for emptiness."""
    if isinstance(jobs, Sequence):
        check_batch(jobs)
    iterator = iter(jobs)
    first = next(iterator, None)
    if first is None:
        raise ValidationError("jobs", "the batch is empty")
    return itertools.chain([first], iterator)


def many_stream(template: NewJob, payloads: Iterable[Any]) -> Iterator[Any]:
    """enqueue_many's payloads as a stream, after the checks that need no SQL:
    ``template`` a NewJob without an idempotency key, at least one payload."""
    if not isinstance(template, NewJob):
        raise ValidationError("template", "must be a jobrun.NewJob")
    if template.idempotency_key is not None:
        raise ValidationError(
            "idempotency_key", "one key cannot name many jobs: give each its own NewJob"
        )
    iterator = iter(payloads)
    first = next(iterator, END)
    if first is END:
        raise ValidationError("payloads", "the batch is empty")
    return itertools.chain([first], iterator)
