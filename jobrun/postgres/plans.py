"""The pure halves of the Store calls the asyncio client shares: no I/O here.

A store call is a plan (check the arguments, build the parameters of each
statement, sort a batch) and its execution on a connection. The execution is
sync in :class:`~jobrun.postgres.store.Store` and async in
:class:`~jobrun.postgres.async_store.AsyncStore`; the plans are written once,
here, on top of store.py's own helpers (the JSON parameters, the run-at
rule, the trace carrier, the replay verdicts), so that both stores send the
same parameters and reach the same verdicts. Everything raises ValidationError
before any SQL runs.
"""

from __future__ import annotations

import builtins
import datetime as dt
import uuid
from collections.abc import Iterable
from typing import Any, cast

from psycopg.types.json import Jsonb

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import EventKind, NewJob, State
from jobrun.postgres.events import EventMode, EventRow
from jobrun.postgres.sqlc import events as eq
from jobrun.postgres.sqlc import models
from jobrun.postgres.store import (
    MAX_LIST_LIMIT,
    MAX_NOTIFY_QUEUE_USAGE,
    _check_id,
    _run_at,
    _trace_json,
    backoff_json,
    raw_json,
)


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
        run_ats=[_run_at(j, db_now) for j in chunk],
        idempotency_keys=[j.idempotency_key or "" for j in chunk],
        trace_contexts=[_trace_json(j, shared) for j in chunk],
        # NULL elements where a job has no key (the array type the generator
        # writes says str).
        concurrency_keys=cast(builtins.list[str], [j.concurrency_key for j in chunk]),
    )


def enqueued_events(jobs: Iterable[NewJob]) -> Iterable[eq.CopyEventsParams]:
    """The "enqueued" rows of jobs just COPYed."""
    return (eq.CopyEventsParams(job_id=j.id, kind="enqueued", attempt=0) for j in jobs)


def enqueued_event_rows(jobs: Iterable[NewJob]) -> builtins.list[EventRow]:
    """The "enqueued" events of jobs just inserted by key."""
    return [EventRow(j.id, EventKind.ENQUEUED, 0) for j in jobs]


def wanted_events(mode: EventMode, rows: Iterable[EventRow]) -> dict[str, Any] | None:
    """The parameters of InsertEvents for the rows ``mode`` records; None when it records none."""
    wanted = [r for r in rows if mode.wants(r.kind)]
    if not wanted:
        return None
    return dict(
        job_ids=[r.job_id for r in wanted],
        kinds=[str(r.kind) for r in wanted],
        attempts=[r.attempt for r in wanted],
        details=[r.detail for r in wanted],
    )


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
        _check_id(after)
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
