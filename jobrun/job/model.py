"""The job domain: value objects with no I/O.

A job moves through these states (an attempt counts when it starts)::

               enqueue                claim (attempts += 1 when started)
    (new) ───────────────▶ queued ─────────────────────────▶ leased
                             ▲  ▲                              │
              retry (admin)  │  └── fail / reap: attempts left ─┤
                             │                                 ├── complete ──────────▶ succeeded
    succeeded/dead/cancelled ┘                                 ├── fail / reap, none left ─▶ dead
                                                               └── cancel requested ──▶ cancelled

``cancel`` on a queued job ends it ``cancelled`` at once; on a leased job it
only sets ``cancel_requested``, and whichever of complete, fail or the reaper
comes next ends the job ``cancelled`` (cancel wins).

A claim starts the first ``start`` of the jobs it leases (``started_at``
set, attempts += 1); the worker asks for all of them, as it claims no more
jobs than it can run at once. A job leased without starting (to wait for a
thread) counts its attempt when it is started, just before its handler runs.
A process that dies burns the attempt of each job it started: a
crash-looping job still runs out of attempts. A lease that expires unstarted
burned nothing: the reaper queues its job again at once, attempts unchanged.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import random
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Literal, TypeAlias

from jobrun.job import ids, validate
from jobrun.job.cron import CronSchedule
from jobrun.job.errors import ValidationError

JSONValue: TypeAlias = Any
"""A value that serialises to JSON (dict, list, str, int, float, bool, None)."""


class State(enum.StrEnum):
    """Where a job is in its life; the values are the Postgres ``job_state`` labels."""

    WAITING = "waiting"
    """Waiting for its parents to finish (see :mod:`jobrun.job.workflow`): not claimable."""
    QUEUED = "queued"
    LEASED = "leased"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        """A terminal job never runs again unless an operator retries it."""
        return self in _TERMINAL


_TERMINAL = frozenset({State.SUCCEEDED, State.DEAD, State.CANCELLED})
TERMINAL_STATES: frozenset[State] = _TERMINAL


BackoffKind: TypeAlias = Literal["exponential", "linear", "constant"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """How long to wait before the next attempt of a failed job.

    The policy travels with the job (stored in its row), so a job enqueued
    under one policy keeps it whatever the worker that fails it is configured
    with. Delay for the attempt that just failed (1-based)::

        exponential: base * factor ** (attempt - 1)
        linear:      base * attempt
        constant:    base

    capped at ``max_delay``, then spread by ``jitter`` (a fraction: 0.1 means
    the delay is drawn uniformly from [0.9 d, 1.1 d]) so that jobs that failed
    together do not all come back together.
    """

    kind: BackoffKind = "exponential"
    base: float = 1.0
    """Seconds."""
    factor: float = 2.0
    max_delay: float = 3600.0
    """Seconds."""
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in ("exponential", "linear", "constant"):
            raise ValidationError(
                "backoff.kind", f"must be exponential, linear or constant, not {self.kind!r}"
            )
        for name in ("base", "factor", "max_delay", "jitter"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ValidationError(f"backoff.{name}", f"must be a finite number, not {value!r}")
            if value < 0:
                raise ValidationError(f"backoff.{name}", f"must not be negative, not {value!r}")
        if self.factor < 1:
            raise ValidationError("backoff.factor", "must be at least 1")
        if self.jitter > 1:
            raise ValidationError("backoff.jitter", "must be a fraction between 0 and 1")
        if self.max_delay > validate.MAX_DELAY_SECONDS:
            raise ValidationError(
                "backoff.max_delay", f"must be at most {validate.MAX_DELAY_SECONDS} s"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> dt.timedelta:
        """The wait before retrying after failed attempt number ``attempt`` (1-based)."""
        attempt = max(attempt, 1)
        if self.kind == "exponential":
            # Cap the exponent before computing it: factor ** 10_000 overflows.
            exponent = min(attempt - 1, 1024)
            try:
                seconds = self.base * self.factor**exponent
            except OverflowError:
                seconds = self.max_delay
        elif self.kind == "linear":
            seconds = self.base * attempt
        else:
            seconds = self.base
        seconds = min(seconds, self.max_delay)
        if self.jitter:
            spread = seconds * self.jitter
            seconds += (rng or random).uniform(-spread, spread)
        return dt.timedelta(seconds=max(seconds, 0.0))

    def to_json(self) -> dict[str, Any]:
        """The stored form (the ``backoff`` jsonb column)."""
        return {
            "kind": self.kind,
            "base": float(self.base),
            "factor": float(self.factor),
            "max_delay": float(self.max_delay),
            "jitter": float(self.jitter),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Backoff:
        """Rebuild a policy from its stored form; unknown keys are a ValidationError."""
        if not isinstance(data, Mapping):
            raise ValidationError("backoff", f"must be an object, not {type(data).__name__}")
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ValidationError("backoff", f"unknown keys {sorted(unknown)}")
        return cls(**data)


DEFAULT_BACKOFF = Backoff()
DEFAULT_QUEUE = "default"
DEFAULT_MAX_ATTEMPTS = 25
DEFAULT_PRIORITY = 0


def new_job_id() -> uuid.UUID:
    """A time-ordered UUIDv7, so ids sort by creation and index inserts stay local."""
    return ids.uuid7()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class NewJob:
    """A job to enqueue: everything the client decides. Validated on construction.

    ``run_at`` (an aware datetime) and ``delay`` are mutually exclusive; with
    neither, the job runs as soon as a worker is free. ``delay`` counts from
    the database clock at insert time, not from this host's clock.
    """

    type: str
    payload: JSONValue = dataclasses.field(default_factory=dict)
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = DEFAULT_BACKOFF
    run_at: dt.datetime | None = None
    delay: dt.timedelta | None = None
    idempotency_key: str | None = None
    id: uuid.UUID = dataclasses.field(default_factory=new_job_id)
    concurrency_key: str | None = None
    """The job's key for its queue's per-key limit (a tenant, an account): with
    ``per_key=K`` on the queue, at most K jobs with the same key are leased at
    once. None: only the queue's own limits apply."""
    trace_context: dict[str, str] | None = None
    """A W3C trace context carrier (``traceparent``, ``tracestate``) to store as
    the job's creation context. Left None, an enqueue traced by
    :func:`jobrun.observe.tracing.instrument` stores its own span's; given, it
    is stored as it is (a context carried from elsewhere is never replaced)."""
    payload_json: str = dataclasses.field(init=False, repr=False, compare=False, default="")
    """The payload as the JSON text that will be stored (set on construction)."""

    def __post_init__(self) -> None:
        # The checks return plain strs: a str subclass is kept as the value
        # it really carries (see jobrun.job.validate).
        kind = validate.job_type(self.type)
        if kind is not self.type:
            object.__setattr__(self, "type", kind)
        queue = validate.queue_name(self.queue)
        if queue is not self.queue:
            object.__setattr__(self, "queue", queue)
        validate.priority(self.priority)
        validate.max_attempts(self.max_attempts)
        if not isinstance(self.backoff, Backoff):
            raise ValidationError("backoff", "must be a jobrun.Backoff")
        if self.run_at is not None and self.delay is not None:
            raise ValidationError("run_at", "give run_at or delay, not both")
        if self.run_at is not None:
            validate.aware_datetime("run_at", self.run_at)
        if self.delay is not None:
            validate.delay(self.delay)
        if self.idempotency_key is not None:
            key = validate.idempotency_key(self.idempotency_key)
            if key is not self.idempotency_key:
                object.__setattr__(self, "idempotency_key", key)
        if not isinstance(self.id, uuid.UUID):
            raise ValidationError("id", "must be a uuid.UUID")
        if self.concurrency_key is not None:
            ckey = validate.concurrency_key(self.concurrency_key)
            if ckey is not self.concurrency_key:
                object.__setattr__(self, "concurrency_key", ckey)
        if self.trace_context is not None:
            object.__setattr__(self, "trace_context", _trace_context(self.trace_context))
        # Check and serialise the payload once, here: nothing downstream can
        # meet a payload jsonb would refuse, and the text is what is stored.
        value, text = validate.payload(self.payload)
        object.__setattr__(self, "payload", value)
        object.__setattr__(self, "payload_json", text)

    @property
    def delay_seconds(self) -> float:
        """The delay as seconds for SQL (0 when none)."""
        return self.delay.total_seconds() if self.delay is not None else 0.0


