"""Worker hooks: the one extension point for Sentry, metrics, tracing and your own tools.

Subclass :class:`WorkerHooks`, override the methods you need (each is a no-op
here), and pass instances to ``Worker(..., hooks=[...])`` or
``Runtime(..., hooks=[...])``. jobrun's Prometheus metrics
(:mod:`jobrun.observe.metrics`) and OpenTelemetry spans
(:mod:`jobrun.observe.tracing`) are hooks like yours.

When each method runs, and on which thread:

``job_started(job, ctx)``
    on the handler thread, just before the handler is called;
``job_returned(job, error)``
    on the same thread, right after the handler returned (``error`` None) or
    raised. The job's outcome is not recorded yet: a success is written
    later, in a batch, by the completer thread. Pair it with ``job_started``
    for anything bound to the handler's thread (a tracing context);
``job_finished(outcome)``
    once the job's outcome is recorded in the database (or known to be
    lost): succeeded, failed (to be retried), dead, cancelled, lease_lost,
    released (an unknown job type given back), snoozed (the handler raised
    or returned ``jobrun.Snooze``: queued again, its attempt given back),
    waiting (parked in a durable wait, ``ctx.sleep`` or
    ``ctx.wait_for_signal``: queued again until it is over). On
    the handler thread for a failure or a snooze, on the completer thread
    for a batch of successes;
For an ``async def`` handler, ``job_started`` and ``job_returned`` run on the
worker's event-loop thread (``jobrun-async-loop``), inside the job's own
asyncio task: each job has its own ``contextvars`` context, so what one
attaches there (a tracing context) is that handler's alone, however many
run at once. Its ``job_finished`` for a failure or a snooze runs on a
``jobrun-async-io`` thread (for a success on the completer, as above).
A hook must never block there: it would hold up every async job.

``store_call(call)``
    after each round trip of the worker's own Store calls (claim,
    complete, complete_tx, fail, heartbeat), with its duration, the number
    of jobs and the error it raised, if any.

A hook runs inside the worker's loops, so it must be quick and must not
block (hand slow work to a queue of your own). A hook that raises is logged
(a WARNING, at most once a minute per hook method, with its traceback) and
never fails the job nor stops the worker. With no hooks the worker pays
nothing: each call site checks one tuple first.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job

if TYPE_CHECKING:
    from jobrun.worker.context import JobContext

log = logging.getLogger("jobrun.worker.hooks")

OutcomeKind: TypeAlias = Literal[
    "succeeded", "failed", "dead", "cancelled", "lease_lost", "released", "snoozed", "parked"
]
OUTCOME_KINDS: tuple[OutcomeKind, ...] = (
    "succeeded",
    "failed",
    "dead",
    "cancelled",
    "lease_lost",
    "released",
    "snoozed",
    "parked",
)

StoreOperation: TypeAlias = Literal["claim", "complete", "complete_tx", "fail", "heartbeat"]
STORE_OPERATIONS: tuple[StoreOperation, ...] = (
    "claim",
    "complete",
    "complete_tx",
    "fail",
    "heartbeat",
)


@dataclasses.dataclass(frozen=True, slots=True)
class JobOutcome:
    """How one attempt of a job ended, as recorded in the database.

    ``job`` is the job as it was claimed (its ``attempts`` counts this
    attempt). ``duration`` is the handler's run time in seconds (None when
    no handler ran: an unknown type, a lease lost before the handler
    returned). ``error`` is the exception the handler (or its commit
    callable) raised, ``error_text`` what was stored as ``last_error``.
    ``next_run_at`` is when a failed, released, snoozed or waiting job runs again
    (database clock). ``result`` is a succeeded job's stored result. A
    snooze is no error: its ``error`` is None and ``error_text`` the reason
    written to its event.
    """

    kind: OutcomeKind
    job: Job
    duration: float | None = None
    error: BaseException | None = None
    error_text: str | None = None
    next_run_at: dt.datetime | None = None
    result: Any = None


@dataclasses.dataclass(frozen=True, slots=True)
class StoreCall:
    """One round trip of the worker's own Store calls.

    ``jobs`` is how many jobs it carried (claimed, completed, heartbeated);
    ``queues`` the queues a claim asked for; ``error`` what it raised
    (the worker retries database faults: each try is a call of its own).
    A claim's round trip also records the successes the worker held for it
    (one transaction completes them, starts buffered jobs and claims):
    ``completed`` counts those.
    """

    operation: StoreOperation
    seconds: float
    jobs: int
    error: BaseException | None = None
    queues: tuple[str, ...] = ()
    completed: int = 0


class WorkerHooks:
    """Override what you need; every method here does nothing."""

    def job_started(self, job: Job, ctx: JobContext) -> None:
        """Before the handler runs, on its thread."""

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        """After the handler returned or raised, on its thread (outcome not recorded yet)."""

    def job_finished(self, outcome: JobOutcome) -> None:
        """Once the attempt's outcome is recorded (or known lost)."""

    def store_call(self, call: StoreCall) -> None:
        """After each claim, complete, fail or heartbeat round trip of the worker."""


