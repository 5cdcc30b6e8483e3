"""``JobrunBackend``: Django's task framework (``django.tasks``) on jobrun.

::

    TASKS = {
        "default": {
            "BACKEND": "jobrun.contrib.django.JobrunBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"max_attempts": 5},
        }
    }

A ``@task`` function's ``enqueue()`` writes one jobrun job of type
``django.task`` whose payload names the function (its module path) and holds
its arguments (JSON). The job is written on Django's own database
connection: inside ``transaction.atomic()`` it is part of the block's
transaction and exists exactly when the block commits (a rolled-back nested
block takes its jobs with it); outside, Django autocommits and so does the
enqueue. No ``transaction.on_commit`` is needed.

How Django's task API maps onto jobrun:

======================  =========================================================
Django                  jobrun
======================  =========================================================
``queue_name``          the job's queue (it must be one of ``QUEUES``)
``priority`` -100..100  ``priority = -priority``: higher runs first in Django,
                        lower in jobrun, so the order is the same
``run_after``           ``run_at`` (a naive datetime is in the current time zone)
result id               the job's id (a UUID, as text)
``get_result(id)``      ``client.get(id)``: status, return value (the job's
                        ``result``), errors, times (from the job's events)
READY                   queued (new, or waiting for its next attempt)
RUNNING                 leased
SUCCESSFUL              succeeded
FAILED                  dead (attempts used up, or PermanentFailure) or cancelled
======================  =========================================================

``OPTIONS`` (all optional) say what Django's API cannot:

``database``
    the Django database alias the jobs are written on, in its transactions,
    and that the backend and the worker read (default ``"default"``). It must
    hold jobrun's schema (``jobrun migrate``).
``max_attempts``
    attempts per task before it is FAILED (default 25, jobrun's).
``backoff``
    the delay between attempts: a ``jobrun.Backoff`` or a dict of its fields,
    like ``{"kind": "exponential", "base": 1.0, "max_delay": 600}``.

Per call, :func:`enqueue` adds what a jobrun job has and a Django task does
not: an idempotency key (enqueuing the same task, arguments and key again
returns the stored job's result instead of a second job), a concurrency
key (counted by the queue's per-key limit), and ``max_attempts``. Commit
callables (the exactly-once path) are not a Django task's to return: write
a jobrun handler for those (see docs/stacks.md).

The worker is ``python manage.py jobrun_worker`` (see
:mod:`jobrun.contrib.django.management.commands.jobrun_worker`). The rest of
jobrun's settings (``JOBRUN_SCHEMA``, ``JOBRUN_JOB_EVENTS``, ...) come from the
environment, as everywhere in jobrun.
"""

from __future__ import annotations

import builtins
import datetime as dt
import re
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.contrib.django._tasks import (
    BaseTaskBackend,
    Task,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from jobrun.job.errors import NotFound, ValidationError
from jobrun.job.model import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_ATTEMPTS,
    Backoff,
    EventKind,
    Job,
    JSONValue,
    NewJob,
    State,
)
from jobrun.postgres.connect import conninfo

__all__ = ["JOB_TYPE", "JobrunBackend", "close_clients", "enqueue", "task_of", "task_result"]

JOB_TYPE = "django.task"
"""The jobrun job type of every Django task; the payload names the function."""

_STATUS: dict[State, Any] = {
    State.WAITING: TaskResultStatus.READY,
    State.QUEUED: TaskResultStatus.READY,
    State.LEASED: TaskResultStatus.RUNNING,
    State.SUCCEEDED: TaskResultStatus.SUCCESSFUL,
    State.DEAD: TaskResultStatus.FAILED,
    State.CANCELLED: TaskResultStatus.FAILED,
}

_OPTIONS = frozenset({"database", "max_attempts", "backoff"})

# Not connection options: what Django's psycopg backend adds for itself.
_NOT_CONNINFO = frozenset({"context", "cursor_factory", "prepare_threshold", "row_factory"})


