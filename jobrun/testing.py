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
their backoff). It works every queue unless given ``queues=``, jobs that the
handlers enqueue meanwhile (in any queue) included: a test that enqueues to
``queue="emails"`` needs no knowledge of how its workers are deployed. A
retry scheduled for later is left queued, and so are the jobs of paused
queues (a worker would not claim them either).

``import jobrun`` makes it reachable as ``jobrun.testing.run_jobs`` too.
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
    """What :func:`run_jobs` did: how many jobs it ran, and how each attempt ended."""

    ran: int
    succeeded: int
    failed: int
    cancelled: int
    lease_lost: int


def run_jobs(
    target: Client | Store,
    registry: Registry,
    *,
    queues: Sequence[str] | None = None,
    max_jobs: int = 10_000,
) -> RunReport:
    """Run the runnable jobs of ``queues`` (default: every queue) until none is left.

    Without ``queues``, the queues come from the store's depth (those with
    ready jobs), read again after each pass, so that a job enqueued by a
    handler into a queue that was empty at first runs too. At most
    ``max_jobs`` jobs run, over every queue together.
    """
    store = target.store if isinstance(target, Client) else target
    totals = dict.fromkeys(("succeeded", "failed", "cancelled", "lease_lost"), 0)
    ran = 0
    while ran < max_jobs:
        names = parse_queues(queues) if queues is not None else _ready_queues(store)
        if not names:
            break
        worker = Worker(store, registry, WorkerConfig(queues=names, concurrency=1))
        ran_now = worker.drain(max_jobs=max_jobs - ran)
        ran += ran_now
        for key in totals:
            totals[key] += worker.stats[key]
        if ran_now == 0 or queues is not None:
            break
    return RunReport(ran=ran, **totals)


def _ready_queues(store: Store) -> dict[str, int | None]:
    """Every queue with a job runnable now (names as stored: never parsed as a spec)."""
    return dict.fromkeys(sorted(d.queue for d in store.depth() if d.ready > 0))
