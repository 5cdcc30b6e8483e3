"""The completer: records handler successes in batches, within their leases.

A success is not recorded by the thread that ran it: plain results are
completed many at a time (``complete_many``: one statement, one commit for a
batch), commit callables together in one transaction (``complete_many_tx``;
the callables run on this thread, so keep them to a few statements). A batch
is flushed when it fills or a few milliseconds pass, at once when the
slots of a queue whose limit binds wait for it or a dependent may be
released by it soon. Until then the jobs keep being heartbeated.

Each try of a completion is bounded by the first end among its jobs' leases
(by this worker's reckoning: see :mod:`jobrun.worker.leases`), so a
completion stuck on a half-open connection is given up when its lease runs
out; faults are retried until then, and past it the jobs are abandoned as
lease lost (the reaper requeues them; the work is redone at most once, as
at-least-once allows). Plain results are at-least-once; the transactional
path is exactly-once in effect through the effect ledger.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from jobrun.job import outage
from jobrun.job.errors import DatabaseError, JobrunError
from jobrun.job.model import CompleteManyResult, Job
from jobrun.worker import text
from jobrun.worker.leases import FLUSH_NOW, Finished, FlushNow
from jobrun.worker.outcomes import DB_RETRY_BACKOFF, let_go
from jobrun.worker.parts import Parts, WorkerLoop
from jobrun.worker.stall_watch import Activity


class Completer(WorkerLoop):
    """The ``jobrun-completer`` thread; stopped by a None on its queue, after what came before."""

    def __init__(self, parts: Parts, activity: Activity, hard_stop: threading.Event) -> None:
        super().__init__("jobrun-completer", parts, activity)
        self._hooks = parts.outcomes.hooks
        self._hard_stop = hard_stop

    def wake(self) -> None:
        self._leases.completions.put(None)  # flush what came before, then end

    def flush_queued(self) -> None:
        """Flush the successes queued so far, in the calling thread (drain())."""
        pending: list[Finished] = []
        completions = self._leases.completions
        while not completions.empty():
            item = completions.get_nowait()
            if isinstance(item, Finished):
                pending.append(item)
        if pending:
            self.flush(pending)

    def loop(self) -> None:
        size = self.config.complete_batch_size
        flush_after = self.config.complete_flush_interval.total_seconds()
        closing = False
        activity = self._activity
        while not closing:
            activity.idle()
            first = self._leases.completions.get()
            if first is FLUSH_NOW:
                continue  # nothing collected: nothing to flush
            activity.busy("collecting a batch")
            if first is None:
                closing = True
                batch: list[Finished] = []
            else:
                assert isinstance(first, Finished)
                batch = [first]
            # A binding limit's slots wait for it, and a job waits for a
            # parent (a chain's next link): then flush what has come by now.
            eager = isinstance(first, Finished) and (
                self._leases.releases_soon(first.job) or first.job.queue in self._leases.binding
            )
            deadline = time.monotonic() + (0.0 if eager or closing else flush_after)
            while len(batch) < size:
                wait = deadline - time.monotonic()
                try:
                    item = (
                        self._leases.completions.get(timeout=wait)
                        if wait > 0
                        else self._leases.completions.get_nowait()
                    )
                except queue.Empty:
                    break
                if item is None:  # stopping: take what is queued already, and flush now
                    closing = True
                    deadline = 0.0
                    continue
                if isinstance(item, FlushNow):
                    break  # the claimer waits on the slots this batch holds
                batch.append(item)
                if self._leases.releases_soon(item.job):
                    deadline = 0.0  # what has come by now, and no more waiting
            if batch:
                self.flush(batch)

    def flush(self, batch: list[Finished]) -> None:
        """Complete a batch: plain successes with complete_many, commit callables with
        complete_many_tx (one transaction each), results stored by the same
        statements. Database faults are retried (both are safe to repeat);
        until then the jobs keep being heartbeated."""
        newest: dict[uuid.UUID, Finished] = {}
        for done in batch:
            seen = newest.get(done.job.id)
            if seen is None or done.job.attempts > seen.job.attempts:
                newest[done.job.id] = done
        superseded = len(batch) - len(newest)
        if superseded:  # a stale claim of a job this worker claimed again
            self._outcomes.count("lease_lost", superseded)
            for done in batch:
                if newest[done.job.id] is not done:
                    if self._hooks is not None:
                        self._outcomes.finished("lease_lost", done.job, duration=done.duration)
                    self._outcomes.job_log(
                        logging.INFO,
                        done.job,
                        "lease_lost",
                        "superseded by a newer claim of the same job; this one is dropped",
                    )
        plain = [done for done in newest.values() if done.commit is None]
        with_commit = [done for done in newest.values() if done.commit is not None]
        self._activity.busy(
            f"completing {len(plain)} plain result(s) and {len(with_commit)} with a commit callable"
        )
        if plain:
            jobs = [done.job for done in plain]
            results = {d.job.id: d.result for d in plain if d.result is not None} or None
            outcome = self._retrying(
                lambda: self._outcomes.call(
                    "complete", len(jobs), lambda: self.store.complete_many(jobs, results=results)
                ),
                jobs,
            )
            self._outcomes.account(outcome, plain)
            if outcome is None:
                self._leases.abandon(jobs)
                self._outcomes.finished_all("lease_lost", plain)
        if with_commit:
            items = [(done.job, done.commit) for done in with_commit]
            results = {d.job.id: d.result for d in with_commit if d.result is not None} or None
            outcome = self._retrying(
                lambda: self._outcomes.call(
                    "complete_tx",
                    len(items),
                    lambda: self.store.complete_many_tx(items, results=results),
                ),
                [job for job, _ in items],
                runs_callables=True,
            )
            self._outcomes.account(outcome, with_commit)
            if outcome is None:
                self._leases.abandon([job for job, _ in items])
                self._outcomes.finished_all("lease_lost", with_commit)
            by_id = {done.job.id: done for done in with_commit}
            for job_id, exc in (outcome.failed if outcome else {}).items():
                done = by_id[job_id]
                self._outcomes.fail(
                    done.job,
                    f"commit callable failed: {text.describe(exc, with_traceback=True)}",
                    exc=exc,
                    started=time.monotonic() - done.duration,
                )
                let_go(exc)  # the callable's frames: the store keeps the error in a cycle
        self._leases.flushed(batch)

    def _retrying(
        self,
        complete: Callable[[], CompleteManyResult],
        jobs: Sequence[Job],
        *,
        runs_callables: bool = False,
    ) -> CompleteManyResult | None:
        """``complete()`` of ``jobs``, within their leases: each try is given up
        when the first of their leases ends by this worker's reckoning, and
        database faults are retried until then. None: not completed (the
        caller abandons them; their leases expire and the reaper requeues
        them).

        The end is taken once, before the first try: a heartbeat skips a row
        that a completion holds locked (and still reports it live), so a
        heartbeat sent meanwhile may not have extended it. A first try when
        that end has passed already (heartbeats failed for a while) still
        gets one heartbeat interval: the database's fence decides then (the
        job completes unless the reaper took it).

        With ``runs_callables`` (the transactional path) the first try keeps
        the store's own bound (``commit_timeout``): it locks the jobs' rows
        before it runs the handlers' commit callables, so the reaper cannot
        take them while it runs, and a callable may rightly take longer than
        the lease. Its retries, after a fault that released those locks, are
        held to the lease like any other.
        """
        size = len(jobs)
        failures = 0
        lease_ends = time.monotonic() + self._leases.lease_left(jobs)
        floor = self.config.heartbeat_interval.total_seconds()
        while not self._hard_stop.is_set():
            left = lease_ends - time.monotonic()
            if failures == 0:
                left = max(left, floor)
            elif left <= 0:
                self._outcomes.count("lease_lost", size)
                self._log.warning(
                    "completing %d job(s) given up: their lease ran out before the database "
                    "answered (lease TTL %s; the first of them ended %s ago by this worker's "
                    "clock); another worker may run them again",
                    size,
                    text.seconds(self.config.lease_ttl.total_seconds()),
                    text.seconds(-left),
                )
                return None
            if runs_callables and failures == 0:
                left = math.inf
            bound = self.store.bounded(left) if left < math.inf else contextlib.nullcontext()
            try:
                with bound:
                    result = complete()
            except DatabaseError as exc:  # a fault: retrying is safe
                failures += 1
                pause = DB_RETRY_BACKOFF[min(failures, len(DB_RETRY_BACKOFF)) - 1]
                outage.of(self.store).failed(exc, f"completing {size} job(s)")
                time.sleep(pause)
                continue
            except JobrunError as exc:
                self._log.error(
                    "completing %d job(s) failed for good (%s); their leases will expire", size, exc
                )
                return None
            return result
        return None
