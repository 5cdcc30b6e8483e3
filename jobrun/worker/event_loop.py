"""The worker's event loop for ``async def`` handlers, on the ``jobrun-async-loop`` thread.

A thousand jobs waiting on the network hold no thread each: each async job
is one task on this loop. What an async job must do that blocks (its
failure or snooze written, its progress writes) runs on the
``jobrun-async-io`` threads instead, so one database round trip never holds
up every other coroutine. A ticker task marks the loop busy on every tick,
so the stall watch sees a loop that stopped ticking (a coroutine blocking it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any

from jobrun.job.service import Service
from jobrun.worker.stall_watch import Activity

ASYNC_IO_THREADS = 8
"""Threads of a worker's async side (``jobrun-async-io``) for the blocking
writes of async jobs (failures, snoozes, progress), started as needed."""


class EventLoop(Service):
    """The worker's event loop for async handlers, on the ``jobrun-async-loop`` thread.

    A ticker task marks the loop busy on every tick (the stall watch sees a
    loop that stopped ticking: a coroutine blocking it). Blocking work of
    async jobs goes to ``io`` (``jobrun-async-io`` threads).
    """

    def __init__(self, activity: Activity, tick: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.io = concurrent.futures.ThreadPoolExecutor(
            max_workers=ASYNC_IO_THREADS, thread_name_prefix="jobrun-async-io"
        )
        self.thread = threading.Thread(target=self._run, name="jobrun-async-loop", daemon=True)
        self._activity = activity
        self._tick = tick

    def start(self) -> None:
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop (tasks still pending are abandoned) and the io threads,
        waiting up to ``timeout`` seconds for its thread (None: not at all)."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        if timeout is not None and self.thread.is_alive():
            self.thread.join(timeout)
        self.io.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        ticker = self.loop.create_task(self._ticks(), name="jobrun-stall-ticker")
        try:
            self.loop.run_forever()
        finally:
            ticker.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(asyncio.wait([ticker], timeout=1.0))
            self._activity.idle()
            # Close it only when nothing is left on it: a task that ignored its
            # cancellation is abandoned (its lease expires), not destroyed.
            if not any(not t.done() for t in asyncio.all_tasks(self.loop)):
                with contextlib.suppress(Exception):
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

    async def _ticks(self) -> None:
        while True:
            self._activity.busy(
                "running async handlers (a coroutine that blocks it holds up every other one)"
            )
            await asyncio.sleep(self._tick)
