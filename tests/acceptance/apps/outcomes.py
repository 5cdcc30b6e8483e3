"""One handler per job outcome, for the console tests (tests/acceptance/test_worker_console.py)."""

from __future__ import annotations

from typing import Any

import jobrun
from jobrun import Job, JobContext, PermanentFailure, Registry

registry = Registry()


@registry.handler("ok")
def ok(ctx: JobContext, job: Job) -> None:
    """Succeeds."""


@registry.handler("flaky")
def flaky(ctx: JobContext, job: Job) -> None:
    """Fails its first attempt, succeeds on the second."""
    if job.attempts == 1:
        raise ValueError("first try fails")


@registry.handler("boom")
def boom(ctx: JobContext, job: Job) -> None:
    """Fails every attempt: dead after the last."""
    raise RuntimeError("always broken")


@registry.handler("perm")
def perm(ctx: JobContext, job: Job) -> None:
    raise PermanentFailure("bad input, no point retrying")


@registry.handler("wait_cancel")
def wait_cancel(ctx: JobContext, job: Job) -> None:
    ctx.logger.info("waiting to be cancelled")
    ctx.cancelled.wait(60)


@registry.handler("result")
def result(ctx: JobContext, job: Job) -> dict[str, Any]:
    return {"sent": 3}


@registry.handler("done")
def done(ctx: JobContext, job: Job) -> jobrun.Done:
    def commit(conn: Any) -> None:
        conn.execute("INSERT INTO effects (job_id, attempt, pid) VALUES (%s, %s, 0)", [job.id, 1])

    return jobrun.Done(result={"rows": 1}, commit=commit)
