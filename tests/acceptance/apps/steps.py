"""A registry with one resumable handler for the durable-steps kill test.

``resumable`` appends each step's name to the file named in its payload when
the step runs; with ``kill``, its first attempt kills its own process
(SIGKILL) right after the first step's checkpoint committed.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from jobrun.job.model import Job
from jobrun.worker.context import JobContext
from jobrun.worker.registry import Registry

registry = Registry()


@registry.handler("resumable")
def resumable(ctx: JobContext, job: Job) -> str:
    path = Path(job.payload["path"])

    def run(name: str) -> str:
        with path.open("a") as f:
            f.write(f"{name} {ctx.attempt}\n")
        return name

    first = ctx.step("one", lambda: run("one"))
    if job.payload.get("kill") and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    second = ctx.step("two", lambda: run("two"))
    return f"{first}+{second}"