def jobs_like(template: NewJob, payloads: Iterable[JSONValue]) -> Iterator[NewJob]:
    """NewJobs like ``template``, one per payload, each with an id of its own.

    The columnar form of a batch (``Client.enqueue_many``): the fields every
    job shares were checked once, in ``template``, so a job costs only its
    payload's check and serialisation and its id, not a whole NewJob's
    validation (a third of the time of ``NewJob(...)``). A bad payload is a
    ValidationError naming its position (``payloads[3]``). ``template`` may
    carry no idempotency key (one key cannot name many jobs).
    """
    if template.idempotency_key is not None:
        raise ValidationError(
            "idempotency_key", "one key cannot name many jobs: give each its own NewJob"
        )
    shared = [
        (name, getattr(template, name))
        for name in _NEW_JOB_FIELDS
        if name not in ("id", "payload", "payload_json")
    ]
    make = object.__new__
    put = object.__setattr__
    for value, text in validate.payloads(payloads):
        job = make(NewJob)
        for name, field_value in shared:
            put(job, name, field_value)
        put(job, "id", ids.uuid7())
        put(job, "payload", value)
        put(job, "payload_json", text)
        yield job


_NEW_JOB_FIELDS = tuple(field.name for field in dataclasses.fields(NewJob))


MAX_TRACE_CONTEXT_ENTRIES = 8
MAX_TRACE_CONTEXT_VALUE = 1024
"""Characters; W3C caps tracestate at 512, a traceparent is 55."""


