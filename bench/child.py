"""One enqueue_batch in a process of its own, so its peak RSS is its own.

``python -m bench.child DSN JOBS list|stream`` prints one JSON line:
``{"inserted", "seconds", "peak_rss_mb", "rss_before_mb"}``.

list    builds a list of JOBS NewJobs, then times ``Store.enqueue_batch(list)``
stream  times ``Store.enqueue_batch(generator)``: the NewJobs are made while
        the batch streams (their construction is part of the time)

Peak RSS is ``getrusage(RUSAGE_SELF).ru_maxrss`` at the end: the whole
process, interpreter and the list of jobs (for ``list``) included.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Iterator

from jobrun import NewJob
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _jobs(n: int) -> Iterator[NewJob]:
    for i in range(n):
        yield NewJob(type="bench.noop", queue="batch", payload={"i": i})


def main(argv: list[str]) -> None:
    dsn, count, mode = argv[0], int(argv[1]), argv[2]
    pool = open_pool(dsn, concurrency=1, min_size=1, max_size=1)
    try:
        store = Store(pool)
        store.now()  # the pool's connection is up before the clock starts
        if mode == "list":
            batch: list[NewJob] | Iterator[NewJob] = list(_jobs(count))
        elif mode == "stream":
            batch = _jobs(count)
        else:
            raise SystemExit(f"unknown mode {mode!r}")
        before = _rss_mb()
        started = time.perf_counter()
        result = store.enqueue_batch(batch)
        seconds = time.perf_counter() - started
    finally:
        pool.close()
    print(
        json.dumps(
            {
                "inserted": result.inserted,
                "seconds": seconds,
                "peak_rss_mb": _rss_mb(),
                "rss_before_mb": before,
            }
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
