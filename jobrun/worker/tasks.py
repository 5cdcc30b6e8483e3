"""Typed tasks: a plain (or async) function, enqueued with its own typed arguments.

::

    registry = jobrun.Registry()

    @registry.task("email.send", queue="emails", max_attempts=5)
    def send_email(to: str, subject: str, *, urgent: bool = False) -> dict[str, str]:
        ...
        return {"sent_to": to}

    send_email.enqueue(client, "ada@example.com", subject="hi")   # a jobrun.Job
    send_email.options(delay=dt.timedelta(minutes=5)).enqueue(client, "ada@...", "hi")
    send_email.options(conn=conn).enqueue(client, ...)   # in your transaction
    send_email.new_job("ada@example.com", "hi")          # the NewJob, for enqueue_batch
    send_email("ada@example.com", "hi")                  # still the plain function

:meth:`Registry.task <jobrun.worker.registry.Registry.task>` registers a
handler for the type that calls the function with the job's arguments, and
returns a :class:`Task` generic over the function's parameters
(``typing.ParamSpec``) and return type, so that mypy checks every
``.enqueue(target, ...)`` and ``.new_job(...)`` against the function's own
signature.

The rules:

- **Checked before anything is written.** The arguments are bound to the
  signature (``inspect.signature(fn).bind``): a missing, extra or doubled
  argument is a ``ValidationError`` (field ``arguments``). Each must be a
  JSON value (str, int, float, bool, None, and lists and str-keyed dicts of
  them; tuples become lists): one that is not is a ``ValidationError``
  whose field is the argument's name. mypy checks the types; the run-time
  check is the JSON one (a ``datetime`` argument type-checks but cannot be
  stored: pass ``.isoformat()``).
- **The payload is the named arguments**: ``{"to": "ada@...", "subject":
  "hi"}``, each argument passed under its parameter's name (whether it was
  passed by position or by keyword), those left out not stored (the
  function's defaults apply when it runs: the payload says what the caller
  said). A ``*args`` parameter's values are a list under its name, a
  ``**kwargs`` parameter's an object under its name. Readable in ``jobrun
  get`` and the dashboard, and a parameter added with a default, or
  parameters reordered, keep working for jobs already queued.
- **The handler calls the function with them** (an ``async def`` function
  runs on the worker's event loop, see :mod:`jobrun.worker.worker`), and
  what it returns means what any handler's return value means (a JSON
  result, a commit callable, :class:`~jobrun.worker.registry.Done`,
  :class:`~jobrun.worker.registry.Snooze`). A payload that no longer fits
  the signature (a job queued by an older or newer version of the code) is
  a failed attempt, retried after its backoff, saying what does not fit.
- **The context**: a function whose first parameter is annotated
  ``jobrun.JobContext`` gets the job's context there (cancellation,
  ``ctx.progress``, ``ctx.job``); it is not an argument of ``enqueue``.
  mypy and the run time agree for that annotation; annotate it exactly (a
  first parameter typed ``object`` is a context to mypy but an argument at
  run time).
- **Options** (``.options(...)``) set a job's queue, priority,
  max_attempts, backoff, run_at or delay, idempotency_key and
  concurrency_key, and ``conn`` (enqueue in that connection's transaction),
  for one enqueue: they return a configured copy and never collide with the
  function's own parameter names.
- **Targets**: ``enqueue`` takes a :class:`jobrun.Client` (its
  ``enqueue_job``) or a Store (its ``enqueue``); ``await
  task.aenqueue(aclient, ...)`` an async client (its ``enqueue_job``); for
  anything else (a batch: ``client.enqueue_batch([...])``) take
  :meth:`Task.new_job`.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import (
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    Self,
    TypeVar,
    overload,
)

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, Job, NewJob
from jobrun.worker.callables import is_async, is_coroutine_handler
from jobrun.worker.context import JobContext

P = ParamSpec("P")
R = TypeVar("R")

_CONTEXT_NAMES = frozenset(
    {
        "JobContext",
        "jobrun.JobContext",
        "jobrun.worker.JobContext",
        "jobrun.worker.context.JobContext",
    }
)


class JobClient(Protocol):
    """What a task enqueues through: a :class:`jobrun.Client`."""

    def enqueue_job(self, job: NewJob, *, conn: Any = None) -> Job: ...


class JobStore(Protocol):
    """Or a Store (``jobrun.postgres.Store``)."""

    def enqueue(self, job: NewJob, *, conn: Any = None) -> Job: ...


class AsyncJobClient(Protocol):
    """What :meth:`Task.aenqueue` enqueues through: an async client (``jobrun.AsyncClient``)."""

    async def enqueue_job(self, job: NewJob, *, conn: Any = None) -> Job: ...


class Registers(Protocol):
    """Where a task's handler goes: a :class:`~jobrun.worker.registry.Registry`
    (named by what it does, so that the registry may import this module)."""

    def register(
        self,
        job_type: str,
        fn: Callable[[JobContext, Job], Any],
        *,
        timeout: dt.timedelta | None = None,
        max_snoozes: int | None = None,
    ) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class _Options:
    queue: str
    priority: int
    max_attempts: int
    backoff: Backoff
    run_at: dt.datetime | None = None
    delay: dt.timedelta | None = None
    idempotency_key: str | None = None
    concurrency_key: str | None = None
    conn: Any = None


class BaseTask(Generic[P, R]):
    """What both kinds of task share: the type, the signature, enqueueing."""

    type: str
    """The job type the task is registered under."""

    def __init__(
        self, job_type: str, fn: Callable[..., Any], options: _Options, *, takes_context: bool
    ) -> None:
        self.type = job_type
        self._fn = fn
        self._options = options
        self._takes_context = takes_context
        signature = _signature(fn)
        parameters = list(signature.parameters.values())
        if takes_context:
            parameters = parameters[1:]
        self._enqueue_signature = signature.replace(parameters=parameters)
        functools.update_wrapper(typing.cast(Any, self), fn)  # its name, doc, __wrapped__

    @property
    def signature(self) -> inspect.Signature:
        """The arguments ``enqueue`` takes (the function's, less the context)."""
        return self._enqueue_signature

    @property
    def queue(self) -> str:
        return self._options.queue

    def __repr__(self) -> str:
        name = getattr(self._fn, "__qualname__", repr(self._fn))
        return f"<{type(self).__name__} {self.type!r}: {name}{self._enqueue_signature}>"

    # -- enqueueing ------------------------------------------------------------------

    def enqueue(self, target: JobClient | JobStore, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        """Enqueue one job with these arguments (checked first: nothing is written
        when they do not fit the signature or are not JSON values)."""
        job = self.new_job(*args, **kwargs)
        conn = self._options.conn
        enqueue_job = getattr(target, "enqueue_job", None)
        if callable(enqueue_job):
            stored = enqueue_job(job, conn=conn)
        elif callable(getattr(target, "enqueue", None)):
            stored = typing.cast(JobStore, target).enqueue(job, conn=conn)
        else:
            raise ValidationError(
                "target",
                f"{self.type!r}.enqueue takes a jobrun.Client or a Store first, not a "
                f"{type(target).__name__}",
            )
        if inspect.isawaitable(stored):
            close = getattr(stored, "close", None)
            if callable(close):
                close()
            raise ValidationError(
                "target",
                f"an async client's enqueue cannot be awaited here: use "
                f"await {self._name()}.aenqueue(client, ...)",
            )
        return typing.cast(Job, stored)

    async def aenqueue(self, target: AsyncJobClient, /, *args: P.args, **kwargs: P.kwargs) -> Job:
        """:meth:`enqueue` through an async client (``await task.aenqueue(aclient, ...)``;
        ``.options(conn=...)`` takes its ``AsyncConnection``)."""
        job = self.new_job(*args, **kwargs)
        return await target.enqueue_job(job, conn=self._options.conn)

    def new_job(self, *args: P.args, **kwargs: P.kwargs) -> NewJob:
        """The NewJob :meth:`enqueue` would write (for ``enqueue_batch`` or an async
        client), checked the same way."""
        payload = self._payload(args, kwargs)
        o = self._options
        try:
            return NewJob(
                type=self.type,
                payload=payload,
                queue=o.queue,
                priority=o.priority,
                max_attempts=o.max_attempts,
                backoff=o.backoff,
                run_at=o.run_at,
                delay=o.delay,
                idempotency_key=o.idempotency_key,
                concurrency_key=o.concurrency_key,
            )
        except ValidationError as exc:
            if exc.field == "payload":
                raise self._argument_error(payload, exc) from None
            raise

    def options(
        self,
        *,
        queue: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        backoff: Backoff | None = None,
        run_at: dt.datetime | None = None,
        delay: dt.timedelta | None = None,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        conn: Any = None,
    ) -> Self:
        """A copy of this task that enqueues with these options (None: as before).

        ``conn``: a psycopg connection whose open transaction the job joins (it
        exists iff that transaction commits). The copy runs the same handler;
        make it where you enqueue (``task.options(delay=...).enqueue(...)``).
        """
        o = self._options
        changes: dict[str, Any] = {}
        if queue is not None:
            changes["queue"] = validate.queue_name(queue)
        if priority is not None:
            changes["priority"] = validate.priority(priority)
        if max_attempts is not None:
            changes["max_attempts"] = validate.max_attempts(max_attempts)
        if backoff is not None:
            changes["backoff"] = _backoff(backoff)
        if run_at is not None:
            changes["run_at"] = validate.aware_datetime("run_at", run_at)
            changes["delay"] = None
        if delay is not None:
            if run_at is not None:
                raise ValidationError("run_at", "give run_at or delay, not both")
            changes["delay"] = validate.delay(delay)
            changes["run_at"] = None
        if idempotency_key is not None:
            changes["idempotency_key"] = validate.idempotency_key(idempotency_key)
        if concurrency_key is not None:
            changes["concurrency_key"] = validate.concurrency_key(concurrency_key)
        if conn is not None:
            changes["conn"] = conn
        configured = copy.copy(self)
        configured._options = dataclasses.replace(o, **changes)
        return configured

    # -- arguments <-> payload -----------------------------------------------------------

    def _payload(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        try:
            bound = self._enqueue_signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise ValidationError(
                "arguments", f"{self._describe()}: {exc} (nothing was enqueued)"
            ) from None
        payload: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            kind = self._enqueue_signature.parameters[name].kind
            payload[name] = list(value) if kind is inspect.Parameter.VAR_POSITIONAL else value
        return payload

    def _argument_error(self, payload: dict[str, Any], exc: ValidationError) -> ValidationError:
        """The argument that makes the payload unstorable, named (else the payload's error)."""
        for name, value in payload.items():
            try:
                validate.payload({name: value})
            except ValidationError as inner:
                what = inner.message.removeprefix("payload ")
                return ValidationError(
                    name, f"argument {name!r} of {self._describe()} {what} (nothing was enqueued)"
                )
        return ValidationError("payload", f"{self._describe()}: {exc.message}")

    def _arguments(self, payload: Any) -> tuple[list[Any], dict[str, Any]]:
        """The call a job's payload stands for: positional and keyword arguments."""
        if not isinstance(payload, dict):
            raise TypeError(f"the payload of a {self.type!r} job is not an object of arguments")
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        positional = True  # until a positional parameter is left out
        unknown = set(payload)
        for name, parameter in self._enqueue_signature.parameters.items():
            kind = parameter.kind
            given = name in payload
            unknown.discard(name)
            value = payload.get(name)
            if kind is inspect.Parameter.VAR_POSITIONAL:
                if given:
                    if not isinstance(value, list):
                        raise TypeError(f"*{name} in the payload is not a list")
                    args.extend(value)
            elif kind is inspect.Parameter.VAR_KEYWORD:
                if given:
                    if not isinstance(value, dict):
                        raise TypeError(f"**{name} in the payload is not an object")
                    kwargs.update(value)
            elif kind is inspect.Parameter.KEYWORD_ONLY:
                if given:
                    kwargs[name] = value
            elif not given:
                positional = False
            elif positional:
                args.append(value)
            else:
                kwargs[name] = value
        if unknown:
            raise TypeError(f"unexpected argument(s) {', '.join(map(repr, sorted(unknown)))}")
        self._enqueue_signature.bind(*args, **kwargs)  # a clear TypeError before the call
        return args, kwargs

    def _name(self) -> str:
        return str(getattr(self._fn, "__name__", self.type))

    def _describe(self) -> str:
        return f"{self._name()}{self._enqueue_signature}"

    def _handler(self, *, coroutine: bool) -> Callable[[JobContext, Job], Any]:
        """The registry's handler: the function called with the job's arguments
        (an ``async def`` one when ``coroutine``: the worker's event loop runs it)."""
        fn, takes_context = self._fn, self._takes_context

        def arguments(ctx: JobContext, job: Job) -> tuple[list[Any], dict[str, Any]]:
            try:
                args, kwargs = self._arguments(job.payload)
            except TypeError as exc:
                raise TypeError(
                    f"the job's payload does not fit {self._describe()}: {exc} "
                    f"(payload keys: {', '.join(sorted(job.payload)) or 'none'})"
                ) from None
            if takes_context:
                args.insert(0, ctx)
            return args, kwargs

        if coroutine:

            async def run_async(ctx: JobContext, job: Job) -> Any:
                args, kwargs = arguments(ctx, job)
                return await fn(*args, **kwargs)

            handler: Callable[[JobContext, Job], Any] = run_async
        else:

            def run(ctx: JobContext, job: Job) -> Any:
                args, kwargs = arguments(ctx, job)
                return fn(*args, **kwargs)

            handler = run
        handler.__qualname__ = getattr(fn, "__qualname__", handler.__qualname__)
        handler.__module__ = getattr(fn, "__module__", handler.__module__)
        return handler


class Task(BaseTask[P, R]):
    """A typed task: ``task.enqueue(client, *args, **kwargs)`` with the function's
    own arguments, checked by mypy and at the call; ``task(*args, **kwargs)``
    calls the function itself. Made by :meth:`Registry.task`."""

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self._fn(*args, **kwargs)
        return result


class ContextTask(BaseTask[P, R]):
    """A typed task whose function takes the job's context first: ``enqueue``
    takes the other arguments; calling it directly takes the context too."""

    def __call__(self, ctx: JobContext, /, *args: P.args, **kwargs: P.kwargs) -> R:
        result: R = self._fn(ctx, *args, **kwargs)
        return result


class TaskDecorator:
    """What ``registry.task(...)`` returns: applied to a function, it registers
    the function's handler and returns its :class:`Task` (or :class:`ContextTask`)."""

    def __init__(
        self,
        registry: Registers,
        job_type: str,
        options: _Options,
        *,
        timeout: dt.timedelta | None,
        max_snoozes: int | None,
    ) -> None:
        self._registry = registry
        self._type = job_type
        self._options = options
        self._timeout = timeout
        self._max_snoozes = max_snoozes

    @overload
    def __call__(self, fn: Callable[Concatenate[JobContext, P], R]) -> ContextTask[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any]) -> ContextTask[Any, Any] | Task[Any, Any]:
        if not callable(fn):
            raise ValidationError("task", f"@task({self._type!r}) decorates a function")
        if is_async(fn) and not is_coroutine_handler(fn):
            raise ValidationError(
                "task",
                f"{getattr(fn, '__qualname__', fn)!r} is an async generator function: a task "
                "returns one value (or raises)",
            )
        try:
            _signature(fn)
        except (TypeError, ValueError) as exc:
            raise ValidationError("task", f"cannot read the signature of {fn!r}: {exc}") from None
        takes_context = _takes_context(fn)
        task: ContextTask[Any, Any] | Task[Any, Any]
        if takes_context:
            task = ContextTask(self._type, fn, self._options, takes_context=True)
        else:
            task = Task(self._type, fn, self._options, takes_context=False)
        self._registry.register(
            self._type,
            task._handler(coroutine=is_coroutine_handler(fn)),
            timeout=self._timeout,
            max_snoozes=self._max_snoozes,
        )
        return task


def task_options(*, queue: str, priority: int, max_attempts: int, backoff: Backoff) -> _Options:
    """A task's defaults, checked (``Registry.task``)."""
    return _Options(
        queue=validate.queue_name(queue),
        priority=validate.priority(priority),
        max_attempts=validate.max_attempts(max_attempts),
        backoff=_backoff(backoff),
    )


def _backoff(value: object) -> Backoff:
    if not isinstance(value, Backoff):
        raise ValidationError("backoff", "must be a jobrun.Backoff")
    return value


def _signature(fn: Callable[..., Any]) -> inspect.Signature:
    """The function's signature, its annotations evaluated when they can be
    (``from __future__ import annotations`` makes them strings)."""
    try:
        return inspect.signature(fn, eval_str=True)
    except Exception:  # a name only a type checker sees: keep the text
        return inspect.signature(fn)


def _takes_context(fn: Callable[..., Any]) -> bool:
    """True when the function's first positional parameter is annotated JobContext."""
    parameters = list(_signature(fn).parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return False
    annotation: object = parameters[0].annotation
    if annotation is JobContext:
        return True
    if isinstance(annotation, str):
        return annotation.strip().strip("'\"") in _CONTEXT_NAMES
    return False
