"""The executor: runs claimed jobs, plain handlers on threads, async ones on the event loop.

It takes what the claimer dispatches, gives each job its context (its
timeout, its progress writer, its cancellation), runs its handler with the
hooks around it, and turns what the handler did into the job's outcome
(:meth:`Executor.settle`): a failure or a snooze is written at once, a success
is handed to the ledger (:meth:`Leases.finished`), which sends it to the
completer or to the claimer's next claim. A handler's exception never kills
its thread.

Both kinds share one count of jobs claimed and not yet returned
(``concurrency`` bounds them together), the same leases, heartbeats and
completions. A worker with only async handlers starts no handler thread; a
plain job (or one of an unknown type) starts threads as it needs them, up to
``concurrency``.

Nothing of a finished job is kept by reference cycles: once its outcome is
recorded the frames on its exception's traceback are cleared (``let_go``)
and the executor drops its references, so what a failed handler allocated is
freed at once, not at the next run of the cyclic collector.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import queue
import sys
import threading
import time
from typing import Any

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job
from jobrun.job.ports import CommitCallable as Commit
from jobrun.job.signals import Parked
from jobrun.worker import text
from jobrun.worker.context import JobContext, ProgressSink
from jobrun.worker.event_loop import EventLoop
from jobrun.worker.leases import Finished, Running
from jobrun.worker.outcomes import let_go
from jobrun.worker.parking import park
from jobrun.worker.parts import Parts
from jobrun.worker.progress import OffloadedProgress, progress_sink
from jobrun.worker.registry import Done, PermanentFailure, Registration, Snooze
from jobrun.worker.stall_watch import Activity
from jobrun.worker.timeouts import Timeouts


class Executor:
    """Runs jobs: ``concurrency`` handler threads at most, and one event loop."""

    def __init__(
        self,
        parts: Parts,
        timeouts: Timeouts,
        *,
        loop_activity: Activity,
        loop_tick: float,
        hard_stop: threading.Event,
    ) -> None:
        self.store = parts.store
        self.config = parts.config
        self.registry = parts.outcomes.registry
        self._leases = parts.leases
        self._outcomes = parts.outcomes
        self._hooks = parts.outcomes.hooks
        self._timeouts = timeouts
        self._loop_args = (loop_activity, loop_tick)
        self._hard_stop = hard_stop
        self.started = False
        """Set by the worker's start: threads start as needed, leases are reckoned."""
        self.handlers: list[threading.Thread] = []
        self._tasks: set[asyncio.Future[None]] = set()
        """The async jobs' tasks (touched on the event loop only)."""
        self._work: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.loop: EventLoop | None = None  # started when an async job needs it
        self._loop_lock = threading.Lock()

    def start(self) -> None:
        """Start the event loop (async handlers registered) or the handler threads."""
        self.started = True
        if self.registry.has_async:
            self.ensure_loop()  # handler threads start as plain jobs need them
        else:
            for n in range(self.config.concurrency):
                self.handlers.append(self._handler_thread(n))
        for thread in self.handlers:
            thread.start()

    def stop_threads(self, wait: float = 0.0) -> None:
        """End every handler thread once it is done with its job, waiting up to
        ``wait`` seconds in all for them to end (a worker whose handlers all
        returned leaves no thread behind once it is stopped)."""
        for _ in self.handlers:
            self._work.put(None)
        deadline = time.monotonic() + wait
        for thread in self.handlers:
            if thread.is_alive():
                thread.join(max(deadline - time.monotonic(), 0.0))

    def run_here(self, job: Job) -> None:
        """Run one job in the calling thread (an async one on the loop, waited for)."""
        running, registration = self.register(job)
        if registration is not None and registration.is_async:
            loop = self.ensure_loop()
            loop.submit(self.run_async(running, registration, loop.io)).result()
        else:
            try:
                self.run_one(running)
            finally:
                self.release(job)

    def _handler_thread(self, n: int) -> threading.Thread:
        return threading.Thread(target=self._handler_loop, name=f"jobrun-handler-{n}", daemon=True)

    def dispatch(self, jobs: list[Job]) -> None:
        """Run claimed jobs: plain ones on the handler threads, one at a time;
        the async ones of the batch on the event loop, handed over together
        (one wake-up of the loop for the batch, not one per job)."""
        on_loop: list[tuple[Running, Registration]] = []
        for job in jobs:
            running, registration = self.register(job)
            if registration is not None and registration.is_async:
                on_loop.append((running, registration))
            else:
                self._to_thread(job)
        if on_loop:
            loop = self.ensure_loop()
            loop.loop.call_soon_threadsafe(self._start_on_loop, on_loop, loop.io)

    def _start_on_loop(
        self, batch: list[tuple[Running, Registration]], io: concurrent.futures.Executor
    ) -> None:
        """On the event loop: a task per async job of a dispatched batch."""
        loop = asyncio.get_running_loop()
        for running, registration in batch:
            task = loop.create_task(
                self.run_async(running, registration, io), name=f"jobrun {running.job.id}"
            )
            self._tasks.add(task)  # the loop keeps only a weak reference
            task.add_done_callback(functools.partial(self._async_ended, running.job))

    def register(self, job: Job) -> tuple[Running, Registration | None]:
        """Track a claimed job as running (its context, its timeout, the counts)."""
        interval = self.config.progress_interval.total_seconds()
        # Its cancellation Event is made only if something waits on it.
        ctx = JobContext(job, None, None, None, None, None, interval)
        registration = self.registry.get(job.type)
        running = Running(job, ctx)
        ctx._step_store = self.store  # durable steps (jobrun.worker.steps)
        if registration is not None and registration.is_async:
            running.on_loop = True
            io = self.ensure_loop().io
            ctx._step_io = io
            ctx._make_progress_sink = functools.partial(self._offloaded_progress, running, io)
        else:
            ctx._make_progress_sink = self._plain_progress
        timeout = self.registry.timeout_for(registration)
        if timeout is not None:
            ctx.deadline = time.monotonic() + timeout.total_seconds()
        # drain() sends no heartbeats: no reckoning, no bound
        self._leases.add(running, reckon=self.started)
        if ctx.deadline is not None:
            self._timeouts.add(ctx)
        return running, registration

    def _plain_progress(self, ctx: JobContext) -> ProgressSink:
        """A job's progress writer, made at its first report (on the reporting thread)."""
        return progress_sink(ctx, self.store.record_progress, self._outcomes.note)

    def _offloaded_progress(
        self, running: Running, io: concurrent.futures.Executor, ctx: JobContext
    ) -> ProgressSink:
        """An async job's progress writer (its writes on ``io``), made at its first
        report; the job's outcome waits for what it has in flight."""
        running.progress = OffloadedProgress(ctx, self._plain_progress(ctx), io)
        return running.progress

    def _to_thread(self, job: Job) -> None:
        """Hand a plain job to the handler threads, starting one if none is free
        (a worker with async handlers starts them as needed, up to concurrency)."""
        on_threads = self._leases.to_thread()
        n = len(self.handlers)
        if on_threads > n and n < self.config.concurrency and self.started:
            thread = self._handler_thread(n)
            self.handlers.append(thread)
            thread.start()
        self._work.put(job)

    def release(self, job: Job, *, on_thread: bool = False) -> None:
        """The job's run is over (its outcome recorded or handed on): free its slot."""
        self._leases.release(job, on_thread=on_thread)

    def ensure_loop(self) -> EventLoop:
        """The event loop of async handlers, started on first need."""
        loop = self.loop
        if loop is not None:
            return loop
        with self._loop_lock:
            if self.loop is None:
                started = EventLoop(*self._loop_args)
                started.start()
                self.loop = started
            return self.loop

    def stop_loop(self, timeout: float | None) -> None:
        with self._loop_lock:
            loop, self.loop = self.loop, None
        if loop is not None:
            loop.stop(timeout)

    def _handler_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None or self._hard_stop.is_set():
                return
            running = self._leases.get(job)
            if running is None:  # pragma: no cover - dispatched jobs are registered first
                continue
            try:
                self.run_one(running)
            except BaseException as exc:
                self._outcomes.unrecorded(job, exc)
                let_go(exc)
            finally:
                self.release(job, on_thread=True)
            job = running = None  # not kept while this thread waits for the next job

    def run_one(self, running: Running) -> None:
        job, ctx = running.job, running.ctx
        registration = self.registry.get(job.type)
        if registration is None:
            self._outcomes.unknown_type(job)
            return
        hooks = self._hooks
        if hooks is not None and hooks.started:
            hooks.job_started(job, ctx)
        running.in_handler = True
        started = time.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            try:
                value = registration.handler(ctx, job)
            finally:
                running.in_handler = False
                ctx.flush_progress()  # a value kept by the throttle, before the outcome
                if hooks is not None and hooks.returned:
                    hooks.job_returned(job, sys.exc_info()[1])
        except (Exception, Parked) as exc:  # Parked: a durable wait, not an error
            error = exc
        try:
            self.settle(running, registration, started, value, error)
        finally:
            # Recorded (or given up on): what the handler held goes now, not
            # when the cyclic collector runs (this frame is on the error's
            # traceback, and held the error: a cycle).
            if error is not None:
                let_go(error)
            error = value = None

    async def run_async(
        self, running: Running, registration: Registration, io: concurrent.futures.Executor
    ) -> None:
        """An async job, on the event loop, in a task of its own: its handler, then
        its outcome (off the loop, on ``io``, when it needs a write of its own).
        The context's cancellation cancels the task only while the handler runs
        (:meth:`_cancel_handler_soon`), so it never lands in the recording."""
        job, ctx = running.job, running.ctx
        try:
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            value: Any = None
            error: BaseException | None = None
            task = asyncio.current_task()
            ctx._on_cancel = functools.partial(self._cancel_handler_soon, loop, task, running)
            try:
                if ctx.is_cancelled:  # cancelled before its handler started
                    raise asyncio.CancelledError
                value = await self._invoke(running, registration)
            except asyncio.CancelledError as exc:  # its context's cancel, or its own
                error = exc
            except (Exception, Parked) as exc:
                error = exc
            ctx.flush_progress()  # a value kept by the throttle, before the outcome
            written = running.progress.pending() if running.progress is not None else None
            if written is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(written)
            try:
                if error is None and value is None and not ctx.is_cancelled and not ctx._parked:
                    # The common case needs no write of its own: it joins the batch here.
                    self.settle(running, registration, started, value, error)
                else:
                    await loop.run_in_executor(
                        io,
                        self.settle,
                        running,
                        registration,
                        started,
                        value,
                        error,
                    )
            finally:
                # Recorded: drop the error (its traceback holds the handler's
                # frames, and this one, which held it) and the task (which
                # keeps its exception), as _run_one does.
                ctx._on_cancel = None
                let_go(error)
                del error, value, task
        except BaseException as exc:
            self._outcomes.unrecorded(job, exc)
            let_go(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self.release(job)

    @staticmethod
    def _cancel_handler_soon(
        loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None, running: Running
    ) -> None:
        """From any thread: cancel an async job's task, on the loop, if its handler
        still runs then (checked there, where the handler runs and ends: a
        cancel that comes late never lands in the recording of its outcome)."""

        def cancel() -> None:
            if running.in_handler and task is not None:
                task.cancel()

        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to cancel
            loop.call_soon_threadsafe(cancel)

    async def _invoke(self, running: Running, registration: Registration) -> Any:
        """The handler, with the hooks around it, in the job's task (its own context)."""
        job, ctx = running.job, running.ctx
        hooks = self._hooks
        if hooks is not None and hooks.started:
            hooks.job_started(job, ctx)
        running.in_handler = True
        try:
            return await registration.handler(ctx, job)
        finally:
            running.in_handler = False
            if hooks is not None and hooks.returned:
                hooks.job_returned(job, sys.exc_info()[1])

    def _async_ended(self, job: Job, task: asyncio.Future[None]) -> None:
        """A job's task is done; warn when its coroutine ended without finishing
        its bookkeeping (cancelled: the loop stopped)."""
        self._tasks.discard(task)
        if task.cancelled():
            self._outcomes.note(
                logging.WARNING, job, "its coroutine was dropped; its lease expires"
            )

    def settle(
        self,
        running: Running,
        registration: Registration,
        started: float,
        value: Any,
        error: BaseException | None,
    ) -> None:
        """Record what the handler did: raised ``error`` or returned ``value``
        (for plain and async handlers alike; see :mod:`jobrun.worker.registry`)."""
        job, ctx = running.job, running.ctx
        parked = ctx._parked  # a durable wait left the handler (even if it caught Parked)
        if parked is not None:
            park(self._outcomes, job, parked, started)
            return
        if error is not None:
            if isinstance(error, Snooze):
                self._outcomes.snooze(job, registration, error, started)
            elif isinstance(error, PermanentFailure):
                self._outcomes.fail(
                    job, text.describe(error), permanent=True, exc=error, started=started
                )
            elif isinstance(error, asyncio.CancelledError) and ctx.is_cancelled:
                self._outcomes.fail(
                    job, f"cancelled ({ctx.cancel_reason})", exc=error, started=started
                )
            else:
                self._outcomes.fail(
                    job, text.describe(error, with_traceback=True), exc=error, started=started
                )
            return
        commit: Commit | None = None
        result: Any = None
        if value is None:  # the common case first: no other check costs it anything
            pass
        elif isinstance(value, Done):
            commit, result = value.commit, value.result
        elif isinstance(value, Snooze):
            self._outcomes.snooze(job, registration, value, started)
            return
        elif callable(value):
            commit = value
        elif inspect.isawaitable(value):
            _close(value)
            advice = (
                "an async handler's value is what it returns: await this one inside it"
                if registration.is_async
                else "jobrun awaits only handlers registered as async def functions: "
                "register an async def (or await it inside this one)"
            )
            self._outcomes.fail(
                job,
                f"the handler returned a {type(value).__name__}, which nothing awaits; {advice}",
                permanent=True,  # it would fail every attempt the same way
                started=started,
            )
            return
        else:
            result = value
        if ctx.is_cancelled:
            # Cancel wins: a handler that returns after cancellation never succeeds.
            self._outcomes.fail(job, f"cancelled ({ctx.cancel_reason})", started=started)
            return
        checked: validate.CheckedResult | None = None
        if result is not None:
            try:
                # Walked and encoded once, here: the completer stores this text.
                checked = validate.checked_result(result)
            except ValidationError as exc:
                # Refused here, in its own attempt: never in the batch it would join.
                self._outcomes.fail(
                    job,
                    f"the handler's return value cannot be stored as the job's result: {exc}",
                    exc=exc,
                    started=started,
                )
                return
        # Completed in a batch by the completer thread, or with the claimer's
        # next claim of a limited queue; heartbeated until then.
        finished = Finished(job, commit, checked, time.monotonic() - started)
        self._leases.finished(finished)


def _close(value: object) -> None:
    """Close a coroutine nothing will await (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # best effort on a value being refused
            close()
