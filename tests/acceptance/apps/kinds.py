"""Registries that know different job types, for workers sharing one queue.

Each handler writes "<type> <pid>" to a file named after the job in the
directory of its payload: the test tells which process ran which job.
"""

from __future__ import annotations

import os
from pathlib import Path

from jobrun.job.model import Job
from jobrun.worker.context import JobContext
from jobrun.worker.registry import Registry


def _record(ctx: JobContext, job: Job) -> None:
    (Path(job.payload["dir"]) / str(job.id)).write_text(f"{job.type} {os.getpid()}")


registry_a = Registry()
registry_a.handler("kind.a")(_record)

registry_b = Registry()
registry_b.handler("kind.b")(_record)
