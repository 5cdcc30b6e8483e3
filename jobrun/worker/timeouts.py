"""The timeouts thread: cancels a job's context once its deadline passes.

One thread for every job of the worker, a heap of deadlines: a handler's
timeout costs no thread of its own, and a handler that ignores its
cancellation is still cancelled (what then happens is the shutdown's and the
outcome's business, not this thread's).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
import weakref

from jobrun.job.service import LoopThread
from jobrun.worker.context import JobContext


class Timeouts(LoopThread):
    """Cancels contexts past their deadline (one thread for every job)."""

    def __init__(self) -> None:
        super().__init__("jobrun-timeouts")
        # Weak: a job's context (its job, an async job's task) is not kept
        # until its deadline once the job is over.
        self._heap: list[tuple[float, int, weakref.ref[JobContext]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()

    def add(self, ctx: JobContext) -> None:
        if ctx.deadline is None:
            return
        with self._cond:
            heapq.heappush(self._heap, (ctx.deadline, next(self._seq), weakref.ref(ctx)))
            self._cond.notify()

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def loop(self) -> None:
        with self._cond:
            while not self.stopping.is_set():
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, _, ref = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                ctx = ref()
                if ctx is not None and not ctx.is_cancelled:
                    ctx.cancel("timeout")
                del ctx
