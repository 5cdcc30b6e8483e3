"""A registry with one handler: ``touch`` writes the job id to the file named in its payload."""

from __future__ import annotations

from pathlib import Path

from jobrun.job.model import Job
from jobrun.worker.context import JobContext
from jobrun.worker.registry import Registry

registry = Registry()


@registry.handler("touch")
def touch(ctx: JobContext, job: Job) -> None:
    Path(job.payload["path"]).write_text(str(job.id))


not_a_registry = {"touch": touch}
