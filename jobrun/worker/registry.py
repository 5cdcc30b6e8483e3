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
- raise :class:`PermanentFailure`: the job is dead now, whatever attempts remain.

A callable is always taken for a commit callable, never for a result: that is
what keeps the transactional path's one-line form (``return commit``).

Handlers run on worker threads: an ``async def`` handler is refused when it
is registered (it would only return a coroutine that nothing awaits), and a
handler that returns an awaitable anyway (a sync wrapper around one) is dead
at its first attempt with a message saying why, rather than failing every
attempt the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job
from jobrun.job.ports import CommitCallable

if TYPE_CHECKING:
    from jobrun.worker.context import JobContext

Handler: TypeAlias = Callable[["JobContext", Job], Any]


class PermanentFailure(Exception):
    """Raise from a handler to fail the job for good: no more attempts."""


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


def is_async(fn: object) -> bool:
    """True for an ``async def`` function (or async generator), a partial of
    one, or an object whose ``__call__`` is one: what a thread cannot run."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return True
    if not inspect.isroutine(fn) and not inspect.isclass(fn):
        call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's, not the instance's
        return call is not None and (
            inspect.iscoroutinefunction(call) or inspect.isasyncgenfunction(call)
        )
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class Registration:
    type: str
    handler: Handler
    timeout: dt.timedelta | None


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
        self, job_type: str, *, timeout: dt.timedelta | None = None
    ) -> Callable[[Handler], Handler]:
        """Decorator: ``@registry.handler("email.send")``."""

        def register(fn: Handler) -> Handler:
            self.register(job_type, fn, timeout=timeout)
            return fn

        return register

    def register(self, job_type: str, fn: Handler, *, timeout: dt.timedelta | None = None) -> None:
        validate.job_type(job_type)
        if not callable(fn):
            raise ValidationError("handler", f"the handler for {job_type!r} is not callable")
        if is_async(fn):
            name = getattr(fn, "__qualname__", None) or type(fn).__name__
            raise ValidationError(
                "handler",
                f"the handler for {job_type!r} ({name}) is an async def function: jobrun "
                "runs handlers on worker threads, where it would only return a coroutine "
                "that nothing awaits. Register a plain def (it may call asyncio.run(...) "
                "for async code)",
            )
        if timeout is not None:
            validate.positive_duration("timeout", timeout)
        if job_type in self._handlers:
            raise ValidationError("type", f"a handler for {job_type!r} is already registered")
        self._handlers[job_type] = Registration(job_type, fn, timeout)

    def get(self, job_type: str) -> Registration | None:
        return self._handlers.get(job_type)

    def timeout_for(self, registration: Registration | None) -> dt.timedelta | None:
        if registration is not None and registration.timeout is not None:
            return registration.timeout
        return self.default_timeout

    @property
    def types(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, job_type: object) -> bool:
        return job_type in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)