def _trace_context(value: object) -> dict[str, str]:
    """A copy of a carrier, checked: the caller's dict may change after enqueue."""
    if not isinstance(value, Mapping):
        raise ValidationError(
            "trace_context", f"must be a dict of str to str, not {type(value).__name__}"
        )
    if len(value) > MAX_TRACE_CONTEXT_ENTRIES:
        raise ValidationError(
            "trace_context",
            f"at most {MAX_TRACE_CONTEXT_ENTRIES} entries (traceparent, tracestate)",
        )
    carrier: dict[str, str] = {}
    for key, text in value.items():
        if not isinstance(key, str) or not isinstance(text, str):
            raise ValidationError("trace_context", "keys and values must be strs")
        if len(key) > MAX_TRACE_CONTEXT_VALUE or len(text) > MAX_TRACE_CONTEXT_VALUE:
            raise ValidationError(
                "trace_context", f"keys and values are at most {MAX_TRACE_CONTEXT_VALUE} characters"
            )
        if "\x00" in key or "\x00" in text:
            raise ValidationError("trace_context", "must not contain NUL characters")
        carrier[str(key)] = str(text)
    return carrier


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Job:
    """A stored job as the database last returned it. Timestamps are aware UTC."""

    id: uuid.UUID
    queue: str
    type: str
    payload: JSONValue
    priority: int
    state: State
    attempts: int
    max_attempts: int
    backoff: Backoff
    run_at: dt.datetime
    lease_owner: str | None
    lease_token: uuid.UUID | None
    lease_expires_at: dt.datetime | None
    cancel_requested: bool
    idempotency_key: str | None
    last_error: str | None
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None
    result: JSONValue = None
    """The JSON value the handler returned, stored with the success (None otherwise)."""
    trace_context: dict[str, str] | None = None
    """The W3C trace context of the span that enqueued the job (None untraced)."""
    concurrency_key: str | None = None
    """The key its queue's per-key limit counts it under (None: no key)."""
    snoozes: int = 0
    """How many times a handler snoozed it (each gave its attempt back)."""
    releases: int = 0
    """How many times a worker without a handler for its type released it
    (each gave its attempt back); a retry from a terminal state resets it."""
    progress: float | None = None
    """The fraction done (0 to 1) its running attempt last reported (None: none yet)."""
    progress_message: str | None = None
    progress_at: dt.datetime | None = None
    """When that progress was recorded, by the database clock."""
    started_at: dt.datetime | None = None
    """While leased: when the lease's attempt started (its handler was about to
    run), by the database clock; None while the job waits for a thread of the
    worker that leased it, its attempt not yet counted (a claim starts only as
    many jobs as its worker can run at once). Every claim sets it afresh."""
    pending_parents: int = 0
    """While waiting: how many of its parents have not finished yet."""
    has_dependents: bool = False
    """Whether jobs wait for it (set when the first is enqueued): its finish
    may release them."""
    dependents_pending: int | None = None
    """For a job others wait for, read by a claim: the fewest parents one of
    them still waited for at the claim, this job included (1: its finish
    releases that one). A worker records such a success at once when this is
    at most its concurrency, in a batch when the job is one of many parents
    (a wide fan-in). None: no job waits for it, or not read by a claim."""
    workflow_id: uuid.UUID | None = None
    """The workflow it was enqueued in (None: alone)."""
    workflow_node: str | None = None
    """Its node's name in that workflow."""
    parent_results: Mapping[str, Any] | None = None
    """Its parents' outcomes (a :class:`jobrun.ParentResults`), loaded with its
    claim (None: a job without parents, or a job not read by a claim); see
    ``JobContext.parent_results``. (Typed as a Mapping here: the domain's
    workflow module, which defines it, builds on this one.)"""

    @property
    def started(self) -> bool:
        """Whether the current lease's attempt started (and so counts)."""
        return self.started_at is not None

    @property
    def attempts_left(self) -> int:
        """Attempts that may still be made after the current one."""
        return max(self.max_attempts - self.attempts, 0)


