"""A finished handler's memory is released once its outcome is recorded.

Without a forced collection (``gc.disable()``): an exception that kept the
handler's frame alive through a reference cycle in the worker (exception ->
traceback -> frames -> locals that hold the exception) would keep every
object the handler held until the cyclic collector happened to run, so a
worker whose handlers allocate a lot and fail could be OOM-killed by memory
it no longer uses. (Measured in this process: three handlers that allocated
300 MB each and raised left 61 -> 961 MB resident before; 62 -> 62 MB now.)
"""

from __future__ import annotations

import asyncio
import datetime as dt
import gc
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker
from jobrun.worker.hooks import JobOutcome, WorkerHooks

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


class Big:
    """What a handler allocates: something a weak reference can watch."""

    def __init__(self) -> None:
        self.data = bytearray(1 << 20)


@pytest.fixture
def no_gc() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def wait_recorded(store: Store, job: Job, *, states: set[State]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        got = store.get(job.id)
        if got.state in states and got.attempts >= 1:
            return
        time.sleep(0.02)
    raise AssertionError(f"the job's outcome was not recorded: {store.get(job.id)}")


def released_soon(ref: weakref.ref[Any]) -> bool:
    """The handler's object is gone (no gc run: refcounts alone) within a moment
    of the outcome being recorded (the worker thread returns from its
    bookkeeping right after the write)."""
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if ref() is None:
            return True
        time.sleep(0.01)
    return False


def _holders(ref: weakref.ref[Any]) -> str:
    obj = ref()
    if obj is None:
        return "released"
    return "; ".join(type(r).__name__ for r in gc.get_referrers(obj))


class Watching(WorkerHooks):
    """A hook that is given the exception (as metrics and error trackers are)."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        self.errors.append(repr(error))

    def job_finished(self, outcome: JobOutcome) -> None:
        self.errors.append(repr(outcome.error))


CASES = [
    "raises",
    "raises_with_hooks",
    "times_out",
    "cancelled",
    "async_raises",
    "async_raises_with_hooks",
    "async_times_out",
    "async_cancelled",
]


@pytest.mark.parametrize("case", CASES)
def test_a_finished_handlers_memory_is_released_without_a_garbage_collection(
    case: str,
    no_gc: None,
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
) -> None:
    refs: list[weakref.ref[Any]] = []
    started = threading.Event()

    def plain(ctx: JobContext, job: Job) -> None:
        big = Big()
        refs.append(weakref.ref(big))
        started.set()
        if "raises" in case:
            error = RuntimeError(f"failed holding {len(big.data)} bytes")
            refs.append(weakref.ref(error))  # and the error itself goes too
            raise error
        while not ctx.is_cancelled:
            time.sleep(0.01)
        raise RuntimeError(f"stopped holding {len(big.data)} bytes")

    async def coroutine(ctx: JobContext, job: Job) -> None:
        big = Big()
        refs.append(weakref.ref(big))
        started.set()
        if "raises" in case:
            error = RuntimeError(f"failed holding {len(big.data)} bytes")
            refs.append(weakref.ref(error))
            raise error
        await asyncio.sleep(60)

    timeout = dt.timedelta(milliseconds=300) if "times_out" in case else None
    registry.register("t", coroutine if case.startswith("async") else plain, timeout=timeout)
    cancelled = "cancelled" in case
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT, max_attempts=3 if cancelled else 1))
    hooks = [Watching()] if "hooks" in case else []
    make_worker(concurrency=1, hooks=hooks)
    assert started.wait(30)
    if cancelled:
        store.cancel(job.id)
        wait_recorded(store, job, states={State.CANCELLED})
    else:
        wait_recorded(store, job, states={State.DEAD})
    for ref in refs:
        assert released_soon(ref), f"{ref} still held by: {_holders(ref)}"
    if hooks:
        assert len(hooks[0].errors) == 2 and "RuntimeError" in hooks[0].errors[1]


def test_a_failed_commit_callables_memory_is_released_without_a_garbage_collection(
    no_gc: None, store: Store, registry: Registry, make_worker: Callable[..., Worker]
) -> None:
    refs: list[weakref.ref[Any]] = []

    def handler(ctx: JobContext, job: Job) -> Callable[[Any], None]:
        def commit(conn: Any) -> None:
            big = Big()
            refs.append(weakref.ref(big))
            raise RuntimeError(f"commit failed holding {len(big.data)} bytes")

        return commit

    registry.register("t", handler)
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT, max_attempts=1))
    make_worker(concurrency=1)
    wait_recorded(store, job, states={State.DEAD})
    assert refs and all(released_soon(ref) for ref in refs), _holders(refs[0])


@pytest.mark.parametrize("kind", ["plain", "async"])
def test_a_finished_jobs_context_and_job_are_released_without_a_garbage_collection(
    kind: str,
    no_gc: None,
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
) -> None:
    """What the worker keeps per job (its context, the job and its payload)
    goes with the job, not at the next collection: a context and its
    progress writer referred to each other."""
    refs: list[weakref.ref[Any]] = []

    def plain(ctx: JobContext, job: Job) -> None:
        refs.append(weakref.ref(ctx))
        ctx.progress(0.5)

    async def coroutine(ctx: JobContext, job: Job) -> None:
        refs.append(weakref.ref(ctx))
        ctx.progress(0.5)

    registry.register("t", plain if kind == "plain" else coroutine, timeout=dt.timedelta(hours=1))
    job = store.enqueue(NewJob(type="t", backoff=NO_WAIT, payload={"blob": "x" * 1000}))
    make_worker(concurrency=1)
    wait_recorded(store, job, states={State.SUCCEEDED})
    assert refs and released_soon(refs[0]), _holders(refs[0])
