"""Starting the jobs a claim leased without starting them, batched across threads.

An attempt counts when its handler starts. A claim starts as many jobs as
its worker has free threads; the jobs that ride along with a
complete-and-claim wait for a thread and count their attempt just before
they run (``Store.start_jobs``), so that a process that dies burns none of
theirs. Short jobs free many threads at once, and so many such starts fall
due together: rather than a round trip each, the threads combine them. The
first thread with a start to make calls the store for every start pending
by then; the threads that come while that call is in flight wait for it to
end, and one of them then makes the next call for all of theirs (flat
combining). A thread alone pays one round trip, as it would by itself; a
crowd pays about two.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Sequence

from jobrun.job.model import Job


@dataclasses.dataclass(eq=False, slots=True)
class _Pending:
    job: Job
    done: bool = False
    started: Job | None = None
    error: BaseException | None = None


class StartBatcher:
    """Calls ``start`` (``Store.start_jobs`` of one owner's jobs: the jobs
    started, as they now stand) for the starts of many threads at once."""

    def __init__(self, start: Callable[[Sequence[Job]], Sequence[Job]]) -> None:
        self._start = start
        self._cond = threading.Condition()
        self._pending: list[_Pending] = []
        self._calling = False

    def start(self, job: Job) -> Job | None:
        """``job`` started (its attempt counted), or None when the store refused
        it (its lease is gone or its cancel was requested: it must not run).
        Raises what the store's call raised (for every job of that call)."""
        me = _Pending(job)
        with self._cond:
            self._pending.append(me)
            while self._calling and not me.done:
                self._cond.wait()
            if not me.done:  # nobody is calling: this thread calls for all
                self._calling = True
                batch, self._pending = self._pending, []
        if not me.done:
            self._call(batch)
        if me.error is not None:
            raise me.error
        return me.started

    def _call(self, batch: list[_Pending]) -> None:
        started: dict[uuid.UUID | None, Job] = {}
        error: BaseException | None = None
        try:
            started = {j.lease_token: j for j in self._start([p.job for p in batch])}
        except BaseException as exc:  # every job of the call shares its fate
            error = exc
        with self._cond:
            for p in batch:
                p.started, p.error, p.done = started.get(p.job.lease_token), error, True
            self._calling = False
            self._cond.notify_all()