def _fast_frozen_init(cls: type[Any]) -> None:
    """Give a frozen, slotted, keyword-only dataclass a cheaper ``__init__``.

    The dataclass's own ``__init__`` of a frozen class sets each field with
    ``object.__setattr__`` looked up anew per field: 6 us for a Job's 28
    fields, paid for every job a claim returns (twice a core's worth of
    per-job time in a drain). This one has the same signature (the same
    keywords, the same defaults) and sets each slot through its own
    descriptor, bound once here: about a third of that. Only for classes
    with no ``__post_init__``, no ``default_factory`` and every field in
    ``__init__`` (checked); equality, hashing, ``repr``, ``replace`` and
    pickling stay the dataclass's.
    """
    fields = dataclasses.fields(cls)
    assert not hasattr(cls, "__post_init__")
    params: list[str] = []
    namespace: dict[str, Any] = {}
    for field in fields:
        assert field.init and field.kw_only
        assert field.default_factory is dataclasses.MISSING
        namespace[f"_set_{field.name}"] = cls.__dict__[field.name].__set__
        if field.default is dataclasses.MISSING:
            params.append(field.name)
        else:
            namespace[f"_default_{field.name}"] = field.default
            params.append(f"{field.name}=_default_{field.name}")
    # The setters and defaults are the closure's cells (cheaper to read than globals).
    body = "".join(f"        _set_{f.name}(self, {f.name})\n" for f in fields)
    source = (
        f"def make({', '.join(namespace)}):\n"
        f"    def __init__(self, *, {', '.join(params)}):\n{body}"
        "    return __init__\n"
    )
    scope: dict[str, Any] = {}
    exec(source, scope)  # noqa: S102 - a fixed template over the class's own field names
    init = scope["make"](**namespace)
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 - mypy would refuse assigning a method


