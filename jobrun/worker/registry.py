"""Handlers: what a worker runs for each job type.

A handler is ``callable(ctx, job)``. It may

- return ``None``: the job succeeded (completed in a batch with
  ``complete_many``; at-least-once: a crash before the batch commits runs it
  again);
- return a *commit callable* ``commit(conn)``: the transactional path. It
  runs inside Complete's transaction, once per effect key, so its writes land
  exactly once however often the job runs;
- raise: the attempt fails and the job is retried after its backoff;
- raise :class:`PermanentFailure`: the job is dead now, whatever attempts remain.

Anything else it returns fails the attempt with a clear error.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job

if TYPE_CHECKING:
    from jobrun.worker.context import JobContext

Handler: TypeAlias = Callable[["JobContext", Job], Any]


class PermanentFailure(Exception):
    """Raise from a handler to fail the job for good: no more attempts."""


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
