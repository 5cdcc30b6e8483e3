"""Workers as first-class objects: what a worker says of itself, and what is listed.

A worker registers a :class:`WorkerInfo` when it starts (its owner id, the
``lease_owner`` of the jobs it holds; host, pid, version, queues,
concurrency, the job types it has handlers for, its lease TTL) and keeps
the row fresh with its heartbeat; a clean stop removes it. The registry
serves operators (``jobrun workers``, the dashboard's Workers page: idle
workers included, which the lease owners alone never showed) and the claim:
a registered worker claims only the types it knows, and a type no live
worker of the queue knows, so that a job waits for a worker that can run it
instead of being parked by one that cannot (docs/workers-registry.md).

Liveness is judged by the database clock against each worker's own lease
TTL: live while seen within it; a row not seen for :data:`PRUNE_FACTOR`
times it is deleted by the next registration of any worker.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from jobrun.job import validate
from jobrun.job.errors import ValidationError

PRUNE_FACTOR = 10
"""A worker not seen for this many times its lease TTL is pruned (5 minutes
with the default 30 s): long enough for an operator to see a crashed worker
as gone, short enough that a crash-looping deployment leaves no pile."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerInfo:
    """What a worker registers about itself (checked here, before any SQL)."""

    id: str
    """Its owner id: the ``lease_owner`` of the jobs it holds."""
    host: str
    pid: int
    version: str
    queues: tuple[str, ...]
    concurrency: int
    types: tuple[str, ...]
    """The job types it has handlers for: the only ones it claims (and the
    types no live worker of the queue knows, which it releases)."""
    lease_ttl: dt.timedelta

    def __post_init__(self) -> None:
        validate.owner(self.id)
        for name in ("host", "version"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > 255:
                raise ValidationError(name, "must be a str of at most 255 characters")
        for name in ("pid", "concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValidationError(name, "must be a non-negative int")
        for name in ("queues", "types"):
            value = getattr(self, name)
            if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
                raise ValidationError(name, "must be a tuple of str")
        validate.positive_duration("lease_ttl", self.lease_ttl)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkerStatus:
    """One registered worker as listed (``jobrun workers``, the dashboard)."""

    info: WorkerInfo
    started_at: dt.datetime
    last_seen_at: dt.datetime
    """Its last registration or heartbeat, by the database clock."""
    live: bool
    """Seen within its lease TTL."""
    leased: int
    """The leases it holds now (0: idle)."""
    leader: bool
    """Its scheduler is the elected leader now."""
    db_now: dt.datetime
    """The database clock when the list was read."""
