"""StartBatcher: the starts of jobs that waited for a thread, combined across
threads (jobrun.worker.starts). The store call is a plain function here: what
is tested is who calls it with what, not the database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import uuid
from collections.abc import Sequence

from jobrun.job.model import Backoff, Job, State
from jobrun.worker.starts import StartBatcher
from tests.support.waiting import wait_for

_T = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def leased(name: str) -> Job:
    return Job(
        id=uuid.uuid4(),
        queue="q",
        type=name,
        payload={},
        priority=0,
        state=State.LEASED,
        attempts=0,
        max_attempts=3,
        backoff=Backoff(),
        run_at=_T,
        lease_owner="w",
        lease_token=uuid.uuid4(),
        lease_expires_at=_T,
        cancel_requested=False,
        idempotency_key=None,
        last_error=None,
        created_at=_T,
        updated_at=_T,
        finished_at=None,
    )


class Store:
    """Starts every job but "refused"; the first call waits for ``go``."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.go = threading.Event()
        self.fail: BaseException | None = None

    def start_jobs(self, jobs: Sequence[Job]) -> list[Job]:
        self.calls.append([j.type for j in jobs])
        if len(self.calls) == 1:
            assert self.go.wait(10)
        if self.fail is not None:
            raise self.fail
        return [
            dataclasses.replace(j, attempts=j.attempts + 1, started_at=_T)
            for j in jobs
            if j.type != "refused"
        ]


def _run(batcher: StartBatcher, job: Job, out: dict[str, object]) -> threading.Thread:
    def run() -> None:
        try:
            out[job.type] = batcher.start(job)
        except BaseException as exc:
            out[job.type] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_starts_due_while_a_call_is_in_flight_go_together_in_the_next_call() -> None:
    store = Store()
    batcher = StartBatcher(store.start_jobs)
    out: dict[str, object] = {}
    first = _run(batcher, leased("a"), out)
    wait_for(lambda: store.calls)
    others = [_run(batcher, leased(name), out) for name in ("b", "c", "refused")]
    wait_for(lambda: len(batcher._pending) == 3)
    store.go.set()
    for thread in (first, *others):
        thread.join(10)
    assert [sorted(call) for call in store.calls] == [["a"], ["b", "c", "refused"]]
    assert out["refused"] is None  # refused: must not run
    for name in ("a", "b", "c"):
        got = out[name]
        assert isinstance(got, Job) and (got.type, got.attempts, got.started) == (name, 1, True)


def test_a_failed_call_raises_in_every_thread_whose_start_it_carried() -> None:
    store = Store()
    store.fail = ConnectionError("the database went away")
    batcher = StartBatcher(store.start_jobs)
    out: dict[str, object] = {}
    first = _run(batcher, leased("a"), out)
    wait_for(lambda: store.calls)
    second = _run(batcher, leased("b"), out)
    wait_for(lambda: batcher._pending)
    store.go.set()
    first.join(10)
    second.join(10)
    assert all(isinstance(out[name], ConnectionError) for name in ("a", "b"))
    store.fail = None
    again = batcher.start(leased("c"))  # the batcher is not stuck
    assert again is not None and again.attempts == 1


def test_a_thread_alone_makes_one_call_of_its_own() -> None:
    store = Store()
    store.go.set()
    batcher = StartBatcher(store.start_jobs)
    assert batcher.start(leased("a")) is not None
    assert batcher.start(leased("refused")) is None
    assert store.calls == [["a"], ["refused"]]
    assert batcher._pending == []  # nothing left behind
