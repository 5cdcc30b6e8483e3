"""The starter: runs buffered jobs as threads free up.

The claimer keeps a buffer of jobs claimed ahead of the free threads
(:mod:`jobrun.worker.ahead`), leased but not started: no attempt is counted
for them, so a process that dies with a full buffer burns none (issue 25).
A job's attempt must be counted, and committed, before its handler runs, or
a job that kills its process would never run out of attempts. So when a
thread frees up, a buffered job costs a round trip before it runs: this
thread's. It is the cheapest one the worker sends (``Store.exchange`` with
only jobs to start: an update of each row by its id, committed
asynchronously like a claim), and it is the only one on the path from a
freed thread to its next job; the claims, with their index scans, the
completions and their synchronous commits, run on the claimer's and the
completer's connections meanwhile. Two round trips are in flight then: the
claimer's, filling the buffer, and this one, emptying it.

A buffered job the database will not start (its lease expired, or its
cancel was requested while it waited) never runs: it is given back, or ends
cancelled (``Store.unclaim``).
"""

from __future__ import annotations

from jobrun.job import outage
from jobrun.job.errors import ConnectionUnavailable, JobrunError
from jobrun.job.model import Job
from jobrun.worker.executor import Executor
from jobrun.worker.outcomes import DB_RETRY_BACKOFF
from jobrun.worker.parts import Parts, WorkerLoop
from jobrun.worker.stall_watch import Activity

START_COALESCE = 0.001
"""Seconds a busy worker waits for more threads to free, to start them together."""


class Starter(WorkerLoop):
    """The ``jobrun-starter`` thread: the only one that starts buffered jobs."""

    def __init__(self, parts: Parts, activity: Activity, executor: Executor) -> None:
        super().__init__("jobrun-starter", parts, activity)
        self._executor = executor
        self._queue_names = list(self.config.queues)

    def wake(self) -> None:
        self._leases.thread_freed.set()

    def loop(self) -> None:
        failures = 0
        batch = max(1, min(self.config.concurrency // 4, 16))
        freed = self._leases.thread_freed
        while not self.stopping.is_set():
            self._activity.idle()
            freed.wait(self.config.poll_interval.total_seconds())
            freed.clear()
            while not self.stopping.is_set():
                buffered = self._leases.holdings().buffered
                if not buffered:
                    break
                if buffered >= batch and self._leases.busy():
                    # A few threads free while the others run: wait a moment
                    # for more, to start them with one statement.
                    freed.wait(START_COALESCE)
                    freed.clear()
                threads = self._leases.take_threads(buffered)
                if not threads:
                    break
                try:
                    self.start_buffered(threads)
                    failures = 0
                except JobrunError as exc:
                    failures += 1
                    pause = DB_RETRY_BACKOFF[min(failures, len(DB_RETRY_BACKOFF)) - 1]
                    if isinstance(exc, ConnectionUnavailable):
                        pause = 0.0  # it waited its whole bound for a connection already
                    outage.of(self.store).failed(exc, "start")
                    self.stopping.wait(pause)
                    break
                finally:
                    self._leases.release_threads(threads)

    def start_buffered(self, threads: int) -> list[Job]:
        """Start up to ``threads`` buffered jobs (reserved by the caller) and run
        them; end the ones the database would not start. Returns those started."""
        asked = self._leases.buffered(threads)
        if not asked:
            return []
        self._activity.busy(f"starting {len(asked)} buffered job(s)")
        got = self.store.exchange(
            self.owner,
            start=asked,
            queues=self._queue_names,
            limit=0,
            ttl=self.config.lease_ttl,
        )
        self._leases.unbuffer(got.started, started=True)
        self._executor.dispatch(got.started)
        ids = {job.id for job in got.started}
        left_out = [job for job in asked if job.id not in ids]
        if left_out:
            self.give_back_unstarted(left_out)
        return got.started
