"""An async handler for the fault suite, in a registry of its own (a registry
with an async handler runs its worker differently: an event loop, handler
threads started on demand), so the other fault tests keep ``tests.faults.app``.

``jobrun worker --app tests.faults.async_app:registry``; the side log is
``tests.faults.app``'s.
"""

from __future__ import annotations

import asyncio
import time

from jobrun import Job, JobContext, Registry
from tests.faults.app import side_log

registry = Registry()


@registry.handler("async.deaf")
async def deaf(ctx: JobContext, job: Job) -> None:
    """Deaf to cancellation on the attempts in ``deaf_attempts`` (default: the
    first): swallows every CancelledError for a minute."""
    side_log("start", job)
    if job.attempts in job.payload.get("deaf_attempts", [1]):
        until = time.monotonic() + 60
        while time.monotonic() < until:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue
    side_log("end", job)
