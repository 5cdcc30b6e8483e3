"""Durable sleeps and signals (issue 29, item 5): the domain half.

A handler may wait for a duration (``ctx.sleep``) or for a named signal sent
to its job or to its job's workflow (``ctx.wait_for_signal``,
``client.signal``; a workflow's signal reaches each of its jobs that waits
for the name, once each) without holding a
thread, a connection or a lease meanwhile: a wait is a durable step whose
first run records its deadline by the database clock; while it is not over,
the job leaves its handler (:class:`Parked`, which the worker turns into a
park: queued again at the deadline, no lease, its attempt given back), and a
later run replays the steps before it and finds the wait over, or parks
again until the same deadline. A signal sent meanwhile moves the job's run
to now, in the transaction that stores it.

This module holds what both sides check before anything is written (signal
names and keys), the wait's outcome as a store hands it back
(:class:`WaitTurn`), the port a store implements (:class:`WaitStore`), and
:class:`SignalTimeout`, what a signal wait raises when its timeout passed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import uuid
from typing import Any, Protocol

from jobrun.job import validate
from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import Job

MAX_SIGNAL_NAME_CHARS = 200
"""The longest signal name (the table's check says the same)."""
MAX_SIGNAL_KEY_CHARS = 200
"""The longest signal key (the table's check says the same)."""


class SignalTimeout(JobrunError, TimeoutError):
    """A signal wait's timeout passed before a signal of its name came.

    Raised by ``ctx.wait_for_signal`` (and on every replay of that wait: the
    timeout is recorded as the wait's step, so a retried attempt sees the
    same outcome). Catch it to take the other branch of a workflow; left
    uncaught it fails the attempt like any exception.
    """

    def __init__(self, job_id: uuid.UUID, step: str, signal: str, until: dt.datetime) -> None:
        super().__init__(
            f"job {job_id}: no signal {signal!r} came before {until.isoformat()} (wait {step!r})"
        )
        self.job_id = job_id
        self.step = step
        self.signal = signal
        self.until = until


class Parked(BaseException):
    """A durable wait is not over: the job leaves its handler until it is.

    Raised by the wait (never by user code); the worker parks the job: queued
    again at ``until`` (at once when a signal it waits for is there), its
    lease and its attempt given back. A BaseException, as
    ``asyncio.CancelledError``, so that a handler's ``except Exception:``
    around a wait does not swallow it; the worker parks the job even if a
    handler does catch it.
    """

    def __init__(self, step: str, signal: str | None, until: dt.datetime) -> None:
        what = "a sleep" if signal is None else f"signal {signal!r}"
        super().__init__(f"waiting ({what}, step {step!r}) until {until.isoformat()}")
        self.step = step
        self.signal = signal
        self.until = until


def signal_name(value: object, field: str = "name") -> str:
    """A valid signal name: a non-empty str of at most MAX_SIGNAL_NAME_CHARS
    characters (no NUL, no lone surrogate); a ValidationError otherwise."""
    return _short_text(field, value, MAX_SIGNAL_NAME_CHARS)


def signal_key(value: object) -> str:
    """A valid signal key (the same rules as a name, at most MAX_SIGNAL_KEY_CHARS)."""
    return _short_text("key", value, MAX_SIGNAL_KEY_CHARS)


def signal_payload(value: object) -> str | None:
    """A signal's payload as the JSON text to store (any JSON value, the job
    result's rules); None for None. A ValidationError naming ``payload``."""
    try:
        return validate.result(value)
    except ValidationError as exc:
        raise ValidationError("payload", exc.message.replace("result", "payload")) from None


def wait_seconds(value: object, field: str) -> float:
    """A wait's duration in seconds: a positive timedelta or number (int or
    float), at most a job's longest delay; a ValidationError otherwise."""
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise ValidationError(
            field,
            f"must be a datetime.timedelta or seconds (an int or a float), not "
            f"{type(value).__name__}",
        )
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else float(value)
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValidationError(field, f"must be positive and finite, not {value!r}")
    if seconds > validate.MAX_DELAY_SECONDS:
        raise ValidationError(field, f"must be at most {validate.MAX_DELAY_SECONDS} s")
    return seconds


def _short_text(field: str, value: object, most: int) -> str:
    message = f"must be a non-empty str of at most {most} characters"
    if not isinstance(value, str):
        raise ValidationError(field, f"{message}, not {type(value).__name__}")
    value = validate.text(field, str(value))
    if not value or len(value) > most:
        raise ValidationError(field, message)
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class WaitTurn:
    """One turn of a durable wait, as the store hands it back.

    ``record`` is the wait's step as recorded (a dict, see :func:`wait_outcome`)
    when the wait is over, None when it goes on until ``until`` (by the
    database clock, read as ``now``).
    """

    record: dict[str, Any] | None
    until: dt.datetime | None
    now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True)
class SignalSent:
    """What ``client.signal`` did: ``sent`` is False for a duplicate (a signal of
    the same job, or workflow, name and key was stored before: nothing
    written); ``woke`` is True when a job was parked waiting for this name
    and was made due now.

    Sent to a job: ``job_id`` is its id and ``workflow_id`` None. Sent to a
    workflow: ``workflow_id`` is its id, ``job_id`` None, and ``woken`` the
    jobs of the workflow made due by it (every job of the workflow waits for
    its own copy: see docs/signals.md).
    """

    job_id: uuid.UUID | None
    name: str
    key: str
    sent: bool
    woke: bool
    workflow_id: uuid.UUID | None = None
    woken: tuple[uuid.UUID, ...] = ()

    @property
    def to(self) -> uuid.UUID:
        """The id the signal was sent to: the job's or the workflow's."""
        to = self.job_id if self.job_id is not None else self.workflow_id
        assert to is not None
        return to


class WaitStore(Protocol):
    """What durable waits need of the store; every call is fenced by the job's
    claim (owner and lease token) and raises ``LeaseLost``, having written
    nothing, when the claim no longer holds the job."""

    def await_step(self, job: Job, step: str, signal: str | None, seconds: float) -> WaitTurn:
        """One turn of the wait ``step`` (see :class:`WaitTurn`): a signal named
        ``signal`` delivered, the wait's deadline (begun ``seconds`` from the
        database's now on its first turn) passed, or neither."""
        ...

    def park(self, job: Job, step: str, *, signal: bool = True) -> Job:
        """Give the job back until the wait ``step`` is over (see :class:`Parked`):
        the job as parked (queued, or cancelled when a cancel was requested).
        ``signal`` False says the wait is a sleep, which no signal ends."""
        ...
