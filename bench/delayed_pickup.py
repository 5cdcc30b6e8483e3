"""Pickup latency of delayed jobs: how long after its run_at a job's handler starts.

    PYTHONPATH=. python -m bench.delayed_pickup [--jobs 50] [--delay 0.2] [--poll 1.0]

A throwaway embedded PostgreSQL, one in-process worker (concurrency 4, its
LISTEN connection up) and, one at a time, ``--jobs`` jobs enqueued with
``delay`` (each enqueued after the previous one ran, so every job meets an
idle worker). Latency = the handler's start (``time.time()`` in the worker)
minus the job's ``run_at`` (the database clock). Same host, same clock: this
is a measurement, not a time decision of jobrun's. Prints p50, p99 and max in
milliseconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import threading
import time
from typing import Any

from jobrun.job.model import NewJob
from jobrun.postgres.embedded import throwaway_cluster
from jobrun.postgres.migrate import migrate
from jobrun.postgres.notify import Notifier
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker, WorkerConfig


def measure(dsn: str, jobs: int, delay: float, poll: float) -> list[float]:
    started: dict[Any, float] = {}
    ran = threading.Event()
    registry = Registry()

    @registry.handler("pickup")
    def pickup(ctx: Any, job: Any) -> None:
        started[job.id] = time.time()
        ran.set()

    pool = open_pool(dsn, concurrency=12)
    store = Store(pool)
    notifier = Notifier(dsn)
    notifier.start()
    assert notifier.wait_connected(30)
    worker = Worker(
        store,
        registry,
        WorkerConfig(concurrency=4, poll_interval=dt.timedelta(seconds=poll)),
        dispatcher=notifier,
    )
    worker.start()
    latencies: list[float] = []
    try:
        time.sleep(1.0)
        for _ in range(jobs):
            ran.clear()
            job = store.enqueue(NewJob(type="pickup", delay=dt.timedelta(seconds=delay)))
            if not ran.wait(delay + poll + 10):
                raise RuntimeError("a job did not run")
            latencies.append(started[job.id] - job.run_at.timestamp())
            time.sleep(0.05)
    finally:
        worker.stop(timeout=5)
        notifier.stop()
        pool.close()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--delay", type=float, default=0.2)
    parser.add_argument("--poll", type=float, default=1.0, help="the worker's poll interval")
    args = parser.parse_args()
    with throwaway_cluster() as cluster:
        dsn = cluster.dsn()
        migrate(dsn)
        latencies = sorted(x * 1000 for x in measure(dsn, args.jobs, args.delay, args.poll))
    p99 = latencies[min(len(latencies) - 1, round(0.99 * (len(latencies) - 1)))]
    print(
        f"{len(latencies)} jobs delayed {args.delay * 1000:.0f} ms, poll {args.poll:g} s: "
        f"p50 {statistics.median(latencies):.1f} ms, p99 {p99:.1f} ms, "
        f"max {latencies[-1]:.1f} ms after run_at"
    )


if __name__ == "__main__":
    main()