_fast_frozen_init(Job)


class EventKind(enum.StrEnum):
    """What a ``job_events`` row records."""

    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    RETRYING = "retrying"
    """An attempt failed and the job is queued again for a later attempt."""
    DEAD = "dead"
    CANCEL_REQUESTED = "cancel_requested"
    CANCELLED = "cancelled"
    RETRIED = "retried"
    """An operator made a job runnable again; or, ``detail.via`` "run_jobs", a test's
    ``run_jobs(advance=...)`` brought a queued job due later forward to now."""
    REAPED = "reaped"
    """The lease expired; ``detail.verdict`` is the state the reaper chose."""
    RELEASED = "released"
    """The claim was given back without counting its attempt (``detail.reason``)."""
    SNOOZED = "snoozed"
    """The handler asked to run again later (``detail.delay_seconds``); its
    attempt was given back and ``snoozes`` counted instead."""
    PARKED = "parked"
    """The handler is in a durable wait (``detail.step``, ``detail.signal``
    (None for a sleep), ``detail.until``): the job was queued again until
    then, its lease and its attempt given back (see docs/signals.md)."""
    WAIT_ENDED = "wait_ended"
    """A durable wait is over without a signal: a sleep done, or a signal wait
    whose timeout passed (``detail.timed_out``)."""
    SIGNAL_SENT = "signal_sent"
    """A signal was stored for the job (``detail.name``, ``detail.key``);
    ``detail.woke``: the job was parked waiting for it and was made due now."""
    SIGNAL_DELIVERED = "signal_delivered"
    """A signal was delivered to the job's wait (``detail.step``, ``detail.signal``,
    ``detail.key``)."""

    @property
    def terminal(self) -> bool:
        return self in (EventKind.SUCCEEDED, EventKind.DEAD, EventKind.CANCELLED)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One row of a job's audit trail."""

    id: int
    job_id: uuid.UUID
    kind: EventKind
    attempt: int
    at: dt.datetime
    detail: JSONValue


@dataclasses.dataclass(frozen=True, slots=True)
class EffectKey:
    """The key of a job's effect in the ``processed_effects`` ledger.

    ``("job:" + type, idempotency_key or id)``. The ledger is keyed across
    queues: two jobs of the same type and idempotency key in different queues
    share one effect, so only the first to complete runs its commit callable.
    """

    scope: str
    key: str

    @classmethod
    def of(cls, job: Job) -> EffectKey:
        return cls("job:" + job.type, job.idempotency_key or str(job.id))


