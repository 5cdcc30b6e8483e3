"""``python manage.py jobrun_worker``: jobrun's worker for a project's Django tasks.

It is ``jobrun worker`` (the same flags, logging, signals and exit codes:
SIGTERM or SIGINT drain it gracefully) run inside the Django project, with
the ``django.task`` handler (:mod:`jobrun.contrib.django.worker`), the task
backend's queues and its Django database::

    python manage.py jobrun_worker                       # the "default" task backend
    python manage.py jobrun_worker --backend emails --queues emails=4
    python manage.py jobrun_worker -- --concurrency 4 --no-scheduler

Everything after ``--`` goes to ``jobrun worker`` as it is (``jobrun worker
--help`` lists it); the rest of jobrun's settings come from the environment.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError  # type: ignore[import-untyped,unused-ignore]

APP = "jobrun.contrib.django.worker:registry"


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type hints
    help = "Run a jobrun worker for this project's Django tasks (the JobrunBackend's queues)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--backend", default="default", help="the TASKS alias of a JobrunBackend (default)"
        )
        parser.add_argument(
            "--queues", help="the queues to work, like emails=4,default (default: the QUEUES)"
        )
        parser.add_argument(
            "jobrun_args", nargs="*", metavar="-- FLAG", help="further `jobrun worker` flags"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        from jobrun import cli  # noqa: PLC0415
        from jobrun.contrib.django._tasks import task_backends  # noqa: PLC0415
        from jobrun.contrib.django.backend import JobrunBackend  # noqa: PLC0415

        alias = options["backend"]
        try:
            backend = task_backends[alias]
        except Exception as exc:  # noqa: BLE001 - Django's InvalidTaskBackendError, said as one line
            raise CommandError(f"no task backend {alias!r}: {exc}") from None
        if not isinstance(backend, JobrunBackend):
            raise CommandError(
                f"TASKS[{alias!r}] is a {type(backend).__name__}, not jobrun.contrib.django."
                "JobrunBackend"
            )
        queues = options["queues"] or ",".join(sorted(backend.queues or {"default"}))
        argv = [
            "worker",
            "--app",
            APP,
            "--queues",
            queues,
            "--database-url",
            backend.database_url(),
            *options["jobrun_args"],
        ]
        code = cli.main(argv)
        if code:
            raise SystemExit(code)
