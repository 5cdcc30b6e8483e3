"""The producer side written once: what the sync Client and the AsyncClient share.

:class:`jobrun.Client` and :class:`jobrun.AsyncClient` take the same
arguments, apply the same defaults and raise the same ValidationErrors
before any SQL; only their calls into the store differ (one awaits). So
every argument is checked and shaped here, and each client is a thin
layer of calls: an option added to one cannot be missed by the other,
and the two cannot drift (``AsyncClient.enqueue_many`` once built every
job before sending the first).

The options are ``TypedDict``\\ s unpacked as keyword arguments, so a
type checker checks every call of both clients against one definition.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, TypedDict

from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, JSONValue, NewJob, State

__all__ = [
    "EnqueueOptions",
    "JobOptions",
    "ListFilters",
    "WorkflowFilters",
    "job_id",
    "list_filters",
    "new_job",
    "store_options",
    "template",
    "workflow_filters",
    "workflow_id",
]


class JobOptions(TypedDict, total=False):
    """What every job of a batch shares (``enqueue_many``); NewJob's defaults apply."""

    queue: str
    priority: int
    max_attempts: int
    backoff: Backoff
    run_at: dt.datetime | None
    delay: dt.timedelta | None
    concurrency_key: str | None


class EnqueueOptions(JobOptions, total=False):
    """One job's options (``enqueue``): the shared ones, its key and its id."""

    idempotency_key: str | None
    id: uuid.UUID | None


class ListFilters(TypedDict, total=False):
    """``list``'s filters: queue, state, type, the last id of the page before, a limit."""

    queue: str | None
    state: State | str | None
    type: str | None
    after: uuid.UUID | str | None
    limit: int


class WorkflowFilters(TypedDict, total=False):
    """``workflows``'s filters: state (running, succeeded, failed, cancelled),
    name, the last id of the page before, a limit."""

    state: str | None
    name: str | None
    before: uuid.UUID | str | None
    limit: int


_JOB_OPTIONS = frozenset(JobOptions.__annotations__)
_ENQUEUE_OPTIONS = frozenset(EnqueueOptions.__annotations__) | _JOB_OPTIONS
_LIST_FILTERS = frozenset(ListFilters.__annotations__)
_WORKFLOW_FILTERS = frozenset(WorkflowFilters.__annotations__)


def _known(call: str, given: dict[str, Any], known: frozenset[str]) -> None:
    """A misspelt option is the TypeError Python raises for any unknown keyword."""
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"{call}() got an unexpected keyword argument {unknown[0]!r}")


def new_job(job_type: str, payload: JSONValue, options: EnqueueOptions) -> NewJob:
    """The NewJob of ``enqueue(type, payload, **options)`` (a new id unless one is given)."""
    if not options.keys() <= _ENQUEUE_OPTIONS:
        _known("enqueue", dict(options), _ENQUEUE_OPTIONS)
    if payload is None:
        payload = {}
    fields: dict[str, Any] = options  # type: ignore[assignment]
    if "id" in fields and fields["id"] is None:  # None: a new id, as when not given
        fields = {k: v for k, v in fields.items() if k != "id"}
    return NewJob(type=job_type, payload=payload, **fields)


def template(job_type: object, options: JobOptions) -> NewJob:
    """The NewJob every job of ``enqueue_many(type, payloads, **options)`` is like."""
    if not isinstance(job_type, str):
        raise ValidationError(
            "type",
            "enqueue_many takes a job type and its payloads; NewJobs go through enqueue_batch",
        )
    _known("enqueue_many", dict(options), _JOB_OPTIONS)
    return NewJob(type=job_type, **options)


def job_id(value: uuid.UUID | str) -> uuid.UUID:
    """A job id given as a UUID or its text; anything else is a ValidationError."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValidationError("job_id", f"{value!r} is not a job id (a UUID)") from None


def workflow_id(value: uuid.UUID | str) -> uuid.UUID:
    """A workflow id given as a UUID or its text; anything else is a ValidationError."""
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise ValidationError("workflow_id", f"{value!r} is not a workflow id (a UUID)") from None


def workflow_filters(filters: WorkflowFilters) -> dict[str, Any]:
    """``workflows``'s keyword arguments for the store (``before`` as a UUID, limit 100)."""
    _known("workflows", dict(filters), _WORKFLOW_FILTERS)
    before = filters.get("before")
    return {
        "state": filters.get("state"),
        "name": filters.get("name"),
        "before": None if before is None else workflow_id(before),
        "limit": filters.get("limit", 100),
    }


def list_filters(filters: ListFilters) -> dict[str, Any]:
    """``list``'s keyword arguments for the store (``after`` as a UUID, limit 100 by default)."""
    _known("list", dict(filters), _LIST_FILTERS)
    after = filters.get("after")
    return {
        "queue": filters.get("queue"),
        "state": filters.get("state"),
        "type": filters.get("type"),
        "after": None if after is None else job_id(after),
        "limit": filters.get("limit", 100),
    }


def store_options(settings: Settings) -> dict[str, Any]:
    """The store settings of ``settings`` (both stores take them; the sync one more)."""
    return {
        "event_mode": settings.job_events,
        "notify_channel": settings.notify_channel,
        "call_timeout": settings.call_timeout,
        "schema": settings.schema,
        "direct_url": settings.direct_url,
    }
