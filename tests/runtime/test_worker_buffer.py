"""The claim-ahead buffer's promises, in this process against real PostgreSQL.

A worker claims jobs ahead of its free threads into a buffer (leased, not
started, no attempt counted: jobrun/worker/ahead.py, starter.py). A stop
gives the buffer back at once; a cancel requested while a job waits there
ends it cancelled without running it; the heartbeat keeps buffered leases;
``claim_ahead=0`` never leaves a leased job unstarted; long jobs are not
hoarded; and a queue listed after a globally limited one is still claimed.
Most tests hold the buffer at a fixed depth (``Ahead.target`` patched) behind
a handler that blocks its only thread, so the buffer stays full while the
test looks.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker
from jobrun.worker.ahead import Ahead
from tests.support.waiting import wait_for

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
LEASE = 3.0  # the runtime tests' lease TTL (tests/runtime/conftest.py FAST)


class Runs:
    """The handler runs, by job id; ``gate`` holds the jobs of type ``block``."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.lock = threading.Lock()
        self.ran: list[tuple[uuid.UUID, int]] = []

    def handler(self, ctx: JobContext, job: Job) -> None:
        with self.lock:
            self.ran.append((job.id, job.attempts))
        if job.type == "block":
            self.gate.wait(30)
        else:
            time.sleep(float(job.payload.get("sleep", 0)) if isinstance(job.payload, dict) else 0)

    def of(self, job: Job) -> list[int]:
        with self.lock:
            return [attempt for job_id, attempt in self.ran if job_id == job.id]


@pytest.fixture
def runs(registry: Registry) -> Iterator[Runs]:
    r = Runs()
    registry.register("block", r.handler)
    registry.register("work", r.handler)
    yield r
    r.gate.set()  # never leave a worker's stop waiting on a blocked handler


def fixed_depth(monkeypatch: pytest.MonkeyPatch, depth: int) -> None:
    """The buffer holds ``depth`` jobs whatever the run time (within the cap)."""
    monkeypatch.setattr(Ahead, "target", lambda self: min(self._cap, depth))


def unstarted(conn: psycopg.Connection[Any]) -> list[uuid.UUID]:
    rows = conn.execute(
        "SELECT id FROM jobrun.jobs WHERE state = 'leased' AND started_at IS NULL ORDER BY id"
    ).fetchall()
    return [r[0] for r in rows]


def blocker_and_buffered(store: Store, n: int, **job: Any) -> tuple[Job, list[Job]]:
    """One job that takes the only thread, then ``n`` that wait in the buffer."""
    blocker = store.enqueue(NewJob(type="block", priority=0, backoff=NO_WAIT))
    waiting = [
        store.enqueue(NewJob(type="work", priority=1, backoff=NO_WAIT, **job)) for _ in range(n)
    ]
    return blocker, waiting


def kinds(store: Store, job: Job) -> list[str]:
    return [str(e.kind) for e in store.events(job.id)]


def test_stop_gives_the_buffer_back_at_once_and_another_worker_takes_it(
    store: Store,
    conn: psycopg.Connection[Any],
    runs: Runs,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed_depth(monkeypatch, 5)
    blocker, waiting = blocker_and_buffered(store, 5)
    worker = make_worker(concurrency=1, claim_ahead=None)
    wait_for(lambda: len(unstarted(conn)) == 5 and runs.of(blocker), 10)
    stopping = threading.Thread(target=worker.stop, kwargs={"timeout": 10})
    stopping.start()
    # Given back while the blocker still runs: the stop does not wait for it.
    wait_for(lambda: all(store.get(j.id).state is State.QUEUED for j in waiting), LEASE / 2)
    assert stopping.is_alive() and store.get(blocker.id).state is State.LEASED
    for job in waiting:
        stored = store.get(job.id)
        assert (stored.attempts, stored.lease_owner) == (0, None)
        events = store.events(job.id)
        assert [str(e.kind) for e in events] == ["enqueued", "claimed", "released"]
        detail = events[-1].detail
        assert events[-1].attempt == 0 and isinstance(detail, dict), events
        assert detail["via"] == "unclaim", events
    runs.gate.set()
    stopping.join(10)
    assert not stopping.is_alive()
    monkeypatch.undo()
    began = time.monotonic()
    make_worker(concurrency=2, claim_ahead=None)
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in waiting), LEASE)
    assert time.monotonic() - began < LEASE  # not after a lease expiry
    for job in waiting:
        assert runs.of(job) == [1]
        assert "reaped" not in kinds(store, job)


def test_a_cancel_requested_while_a_job_is_buffered_ends_it_cancelled_without_running(
    store: Store,
    conn: psycopg.Connection[Any],
    runs: Runs,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed_depth(monkeypatch, 3)
    blocker, waiting = blocker_and_buffered(store, 3)
    make_worker(concurrency=1, claim_ahead=None)
    wait_for(lambda: len(unstarted(conn)) == 3 and runs.of(blocker), 10)
    doomed, *others = waiting
    store.cancel(doomed.id)
    runs.gate.set()  # the thread frees: the starter tries the buffered jobs
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in others), 10)
    wait_for(lambda: store.get(doomed.id).state is State.CANCELLED, 10)
    assert runs.of(doomed) == []
    assert store.get(doomed.id).attempts == 0
    assert kinds(store, doomed)[-1] == "cancelled"


