"""Crashes, stale owners, the reaper's races and graceful stops (scenarios 1, 2, 3, 16)."""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import LeaseLost
from jobrun.job.model import Job, NewJob, State
from jobrun.postgres.store import Store
from tests.faults.app import LOG_ENV, commit_for
from tests.faults.harness import (
    QUICK_RETRY,
    ROOT,
    TTL,
    Background,
    Reaper,
    WorkerProc,
    Workers,
    parked,
    scalar,
    states,
    wait_until,
    waiting_on_lock,
)
from tests.faults.oracle import Oracle, side_log_records

OWNER = "test-owner"


def started(side_log: Any, n: int) -> bool:
    return len([r for r in side_log_records(side_log) if r["event"] == "start"]) >= n


def kinds(store: Store, job: Job) -> list[str]:
    return [str(e.kind) for e in store.events(job.id)]


def effects(conn: psycopg.Connection[Any], job: Job) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT attempt, pid FROM effects WHERE job_id = %s ORDER BY at", [job.id]
    ).fetchall()


def woken_owner_changes_nothing(
    store: Store,
    conn: psycopg.Connection[Any],
    job: Job,
    stale: WorkerProc,
    fresh: WorkerProc,
    told: str,
) -> None:
    """The frozen owner of ``job``'s first attempt wakes after ``fresh`` ran
    its second: its log says so (``told``, a pattern), and the job, its
    events and its one effect (``fresh``'s) stay as they were."""
    done = store.get(job.id)
    events_before = kinds(store, job)
    stale.cont()
    wait_until(
        lambda: re.search(told, stale.output(), re.I),
        30,
        lambda: f"the stale owner's log says /{told}/\n" + stale.output()[-2000:],
    )
    after = store.get(job.id)
    assert (after.state, after.finished_at, after.attempts) == (
        done.state,
        done.finished_at,
        done.attempts,
    )
    assert kinds(store, job) == events_before
    assert effects(conn, job) == [(2, fresh.pid)]


# -- 1. a worker killed mid-job and inside the complete transaction ------------------------


