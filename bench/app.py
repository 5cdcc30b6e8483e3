"""The handlers the benchmark's worker processes run.

``jobrun worker --app bench.app:registry`` (from the repository root):

bench.noop    returns None: completed in batches (``complete_many``)
bench.tx      returns a commit callable inserting one row into bench_sink:
              the transactional path, one Complete transaction per job
bench.pickup  notes ``time.time()`` as the handler starts, and writes it to
              bench_pickup through its commit callable (pickup latency)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from jobrun import Job, JobContext, Registry

registry = Registry()


@registry.handler("bench.noop")
def noop(ctx: JobContext, job: Job) -> None:
    return None


@registry.handler("bench.tx")
def transactional(ctx: JobContext, job: Job) -> Callable[[Any], None]:
    def commit(conn: Any) -> None:
        conn.execute("INSERT INTO bench_sink (job_id) VALUES (%s)", [job.id])

    return commit


@registry.handler("bench.pickup")
def pickup(ctx: JobContext, job: Job) -> Callable[[Any], None]:
    started = time.time()

    def commit(conn: Any) -> None:
        conn.execute(
            "INSERT INTO bench_pickup (job_id, started) VALUES (%s, %s)", [job.id, started]
        )

    return commit
