"""JobContext: what a handler gets besides its job."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TypeAlias

from jobrun.job import validate
from jobrun.job.model import Job
from jobrun.job.workflow import NO_PARENTS, ParentResults
from jobrun.worker.logs import job_fields
from jobrun.worker.waits import DurableWaits

ProgressSink: TypeAlias = Callable[[float, str | None], bool]
"""Writes a job's progress (a checked fraction and message) for the worker;
True when it is done with the value (written, or never to be written: the
lease is gone), False when the value should be written again later."""

DEFAULT_PROGRESS_INTERVAL = 1.0
"""Seconds between two progress writes of one job (``WorkerConfig.progress_interval``)."""


_CANCEL_EVENTS = threading.Lock()
"""Guards making a context's ``cancelled`` Event against its cancellation (both rare)."""


class JobContext(DurableWaits):
    """The handler's view of its attempt.

    ``cancelled`` is set when the job must stop: its cancel was requested,
    its lease was lost, its timeout passed, or the worker is shutting down.
    Long handlers should check it (or wait on it instead of sleeping): a
    handler that returns after cancellation is reported as failed, never as
    succeeded. ``deadline`` is a ``time.monotonic()`` value (None: no timeout).

    :meth:`progress` reports how far the attempt got (see there). Durable
    steps, idempotency keys and the fencing token: :mod:`jobrun.worker.steps`;
    durable sleeps and signal waits: :mod:`jobrun.worker.waits`.

    In an ``async def`` handler the context is the same object, and its
    cancellation reaches the handler the asyncio way: when ``cancelled`` is
    set (by a cancel, a lost lease, the timeout or the shutdown), the job's
    task is cancelled, so the handler gets ``asyncio.CancelledError`` at its
    next ``await`` (clean up in ``finally``; ``cancel_reason`` says why).
    ``is_cancelled`` and ``remaining()`` work there too; ``cancelled.wait()``
    would block the event loop: never call it from a coroutine.

    The ``cancelled`` Event is made on first use (most handlers never touch
    it: an Event and its Condition cost more than the rest of the context,
    for every job); :meth:`cancel` and :attr:`is_cancelled` need none.
    """

    def __init__(
        self,
        job: Job,
        cancelled: threading.Event | None = None,
        deadline: float | None = None,
        cancel_reason: str | None = None,
        _logger: logging.LoggerAdapter[logging.Logger] | None = None,
        _progress_sink: ProgressSink | None = None,
        _progress_interval: float = DEFAULT_PROGRESS_INTERVAL,
        _on_cancel: Callable[[], None] | None = None,
    ) -> None:
        self.job = job
        self._event = cancelled
        """The ``cancelled`` Event: the one given, else made on first use."""
        self._cancel_called = False
        """Set by :meth:`cancel` (the Event, once made, is set as well)."""
        self.deadline = deadline
        self.cancel_reason = cancel_reason
        self._logger = _logger
        self._progress_sink = _progress_sink
        """Writes a report (None: none made yet, or progress is only kept here,
        as in a test)."""
        self._make_progress_sink: Callable[[JobContext], ProgressSink] | None = None
        """Set by the worker: makes the sink at the first report (most jobs make
        none, and a writer is an object or two per job)."""
        self._progress_interval = _progress_interval
        self._on_cancel = _on_cancel
        """Called (once, from the cancelling thread) when the context is cancelled:
        the worker cancels an async handler's task through it."""
        self._progress: float | None = None
        self._progress_message: str | None = None
        self._progress_written_at: float | None = None
        self._progress_held = False
        self._progress_lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(job={self.job!r}, cancelled={self.is_cancelled}, "
            f"deadline={self.deadline!r}, cancel_reason={self.cancel_reason!r}, "
            f"_progress={self._progress!r}, _progress_message={self._progress_message!r})"
        )

    @property
    def cancelled(self) -> threading.Event:
        """Set once the job must stop (see the class docstring); wait on it to sleep."""
        event = self._event
        if event is None:
            with _CANCEL_EVENTS:
                event = self._event
                if event is None:
                    event = threading.Event()
                    if self._cancel_called:
                        event.set()
                    self._event = event
        return event

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """``jobrun.job.<type>``, its records carrying the job's fields (made on first use).

        The same fields as the worker's own lines about the job (id, type,
        attempt, max_attempts, queue; see :mod:`jobrun.worker.logs`), so that
        the console and a log shipper tie a handler's lines to its job.
        """
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                logging.getLogger(f"jobrun.job.{self.job.type}"), job_fields(self.job)
            )
        return self._logger

    def parent_results(self) -> ParentResults:
        """The outcomes of the jobs this one waited for, loaded with its claim
        (empty for a job without parents; see :mod:`jobrun.workflow`)."""
        parents = self.job.parent_results
        return parents if isinstance(parents, ParentResults) else NO_PARENTS

    @property
    def attempt(self) -> int:
        """1 for the first attempt."""
        return self.job.attempts

    def remaining(self) -> float | None:
        """Seconds until the deadline (None without one)."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def cancel(self, reason: str) -> None:
        with _CANCEL_EVENTS:
            if self.cancel_reason is None:
                self.cancel_reason = reason
            first = not self.is_cancelled
            self._cancel_called = True
            event = self._event
        if event is not None:
            event.set()
        on_cancel = self._on_cancel
        if first and on_cancel is not None:
            on_cancel()

    @property
    def is_cancelled(self) -> bool:
        if self._cancel_called:
            return True
        event = self._event  # one given to the constructor may be set directly
        return event is not None and event.is_set()

    # -- progress ------------------------------------------------------------------

    def progress(self, value: float, message: str | None = None) -> None:
        """Report the fraction of the work done (0 to 1) and, if given, a message.

        Stored on the job (``progress``, ``progress_message``, ``progress_at``:
        ``jobrun get ID``, the dashboard) while it runs. Checked here: a value
        outside 0..1 (or not a number), or a message that is not a str of at
        most 1000 characters, is a ValidationError, and nothing is written.
        Each report replaces the last one, message included (None clears it).

        Cheap enough for a hot loop: the first report is written at once; one
        within ``progress_interval`` (``WorkerConfig``, 1 s by default) of the
        last write is only kept, and the next report after the interval
        writes the latest value; when the handler returns (however it ends)
        a value kept and not written yet is written once. Writes run on the
        calling thread (one UPDATE of the job's own row, fenced by its
        lease). A write that finds the lease gone cancels this context; a
        database error is logged once per job and never fails the job.

        From an ``async def`` handler the call never blocks the event loop:
        the check and the throttle run at the call, and the write itself is
        handed to one of the worker's ``jobrun-async-io`` threads (one write
        at a time per job, the latest value winning); the worker waits for
        it before it records the job's outcome.
        """
        fraction = validate.progress(value)
        text = None if message is None else validate.progress_message(message)
        with self._progress_lock:
            self._progress, self._progress_message = fraction, text
            sink = self._progress_sink
            if sink is None:
                make = self._make_progress_sink
                if make is None:
                    return
                sink = self._progress_sink = make(self)
            now = time.monotonic()
            last = self._progress_written_at
            if last is not None and now - last < self._progress_interval:
                self._progress_held = True
                return
            self._write_progress(sink, fraction, text, now)

    def flush_progress(self) -> None:
        """Write the progress kept and not written yet, if any (the worker calls
        this when the handler returns; a handler need not)."""
        if not self._progress_held:
            return  # nothing kept (read without the lock: as racy as a read with it)
        with self._progress_lock:
            sink = self._progress_sink
            if not self._progress_held or sink is None or self._progress is None:
                return
            self._write_progress(sink, self._progress, self._progress_message, time.monotonic())

    def _hold_progress(self) -> None:
        """The sink could not write the value it took: write the latest one again
        later (the next report past the interval, or when the handler returns)."""
        with self._progress_lock:
            if self._progress is not None:
                self._progress_held = True

    def _write_progress(
        self, sink: ProgressSink, fraction: float, text: str | None, now: float
    ) -> None:
        self._progress_written_at = now  # a failed write waits its interval too
        self._progress_held = not sink(fraction, text)

    @property
    def progress_value(self) -> float | None:
        """The fraction last reported through :meth:`progress` (None: none yet)."""
        return self._progress

    @property
    def progress_message(self) -> str | None:
        """The message reported with it."""
        return self._progress_message