def test_a_worker_killed_mid_job_is_reaped_with_its_attempt_burned_and_the_effect_once(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    jobs = [
        store.enqueue(
            NewJob(
                type="tx.work",
                payload={"sleep": 60, "sleep_attempts": [1], "honour_cancel": False},
                backoff=QUICK_RETRY,
            )
        )
        for _ in range(4)
    ]
    oracle.enqueued(jobs)
    first = workers.start(concurrency=4)
    wait_until(lambda: started(side_log, 4), 30, "four handlers running")
    first.kill9()
    assert states(conn) == {"leased": 4}  # nobody finished them; the leases run out
    second = workers.start(scheduler=True)  # its reaper requeues the expired leases
    wait_until(lambda: states(conn) == {"succeeded": 4}, 60, "all jobs succeed after the reap")
    for job in jobs:
        stored = store.get(job.id)
        assert stored.attempts == 2  # the killed worker burned exactly one
        assert effects(conn, job) == [(2, second.pid)]
        assert kinds(store, job) == ["enqueued", "claimed", "reaped", "claimed", "succeeded"]
    oracle.watch(oracle.default_url, settled=True)


# A process that claims three jobs and starts only the first (as a worker
# whose jobs wait for a thread will: Store.claim's ``start``), runs its
# "handler" (the side log's start record) and then hangs until it is killed.
CLAIM_ONE_STARTED = """
import datetime as dt, os, sys, time
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.faults.app import side_log
store = Store(open_pool(os.environ["DATABASE_URL"], concurrency=1, application_name="claimer"))
jobs = store.claim("claimer", ["default"], 3, dt.timedelta(seconds=float(sys.argv[1])), start=1)
assert [job.started for job in jobs] == [True, False, False], jobs
side_log("start", jobs[0])
time.sleep(600)
"""


def test_a_process_killed_with_leased_unstarted_jobs_burns_only_the_started_jobs_attempt(
    dsn: str,
    tmp_path: Any,
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    # One attempt each: a crash that burned the waiting jobs' attempts would
    # leave them dead instead of run.
    def job(priority: int) -> Job:
        return store.enqueue(
            NewJob(
                type="plain.work",
                payload={"sleep": 0},
                priority=priority,
                max_attempts=1,
                backoff=QUICK_RETRY,
            )
        )

    running, waiting = job(0), [job(1), job(2)]
    oracle.enqueued([running, *waiting])
    with open(tmp_path / "claimer.log", "wb") as log:
        claimer = subprocess.Popen(
            [sys.executable, "-c", CLAIM_ONE_STARTED, str(TTL.total_seconds())],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={
                **os.environ,
                "DATABASE_URL": dsn,
                LOG_ENV: str(side_log),
                "PYTHONPATH": str(ROOT),
            },
            cwd=ROOT,
        )
    try:
        wait_until(lambda: claimer.poll() is not None or started(side_log, 1), 30, "the claim made")
        assert claimer.poll() is None, (tmp_path / "claimer.log").read_text()
        claimer.send_signal(signal.SIGKILL)  # as a segfault or the OOM killer would
        claimer.wait(30)
    finally:
        if claimer.poll() is None:
            claimer.kill()
            claimer.wait(30)
    assert states(conn) == {"leased": 3}
    assert [store.get(j.id).attempts for j in (running, *waiting)] == [1, 0, 0]
    worker = workers.start(scheduler=True)  # its reaper requeues the expired leases
    wait_until(lambda: states(conn) == {"succeeded": 2, "dead": 1}, 60, "the leases reaped")
    # The job that was running burned its one attempt; the waiting ones none.
    assert store.get(running.id).state is State.DEAD
    assert [store.get(j.id).attempts for j in (running, *waiting)] == [1, 1, 1]
    assert kinds(store, running) == ["enqueued", "claimed", "reaped", "dead"]
    for waited in waiting:
        trail = store.events(waited.id)
        assert [str(e.kind) for e in trail] == [
            "enqueued",
            "claimed",
            "reaped",
            "claimed",
            "succeeded",
        ]
        assert (trail[1].attempt, trail[1].detail) == (0, {"started": False})
        reaped = trail[2].detail
        assert isinstance(reaped, dict) and (trail[2].attempt, reaped["started"]) == (0, False)
        runs = [r for r in side_log_records(side_log) if r["job"] == str(waited.id)]
        assert [(r["event"], r["attempt"], r["pid"]) for r in runs] == [
            ("start", 1, worker.pid),
            ("end", 1, worker.pid),
        ]
    oracle.watch(oracle.default_url, settled=True)


def test_a_worker_killed_inside_the_complete_transaction_leaves_no_effect_and_runs_again(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    # The commit callable sleeps in SQL on the first attempt: the worker dies
    # with Complete's transaction open (effect row and ledger row written).
    job = store.enqueue(
        NewJob(
            type="tx.work",
            payload={"commit_pg_sleep": 4, "commit_sleep_attempts": [1]},
            backoff=QUICK_RETRY,
        )
    )
    oracle.enqueued([job])
    first = workers.start(concurrency=1)
    wait_until(
        lambda: scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'jobrun-worker'"
            " AND datname = current_database() AND query LIKE 'SELECT pg_sleep%%'"
            " AND state = 'active'",
        ),
        30,
        "the commit callable sleeping inside Complete's transaction",
    )
    first.kill9()
    # The server aborts the orphaned transaction: no ledger row, no effect.
    wait_until(
        lambda: (
            scalar(conn, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE %s", "%pg_sleep%")
            == 0
        ),
        30,
        "the orphaned transaction ends",
    )
    assert effects(conn, job) == []
    assert scalar(conn, "SELECT count(*) FROM jobrun.processed_effects") == 0
    assert store.get(job.id).state is State.LEASED
    second = workers.start(scheduler=True)
    wait_until(lambda: store.get(job.id).state is State.SUCCEEDED, 60, "the job succeeds")
    assert store.get(job.id).attempts == 2
    assert effects(conn, job) == [(2, second.pid)]
    assert kinds(store, job) == ["enqueued", "claimed", "reaped", "claimed", "succeeded"]


# -- 2. stale owners are fenced ---------------------------------------------------------


def test_a_frozen_owner_is_reaped_and_fenced_when_it_wakes_up(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    job = store.enqueue(
        NewJob(
            type="tx.work",
            payload={"sleep": 2, "sleep_attempts": [1], "honour_cancel": False},
            backoff=QUICK_RETRY,
        )
    )
    oracle.enqueued([job])
    stale = workers.start(concurrency=1)
    wait_until(lambda: started(side_log, 1), 30, "the first attempt runs")
    stale.stop()  # SIGSTOP: no heartbeats, no progress; its lease runs out
    reaped = wait_until(
        lambda: store.reap_expired(store.now(), 10).requeued, 30, "the lease expires and is reaped"
    )
    assert reaped == [job.id]
    fresh = workers.start(concurrency=1)
    wait_until(lambda: store.get(job.id).state is State.SUCCEEDED, 30, "the new owner finishes")
    # Its handler returns; its Complete (alone or in a batch) or Fail is refused.
    woken_owner_changes_nothing(store, conn, job, stale, fresh, r"lease lost|lost their lease")


def test_an_owner_frozen_inside_its_commit_lets_go_of_the_job_and_is_fenced(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    """Frozen between its Complete's row lock and its COMMIT (its commit callable
    runs), the worker's transaction would hold the job's row for as long as the
    freeze lasts, and the reaper skips locked rows: the server ends the silent
    session after commit_timeout of silence (a commit callable may take longer
    than the lease: the Complete holds its rows so that the reaper waits), and
    the job runs again elsewhere, once."""
    job = store.enqueue(
        NewJob(
            type="tx.work",
            payload={"commit_py_sleep": 2, "commit_sleep_attempts": [1]},
            backoff=QUICK_RETRY,
        )
    )
    oracle.enqueued([job])
    stale = workers.start(concurrency=1, env={"JOBRUN_COMMIT_TIMEOUT": "2s"})
    wait_until(
        lambda: any(r["event"] == "commit" for r in side_log_records(side_log)),
        30,
        "the first attempt's commit callable runs",
    )
    stale.stop()  # SIGSTOP inside the Complete: its row lock stays, its watchdog sleeps
    fresh = workers.start(concurrency=1)
    with Reaper(store):
        wait_until(
            lambda: store.get(job.id).state is State.SUCCEEDED,
            30,
            lambda: f"the job runs again: {store.get(job.id)}",
        )
    woken_owner_changes_nothing(
        store, conn, job, stale, fresh, r"lease lost|lost their lease|outcome unknown"
    )


def test_a_stale_claim_is_fenced_even_when_the_same_worker_claimed_the_job_again(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [old] = store.claim(OWNER, ["default"], 1, TTL)
    conn.execute("UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 second'")
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    [new] = store.claim(OWNER, ["default"], 1, TTL)  # the same owner name, a new token
    assert new.lease_token != old.lease_token

    with pytest.raises(LeaseLost):
        store.complete(old, commit_for(old))
    with pytest.raises(LeaseLost):
        store.fail(old, "stale", None)
    until = store.now() + TTL
    assert store.heartbeat(OWNER, [(old.id, old.lease_token)], until) == set()  # type: ignore[list-item]
    assert store.heartbeat(OWNER, [(new.id, new.lease_token)], until) == {job.id}  # type: ignore[list-item]
    assert scalar(conn, "SELECT count(*) FROM effects") == 0
    leased = store.get(job.id)
    assert (leased.state, leased.lease_token) == (State.LEASED, new.lease_token)
    assert store.complete(new, commit_for(new)).state is State.SUCCEEDED


def test_a_worker_that_reclaims_its_own_reaped_job_keeps_heartbeating_the_new_claim(
    store: Store, conn: psycopg.Connection[Any], in_process: Any, oracle: Oracle
) -> None:
    """Attempt 1's stale handler ends while attempt 2 of the same job runs in the same worker."""
    job = store.enqueue(
        NewJob(
            type="tx.work",
            # Attempt 2 outlives the end of attempt 1 by more than the TTL (3 s).
            payload={"sleeps": {"1": 2, "2": 8}, "honour_cancel": False},
            backoff=QUICK_RETRY,
        )
    )
    oracle.enqueued([job])
    in_process(concurrency=2, scheduler=False)
    wait_until(lambda: store.get(job.id).state is State.LEASED, 30, "attempt 1 runs")
    _expire(conn, store.get(job.id))
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    wait_until(lambda: store.get(job.id).attempts == 2, 30, "the same worker claims it again")
    # Reap whatever expires meanwhile: attempt 2 is heartbeated, so not it.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and store.get(job.id).state is not State.SUCCEEDED:
        store.reap_expired(store.now(), 10)
        time.sleep(0.2)
    stored = store.get(job.id)
    assert (stored.state, stored.attempts) == (State.SUCCEEDED, 2), kinds(store, job)


# -- 3. the reaper racing Complete --------------------------------------------------------


def _expire(conn: psycopg.Connection[Any], job: Job) -> None:
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        [job.id],
    )


def test_a_complete_arriving_while_the_reaper_holds_the_row_gets_lease_lost(
    store: Store,
    conn: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    oracle: Oracle,
) -> None:
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    _expire(conn, claimed)
    selected, go = threading.Event(), threading.Event()
    queries = type(store.q)
    select = queries.select_expired_leases

    def paused_select(*args: Any, **kwargs: Any) -> Any:
        rows = select(*args, **kwargs)
        selected.set()  # the reaper holds the row (FOR UPDATE) ...
        assert go.wait(30)  # ... and is parked before its UPDATE
        return rows

    monkeypatch.setattr(queries, "select_expired_leases", paused_select)
    reaper = Background(lambda: store.reap_expired(store.now(), 10), "test-reaper")
    assert selected.wait(30)
    ran: list[bool] = []
    complete = Background(lambda: store.complete(claimed, lambda c: ran.append(True)), "test-cmp")
    wait_until(lambda: waiting_on_lock(conn) == 1, 30, "Complete waits for the reaper's row lock")
    go.set()
    assert reaper.join(30).requeued == [job.id]
    with pytest.raises(LeaseLost):
        complete.join(30)
    assert ran == []
    assert kinds(store, job) == ["enqueued", "claimed", "reaped"]
    assert store.get(job.id).state is State.QUEUED


def test_the_reaper_skips_a_row_being_completed_and_never_rewrites_the_finished_job(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    _expire(conn, claimed)  # expired, but not reaped yet: its owner may still finish it
    inside, go = threading.Event(), threading.Event()

    def commit(c: psycopg.Connection[Any]) -> None:
        inside.set()  # Complete holds the row lock and is parked here
        assert go.wait(30)
        commit_for(claimed)(c)

    complete = Background(lambda: store.complete(claimed, commit), "test-complete")
    assert inside.wait(30)
    result = store.reap_expired(store.now(), 10)  # SKIP LOCKED: the row is Complete's
    assert result.total == 0
    go.set()
    assert complete.join(30).state is State.SUCCEEDED
    finished = store.get(job.id)
    far_future = store.now() + dt.timedelta(days=1)
    assert store.reap_expired(far_future, 10).total == 0
    assert store.get(job.id) == finished  # not a column rewritten
    assert kinds(store, job) == ["enqueued", "claimed", "succeeded"]


def test_a_complete_parked_behind_a_row_lock_still_wins_over_the_reaper(
    store: Store, conn: psycopg.Connection[Any], admin_dsn: str, oracle: Oracle
) -> None:
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    _expire(conn, claimed)
    with parked(admin_dsn, job.id):
        complete = Background(lambda: store.complete(claimed, commit_for(claimed)), "test-cmp")
        wait_until(lambda: waiting_on_lock(conn) == 1, 30, "Complete is parked on the row lock")
        assert store.reap_expired(store.now(), 10).total == 0  # skipped, not blocked
    assert complete.join(30).state is State.SUCCEEDED
    assert store.reap_expired(store.now() + dt.timedelta(days=1), 10).total == 0
    assert kinds(store, job) == ["enqueued", "claimed", "succeeded"]


# -- 16. graceful stop --------------------------------------------------------------------


def _leases_within_ttl(conn: psycopg.Connection[Any]) -> list[Any]:
    """Leases that outlive the TTL from now (none may)."""
    return conn.execute(
        "SELECT id, lease_expires_at - now() FROM jobrun.jobs WHERE state = 'leased'"
        " AND lease_expires_at > now() + %s",
        [TTL + dt.timedelta(milliseconds=500)],
    ).fetchall()


def test_a_grace_period_too_short_leaves_no_job_leased_past_its_ttl(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    stubborn = [
        store.enqueue(
            NewJob(
                type="tx.work",
                payload={"sleep": 60, "sleep_attempts": [1], "honour_cancel": False},
                backoff=QUICK_RETRY,
            )
        )
        for _ in range(2)
    ]
    polite = [
        store.enqueue(
            NewJob(
                type="tx.work", payload={"sleep": 60, "sleep_attempts": [1]}, backoff=QUICK_RETRY
            )
        )
        for _ in range(2)
    ]
    oracle.enqueued(stubborn + polite)
    worker = workers.start(concurrency=4, env={"JOBRUN_SHUTDOWN_GRACE": "1s"})
    wait_until(lambda: started(side_log, 4), 30, "four handlers running")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    assert _leases_within_ttl(conn) == []
    # The handlers that honoured cancellation were failed back to the queue.
    for job in polite:
        assert store.get(job.id).state is State.QUEUED
        assert kinds(store, job)[-1] == "retrying"
    # The abandoned ones (their handlers ignored cancellation) were failed back
    # to the queue by the exiting worker, at once, not when their lease expired,
    # with the attempt they burned kept (it did run).
    for job in stubborn:
        stored = store.get(job.id)
        assert stored.state is State.QUEUED, stored
        assert stored.attempts == 1
        assert "ignored cancellation" in (stored.last_error or "")
        assert kinds(store, job)[-1] == "retrying"
    workers.start(scheduler=True)
    wait_until(lambda: states(conn) == {"succeeded": 4}, 60, "every job finishes elsewhere")
    for job in [*stubborn, *polite]:
        assert store.get(job.id).attempts == 2
    oracle.watch(oracle.default_url, settled=True)


def test_a_coroutine_deaf_to_cancellation_at_shutdown_has_its_job_queued_again_at_once(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    """An async handler that swallows its cancellation is abandoned like a thread:
    its job is failed back to the queue as the process exits, attempt kept."""
    app = ("--app", "tests.faults.async_app:registry")
    job = store.enqueue(NewJob(type="async.deaf", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    worker = workers.start(*app, concurrency=2, env={"JOBRUN_SHUTDOWN_GRACE": "1s"})
    wait_until(lambda: started(side_log, 1), 30, "the coroutine runs")
    worker.signal(signal.SIGTERM)
    assert worker.wait(30) == 0, worker.output()
    stored = store.get(job.id)
    assert stored.state is State.QUEUED, stored
    assert stored.attempts == 1
    assert "ignored cancellation" in (stored.last_error or "")
    workers.start(*app, scheduler=True)
    wait_until(lambda: states(conn) == {"succeeded": 1}, 60, "the job runs again elsewhere")
    assert store.get(job.id).attempts == 2
    oracle.watch(oracle.default_url, settled=True)


def test_a_second_sigterm_stops_at_once_and_the_leases_still_end_within_their_ttl(
    store: Store,
    conn: psycopg.Connection[Any],
    workers: Workers,
    side_log: Any,
    oracle: Oracle,
) -> None:
    jobs = [
        store.enqueue(
            NewJob(
                type="tx.work", payload={"sleep": 60, "sleep_attempts": [1]}, backoff=QUICK_RETRY
            )
        )
        for _ in range(2)
    ]
    oracle.enqueued(jobs)
    worker = workers.start(concurrency=2, env={"JOBRUN_SHUTDOWN_GRACE": "120s"})
    wait_until(lambda: started(side_log, 2), 30, "two handlers running")
    for _ in range(2):
        worker.signal(signal.SIGTERM)
        wait_until(lambda: "stopping gracefully" in worker.output(), 30, "the first signal lands")
    worker.wait(15)  # far less than the jobs' 60 s or the 120 s grace
    assert _leases_within_ttl(conn) == []
    workers.start(scheduler=True)
    wait_until(lambda: states(conn) == {"succeeded": 2}, 60, "both jobs finish elsewhere")
    oracle.watch(oracle.default_url, settled=True)
