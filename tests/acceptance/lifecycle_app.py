"""Handlers for the process-level acceptance tests (run by `jobrun worker --app`).

They report what they see into tables of the test's database (``observed``
and ``effects``), through a connection of their own or their commit callable.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psycopg

from jobrun import Job, JobContext, Registry

registry = Registry()


def observe(job: Job, what: str) -> None:
    with psycopg.connect(os.environ["DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO observed (job_id, attempt, what, pid) VALUES (%s, %s, %s, %s)",
            [job.id, job.attempts, what, os.getpid()],
        )


@registry.handler("tx")
def tx(ctx: JobContext, job: Job) -> Callable[[Any], None]:
    """Sleeps (so a test can kill the worker mid-job), then writes its effect once."""
    observe(job, "started")
    ctx.cancelled.wait(float(job.payload.get("sleep", 0)))

    def commit(conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "INSERT INTO effects (job_id, attempt, pid) VALUES (%s, %s, %s)",
            [job.id, job.attempts, os.getpid()],
        )

    return commit


@registry.handler("sleep")
def sleep(ctx: JobContext, job: Job) -> None:
    """Works for a while without looking at cancellation (a graceful stop waits for it)."""
    observe(job, "started")
    time.sleep(float(job.payload.get("seconds", 1)))
    observe(job, "finished")


@registry.handler("wait_cancel")
def wait_cancel(ctx: JobContext, job: Job) -> None:
    observe(job, "started")
    if ctx.cancelled.wait(120):
        observe(job, "cancelled")


@registry.handler("tick")
def tick(ctx: JobContext, job: Job) -> None:
    observe(job, "tick")
