"""A registry with one signup handler for the durable-waits kill tests.

``signup`` records a welcome step, waits for signal ``confirmed`` (an hour
at most) and appends what it received to the file named in its payload;
with ``kill``, its first attempt kills its own process (SIGKILL) right after
the signal was delivered (the wait's step committed).
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from jobrun.job.model import Job
from jobrun.worker.context import JobContext
from jobrun.worker.registry import Registry

registry = Registry()


@registry.handler("signup")
def signup(ctx: JobContext, job: Job) -> Any:
    path = Path(job.payload["path"])

    def note(line: str) -> None:
        with path.open("a") as f:
            f.write(line + "\n")

    ctx.step("welcome", note, f"welcome {ctx.attempt}")
    got = ctx.wait_for_signal("confirmed", timeout=3600)
    note(f"confirmed {json.dumps(got)} {ctx.attempt}")
    if job.payload.get("kill") and ctx.attempt == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return got
