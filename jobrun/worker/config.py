"""How a worker runs: :class:`WorkerConfig`, its defaults and :func:`parse_queues`.

Validated on construction, so a bad setting fails when the worker is built,
not when a thread first reads it. ``jobrun.config`` builds one from the
environment; the CLI parses ``--queues`` with :func:`parse_queues`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import socket
import uuid
from collections.abc import Mapping, Sequence

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.worker import logs
from jobrun.worker.text import seconds

DEFAULT_CONCURRENCY = 10
DEFAULT_LEASE_TTL = dt.timedelta(seconds=30)
DEFAULT_HEARTBEAT_INTERVAL = dt.timedelta(seconds=5)
DEFAULT_POLL_INTERVAL = dt.timedelta(seconds=1)
DEFAULT_SHUTDOWN_GRACE = dt.timedelta(seconds=30)
DEFAULT_COMPLETE_BATCH = 200
DEFAULT_COMPLETE_FLUSH = dt.timedelta(milliseconds=5)
DEFAULT_PROGRESS_INTERVAL = dt.timedelta(seconds=1)
MAX_CONCURRENCY = 1000
DEFAULT_UNKNOWN_TYPE_DELAY = dt.timedelta(seconds=60)
DEFAULT_UNKNOWN_TYPE_RELEASES = 24
UNKNOWN_TYPE_DELAY_GROWTH = 10
"""A released job's delay doubles from ``unknown_type_delay`` up to this many times it."""