class JobrunBackend(BaseTaskBackend):
    """Django's task backend on jobrun (see the module docstring)."""

    supports_defer = True
    supports_get_result = True
    supports_priority = True
    supports_async_task = False
    """Tasks run on jobrun's worker threads: an ``async def`` task is refused."""

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415 - Django is set up when backends are made
        from django.db import DEFAULT_DB_ALIAS  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

        options: Mapping[str, Any] = self.options
        unknown = sorted(set(options) - _OPTIONS)
        if unknown:
            raise ImproperlyConfigured(
                f"TASKS[{alias!r}]['OPTIONS']: unknown option(s) {', '.join(unknown)}; "
                f"jobrun's backend takes {', '.join(sorted(_OPTIONS))}"
            )
        self.database: str = options.get("database", DEFAULT_DB_ALIAS)
        self.max_attempts: int = options.get("max_attempts", DEFAULT_MAX_ATTEMPTS)
        backoff = options.get("backoff", DEFAULT_BACKOFF)
        try:
            self.backoff: Backoff = backoff if isinstance(backoff, Backoff) else Backoff(**backoff)
            NewJob(type=JOB_TYPE, max_attempts=self.max_attempts, backoff=self.backoff)
        except (TypeError, ValidationError) as exc:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]['OPTIONS']: {exc}") from None

    # -- where the jobs are ---------------------------------------------------------

    def connection(self) -> Any:
        """The Django connection the jobs are written on (this thread's)."""
        from django.db import connections  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

        return connections[self.database]

    def database_url(self) -> str:
        """A libpq connection string for the backend's Django database (for the worker)."""
        params = self.connection().get_connection_params()
        return conninfo(
            **{k: v for k, v in params.items() if k not in _NOT_CONNINFO and v is not None}
        )

    def client(self) -> Client:
        """The process's jobrun Client on the backend's database (opened on first use)."""
        return _client(self.database_url())

    # -- enqueue ----------------------------------------------------------------------

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any]:
        """Enqueue ``task(*args, **kwargs)``, in the current transaction of the database."""
        return self.enqueue_with(task, args, kwargs)

    def enqueue_with(
        self,
        task: Task[Any, Any],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        concurrency_key: str | None = None,
        max_attempts: int | None = None,
    ) -> TaskResult[Any]:
        """:meth:`enqueue` with jobrun's own options (see :func:`enqueue`)."""
        self.validate_task(task)
        payload: dict[str, JSONValue] = {
            "task": task.module_path,
            "args": normalize_json(list(args)),  # a TypeError names what JSON cannot hold
            "kwargs": normalize_json(dict(kwargs or {})),
            "priority": task.priority,
            "backend": self.alias,
        }
        job = self.client().enqueue(
            JOB_TYPE,
            payload,
            queue=task.queue_name,
            priority=-task.priority,
            run_at=_aware(task.run_after),
            max_attempts=self.max_attempts if max_attempts is None else max_attempts,
            backoff=self.backoff,
            idempotency_key=idempotency_key,
            concurrency_key=concurrency_key,
            conn=self.connection(),
        )
        stored = task_result(job, task, self.alias)
        task_enqueued.send(type(self), task_result=stored)
        return stored

    # -- results ----------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[Any]:
        """The task's result now: TaskResultDoesNotExist for an id that is no task of jobrun's."""
        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        client = self.client()
        try:
            job = client.get(job_id)
        except NotFound:
            raise TaskResultDoesNotExist(result_id) from None
        if job.type != JOB_TYPE or not isinstance(job.payload, dict):
            raise TaskResultDoesNotExist(result_id)
        claims = [e.at for e in client.events(job_id) if e.kind == EventKind.CLAIMED]
        return task_result(job, task_of(job, self.alias), self.alias, claims=claims)


