"""Handlers: what a worker runs for each job type.

A handler is ``callable(ctx, job)``. It may

- return ``None``: the job succeeded (completed in a batch with
  ``complete_many``; at-least-once: a crash before the batch commits runs it
  again);
- return a *commit callable* ``commit(conn)``: the transactional path. It
  runs inside Complete's transaction, once per effect key, so its writes land
  exactly once however often the job runs;
- return any other JSON value (a dict, a list, a str, a number, a bool): the
  job succeeded and the value is its **result**, stored with the success in
  the same transaction (``client.get(id).result``, ``jobrun get ID``). It is
  checked like a payload in the handler's thread, so a value that cannot be
  stored fails that attempt (a ValidationError naming ``result``) and never
  the batch it would have joined;
- return :class:`Done` (``Done(result=..., commit=fn)``): both a result and
  a commit callable, written in the one transaction;
- raise: the attempt fails and the job is retried after its backoff;
- raise :class:`PermanentFailure`: the job is dead now, whatever attempts remain;
- raise (or return) :class:`Snooze` (``raise Snooze(30)``): run the job again
  after a delay without counting this attempt (see :class:`Snooze` for how
  ``max_snoozes`` bounds it).

A callable is always taken for a commit callable, never for a result: that is
what keeps the transactional path's one-line form (``return commit``).

A plain ``def`` handler runs on a worker thread. An ``async def`` handler (or
a partial of one, or an object whose ``__call__`` is one) runs as a task on
the worker's event loop (one ``jobrun-async-loop`` thread for all of them,
see :mod:`jobrun.worker.worker`): everything above holds for it, the value
it returns meaning the same; its task is cancelled (``CancelledError`` at
its next ``await``) when its context is. An async generator function is
refused when it is registered (there is no one value to take from it), and
a plain handler that returns an awaitable (a sync wrapper around a
coroutine) is dead at its first attempt with a message saying why, rather
than failing every attempt the same way.

Typed tasks (:meth:`Registry.task`, :mod:`jobrun.worker.tasks`) are
handlers too: a function with typed parameters, enqueued with its own
arguments, checked against its signature.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    Backoff,
    Job,
)
from jobrun.job.ports import CommitCallable
from jobrun.worker.callables import is_async, is_coroutine_handler
from jobrun.worker.tasks import TaskDecorator, task_options

if TYPE_CHECKING:
    from jobrun.worker.context import JobContext

Handler: TypeAlias = Callable[["JobContext", Job], Any]

MAX_SNOOZES = 1_000_000_000
"""The largest ``max_snoozes`` a handler takes (the column is an int4)."""


class PermanentFailure(Exception):
    """Raise from a handler to fail the job for good: no more attempts."""


class Snooze(Exception):
    """Raise from a handler (or return it) to run the job again after ``delay``.

    ``raise Snooze(30)`` or ``raise Snooze(dt.timedelta(minutes=5))``: the
    job is queued again at the database's now + ``delay``, and the attempt
    this run burned is given back (``attempts`` is as before the claim;
    the job's ``snoozes`` counts one more, a "snoozed" event is written and
    ``last_error`` is left as it was: a snooze is no error). For work that
    cannot run *yet* (a resource busy, a rate limit upstream, a result not
    ready): snoozing never burns ``max_attempts``, so a job that snoozes 30
    times still gets every one of its real attempts afterwards.

    Unlimited by default (like Oban's and River's snooze). A handler
    registered with ``max_snoozes=N`` bounds it: once the job has snoozed N
    times, a further Snooze is a failed attempt (``last_error`` says
    "snoozed more than N times"), retried after its backoff and dead when its
    attempts run out, so a job that snoozes forever still ends.

    A cancel requested meanwhile wins: the snooze ends the job cancelled.

    ``delay`` is a ``datetime.timedelta`` or seconds (int or float): positive
    and at most what a job's delay may be (ten years). A bad one is a
    ValidationError here, where the Snooze is made: raised in a handler, it
    fails that attempt with a message saying why.
    """

    def __init__(self, delay: dt.timedelta | float) -> None:
        self.delay: dt.timedelta = snooze_delay(delay)
        super().__init__(self.delay)

    def __str__(self) -> str:
        return f"snooze for {self.delay.total_seconds():g} s"


def snooze_delay(value: object) -> dt.timedelta:
    """A Snooze's delay, checked: a positive timedelta (or seconds), at most a job's delay."""
    field = "delay"
    if isinstance(value, bool) or not isinstance(value, dt.timedelta | int | float):
        raise ValidationError(
            field,
            "Snooze(delay) takes a datetime.timedelta or seconds (an int or a float), "
            f"not {type(value).__name__}",
        )
    if not isinstance(value, dt.timedelta):
        if not math.isfinite(value):
            raise ValidationError(field, f"Snooze(delay) must be a finite number, not {value!r}")
        if value > validate.MAX_DELAY_SECONDS:
            most = validate.MAX_DELAY_SECONDS
            raise ValidationError(field, f"Snooze(delay) must be at most {most} s, not {value!r}")
        seconds = value
        value = dt.timedelta(seconds=value)
        if value <= dt.timedelta(0):
            raise ValidationError(field, f"Snooze(delay) must be positive, not {seconds!r} s")
    elif value <= dt.timedelta(0):
        raise ValidationError(field, f"Snooze(delay) must be positive, not {value!r}")
    return validate.delay(value, field)


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """A handler's success with a result and a commit callable together.

    ``return Done(result={"sent": 3}, commit=record_sent)``: ``commit(conn)``
    runs inside Complete's transaction (the transactional path, once per
    effect key) and ``result`` (any JSON value) is stored by that same
    transaction. Either may be None (``Done()`` is a plain success).

    A frozen dataclass rather than a tuple: ``return result, commit`` would be
    a JSON list to store, and a typo in the order would be silent.
    """

    result: Any = None
    commit: CommitCallable | None = None

    def __post_init__(self) -> None:
        if self.commit is not None and not callable(self.commit):
            raise ValidationError(
                "commit", f"Done(commit=...) must be callable, got a {type(self.commit).__name__}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Registration:
    type: str
    handler: Handler
    timeout: dt.timedelta | None
    max_snoozes: int | None = None
    """How many times a job of this type may snooze before a further Snooze
    is a failed attempt (None: no limit; see :class:`Snooze`)."""
    is_async: bool = False
    """An ``async def`` handler: run as a task on the worker's event loop."""


