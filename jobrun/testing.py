"""Helpers for applications' own test suites.

::

    from jobrun.testing import run_jobs

    def test_signup_sends_a_welcome_email(client, registry):
        signup(client, "a@example.com")          # enqueues email.send
        report = run_jobs(client, registry)      # runs it here, now, for real
        assert report.succeeded == 1

``run_jobs`` runs the queued, runnable jobs of a registry to completion,
synchronously, in the calling thread, against a real database, through the
same code path as a worker (claims, leases, commit callables, failures and
their backoff). A retry scheduled for later is left queued.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from jobrun.client import Client
from jobrun.job.ports import Store
from jobrun.worker.registry import Registry
from jobrun.worker.worker import Worker, WorkerConfig, parse_queues


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunReport:
    ran: int
    succeeded: int
    failed: int
    cancelled: int
    lease_lost: int


def run_jobs(
    target: Client | Store,
    registry: Registry,
    *,
    queues: Sequence[str] = ("default",),
    max_jobs: int = 10_000,
) -> RunReport:
    """Run the runnable jobs of ``queues`` with ``registry``'s handlers until none is left."""
    store = target.store if isinstance(target, Client) else target
    worker = Worker(store, registry, WorkerConfig(queues=parse_queues(queues), concurrency=1))
    ran = worker.drain(max_jobs=max_jobs)
    stats = worker.stats
    return RunReport(
        ran=ran,
        succeeded=stats["succeeded"],
        failed=stats["failed"],
        cancelled=stats["cancelled"],
        lease_lost=stats["lease_lost"],
    )