def enqueue(
    task: Task[Any, Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    idempotency_key: str | None = None,
    concurrency_key: str | None = None,
    max_attempts: int | None = None,
) -> TaskResult[Any]:
    """``task.enqueue(*args, **kwargs)`` with what only jobrun has.

    ``idempotency_key``: enqueuing again with the same key (in the task's
    queue) and the same task and arguments returns the stored job's result;
    different ones raise ``jobrun.IdempotencyConflict``. ``concurrency_key``:
    what the queue's per-key limit counts the job under. ``max_attempts``:
    instead of the backend's. The task's backend must be a JobrunBackend.
    """
    backend = task.get_backend()
    if not isinstance(backend, JobrunBackend):
        raise ValidationError(
            "task", f"{task.module_path} runs on {type(backend).__name__}, not a JobrunBackend"
        )
    return backend.enqueue_with(
        task,
        args,
        kwargs,
        idempotency_key=idempotency_key,
        concurrency_key=concurrency_key,
        max_attempts=max_attempts,
    )


def task_of(job: Job, alias: str | None = None) -> Task[Any, Any]:
    """The Django Task a ``django.task`` job runs, as it was enqueued (priority, queue).

    On the task backend ``alias``, else the one it was enqueued through.
    """
    from django.utils.module_loading import import_string  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    payload = job.payload
    if not isinstance(payload, dict) or not isinstance(payload.get("task"), str):
        raise ValidationError("payload", f"job {job.id} is not a Django task's (no 'task' path)")
    found = import_string(payload["task"])
    if not isinstance(found, Task):
        raise ValidationError("payload", f"{payload['task']} is not a Django task (@task)")
    priority = payload.get("priority")
    enqueued_on = payload.get("backend")
    return found.using(
        priority=priority if isinstance(priority, int) else -job.priority,
        queue_name=job.queue,
        backend=alias or (enqueued_on if isinstance(enqueued_on, str) else found.backend),
    )


def task_result(
    job: Job, task: Task[Any, Any], alias: str, *, claims: Sequence[dt.datetime] = ()
) -> TaskResult[Any]:
    """Django's view of a ``django.task`` job: status, return value, errors and times.

    ``claims`` are the times of the job's attempts (its ``claimed`` events),
    for ``started_at`` and ``last_attempted_at``. jobrun does not keep which
    worker ran each past attempt: ``worker_ids`` has one entry per attempt
    (so ``attempts`` is right), the current lease owner's for a running job.
    """
    payload = job.payload if isinstance(job.payload, dict) else {}
    owners = ["jobrun"] * job.attempts
    if owners and job.lease_owner:
        owners[-1] = job.lease_owner
    errors = []
    if job.last_error:
        errors.append(
            TaskError(
                exception_class_path=_exception_path(job.last_error), traceback=job.last_error
            )
        )
    args = payload.get("args")
    kwargs = payload.get("kwargs")
    result: TaskResult[Any] = TaskResult(
        task=task,
        id=str(job.id),
        status=_STATUS[job.state],
        enqueued_at=job.created_at,
        started_at=claims[0] if claims else None,
        finished_at=job.finished_at,
        last_attempted_at=claims[-1] if claims else None,
        args=args if isinstance(args, list) else [],
        kwargs=kwargs if isinstance(kwargs, dict) else {},
        backend=alias,
        errors=errors,
        worker_ids=owners,
    )
    if job.state is State.SUCCEEDED:
        # The frozen dataclass's private field, set as Django's own backends do.
        object.__setattr__(result, "_return_value", job.result)
    return result


_LAST_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _exception_path(last_error: str) -> str:
    """The dotted path of the exception class a ``last_error`` ("Name: message\\ntraceback") names.

    The traceback's last line names the class with its module
    (``myapp.tasks.Declined: ...``); a built-in exception is ``builtins.Name``.
    """
    name = last_error.split(":", 1)[0].split("\n", 1)[0].strip()
    for line in reversed(last_error.splitlines()):
        m = _LAST_LINE.match(line)
        if m and (m.group(1) == name or m.group(1).endswith("." + name)) and "." in m.group(1):
            return m.group(1)
    if isinstance(getattr(builtins, name, None), type):
        return f"builtins.{name}"
    return name


def _aware(when: dt.datetime | None) -> dt.datetime | None:
    if when is None or when.tzinfo is not None:
        return when
    from django.utils import timezone  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415

    return timezone.make_aware(when)  # type: ignore[no-any-return]


_clients: dict[str, Client] = {}
_clients_lock = threading.Lock()


def _client(database_url: str) -> Client:
    """One Client (and pool) per database per process, whatever the thread.

    Django makes a backend per thread; they share this. Its settings are
    jobrun's from the environment, with the Django database as the URL.
    """
    with _clients_lock:
        client = _clients.get(database_url)
        if client is None:
            settings = Settings.from_env(database_url=database_url)
            client = Client.connect(
                settings=settings, pool_size=2, application_name="jobrun-django"
            )
            _clients[database_url] = client
        return client


def close_clients() -> None:
    """Close the backends' jobrun clients (their pools): for tests and for shutdown."""
    with _clients_lock:
        clients = list(_clients.values())
        _clients.clear()
    for client in clients:
        client.close()
