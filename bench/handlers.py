"""Plain and ``async def`` handlers side by side: what running a job on the
event loop costs against running it on a thread.

An async job is claimed, leased and completed like a plain one; what differs
is the hand-over (the claim's async jobs go to the worker's event loop
together, each in one task) and what a coroutine costs to run. Each run
alternates a drain of ``bench.noop`` (``def``) and one of ``bench.anoop``
(``async def``) at the highest concurrency, so that drift of the machine hits
both alike; ``drain.handlers.async.ratio`` is the async drain's rate over the
plain one's in the same run. No target: a figure to watch (see
docs/performance.md, "Async handlers: one hand-over per claim").
"""

from __future__ import annotations

import functools

from bench.measure import Context, _cores, _drain_once, alternated
from bench.stats import Figure

KINDS = {"plain": "bench.noop", "async": "bench.anoop"}
"""Each variant's handler (bench/app.py)."""


def handlers(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    concurrency = max(s.concurrencies)
    variants = {
        kind: functools.partial(_drain_once, ctx, job_type, s.drain_jobs, concurrency, 1)
        for kind, job_type in KINDS.items()
    }
    drains = alternated(ctx, "drain.handlers", variants)
    if drains is None:
        return []
    params = {"jobs": s.drain_jobs, "concurrency": concurrency}
    figures: list[Figure] = []
    for kind, job_type in KINDS.items():
        runs = drains[kind]
        figures.append(
            Figure(
                f"drain.handlers.{kind}",
                "jobs/s",
                [r.rate for r in runs],
                {**params, "handler": job_type, **_cores(runs)},
                throughput=True,
            )
        )
        figures.append(
            Figure(
                f"drain.handlers.{kind}.cpu_per_job",
                "us",
                [1e6 * r.worker_cpu / r.rate for r in runs],  # cores / (jobs/s)
                {**params, "handler": job_type, "what": "worker CPU time per job"},
            )
        )
    figures.append(
        Figure(
            "drain.handlers.async.ratio",
            "x",
            [a.rate / p.rate for a, p in zip(drains["async"], drains["plain"], strict=True)],
            {**params, "what": "async drain / plain drain, per run"},
        )
    )
    return figures