def parse_queues(spec: str | Sequence[str] | Mapping[str, int | None]) -> dict[str, int | None]:
    """Parse ``"emails=4,default"``, ``["a", "b"]`` or ``{"a": 4}`` into {queue: limit or None}."""
    items: list[tuple[str, int | None]]
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        parts = spec.split(",") if isinstance(spec, str) else list(spec)
        items = []
        for part in parts:
            name, _, count = str(part).strip().partition("=")
            if count:
                try:
                    items.append((name.strip(), int(count)))
                except ValueError:
                    raise ValidationError(
                        "queues", f"{part!r}: the limit after '=' must be an int"
                    ) from None
            else:
                items.append((name.strip(), None))
    queues: dict[str, int | None] = {}
    for name, limit in items:
        validate.queue_name(name, "queues")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValidationError("queues", f"the limit of queue {name!r} must be a positive int")
        if name in queues:
            raise ValidationError("queues", f"queue {name!r} is listed twice")
        queues[name] = limit
    if not queues:
        raise ValidationError("queues", "at least one queue is needed")
    return queues


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """How a worker runs. Validated on construction: bad values fail at start."""

    queues: Mapping[str, int | None] = dataclasses.field(default_factory=lambda: {"default": None})
    concurrency: int = DEFAULT_CONCURRENCY
    lease_ttl: dt.timedelta = DEFAULT_LEASE_TTL
    heartbeat_interval: dt.timedelta = DEFAULT_HEARTBEAT_INTERVAL
    poll_interval: dt.timedelta = DEFAULT_POLL_INTERVAL
    shutdown_grace: dt.timedelta = DEFAULT_SHUTDOWN_GRACE
    complete_batch_size: int = DEFAULT_COMPLETE_BATCH
    complete_flush_interval: dt.timedelta = DEFAULT_COMPLETE_FLUSH
    owner: str | None = None
    """Defaults to host:pid:random, unique per process start."""
    stall_warning: dt.timedelta | None = None
    """How long a loop (claimer, completer, heartbeat, listener) may take over
    one step before the stall watch logs a WARNING naming it and where it is
    blocked. Defaults to the lease TTL."""
    unknown_type_delay: dt.timedelta = DEFAULT_UNKNOWN_TYPE_DELAY
    """How long a job of a type no handler knows waits after its first release
    (doubling with each release, up to ten times this: :meth:`unknown_type_delay_for`)."""
    unknown_type_releases: int = DEFAULT_UNKNOWN_TYPE_RELEASES
    """How many times such a job is released before it is dead (0: dead at once)."""
    success_log_level: int | str | None = None
    """The level of the ``succeeded`` line: ``logging.DEBUG`` or ``INFO``
    (``"debug"``, ``"info"``); None takes the process default
    (:func:`jobrun.worker.logs.set_success_level`, ``--log-success``), DEBUG."""
    progress_interval: dt.timedelta = DEFAULT_PROGRESS_INTERVAL
    """The least time between two progress writes of one job
    (:meth:`JobContext.progress` keeps the reports in between)."""
    claim_lanes: int | None = None
    """Claims in flight at once (each with its own connection): the server
    runs them in parallel, so a busy worker's claims and completions use
    more than one core. None: 2 from 8 threads on, else 1."""
    claim_ahead: int | None = 0
    """The most jobs claimed ahead of the free threads, leased but not started
    (:mod:`jobrun.worker.ahead` sizes the buffer from the observed run
    time); None: up to the larger of ``concurrency`` and
    ``complete_batch_size``; 0 (the default): claim only for free threads.
    A buffered job's start is a round trip of its own (its attempt must be
    committed before it runs), which a drain of short jobs measured to cost
    more than it saves: see docs/performance.md."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", parse_queues(self.queues))
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CONCURRENCY:
            raise ValidationError("concurrency", f"must be an int between 1 and {MAX_CONCURRENCY}")
        for name in (
            "lease_ttl",
            "heartbeat_interval",
            "poll_interval",
            "shutdown_grace",
            "complete_flush_interval",
            "progress_interval",
        ):
            validate.positive_duration(name, getattr(self, name))
        if self.stall_warning is not None:
            validate.positive_duration("stall_warning", self.stall_warning)
        if self.heartbeat_interval * 3 > self.lease_ttl:
            # Refused, not warned: with fewer than three heartbeats per lease,
            # one late or lost heartbeat loses leases of healthy jobs, which
            # then run twice; no deployment wants that.
            raise ValidationError(
                "heartbeat_interval",
                f"{seconds(self.heartbeat_interval.total_seconds())} must be at most a third "
                f"of lease_ttl ({seconds(self.lease_ttl.total_seconds())}), so that one lost "
                "heartbeat never loses a lease",
            )
        b = self.complete_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 10_000:
            raise ValidationError("complete_batch_size", "must be an int between 1 and 10000")
        if self.owner is not None:
            validate.owner(self.owner)
        validate.positive_duration("unknown_type_delay", self.unknown_type_delay)
        validate.delay(self.unknown_type_delay * UNKNOWN_TYPE_DELAY_GROWTH, "unknown_type_delay")
        r = self.unknown_type_releases
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= 10_000:
            raise ValidationError("unknown_type_releases", "must be an int between 0 and 10000")
        lanes = self.claim_lanes
        if lanes is None:
            object.__setattr__(self, "claim_lanes", 2 if self.concurrency >= 8 else 1)
        elif isinstance(lanes, bool) or not isinstance(lanes, int) or not 1 <= lanes <= 8:
            raise ValidationError("claim_lanes", "must be None or an int between 1 and 8")
        a = self.claim_ahead
        if a is not None and (
            isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= validate.MAX_CLAIM_LIMIT
        ):
            raise ValidationError(
                "claim_ahead", f"must be None or an int between 0 and {validate.MAX_CLAIM_LIMIT}"
            )
        if self.success_log_level is not None:
            logs.success_level(self.success_log_level)

    def unknown_type_delay_for(self, release: int) -> dt.timedelta:
        """The delay of a job's ``release``-th release (1 for the first)."""
        growth: int = min(2 ** min(release - 1, 30), UNKNOWN_TYPE_DELAY_GROWTH)
        delay: dt.timedelta = self.unknown_type_delay * growth
        return delay

    def with_owner(self) -> WorkerConfig:
        if self.owner is not None:
            return self
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        return dataclasses.replace(self, owner=owner)