class Registry:
    """Maps job types to handlers, with an optional execution timeout each.

    ``default_timeout`` applies to handlers registered without one; past its
    timeout a job's context is cancelled and the attempt fails.
    """

    def __init__(self, *, default_timeout: dt.timedelta | None = None) -> None:
        if default_timeout is not None:
            validate.positive_duration("default_timeout", default_timeout)
        self.default_timeout = default_timeout
        self._handlers: dict[str, Registration] = {}

    def handler(
        self,
        job_type: str,
        *,
        timeout: dt.timedelta | None = None,
        max_snoozes: int | None = None,
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``@registry.handler("email.send")``."""

        def register(fn: Handler) -> Handler:
            self.register(job_type, fn, timeout=timeout, max_snoozes=max_snoozes)
            return fn

        return register

    def task(
        self,
        job_type: str,
        *,
        queue: str = DEFAULT_QUEUE,
        priority: int = DEFAULT_PRIORITY,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Backoff = DEFAULT_BACKOFF,
        timeout: dt.timedelta | None = None,
        max_snoozes: int | None = None,
    ) -> TaskDecorator:
        """Decorator: a typed task (see :mod:`jobrun.worker.tasks`).

        ``@registry.task("email.send", queue="emails")`` on ``def send_email(to:
        str, subject: str) -> None`` registers a handler for ``email.send`` that
        calls it with the job's arguments, and gives a :class:`~jobrun.worker.tasks.Task`:
        ``send_email.enqueue(client, "ada@example.com", subject="hi")``, checked
        against the signature by mypy and at the call. ``queue``, ``priority``,
        ``max_attempts`` and ``backoff`` are the defaults of the jobs it enqueues
        (``.options(...)`` overrides them for one enqueue); ``timeout`` and
        ``max_snoozes`` are the handler's, as in :meth:`register`.
        """
        options = task_options(
            queue=queue, priority=priority, max_attempts=max_attempts, backoff=backoff
        )
        validate.job_type(job_type)
        return TaskDecorator(self, job_type, options, timeout=timeout, max_snoozes=max_snoozes)

    def register(
        self,
        job_type: str,
        fn: Handler,
        *,
        timeout: dt.timedelta | None = None,
        max_snoozes: int | None = None,
    ) -> None:
        """Run ``fn`` for jobs of ``job_type``.

        ``timeout``: past it the job's context is cancelled (``default_timeout``
        when None). ``max_snoozes``: how many times a job of this type may
        :class:`Snooze` before a further snooze counts as a failed attempt
        (None: no limit; 0: every snooze is a failed attempt).
        """
        validate.job_type(job_type)
        if not callable(fn):
            raise ValidationError("handler", f"the handler for {job_type!r} is not callable")
        coroutine = is_coroutine_handler(fn)
        if not coroutine and is_async(fn):
            name = getattr(fn, "__qualname__", None) or type(fn).__name__
            raise ValidationError(
                "handler",
                f"the handler for {job_type!r} ({name}) is an async generator function: "
                "a handler returns one value (or raises); register an async def (or a "
                "plain def) that returns it",
            )
        if timeout is not None:
            validate.positive_duration("timeout", timeout)
        if max_snoozes is not None and (
            isinstance(max_snoozes, bool)
            or not isinstance(max_snoozes, int)
            or not 0 <= max_snoozes <= MAX_SNOOZES
        ):
            raise ValidationError(
                "max_snoozes",
                f"must be None or an int from 0 to {MAX_SNOOZES:,}, not {max_snoozes!r}",
            )
        if job_type in self._handlers:
            raise ValidationError("type", f"a handler for {job_type!r} is already registered")
        self._handlers[job_type] = Registration(
            job_type, fn, timeout, max_snoozes, is_async=coroutine
        )

    def get(self, job_type: str) -> Registration | None:
        return self._handlers.get(job_type)

    def timeout_for(self, registration: Registration | None) -> dt.timedelta | None:
        if registration is not None and registration.timeout is not None:
            return registration.timeout
        return self.default_timeout

    @property
    def has_async(self) -> bool:
        """True when an ``async def`` handler is registered (a worker then runs an event loop)."""
        return any(r.is_async for r in self._handlers.values())

    @property
    def types(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)
