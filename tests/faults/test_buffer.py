"""The claim-ahead buffer under faults (issue 27): a full buffer killed, frozen, limited.

A pipelined worker holds jobs claimed ahead of its free threads: leased, not
started, no attempt counted (migration 0010). Its promises, with real
``jobrun worker`` processes whose buffer is held deep
(:mod:`tests.faults.buffer_app`) and the suite's oracle after each test:

- kill -9 with a full buffer burns only the started jobs' attempts: the
  buffered ones are reaped unstarted and run once, even with max_attempts=1;
- a frozen worker's buffered leases expire and are requeued unstarted; when
  it wakes, its starter's StartJobs is fenced and none of them runs there;
- buffered leases count against limits: a global concurrency limit is never
  overshot, limited queues are never claimed ahead, and no worker holds more
  than its concurrency plus the completion allowance.
"""

from __future__ import annotations

import collections
import re
import signal
import threading
from pathlib import Path
from typing import Any

import psycopg

from jobrun.job.model import NewJob
from jobrun.postgres.store import Store
from jobrun.worker.config import DEFAULT_COMPLETE_BATCH
from tests.faults.buffer_app import AHEAD_ENV
from tests.faults.harness import (
    QUICK_RETRY,
    TTL,
    Reaper,
    WorkerProc,
    Workers,
    scalar,
    states,
    wait_until,
)
from tests.faults.oracle import (
    ExpectedLimits,
    LeaseSampler,
    Oracle,
    install_limit_oracle,
    limit_violations,
    most_running,
    side_log_records,
)

APP = ("--app", "tests.faults.buffer_app:registry")


def buffered_worker(workers: Workers, depth: int, *args: str, concurrency: int) -> WorkerProc:
    """A worker process whose claimer keeps ``depth`` jobs claimed ahead."""
    env = {AHEAD_ENV: str(depth), "JOBRUN_CLAIM_AHEAD": "auto"}  # off by default
    return workers.start(*APP, *args, env=env, concurrency=concurrency)


def leased_unstarted(conn: psycopg.Connection[Any]) -> int:
    return int(
        scalar(
            conn, "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased' AND started_at IS NULL"
        )
    )


def attempts(conn: psycopg.Connection[Any], jobs: list[NewJob]) -> list[int]:
    by_id = dict(conn.execute("SELECT id, attempts FROM jobrun.jobs").fetchall())
    return [by_id[job.id] for job in jobs]


def runs(side_log: Path, job: NewJob) -> list[tuple[int, int]]:
    """(attempt, pid) of each handler run of ``job``, in order."""
    return [
        (r["attempt"], r["pid"])
        for r in side_log_records(side_log)
        if r["event"] == "start" and r["job"] == str(job.id)
    ]


def effects(conn: psycopg.Connection[Any], job: NewJob) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT attempt, pid FROM effects WHERE job_id = %s ORDER BY at", [job.id]
    ).fetchall()


def trail(conn: psycopg.Connection[Any], job: NewJob) -> list[tuple[str, int, Any]]:
    return [
        (str(kind), attempt, detail)
        for kind, attempt, detail in conn.execute(
            "SELECT kind::text, attempt, detail FROM jobrun.job_events WHERE job_id = %s"
            " ORDER BY id",
            [job.id],
        ).fetchall()
    ]


def long_then_short(n: int, first_attempt_sleep: float) -> list[NewJob]:
    """Jobs claimed first (priority 0) that hold their threads on attempt 1
    (so the buffer behind them stays full) and run briefly on attempt 2."""
    return [
        NewJob(
            type="tx.work",
            payload={
                "sleep": 0.05,
                "sleeps": {"1": first_attempt_sleep},
                "honour_cancel": False,
            },
            priority=0,
            max_attempts=2,
            backoff=QUICK_RETRY,
        )
        for _ in range(n)
    ]


def one_attempt(n: int, sleep: float) -> list[NewJob]:
    """Jobs claimed after the long ones (priority 1), into the buffer: one
    attempt each, so a buffered job charged an attempt by a crash goes dead."""
    return [
        NewJob(
            type="tx.work",
            payload={"sleep": sleep},
            priority=1,
            max_attempts=1,
            backoff=QUICK_RETRY,
        )
        for _ in range(n)
    ]


def assert_buffered_then_reaped(conn: psycopg.Connection[Any], job: NewJob) -> None:
    """The job's first lease was a buffered claim, reaped unstarted, no attempt."""
    events = trail(conn, job)
    assert [kind for kind, _, _ in events[:3]] == ["enqueued", "claimed", "reaped"], events
    assert events[1][1:] == (0, {"started": False}), events
    reaped = events[2][2]
    assert events[2][1] == 0 and isinstance(reaped, dict) and reaped["started"] is False, events


# -- kill -9 with a full buffer ----------------------------------------------------------


