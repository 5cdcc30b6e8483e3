"""The worker side of :class:`~jobrun.contrib.django.JobrunBackend`: the ``django.task`` handler.

``registry`` holds one handler, for jobs of type ``django.task``: it imports
the task the payload names (``myapp.tasks.send_invoice``), calls it with the
payload's arguments, and returns its return value, which jobrun stores as the
job's result (``get_result(id).return_value``). An exception fails the
attempt: the job runs again after its backoff, and is FAILED once its
attempts are used up; ``jobrun.PermanentFailure`` fails it at once, and
``jobrun.Snooze`` runs it later without counting the attempt.

Around each task, Django's unusable or expired database connections are
closed (``close_old_connections``), as Django does around each request.
Django's ``task_started`` and ``task_finished`` signals are sent (finished:
on success, and on the failure of the last attempt).

``python manage.py jobrun_worker`` runs this registry; a program of its own
can too: ``jobrun.Runtime(settings, registry).run()`` after ``django.setup()``.
"""

from __future__ import annotations

from typing import Any

from jobrun.contrib.django._tasks import (
    TaskContext,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from jobrun.contrib.django.backend import JOB_TYPE, task_of, task_result
from jobrun.job.model import Job
from jobrun.worker import JobContext, PermanentFailure, Registry, Snooze

__all__ = ["registry", "run_task"]


def run_task(ctx: JobContext, job: Job) -> Any:
    """Run the Django task a ``django.task`` job names; its return value is the result."""
    from django.db import close_old_connections  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415 - Django is set up in a worker

    task = task_of(job)
    running = task_result(job, task, task.backend)
    object.__setattr__(running, "status", TaskResultStatus.RUNNING)
    sender = type(task.get_backend())
    args, kwargs = running.args, running.kwargs
    close_old_connections()
    try:
        task_started.send(sender=sender, task_result=running)
        if task.takes_context:
            value = task.call(TaskContext(task_result=running), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
        value = normalize_json(value)
    except Snooze:
        raise
    except BaseException as exc:
        if isinstance(exc, PermanentFailure) or job.attempts >= job.max_attempts:
            object.__setattr__(running, "status", TaskResultStatus.FAILED)
            task_finished.send(sender=sender, task_result=running)
        raise
    finally:
        close_old_connections()
    object.__setattr__(running, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(running, "_return_value", value)
    task_finished.send(sender=sender, task_result=running)
    return value


registry = Registry()
registry.register(JOB_TYPE, run_task)
