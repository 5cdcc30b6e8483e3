"""The job_events audit trail: which transitions are recorded, and how.

``EventMode.ALL`` (the default, ``JOBRUN_JOB_EVENTS=all``) records a row for every
transition: enqueued, claimed, succeeded, retrying, dead, cancel_requested,
cancelled, retried, and reaped (with the reaper's verdict in ``detail``; a
terminal verdict also gets its terminal row). ``EventMode.TERMINAL`` records
only succeeded, dead and cancelled, whichever path got the job there
(complete, complete_many, fail, the reaper), so a busy queue writes one event
row per job instead of about four.

The hot paths (enqueue, claim, fail, complete_many) write their events inside
their own statement (a data-modifying CTE); the others go through
:func:`record`, one batched INSERT per transaction.

Event rows can hold payload fragments and error text: they are capped in
size, and ``prune_events`` deletes them by age (retention).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable
from typing import Any

import psycopg

from jobrun.job.model import EventKind
from jobrun.postgres.sqlc import Queries


class EventMode(enum.StrEnum):
    """Which transitions get a job_events row (``JOBRUN_JOB_EVENTS``)."""

    ALL = "all"
    TERMINAL = "terminal"

    def wants(self, kind: EventKind) -> bool:
        return self is EventMode.ALL or kind.terminal


@dataclasses.dataclass(frozen=True, slots=True)
class EventRow:
    job_id: uuid.UUID
    kind: EventKind
    attempt: int
    detail: dict[str, Any] | None = None


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


def record(
    queries: Queries, conn: psycopg.Connection[Any], mode: EventMode, rows: Iterable[EventRow]
) -> None:
    """Insert the rows ``mode`` wants, in one statement (the sync store's leases)."""
    args = wanted_events(mode, rows)
    if args is not None:
        queries.insert_events(conn, **args)