SCHEDULE_ID_PATTERN = validate.SCHEDULE_ID_PATTERN
"""Schedule ids: no ``:``, so the key ``sched:<id>:<next_run>`` cannot be ambiguous."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleSpec:
    """A schedule to create or upsert: cron, time zone and the job template. Validated."""

    id: str
    cron: str
    type: str
    payload: JSONValue = dataclasses.field(default_factory=dict)
    timezone: str = "UTC"
    queue: str = DEFAULT_QUEUE
    priority: int = DEFAULT_PRIORITY
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    backoff: Backoff = DEFAULT_BACKOFF
    payload_json: str = dataclasses.field(init=False, repr=False, compare=False, default="")
    """The payload as the JSON text that will be stored (set on construction)."""

    def __post_init__(self) -> None:
        # The same checks as NewJob's (each occurrence becomes one), and the
        # text fields kept as the plain strs they were checked as.
        set_field = object.__setattr__
        set_field(self, "id", validate.schedule_id(self.id))
        if isinstance(self.cron, str):
            set_field(self, "cron", validate.text("cron", self.cron))
        if isinstance(self.timezone, str):
            set_field(self, "timezone", validate.text("timezone", self.timezone))
        parsed = CronSchedule.parse(self.cron, self.timezone)
        set_field(self, "cron", parsed.expression)
        set_field(self, "type", validate.job_type(self.type))
        set_field(self, "queue", validate.queue_name(self.queue))
        validate.priority(self.priority)
        validate.max_attempts(self.max_attempts)
        if not isinstance(self.backoff, Backoff):
            raise ValidationError("backoff", "must be a jobrun.Backoff")
        value, text = validate.payload(self.payload)
        set_field(self, "payload", value)
        set_field(self, "payload_json", text)

    @property
    def schedule(self) -> CronSchedule:
        return CronSchedule.parse(self.cron, self.timezone)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """A cron schedule and the template of the job each occurrence enqueues."""

    id: str
    cron: str
    timezone: str
    queue: str
    type: str
    payload: JSONValue
    priority: int
    max_attempts: int
    backoff: Backoff
    next_run_at: dt.datetime
    paused: bool
    created_at: dt.datetime
    updated_at: dt.datetime

    @property
    def cron_schedule(self) -> CronSchedule:
        return CronSchedule.parse(self.cron, self.timezone)

    def occurrence_key(self, occurrence: dt.datetime) -> str:
        """The idempotency key of the job an occurrence enqueues: ``sched:<id>:<UTC instant>``."""
        instant = occurrence.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return f"sched:{self.id}:{instant}"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueDepth:
    """Per-queue counts, as ``depth`` reports them."""

    queue: str
    ready: int
    """Queued and runnable now."""
    scheduled: int
    """Queued with run_at in the future."""
    leased: int
    dead: int


MAX_LIMIT = 1_000_000
"""The largest concurrency, per-key or rate limit a queue takes."""
MAX_RATE_PERIOD = dt.timedelta(days=1)
MIN_RATE_PERIOD = dt.timedelta(milliseconds=1)
_RATE_UNITS = {
    "ms": 0.001,
    "s": 1.0,
    "sec": 1.0,
    "second": 1.0,
    "m": 60.0,
    "min": 60.0,
    "minute": 60.0,
    "h": 3600.0,
    "hour": 3600.0,
    "d": 86400.0,
    "day": 86400.0,
}
_RATE_TEXT = re.compile(r"\s*(\d+)\s*/\s*(\d*\.?\d*)\s*([a-z]+)\s*")


def _limit(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_LIMIT:
        raise ValidationError(field, f"must be an int from 1 to {MAX_LIMIT:,}, not {value!r}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``limit`` jobs of a queue started (claimed) in any window of
    ``period``, by the database clock: a sliding window, exact across every
    worker (see :meth:`jobrun.postgres.store.Store.set_queue_limits`)."""

    limit: int
    period: dt.timedelta

    def __post_init__(self) -> None:
        _limit("rate", self.limit)
        if not isinstance(self.period, dt.timedelta) or not (
            MIN_RATE_PERIOD <= self.period <= MAX_RATE_PERIOD
        ):
            raise ValidationError(
                "rate", f"the period must be a timedelta from 1 ms to 1 day, not {self.period!r}"
            )

    @classmethod
    def parse(cls, text: str) -> RateLimit:
        """``"100/s"``, ``"10/min"``, ``"5/10s"``, ``"1000/h"``: jobs per period."""
        match = _RATE_TEXT.fullmatch(text.lower()) if isinstance(text, str) else None
        word = "" if match is None else match.group(3)
        unit = _RATE_UNITS.get(word, _RATE_UNITS.get(word.removesuffix("s")))
        if match is None or unit is None:
            raise ValidationError(
                "rate",
                f"{text!r} is not a rate: write JOBS/PERIOD, e.g. 100/s, 10/min, 5/10s, 1000/h",
            )
        count = float(match.group(2)) if match.group(2) else 1.0
        return cls(int(match.group(1)), dt.timedelta(seconds=count * unit))

    def __str__(self) -> str:
        seconds = self.period.total_seconds()
        for name, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
            if seconds >= size and (seconds / size).is_integer():
                n = int(seconds / size)
                return f"{self.limit}/{'' if n == 1 else n}{name}"
        return f"{self.limit}/{seconds * 1000:g}ms"