def test_a_worker_killed_with_a_full_buffer_burns_only_its_started_jobs_attempts(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    running, buffered = long_then_short(2, 60), one_attempt(14, 0.3)
    store.enqueue_batch([*running, *buffered])
    oracle.enqueued([*running, *buffered])
    first = buffered_worker(workers, len(buffered), concurrency=len(running))
    wait_until(
        lambda: len(side_log_records(side_log)) >= 2 and leased_unstarted(conn) == len(buffered),
        30,
        lambda: f"two handlers running, the buffer full: {states(conn)}\n{first.output()}",
    )
    first.kill9()  # as the OOM killer would: no give-back, no completion
    assert states(conn) == {"leased": 16}
    assert attempts(conn, running) == [1, 1]
    assert attempts(conn, buffered) == [0] * len(buffered)
    with Reaper(store):
        second = buffered_worker(workers, 6, concurrency=4)
        wait_until(
            lambda: states(conn) == {"succeeded": 16},
            60,
            lambda: f"every job succeeds after the reap: {states(conn)}\n{workers.outputs()}",
        )
    # The started jobs burned one attempt each in the killed worker; the
    # buffered ones none: each ran once, on its first attempt, after the reap.
    assert attempts(conn, running) == [2, 2]
    assert attempts(conn, buffered) == [1] * len(buffered)
    for job in running:
        assert runs(side_log, job) == [(1, first.pid), (2, second.pid)]
        assert effects(conn, job) == [(2, second.pid)]
    for job in buffered:
        assert runs(side_log, job) == [(1, second.pid)]
        assert effects(conn, job) == [(1, second.pid)]
        assert_buffered_then_reaped(conn, job)
    # The second worker buffered some of them again before starting them.
    seconds = [trail(conn, job)[3] for job in buffered]
    assert any(detail == {"started": False} for kind, _, detail in seconds), seconds
    oracle.watch(oracle.default_url, settled=True)


# -- a frozen worker's buffered leases expire -------------------------------------------


def test_a_frozen_workers_buffered_leases_are_reaped_unstarted_and_never_run_when_it_wakes(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    running, buffered = long_then_short(2, TTL.total_seconds() + 1), one_attempt(10, 0.05)
    store.enqueue_batch([*running, *buffered])
    oracle.enqueued([*running, *buffered])
    stale = buffered_worker(workers, len(buffered), concurrency=len(running))
    wait_until(
        lambda: len(side_log_records(side_log)) >= 2 and leased_unstarted(conn) == len(buffered),
        30,
        lambda: f"two handlers running, the buffer full: {states(conn)}\n{stale.output()}",
    )
    stale.stop()  # SIGSTOP: no heartbeat; every lease it holds runs out
    with Reaper(store):
        wait_until(lambda: states(conn) == {"queued": 12}, TTL.total_seconds() + 30, "all reaped")
    assert attempts(conn, running) == [1, 1]
    assert attempts(conn, buffered) == [0] * len(buffered)  # requeued unstarted
    for job in buffered:
        assert_buffered_then_reaped(conn, job)
    other = workers.start(concurrency=4)
    wait_until(
        lambda: states(conn) == {"succeeded": 12},
        60,
        lambda: f"another worker runs them: {states(conn)}\n{workers.outputs()}",
    )
    # The stale worker wakes: its handlers return (their completions are
    # fenced), its threads free up and its starter tries its stale buffer.
    stale.cont()
    wait_until(
        lambda: sum(1 for r in side_log_records(side_log) if r["pid"] == stale.pid) >= 4,
        30,
        lambda: f"the stale handlers return\n{stale.output()}",
    )
    wait_until(
        lambda: re.search(r"lease lost|lost their lease", stale.output()),
        30,
        lambda: f"the stale worker is told of its lost leases\n{stale.output()}",
    )
    # Its ledger is sound again: with the other worker gone, it runs new work.
    other.signal(signal.SIGTERM)
    assert other.wait(30) == 0, other.output()
    late = one_attempt(4, 0.0)
    store.enqueue_batch(late)
    oracle.enqueued(late)
    wait_until(
        lambda: states(conn) == {"succeeded": 16},
        30,
        lambda: f"the woken worker runs new jobs: {states(conn)}\n{stale.output()}",
    )
    stale.signal(signal.SIGTERM)
    assert stale.wait(30) == 0, stale.output()
    # Nothing of the stale buffer ran in the stale worker: the jobs ran once,
    # in the other worker, on their first attempt.
    assert attempts(conn, buffered) == [1] * len(buffered)
    for job in buffered:
        assert runs(side_log, job) == [(1, other.pid)]
        assert effects(conn, job) == [(1, other.pid)]
    for job in running:
        assert runs(side_log, job) == [(1, stale.pid), (2, other.pid)]
        assert effects(conn, job) == [(2, other.pid)]
    for job in late:
        assert runs(side_log, job) == [(1, stale.pid)]
    assert states(conn) == {"succeeded": 16}
    oracle.watch(oracle.default_url, settled=True)


# -- limits with buffered leases counted ------------------------------------------------

LIMITED, PER_WORKER, FREE = "conc", "perw", "free"
GLOBAL_LIMIT, WORKER_LIMIT, CONCURRENCY, DEPTH = 5, 2, 8, DEFAULT_COMPLETE_BATCH
ALLOWANCE = max(CONCURRENCY, DEFAULT_COMPLETE_BATCH)

PER_OWNER = """
SELECT lease_owner, count(*)::int,
       count(*) FILTER (WHERE started_at IS NULL)::int,
       count(*) FILTER (WHERE started_at IS NULL AND queue <> %s)::int,
       count(*) FILTER (WHERE queue = %s)::int
FROM jobrun.jobs WHERE state = 'leased' GROUP BY lease_owner
"""


def left(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    """The jobs not succeeded, per queue and state."""
    return conn.execute(
        "SELECT queue, state::text, count(*) FROM jobrun.jobs WHERE state <> 'succeeded'"
        " GROUP BY 1, 2 ORDER BY 1, 2"
    ).fetchall()


class OwnerSampler:
    """A thread reading each worker's leases every few milliseconds: the most
    leases, buffered leases, buffered leases of the limited queues and leases
    of the per-worker limited queue any one owner held at once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.samples = 0
        self.peak: collections.Counter[str] = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owner-sampler", daemon=True)

    def __enter__(self) -> OwnerSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.wait(0.005):
                for _, leases, unstarted, limited, per_worker in conn.execute(
                    PER_OWNER, [FREE, PER_WORKER]
                ).fetchall():
                    for name, n in (
                        ("leases", leases),
                        ("buffered", unstarted),
                        ("buffered limited", limited),
                        ("per-worker queue", per_worker),
                    ):
                        self.peak[name] = max(self.peak[name], n)
                self.samples += 1


def test_buffered_leases_count_against_limits_and_limited_queues_are_never_claimed_ahead(
    store: Store,
    conn: psycopg.Connection[Any],
    admin_dsn: str,
    workers: Workers,
    side_log: Path,
    oracle: Oracle,
) -> None:
    store.set_queue_limits(LIMITED, concurrency=GLOBAL_LIMIT)
    expected = {LIMITED: ExpectedLimits(concurrency=GLOBAL_LIMIT)}
    install_limit_oracle(conn, expected)
    jobs = [
        *(
            NewJob(type="tx.limited", queue=LIMITED, payload={"sleep": 0.05}, backoff=QUICK_RETRY)
            for _ in range(80)
        ),
        *(
            NewJob(
                type="tx.limited", queue=PER_WORKER, payload={"sleep": 0.05}, backoff=QUICK_RETRY
            )
            for _ in range(40)
        ),
        *(
            NewJob(type="tx.limited", queue=FREE, payload={"sleep": 0.01}, backoff=QUICK_RETRY)
            for _ in range(900)
        ),
    ]
    store.enqueue_batch(jobs)
    oracle.enqueued(jobs)
    queues = ("--queues", f"{LIMITED},{PER_WORKER}={WORKER_LIMIT},{FREE}")
    with LeaseSampler(admin_dsn, expected) as sampler, OwnerSampler(admin_dsn) as owners:
        procs = [
            buffered_worker(workers, DEPTH, *queues, concurrency=CONCURRENCY) for _ in range(3)
        ]
        wait_until(
            lambda: states(conn) == {"succeeded": len(jobs)},
            60,
            lambda: f"every job succeeds: {left(conn)}\n{workers.outputs()[-3000:]}",
            interval=0.2,
        )
    assert all(p.alive() for p in procs)
    assert limit_violations(conn) == []
    assert sampler.violations == []
    assert sampler.samples > 50 and owners.samples > 50
    assert sampler.peak[LIMITED] == GLOBAL_LIMIT, sampler.peak  # the limit was reached
    # The buffer was used, and deep; never for a limited queue; no worker held
    # more leases than its threads plus the completion allowance.
    assert owners.peak["buffered"] > CONCURRENCY, owners.peak
    assert owners.peak["buffered limited"] == 0, owners.peak
    assert owners.peak["leases"] <= CONCURRENCY + ALLOWANCE, owners.peak
    # A per-worker limit bounds the handlers running at once in each worker
    # (its leases also include successes waiting for the completer).
    per_worker = most_running(
        side_log_records(side_log), lambda r: r["pid"] if r["queue"] == PER_WORKER else None
    )
    assert 0 < max(per_worker.values()) <= WORKER_LIMIT, per_worker
    oracle.watch(oracle.default_url, settled=True, runs_exactly_once=True)