def test_the_heartbeat_keeps_buffered_leases_past_the_lease_ttl(
    store: Store,
    conn: psycopg.Connection[Any],
    runs: Runs,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fixed_depth(monkeypatch, 4)
    blocker, waiting = blocker_and_buffered(store, 4)
    make_worker(concurrency=1, claim_ahead=None)
    wait_for(lambda: len(unstarted(conn)) == 4 and runs.of(blocker), 10)
    held = unstarted(conn)
    until = time.monotonic() + LEASE * 1.7
    reaped = 0
    while time.monotonic() < until:  # the reaper's job, done often
        reaped += store.reap_expired(store.now(), 100).total
        time.sleep(0.1)
    assert reaped == 0
    assert unstarted(conn) == held  # still buffered, still this worker's
    runs.gate.set()
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in waiting), 10)
    for job in waiting:
        assert runs.of(job) == [1]
        assert kinds(store, job) == ["enqueued", "claimed", "succeeded"]


class Unstarted:
    """A thread counting the most leased, unstarted jobs seen at once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.most = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Unstarted:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as c:
            while not self._stop.wait(0.002):
                row = c.execute(
                    "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased' AND started_at IS NULL"
                ).fetchone()
                assert row is not None
                self.most = max(self.most, int(row[0]))
                self.samples += 1


@pytest.mark.parametrize("claim_ahead", [0, None])
def test_claim_ahead_0_never_leaves_a_leased_job_unstarted(
    store: Store,
    admin_dsn: str,
    runs: Runs,
    make_worker: Callable[..., Worker],
    claim_ahead: int | None,
) -> None:
    jobs = [NewJob(type="work", payload={"sleep": 0.002}, backoff=NO_WAIT) for _ in range(300)]
    store.enqueue_batch(jobs)
    with Unstarted(admin_dsn) as sampler:
        make_worker(concurrency=4, claim_ahead=claim_ahead)
        wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs[-5:]), 30)
        wait_for(lambda: len(runs.ran) == len(jobs), 30)
    assert sampler.samples > 20
    if claim_ahead == 0:
        assert sampler.most == 0
    else:  # the default buffers short jobs (the sampler can tell)
        assert sampler.most > 0


def test_long_jobs_are_not_claimed_ahead(
    store: Store,
    admin_dsn: str,
    runs: Runs,
    make_worker: Callable[..., Worker],
) -> None:
    # Warm the estimate with a few runs first: Ahead sizes nothing until it saw one.
    # One-second jobs on two threads buffer one only if a round trip averages
    # 250 ms (two round trips' work): never, even on a loaded CI machine (0.3 s
    # jobs did, at 75 ms).
    jobs = [NewJob(type="work", payload={"sleep": 1.0}, backoff=NO_WAIT) for _ in range(8)]
    store.enqueue_batch(jobs)
    with Unstarted(admin_dsn) as sampler:
        make_worker(concurrency=2, claim_ahead=None)
        wait_for(lambda: len(runs.ran) == len(jobs), 30)
    assert sampler.samples > 20
    assert sampler.most == 0


@pytest.mark.parametrize("after", ["perw", "free"])
def test_a_queue_listed_after_an_idle_globally_limited_queue_is_still_claimed(
    store: Store,
    runs: Runs,
    make_worker: Callable[..., Worker],
    after: str,
) -> None:
    # A per-worker limited queue, or an unlimited one without claiming
    # ahead, behind a globally limited queue that has no jobs.
    store.set_queue_limits("conc", concurrency=2)
    jobs = [NewJob(type="work", queue=after, backoff=NO_WAIT) for _ in range(5)]
    store.enqueue_batch(jobs)
    make_worker(queues={"conc": None, "perw": 2, "free": None}, concurrency=4, claim_ahead=0)
    wait_for(lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs), 10)


def test_a_job_reclaimed_into_the_buffer_while_its_stale_run_goes_on_keeps_its_new_lease(
    store: Store,
    conn: psycopg.Connection[Any],
    runs: Runs,
    make_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The job's first run ignores its cancel and holds the only thread. Its
    # lease is reaped meanwhile and the same worker claims it again, into the
    # buffer (no thread free): the new claim's attempts equal the stale run's
    # (a buffered claim counts none), and the heartbeat must keep the new
    # lease, not only the stale one it has lost.
    fixed_depth(monkeypatch, 2)
    job = store.enqueue(NewJob(type="block", backoff=NO_WAIT))
    make_worker(concurrency=1, claim_ahead=None)
    wait_for(lambda: runs.of(job) == [1], 10)
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = %s", [job.id]
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    wait_for(lambda: unstarted(conn) == [job.id], 10)  # claimed again, buffered
    until = time.monotonic() + LEASE * 1.7
    while time.monotonic() < until:
        store.reap_expired(store.now(), 10)
        time.sleep(0.1)
    assert kinds(store, job) == ["enqueued", "claimed", "reaped", "claimed"]
    runs.gate.set()  # the stale run ends; the buffered claim starts and runs
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED, 10)
    assert runs.of(job) == [1, 2]