class Keep(enum.Enum):
    """The type of :data:`KEEP`."""

    KEEP = "keep"


KEEP = Keep.KEEP
"""For ``change_queue_limits``: leave this limit as it is."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class QueueLimits:
    """The limits every worker applies to a queue's claims (None: no such limit),
    and, as :meth:`~jobrun.postgres.store.Store.queue_limits` reads them, what they
    hold now."""

    queue: str
    concurrency: int | None = None
    """At most this many jobs of the queue leased at once, across every worker."""
    per_key: int | None = None
    """At most this many jobs with the same ``concurrency_key`` leased at once."""
    rate: RateLimit | None = None
    """At most ``rate.limit`` jobs started in any window of ``rate.period``."""
    leased: int = 0
    """Jobs of the queue leased now."""
    started_in_window: int = 0
    """Jobs started in the current rate window (0 without a rate limit)."""
    updated_at: dt.datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "queue", validate.queue_name(self.queue))
        if self.concurrency is not None:
            _limit("concurrency", self.concurrency)
        if self.per_key is not None:
            _limit("per_key", self.per_key)
        if self.rate is not None and not isinstance(self.rate, RateLimit):
            raise ValidationError("rate", "must be a jobrun.RateLimit (RateLimit.parse('100/s'))")

    def describe(self) -> str:
        """``concurrency 5, per key 1, rate 100/s`` (``no limits`` for none)."""
        parts = []
        if self.concurrency is not None:
            parts.append(f"concurrency {self.concurrency}")
        if self.per_key is not None:
            parts.append(f"per key {self.per_key}")
        if self.rate is not None:
            parts.append(f"rate {self.rate}")
        return ", ".join(parts) or "no limits"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StateCount:
    """How many jobs are in a state, and how many attempts they burned in all."""

    state: State
    jobs: int
    attempts: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ReapResult:
    """What one ``reap_expired`` call did, per verdict."""

    requeued: list[uuid.UUID]
    dead: list[uuid.UUID]
    cancelled: list[uuid.UUID]

    @property
    def total(self) -> int:
        return len(self.requeued) + len(self.dead) + len(self.cancelled)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class BatchResult:
    """What ``enqueue_batch`` did.

    ``inserted`` counts new jobs (their ids are the ones the caller chose);
    ``replayed`` holds the stored job for every idempotency key that was
    already taken by an identical job.
    """

    inserted: int
    replayed: tuple[Job, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CompleteManyResult:
    """The three outcomes of ``complete_many``, as sets of job ids."""

    completed: frozenset[uuid.UUID]
    cancelled: frozenset[uuid.UUID]
    """Cancel was requested: the job ended cancelled, not succeeded."""
    lease_lost: frozenset[uuid.UUID]
    """The caller no longer held the lease; nothing was changed for these."""
    failed: Mapping[uuid.UUID, BaseException] = dataclasses.field(default_factory=dict)
    """Their commit callable (or their Complete) raised; the job is still leased."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaderTerm:
    """One leadership of an election: the fence every leader action carries.

    Terms of one election only grow (the database numbers them), so a term
    names one leadership exactly; a Store fenced by it
    (``Store.fenced(term)``) refuses, with ``LeaderLost``, any action once
    the term is over (see jobrun.postgres.leader).
    """

    name: str
    """The election (one per jobrun schema)."""
    holder: str
    """Who holds it: the candidate's own id (host, pid and a random part)."""
    term: int
    """The term's number, 1 for the first leader of the election."""
