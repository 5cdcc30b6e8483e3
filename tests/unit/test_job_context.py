"""JobContext's cancellation: the Event made on first use behaves as one made at once."""

from __future__ import annotations

import threading

from jobrun.job.model import Job
from jobrun.worker.context import JobContext
from tests.support.jobs import leased_job


def _job() -> Job:
    return leased_job()


def test_an_event_asked_for_after_the_cancel_is_set() -> None:
    ctx = JobContext(_job())
    assert not ctx.is_cancelled
    ctx.cancel("timeout")
    assert ctx.is_cancelled
    assert ctx.cancelled.is_set()
    assert ctx.cancel_reason == "timeout"


def test_a_waiter_on_the_event_is_woken_by_the_cancel() -> None:
    ctx = JobContext(_job())
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(ctx.cancelled.wait(30)))
    waiter.start()
    while ctx._event is None:  # the waiter made it
        threading.Event().wait(0.001)
    ctx.cancel("lease lost")
    waiter.join(30)
    assert woke == [True]


def test_the_first_reason_wins_and_on_cancel_runs_once() -> None:
    calls: list[int] = []
    ctx = JobContext(_job(), _on_cancel=lambda: calls.append(1))
    ctx.cancel("timeout")
    ctx.cancel("shutdown")
    assert ctx.cancel_reason == "timeout"
    assert calls == [1]


def test_an_event_given_and_set_directly_cancels_the_context() -> None:
    event = threading.Event()
    ctx = JobContext(_job(), event, None)
    assert ctx.cancelled is event
    event.set()
    assert ctx.is_cancelled
    calls: list[int] = []
    ctx._on_cancel = lambda: calls.append(1)
    ctx.cancel("late")  # already cancelled: not a first cancel
    assert calls == []


def test_cancels_racing_the_events_creation_always_leave_it_set() -> None:
    for _ in range(200):
        ctx = JobContext(_job())
        canceller = threading.Thread(target=ctx.cancel, args=("timeout",))
        canceller.start()
        event = ctx.cancelled
        canceller.join()
        assert event.is_set()
        assert ctx.cancelled is event
