"""Django: a ``django.tasks`` backend on jobrun, and Django's connection as ``conn=``.

``pip install 'jobrun[django]'``, then in settings.py::

    INSTALLED_APPS = [..., "jobrun.contrib.django"]   # for manage.py jobrun_worker
    TASKS = {"default": {"BACKEND": "jobrun.contrib.django.JobrunBackend", "QUEUES": ["default"]}}

Works with Django 6's ``django.tasks`` and, before it, with the
``django-tasks`` backport (the same API). Needs Django's PostgreSQL backend
on psycopg 3.

- :class:`JobrunBackend` (:mod:`.backend`): ``@task`` functions enqueue
  jobrun jobs, in the current ``atomic()`` block's transaction;
- :func:`enqueue`: the same with an idempotency key, a concurrency key or
  ``max_attempts``;
- ``python manage.py jobrun_worker``: the worker (:mod:`.worker`);
- ``client.enqueue(..., conn=django.db.connection)`` for jobrun's own job
  types (:mod:`.connection`).

Importing this package imports nothing of Django's task framework until one
of these names is used: ``jobrun.contrib`` finds Django's connection through
it without needing ``django-tasks``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobrun.contrib.django.backend import JobrunBackend, enqueue

__all__ = ["JobrunBackend", "enqueue"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from jobrun.contrib.django import backend  # noqa: PLC0415 - on first use

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
