"""How a job's progress reports are written: fenced by its claim, never failing it.

``ctx.progress`` throttles in the context (:mod:`jobrun.worker.context`);
what it lets through is written here, on the handler's thread for a plain
job, and for an async job on an io thread (:class:`OffloadedProgress`), never
on the event loop. A write that finds the lease gone cancels the job's
context; a database error is logged once per job, and the job runs on.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable

from jobrun.job.errors import LeaseLost
from jobrun.job.model import Job
from jobrun.worker import text
from jobrun.worker.context import JobContext, ProgressSink

Note = Callable[[int, Job, str], None]
"""Logs a line about a job that is not its outcome (level, job, message)."""


def progress_sink(
    ctx: JobContext, record: Callable[[Job, float, str | None], object], note: Note
) -> ProgressSink:
    """How ``ctx.progress`` writes: on the handler's thread, fenced by the
    claim; a lost lease cancels the context, a database error is logged once
    per job (and never fails it)."""
    job = ctx.job
    lost = warned = False

    def write(value: float, message: str | None) -> bool:
        nonlocal lost, warned
        if lost:
            return True
        try:
            record(job, value, message)
        except LeaseLost:
            lost = True
            note(
                logging.INFO,
                job,
                "cancelling: its lease is gone (a progress write found the job "
                "no longer held by this claim)",
            )
            ctx.cancel("lease lost")
            return True
        except Exception as exc:
            if not warned:
                warned = True
                note(
                    logging.WARNING,
                    job,
                    f"recording its progress failed ({text.describe(exc)}); the job runs on "
                    "(said once per job)",
                )
            return False
        return True

    return write


class OffloadedProgress:
    """An async job's progress sink: the write runs on an io thread, never on the loop.

    One write at a time per job, the latest value winning: a report made
    while a write is in flight is written right after it. ``pending()`` is
    what the worker waits for before it records the job's outcome.
    """

    def __init__(
        self, ctx: JobContext, write: ProgressSink, executor: concurrent.futures.Executor
    ) -> None:
        self._ctx = ctx
        self._write = write
        self._executor = executor
        self._lock = threading.Lock()
        self._next: tuple[float, str | None] | None = None
        self._future: concurrent.futures.Future[None] | None = None

    def __call__(self, value: float, message: str | None) -> bool:
        with self._lock:
            self._next = (value, message)
            if self._future is None:
                try:
                    self._future = self._executor.submit(self._drain)
                except RuntimeError:  # the executor is shut down: the worker stopped
                    self._next = None
                    return True
        return True  # handed over (a failed write holds the value again: _drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                item, self._next = self._next, None
                if item is None:
                    self._future = None
                    return
            if not self._write(*item):  # a database error: write it again later
                self._ctx._hold_progress()

    def pending(self) -> concurrent.futures.Future[None] | None:
        with self._lock:
            return self._future
