"""Durable sleeps and signal waits: what a handler's context offers (issue 29, item 5).

:class:`DurableWaits` is a part of :class:`~jobrun.worker.context.JobContext`
(its base class, on top of :class:`~jobrun.worker.steps.DurableSteps`).

- ``ctx.sleep(name, duration)`` returns once ``duration`` has passed since
  the first run reached it, by the database clock.
- ``ctx.wait_for_signal(name, timeout=...)`` returns the payload of signal
  ``name`` sent to the job or to its workflow (``client.signal``), sent
  before or after the wait began; :class:`~jobrun.job.signals.SignalTimeout` when ``timeout`` passed
  first.

A wait is a durable step (its name is a step name, once per attempt): its
first run records its deadline; while it is not over the handler is left by
:class:`~jobrun.job.signals.Parked` and the worker parks the job (queued
again at the deadline, or at once when the signal is there already; no
thread, connection or lease held meanwhile; the attempt given back, and
never counted in ``snoozes``). The next run replays the steps before the
wait (they do not run again) and finds it over, or parks again until the
same deadline. The outcome (the payload received, the timeout, the sleep
done) is recorded as the wait's step: a retried attempt gets it back at once.

So the code before a wait runs again on each run that reaches it, as it
does after a failure: put what must not run twice in steps.

Async handlers use ``await ctx.sleep_async(...)`` and ``await
ctx.wait_for_signal_async(...)``: the database work runs on the worker's io
threads, never on the event loop.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from jobrun.job.errors import ValidationError
from jobrun.job.signals import Parked, SignalTimeout, WaitStore, signal_name, wait_seconds
from jobrun.job.steps import StepRecord
from jobrun.worker.steps import DurableSteps, _off_any_loop


class DurableWaits(DurableSteps):
    """Durable sleeps and signal waits for a job's handler (see the module docstring).

    A context made by hand (a unit test of a handler, no store) sleeps not at
    all and refuses a signal wait (ValidationError): both need a worker.
    """

    _parked: Parked | None = None
    """The wait this run left its handler for (the worker parks the job)."""

    def sleep(self, name: str, duration: dt.timedelta | float) -> None:
        """Return once ``duration`` (a timedelta or seconds) has passed since the
        first run of the job that reached this step; until then the job is
        parked, holding nothing (see the module docstring).

        ``name``: the step's name (a step name, once per attempt). ValidationError
        for a bad name or duration (positive, at most ten years).
        """
        _off_any_loop("sleep_async")
        step, seconds = self._wait_args(name, None, duration, "duration")
        self._wait(step, None, seconds)

    async def sleep_async(self, name: str, duration: dt.timedelta | float) -> None:
        """:meth:`sleep` for an ``async def`` handler (its database work off the loop)."""
        step, seconds = self._wait_args(name, None, duration, "duration")
        await self._off_loop(self._wait, step, None, seconds)

    def wait_for_signal(
        self, name: str, *, timeout: dt.timedelta | float, step: str | None = None
    ) -> Any:
        """The payload of signal ``name`` sent to this job or to its workflow
        (``client.signal``).

        A signal sent before the wait began is not lost: the wait takes the
        oldest one of that name not delivered to this job yet, sent to the
        job or to its workflow (one per wait; a workflow's signal is each of
        its waiting jobs' once); otherwise
        the job is parked until one comes or ``timeout`` (a timedelta or
        seconds, counted from the first run that reached the wait, by the
        database clock) passes: then
        :class:`~jobrun.job.signals.SignalTimeout`. Either outcome is the
        wait's step: a retried attempt gets the same payload (or the same
        timeout) back at once.

        ``step``: the wait's step name, ``name`` by default (a handler that
        waits twice for one signal names each wait apart).
        """
        _off_any_loop("wait_for_signal_async")
        wait, seconds = self._wait_args(
            step if step is not None else name, name, timeout, "timeout"
        )
        return self._wait(wait, signal_name(name), seconds)

    async def wait_for_signal_async(
        self, name: str, *, timeout: dt.timedelta | float, step: str | None = None
    ) -> Any:
        """:meth:`wait_for_signal` for an ``async def`` handler (off the loop)."""
        wait, seconds = self._wait_args(
            step if step is not None else name, name, timeout, "timeout"
        )
        return await self._off_loop(self._wait, wait, signal_name(name), seconds)

    # -- the parts -----------------------------------------------------------------

    def _wait_args(
        self, step: str, signal: str | None, duration: object, field: str
    ) -> tuple[str, float]:
        if signal is not None:
            signal_name(signal)
        seconds = wait_seconds(duration, field)
        return self._take(step, self.sleep), seconds

    def _wait(self, step: str, signal: str | None, seconds: float) -> Any:
        """One turn of the wait ``step`` (its name taken by :meth:`_wait_args`)."""
        try:
            done = self._done().get(step)
            if done is not None:
                return self._outcome(step, signal, done.value)
            store: WaitStore | None = self._step_store  # type: ignore[assignment]
            if store is None:
                if signal is not None:
                    raise ValidationError(
                        "ctx", "a signal wait runs in a worker (this context has no store)"
                    )
                record = {"signal": None, "key": None, "payload": None, "timed_out": False}
                self._remember(step, record)
                return None
            turn = self._fenced(lambda: store.await_step(self.job, step, signal, seconds))
            if turn.record is None:
                assert turn.until is not None
                parked = self._parked = Parked(step, signal, turn.until)
                raise parked
            self._remember(step, turn.record)
            return self._outcome(step, signal, turn.record)
        except BaseException:
            self._give_back(step)
            raise

    def _remember(self, step: str, record: dict[str, Any]) -> None:
        """The wait's outcome, as a replay in this attempt will find it."""
        done = self._done()
        with self._lock():
            done[step] = StepRecord(record, self.job.attempts)

    def _outcome(self, step: str, signal: str | None, record: object) -> Any:
        """A wait's recorded outcome: the payload, None for a sleep, or SignalTimeout."""
        if not isinstance(record, dict) or "timed_out" not in record:
            raise ValidationError(
                "step", f"step {step!r} was recorded by ctx.step, not by a durable wait"
            )
        if record.get("key") is not None:
            return record.get("payload")
        if record.get("timed_out"):
            until = record.get("until")
            raise SignalTimeout(
                self.job.id,
                step,
                str(record.get("signal") or signal),
                dt.datetime.fromisoformat(until) if isinstance(until, str) else _epoch(),
            )
        return None


def _epoch() -> dt.datetime:  # pragma: no cover - a timeout is recorded with its deadline
    return dt.datetime.fromtimestamp(0, dt.UTC)