def pickup_delay(job: Job) -> float:
    """Seconds from when a claimed job could first run to its claim, by the database clock.

    ``claimed_at - max(run_at, created_at)``: a claim sets ``updated_at`` to
    the database's ``now()``, so all three times come from one clock.
    """
    ready = max(job.run_at, job.created_at)
    return max((job.updated_at - ready).total_seconds(), 0.0)


class HookRunner:
    """Calls every hook, isolating each: a raising hook is logged, never propagated."""

    REPORT_EVERY = 60.0
    """Seconds between two WARNINGs about the same hook method raising."""

    def __init__(self, hooks: Sequence[WorkerHooks]) -> None:
        for hook in hooks:
            if not isinstance(hook, WorkerHooks):
                raise ValidationError(
                    "hooks",
                    f"a hook must be a jobrun.WorkerHooks (subclass it), not a "
                    f"{type(hook).__name__}",
                )
        self.hooks: tuple[WorkerHooks, ...] = tuple(hooks)
        # Per method, only the hooks that override it: a hook that watches
        # round trips alone (health) costs the jobs nothing.
        self.started = _overriding(self.hooks, "job_started")
        self.returned = _overriding(self.hooks, "job_returned")
        self.finished = _overriding(self.hooks, "job_finished")
        self.calls = _overriding(self.hooks, "store_call")
        self._lock = threading.Lock()
        self._reported: dict[tuple[int, str], float] = {}

    def __bool__(self) -> bool:
        return bool(self.hooks)

    def job_started(self, job: Job, ctx: JobContext) -> None:
        for hook in self.started:
            try:
                hook.job_started(job, ctx)
            except Exception as exc:
                self._report(hook, "job_started", exc)

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        for hook in self.returned:
            try:
                hook.job_returned(job, error)
            except Exception as exc:
                self._report(hook, "job_returned", exc)

    def job_finished(self, outcome: JobOutcome) -> None:
        for hook in self.finished:
            try:
                hook.job_finished(outcome)
            except Exception as exc:
                self._report(hook, "job_finished", exc)

    def store_call(self, call: StoreCall) -> None:
        for hook in self.calls:
            try:
                hook.store_call(call)
            except Exception as exc:
                self._report(hook, "store_call", exc)

    def _report(self, hook: WorkerHooks, method: str, exc: Exception) -> None:
        key = (id(hook), method)
        now = time.monotonic()
        with self._lock:
            last = self._reported.get(key)
            if last is not None and now - last < self.REPORT_EVERY:
                return
            self._reported[key] = now
        log.warning(
            "the hook %s.%s raised %s: %s (ignored; the job is unaffected)",
            type(hook).__qualname__,
            method,
            type(exc).__name__,
            exc,
            exc_info=exc,
        )


def _overriding(hooks: tuple[WorkerHooks, ...], method: str) -> tuple[WorkerHooks, ...]:
    base = getattr(WorkerHooks, method)
    return tuple(hook for hook in hooks if getattr(type(hook), method, base) is not base)
