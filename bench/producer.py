"""The producer of the sustained run: no-op jobs at a steady rate, from a process of its own.

``python -m bench.producer DSN QUEUE RATE SECONDS`` enqueues ``RATE`` jobs
per second for ``SECONDS`` seconds and prints one JSON line:
``{"enqueued", "seconds", "batches", "behind_max_jobs"}``.

The schedule is a line, not a sleep per job: every ``TICK`` the jobs due by
then (``RATE x elapsed``, less those sent) go in one ``Store.enqueue_many``
(COPY, one transaction, their "enqueued" events with them). A slow batch is
caught up by the next one, so the rate holds whatever one batch costs, and
``behind_max_jobs`` says how far behind the line the producer ever fell (a
producer that could not keep its rate would show there, not as a slower
worker).
"""

from __future__ import annotations

import json
import sys
import time

from jobrun import NewJob
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store

TICK = 0.05
"""Seconds between batches: 20 batches a second (200 jobs each at 4,000 jobs/s)."""


def main(argv: list[str]) -> None:
    dsn, queue, rate, seconds = argv[0], argv[1], float(argv[2]), float(argv[3])
    pool = open_pool(dsn, concurrency=1, min_size=1, max_size=1, application_name="bench-producer")
    store = Store(pool)
    template = NewJob(type="bench.noop", queue=queue)
    sent = batches = behind = 0
    started = time.monotonic()
    try:
        tick = 0
        while True:
            elapsed = min(time.monotonic() - started, seconds)
            due = int(rate * elapsed) - sent
            behind = max(behind, due)
            if due > 0:
                store.enqueue_many(template, ({"i": sent + k} for k in range(due)))
                sent += due
                batches += 1
            if elapsed >= seconds:
                break
            tick += 1
            time.sleep(max(0.0, started + tick * TICK - time.monotonic()))
    finally:
        pool.close()
    took = time.monotonic() - started
    result = {"enqueued": sent, "seconds": took, "batches": batches, "behind_max_jobs": behind}
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
