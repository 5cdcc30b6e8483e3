"""Store claim, heartbeat, complete, complete_many, fail and reap_expired: leases and fencing."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import (
    CommitRefused,
    DatabaseError,
    LeaseLost,
    OutcomeUnknown,
    ValidationError,
)
from jobrun.job.model import Backoff, EffectKey, Job, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, counts, new_job

OWNER = "worker-a"


def claim_one(store: Store, owner: str = OWNER, ttl: dt.timedelta = TTL) -> Job:
    jobs = store.claim(owner, ["default"], 1, ttl)
    assert len(jobs) == 1
    return jobs[0]


def expire(conn: psycopg.Connection[Any], job_id: uuid.UUID) -> None:
    """Move a lease into the past, as if the worker had stopped heartbeating long ago."""
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [job_id],
    )


@contextlib.contextmanager
def quiet_client(
    call: Callable[[], object], inside: threading.Event, wake: threading.Event
) -> Iterator[list[object]]:
    """Run ``call`` in a thread whose client goes quiet once ``inside`` is set
    (it waits for ``wake``: a frozen worker) and yield, inside, the list that
    gets what ``call`` returned or raised once the block ends and wakes it."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # what the woken client is told
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert inside.wait(10)
        yield outcome
    finally:
        wake.set()
        thread.join(30)


def requeued_within(store: Store, ids: list[uuid.UUID], seconds: float) -> None:
    """Reap until every one of ``ids`` is requeued; fail after ``seconds``."""
    deadline = time.monotonic() + seconds
    reaped: set[uuid.UUID] = set()
    while reaped != set(ids):
        assert time.monotonic() < deadline, f"still held, not reaped: {set(ids) - reaped}"
        reaped.update(store.reap_expired(store.now(), 10).requeued)
        time.sleep(0.1)


def event_kinds(store: Store, job_id: uuid.UUID) -> list[str]:
    return [str(e.kind) for e in store.events(job_id)]


# -- claim ---------------------------------------------------------------------


def test_claim_leases_the_job_and_burns_exactly_one_attempt(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    assert job.state is State.LEASED
    assert job.attempts == 1
    assert job.lease_owner == OWNER
    assert job.lease_token is not None
    assert job.lease_expires_at is not None


def test_claim_lease_expiry_is_the_database_clock_plus_ttl(store: Store, conn: Any) -> None:
    store.enqueue(new_job())
    job = claim_one(store, ttl=dt.timedelta(seconds=45))
    (updated_at,) = conn.execute(
        "SELECT updated_at FROM jobrun.jobs WHERE id = %s", [job.id]
    ).fetchone()
    assert job.lease_expires_at == updated_at + dt.timedelta(seconds=45)


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
def test_claimed_jobs_carry_their_own_backoff_policies(store: Store, limited: bool) -> None:
    # A claim's rows go through JsonbValues, which answers a repeated jsonb
    # text from a cache, and backoff_from_row caches the policies: each job
    # must still get its own, the default or not.
    if limited:
        store.set_queue_limits("default", concurrency=10)
    policies = [
        Backoff(),
        Backoff(kind="constant", base=600.0, jitter=0.0),
        Backoff(kind="linear", base=2.5, factor=3.0, jitter=0.5, max_delay=90.0),
    ]
    jobs = [store.enqueue(new_job(backoff=policies[i % 3], priority=i)) for i in range(9)]
    claimed = {job.id: job for job in store.claim(OWNER, ["default"], 9, TTL)}
    assert {job.id: claimed[job.id].backoff for job in jobs} == {
        job.id: policies[i % 3] for i, job in enumerate(jobs)
    }
    assert all(store.get(job.id).backoff == claimed[job.id].backoff for job in jobs)


def test_claim_returns_at_most_limit_jobs(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(10)])
    assert len(store.claim(OWNER, ["default"], 4, TTL)) == 4
    assert len(store.claim(OWNER, ["default"], 100, TTL)) == 6
    assert store.claim(OWNER, ["default"], 100, TTL) == []


def test_claim_takes_lower_priority_first_then_earlier_run_at(store: Store) -> None:
    now = store.now()
    late = store.enqueue(new_job(priority=0, run_at=now - dt.timedelta(seconds=1)))
    early = store.enqueue(new_job(priority=0, run_at=now - dt.timedelta(seconds=5)))
    urgent = store.enqueue(new_job(priority=-5))
    claimed = store.claim(OWNER, ["default"], 3, TTL)
    assert [j.id for j in claimed] == [urgent.id, early.id, late.id]


def test_claim_skips_jobs_whose_run_at_is_in_the_future(store: Store) -> None:
    store.enqueue(new_job(delay=dt.timedelta(minutes=1)))
    assert store.claim(OWNER, ["default"], 10, TTL) == []


def test_claim_only_reads_the_named_queues(store: Store) -> None:
    store.enqueue(new_job(queue="emails"))
    store.enqueue(new_job(queue="reports"))
    claimed = store.claim(OWNER, ["emails", "other"], 10, TTL)
    assert [j.queue for j in claimed] == ["emails"]


def test_every_claim_gets_a_new_lease_token(store: Store, conn: Any) -> None:
    store.enqueue(new_job())
    first = claim_one(store)
    expire(conn, first.id)
    store.reap_expired(store.now(), 10)
    conn.execute("UPDATE jobrun.jobs SET run_at = now() WHERE id = %s", [first.id])
    second = claim_one(store)
    assert second.id == first.id
    assert second.lease_token != first.lease_token
    assert second.attempts == 2


def test_claim_writes_claimed_events_in_all_mode_and_none_in_terminal_mode(
    store: Store, terminal_store: Store
) -> None:
    a = store.enqueue(new_job(queue="a"))
    b = store.enqueue(new_job(queue="b"))
    store.claim(OWNER, ["a"], 1, TTL)
    terminal_store.claim(OWNER, ["b"], 1, TTL)
    assert event_kinds(store, a.id) == ["enqueued", "claimed"]
    assert event_kinds(store, b.id) == ["enqueued"]


def test_threads_claiming_5000_jobs_process_each_exactly_once(dsn: str) -> None:
    pool = open_pool(dsn, min_size=8, max_size=8)
    try:
        store = Store(pool)
        store.enqueue_batch(new_job() for _ in range(5000))
        seen: Counter[uuid.UUID] = Counter()
        lock = threading.Lock()
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            owner = f"w{n}"
            try:
                while batch := store.claim(owner, ["default"], 10, TTL):
                    result = store.complete_many(batch)
                    assert result.completed == {j.id for j in batch}
                    with lock:
                        seen.update(j.id for j in batch)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == []
        assert len(seen) == 5000
        assert set(seen.values()) == {1}
    finally:
        pool.close()


# -- heartbeat ---------------------------------------------------------------


def test_heartbeat_extends_live_leases_to_until(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    until = store.now() + dt.timedelta(minutes=10)
    assert store.heartbeat(OWNER, [(job.id, job.lease_token)], until) == {job.id}  # type: ignore[list-item]
    assert store.get(job.id).lease_expires_at == until


def test_heartbeat_omits_expired_cancelled_stale_and_foreign_leases(
    store: Store, conn: Any
) -> None:
    store.enqueue_batch([new_job() for _ in range(5)])
    live, expired, cancelled, foreign, stale = store.claim(OWNER, ["default"], 5, TTL)
    expire(conn, expired.id)
    store.cancel(cancelled.id)
    conn.execute("UPDATE jobrun.jobs SET lease_owner = 'someone-else' WHERE id = %s", [foreign.id])
    leases = [(j.id, j.lease_token) for j in (live, expired, cancelled, foreign)]
    leases.append((stale.id, uuid.uuid4()))
    kept = store.heartbeat(OWNER, leases, store.now() + TTL)  # type: ignore[arg-type]
    assert kept == {live.id}
    # the expired lease was not extended
    assert store.get(expired.id).lease_expires_at < store.now()  # type: ignore[operator]


def test_heartbeat_with_nothing_to_extend_is_a_no_op(store: Store) -> None:
    assert store.heartbeat(OWNER, [], store.now()) == set()


def test_heartbeats_are_hot_updates(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job() for _ in range(50)])
    jobs = store.claim(OWNER, ["default"], 50, TTL)
    conn.execute("SELECT pg_stat_force_next_flush()") if _has_force_flush(conn) else None
    for _ in range(20):
        store.heartbeat(OWNER, [(j.id, j.lease_token) for j in jobs], store.now() + TTL)  # type: ignore[misc]
    hot = _hot_ratio(conn)
    assert hot > 0.5, f"only {hot:.0%} of updates were HOT"


def _has_force_flush(conn: Any) -> bool:
    return bool(conn.info.server_version >= 150000)


def _hot_ratio(conn: Any) -> float:
    deadline = time.monotonic() + 10
    while True:
        if _has_force_flush(conn):
            conn.execute("SELECT pg_stat_force_next_flush()")
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'"
        ).fetchone()
        if row[0] >= 1000 or time.monotonic() > deadline:
            return float(row[1]) / max(row[0], 1)
        time.sleep(0.2)


# -- complete ----------------------------------------------------------------


def test_complete_marks_succeeded_clears_the_lease_and_writes_the_effect_row(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    done = store.complete(job)
    assert done.state is State.SUCCEEDED
    assert done.lease_owner is None and done.lease_token is None and done.lease_expires_at is None
    assert done.finished_at is not None
    assert store.effect_done(job)
    assert event_kinds(store, job.id)[-1] == "succeeded"


def test_complete_runs_the_commit_callable_inside_the_transaction_after_the_effect_row(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid, effect_rows int)")
    store.enqueue(new_job())
    job = claim_one(store)
    key = EffectKey.of(job)

    def commit(c: psycopg.Connection[Any]) -> None:
        (n,) = c.execute(
            "SELECT count(*) FROM jobrun.processed_effects WHERE scope = %s AND key = %s",
            [key.scope, key.key],
        ).fetchone()
        c.execute("INSERT INTO side VALUES (%s, %s)", [job.id, n])

    store.complete(job, commit)
    assert conn.execute("SELECT job_id, effect_rows FROM side").fetchall() == [(job.id, 1)]


def test_a_stale_owners_complete_after_the_reaper_requeued_raises_lease_lost_and_rolls_back(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (x int)")
    store.enqueue(new_job())
    job = claim_one(store)
    expire(conn, job.id)
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    ran: list[bool] = []

    def commit(c: psycopg.Connection[Any]) -> None:
        ran.append(True)
        c.execute("INSERT INTO side VALUES (1)")

    with pytest.raises(LeaseLost):
        store.complete(job, commit)
    assert ran == []
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (0,)
    assert store.get(job.id).state is State.QUEUED
    assert not store.effect_done(job)


def test_a_stale_claim_cannot_finish_a_later_claim_by_the_same_worker(
    store: Store, conn: Any
) -> None:
    store.enqueue(new_job(backoff=Backoff(base=0.0, jitter=0.0)))
    old = claim_one(store)
    expire(conn, old.id)
    store.reap_expired(store.now(), 10)
    new = claim_one(store)  # same owner, same job: only the token differs
    assert (new.id, new.lease_owner) == (old.id, old.lease_owner)
    with pytest.raises(LeaseLost):
        store.complete(old)
    with pytest.raises(LeaseLost):
        store.fail(old, "boom", None)
    assert store.heartbeat(OWNER, [(old.id, old.lease_token)], store.now() + TTL) == set()  # type: ignore[list-item]
    after = store.get(new.id)
    assert after.state is State.LEASED and after.lease_token == new.lease_token
    assert store.complete(new).state is State.SUCCEEDED


def test_complete_skips_the_commit_callable_when_the_effect_already_committed(store: Store) -> None:
    store.enqueue(new_job(idempotency_key="once"))
    job = claim_one(store)
    calls: list[int] = []
    store.complete(job, lambda c: calls.append(1))
    store.retry(job.id)
    again = claim_one(store)
    done = store.complete(again, lambda c: calls.append(2))
    assert calls == [1]
    assert done.state is State.SUCCEEDED
    assert store.events(job.id)[-1].detail == {"effect": "already_applied"}


def test_a_failing_commit_callable_rolls_everything_back_and_reraises(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (x int)")
    store.enqueue(new_job())
    job = claim_one(store)

    def commit(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO side VALUES (1)")
        raise RuntimeError("handler bug")

    with pytest.raises(RuntimeError, match="handler bug"):
        store.complete(job, commit)
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (0,)
    assert not store.effect_done(job)
    assert store.get(job.id).state is State.LEASED
    assert store.complete(job).state is State.SUCCEEDED


@pytest.mark.parametrize("how", ["method", "sql_commit", "sql_rollback"])
def test_a_commit_callable_that_ends_the_transaction_is_refused(
    store: Store, conn: Any, how: str
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)

    def commit(c: psycopg.Connection[Any]) -> None:
        if how == "method":
            c.commit()
        elif how == "sql_commit":
            c.execute("COMMIT")
        else:
            c.execute("ROLLBACK")

    with pytest.raises(CommitRefused):
        store.complete(job, commit)
    assert store.get(job.id).state is State.LEASED


def test_commit_timeout_rolls_back_and_does_not_leak_to_the_pooled_connection(
    dsn: str, conn: Any
) -> None:
    pool = open_pool(dsn, min_size=1, max_size=1)
    try:
        store = Store(pool, commit_timeout=dt.timedelta(milliseconds=200))
        conn.execute("CREATE TABLE side (x int)")
        with pool.connection() as c:
            (default,) = c.execute("SHOW statement_timeout").fetchone()
        store.enqueue(new_job())
        job = store.claim(OWNER, ["default"], 1, TTL)[0]
        with pytest.raises(DatabaseError, match="cancel"):
            store.complete(job, lambda c: c.execute("INSERT INTO side SELECT 1 FROM pg_sleep(2)"))
        with pool.connection() as c:
            assert c.execute("SHOW statement_timeout").fetchone() == (default,)
            assert c.execute("SELECT count(*) FROM side").fetchone() == (0,)
        assert store.complete(job).state is State.SUCCEEDED
        with pool.connection() as c:
            assert c.execute("SHOW statement_timeout").fetchone() == (default,)
    finally:
        pool.close()


def test_cancel_wins_over_complete_without_running_the_callable_or_writing_the_effect(
    store: Store,
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.cancel(job.id)
    calls: list[int] = []
    done = store.complete(job, lambda c: calls.append(1))
    assert done.state is State.CANCELLED
    assert calls == []
    assert not store.effect_done(job)
    assert event_kinds(store, job.id)[-2:] == ["cancel_requested", "cancelled"]
    assert store.events(job.id)[-1].detail == {"via": "complete"}


def test_complete_of_an_unclaimed_job_is_a_validation_error(store: Store) -> None:
    job = store.enqueue(new_job())
    with pytest.raises(ValidationError):
        store.complete(job)


# -- complete_many -----------------------------------------------------------


def test_complete_many_returns_completed_cancelled_and_lease_lost(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job() for _ in range(4)])
    ok1, ok2, cancelled, lost = store.claim(OWNER, ["default"], 4, TTL)
    store.cancel(cancelled.id)
    expire(conn, lost.id)
    store.reap_expired(store.now(), 10)
    result = store.complete_many([ok1, ok2, cancelled, lost])
    assert result.completed == {ok1.id, ok2.id}
    assert result.cancelled == {cancelled.id}
    assert result.lease_lost == {lost.id}
    assert store.get(ok1.id).state is State.SUCCEEDED
    assert store.get(cancelled.id).state is State.CANCELLED
    assert store.get(lost.id).state is State.QUEUED
    assert store.effect_done(ok1) and not store.effect_done(cancelled)
    assert event_kinds(store, ok2.id)[-1] == "succeeded"
    assert event_kinds(store, cancelled.id)[-1] == "cancelled"


def test_complete_many_with_nothing_is_a_no_op(store: Store) -> None:
    result = store.complete_many([])
    assert not (result.completed or result.cancelled or result.lease_lost)


# -- fail --------------------------------------------------------------------


def test_fail_queues_the_job_again_at_retry_at_and_stores_the_error(store: Store) -> None:
    store.enqueue(new_job(max_attempts=3))
    job = claim_one(store)
    retry_at = store.now() + dt.timedelta(minutes=3)
    failed = store.fail(job, "boom", retry_at)
    assert failed.state is State.QUEUED
    assert failed.run_at == retry_at
    assert failed.last_error == "boom"
    assert failed.lease_owner is None and failed.lease_token is None
    assert failed.finished_at is None
    assert event_kinds(store, job.id)[-1] == "retrying"


def test_fail_with_no_attempts_left_is_dead(store: Store) -> None:
    store.enqueue(new_job(max_attempts=1))
    job = claim_one(store)
    failed = store.fail(job, "boom", store.now())
    assert failed.state is State.DEAD
    assert failed.finished_at is not None
    assert event_kinds(store, job.id)[-1] == "dead"


def test_a_permanent_failure_is_dead_whatever_attempts_remain(store: Store) -> None:
    store.enqueue(new_job(max_attempts=10))
    job = claim_one(store)
    assert store.fail(job, "bad input", None, permanent=True).state is State.DEAD


def test_cancel_wins_over_fail(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.cancel(job.id)
    assert store.fail(job, "boom", store.now()).state is State.CANCELLED
    assert event_kinds(store, job.id)[-1] == "cancelled"


def test_fail_truncates_and_cleans_the_error_text(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    failed = store.fail(job, "x\x00y" + "z" * 100_000, None)
    assert failed.last_error is not None
    assert "\x00" not in failed.last_error and len(failed.last_error) <= 8192


def test_fail_records_an_error_text_with_lone_surrogates_escaped(store: Store) -> None:
    """A handler's exception message may carry anything; the failure is always recorded."""

    class Sly(str):
        def __str__(self) -> str:
            return "harmless"

    store.enqueue(new_job())
    job = claim_one(store)
    failed = store.fail(job, Sly("boom \ud800 and \udcff\x00!"), None)
    assert failed.last_error == "boom \\ud800 and \\udcff\\0!"
    assert store.events(job.id)[-1].detail["error"] == failed.last_error  # type: ignore[index]


def test_fail_without_retry_at_retries_at_database_now(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    failed = store.fail(job, "boom", None)
    assert failed.run_at == failed.updated_at


def test_terminal_mode_records_only_the_terminal_failure(terminal_store: Store) -> None:
    terminal_store.enqueue_batch([new_job(max_attempts=2)])
    job = terminal_store.claim(OWNER, ["default"], 1, TTL)[0]
    terminal_store.fail(job, "first", None)
    job = terminal_store.claim(OWNER, ["default"], 1, TTL)[0]
    terminal_store.fail(job, "second", None)
    assert event_kinds(terminal_store, job.id) == ["dead"]


# -- reap_expired ------------------------------------------------------------


def test_reap_requeues_with_the_jobs_own_backoff(store: Store, conn: Any) -> None:
    store.enqueue(new_job(backoff=Backoff(kind="constant", base=120.0, jitter=0.0)))
    job = claim_one(store)
    expire(conn, job.id)
    now = store.now()
    result = store.reap_expired(now, 10)
    assert result.requeued == [job.id] and result.total == 1
    after = store.get(job.id)
    assert after.state is State.QUEUED
    assert after.run_at == now + dt.timedelta(seconds=120)
    assert after.attempts == 1  # the attempt the crashed worker burned stays burned
    assert after.lease_owner is None
    events = store.events(job.id)
    assert events[-1].kind == "reaped"
    assert events[-1].detail == {"verdict": "queued", "owner": OWNER}


def test_reap_kills_jobs_without_attempts_left_and_cancels_cancel_requested(
    store: Store, conn: Any
) -> None:
    store.enqueue(new_job(queue="a", max_attempts=1))
    store.enqueue(new_job(queue="b"))
    dead = store.claim(OWNER, ["a"], 1, TTL)[0]
    cancelled = store.claim(OWNER, ["b"], 1, TTL)[0]
    store.cancel(cancelled.id)
    expire(conn, dead.id)
    expire(conn, cancelled.id)
    result = store.reap_expired(store.now(), 10)
    assert result.dead == [dead.id] and result.cancelled == [cancelled.id]
    assert store.get(dead.id).state is State.DEAD
    assert store.get(cancelled.id).state is State.CANCELLED
    assert event_kinds(store, dead.id)[-2:] == ["reaped", "dead"]


def test_reap_leaves_live_leases_alone(store: Store) -> None:
    store.enqueue(new_job())
    claim_one(store)
    assert store.reap_expired(store.now(), 10).total == 0


def test_reap_handles_at_most_limit_jobs_per_call(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job() for _ in range(5)])
    for job in store.claim(OWNER, ["default"], 5, TTL):
        expire(conn, job.id)
    now = store.now()
    assert store.reap_expired(now, 2).total == 2
    assert store.reap_expired(now, 2).total == 2
    assert store.reap_expired(now, 2).total == 1
    assert store.reap_expired(now, 2).total == 0


def test_the_reaper_never_rewrites_a_job_that_finished_in_between(
    store: Store, conn: Any, dsn: str
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    expire(conn, job.id)
    with psycopg.connect(dsn) as completer:
        # A complete in flight: it holds the row lock and has finished the job.
        completer.execute(
            "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL, "
            "lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
            [job.id],
        )
        assert store.reap_expired(store.now(), 10).total == 0
        completer.commit()
    assert store.reap_expired(store.now(), 10).total == 0
    assert store.get(job.id).state is State.SUCCEEDED
    assert "reaped" not in event_kinds(store, job.id)


def test_reap_in_terminal_mode_records_only_terminal_verdicts(
    terminal_store: Store, conn: Any
) -> None:
    terminal_store.enqueue(new_job(queue="a", max_attempts=1))
    terminal_store.enqueue(new_job(queue="b"))
    dead = terminal_store.claim(OWNER, ["a"], 1, TTL)[0]
    requeued = terminal_store.claim(OWNER, ["b"], 1, TTL)[0]
    expire(conn, dead.id)
    expire(conn, requeued.id)
    terminal_store.reap_expired(terminal_store.now(), 10)
    assert event_kinds(terminal_store, dead.id) == ["dead"]
    assert event_kinds(terminal_store, requeued.id) == []


def test_nothing_is_written_by_rejected_lease_calls(store: Store, conn: Any) -> None:
    store.enqueue(new_job())
    before = counts(conn)
    naive = dt.datetime(2030, 1, 1)  # noqa: DTZ001
    with pytest.raises(ValidationError):
        store.claim(OWNER, ["default"], 0, TTL)
    with pytest.raises(ValidationError):
        store.claim(OWNER, ["default"], 1_000_000, TTL)
    with pytest.raises(ValidationError):
        store.claim(OWNER, ["default"], 1, dt.timedelta(0))
    with pytest.raises(ValidationError):
        store.claim(OWNER, ["Bad Queue"], 1, TTL)
    with pytest.raises(ValidationError):
        store.claim(OWNER, "default", 1, TTL)
    with pytest.raises(ValidationError):
        store.heartbeat(OWNER, [], naive)
    with pytest.raises(ValidationError):
        store.reap_expired(naive, 10)
    job = claim_one(store)
    with pytest.raises(ValidationError):
        store.fail(job, "x", naive)
    assert counts(conn)[0] == before[0]


def test_a_complete_retried_after_it_committed_answers_success_without_rerunning(
    store: Store, conn: Any
) -> None:
    """The COMMIT reply was lost: the caller retries with the same claim."""
    conn.execute("CREATE TABLE side (x int)")
    store.enqueue(new_job())
    job = claim_one(store)
    calls: list[int] = []

    def commit(c: psycopg.Connection[Any]) -> None:
        calls.append(1)
        c.execute("INSERT INTO side VALUES (1)")

    first = store.complete(job, commit)
    again = store.complete(job, commit)
    assert again.state is State.SUCCEEDED and again.id == first.id
    assert calls == [1]
    assert conn.execute("SELECT count(*) FROM side").fetchone() == (1,)
    assert event_kinds(store, job.id).count("succeeded") == 1


def test_a_complete_after_the_job_was_reaped_and_finished_by_another_claim_is_lease_lost(
    store: Store, conn: Any
) -> None:
    store.enqueue(new_job(backoff=Backoff(base=0.0, jitter=0.0)))
    old = claim_one(store)
    expire(conn, old.id)
    store.reap_expired(store.now(), 10)
    new = claim_one(store, owner="worker-b")
    store.complete(new)
    with pytest.raises(LeaseLost):
        store.complete(old)


def test_complete_returns_the_job_as_stored(store: Store) -> None:
    store.enqueue_batch([new_job(), new_job()])
    plain, cancelled = store.claim(OWNER, ["default"], 2, TTL)
    store.cancel(cancelled.id)
    assert store.complete(plain, lambda c: None) == store.get(plain.id)
    assert store.complete(cancelled) == store.get(cancelled.id)


# -- complete_many_tx: the transactional path, batched ------------------------


def _side(conn: Any) -> list[Any]:
    return [r[0] for r in conn.execute("SELECT job_id FROM side ORDER BY job_id").fetchall()]


def _writer(job: Job) -> Any:
    return lambda c: c.execute("INSERT INTO side VALUES (%s)", [job.id])


def test_complete_many_tx_runs_each_callable_once_in_one_transaction(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    store.enqueue_batch([new_job() for _ in range(5)])
    ok1, ok2, plain, cancelled, lost = store.claim(OWNER, ["default"], 5, TTL)
    store.cancel(cancelled.id)
    expire(conn, lost.id)
    store.reap_expired(store.now(), 10)
    items = [
        (ok1, _writer(ok1)),
        (ok2, _writer(ok2)),
        (plain, None),
        (cancelled, _writer(cancelled)),
        (lost, _writer(lost)),
    ]
    result = store.complete_many_tx(items)
    assert result.completed == {ok1.id, ok2.id, plain.id}
    assert result.cancelled == {cancelled.id} and result.lease_lost == {lost.id}
    assert not result.failed
    assert sorted(_side(conn)) == sorted([ok1.id, ok2.id])
    assert store.get(ok1.id).state is State.SUCCEEDED
    assert store.get(cancelled.id).state is State.CANCELLED
    assert not store.effect_done(cancelled)
    assert store.events(ok1.id)[-1].detail == {"effect": "applied"}
    # The same batch again (its COMMIT reply lost): nothing runs twice.
    again = store.complete_many_tx(items)
    assert again.completed == {ok1.id, ok2.id, plain.id}
    assert len(_side(conn)) == 2


def test_one_failing_callable_rolls_the_batch_back_and_the_others_complete_alone(
    store: Store, conn: Any
) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    store.enqueue_batch([new_job() for _ in range(3)])
    a, bad, c = store.claim(OWNER, ["default"], 3, TTL)

    def boom(cx: Any) -> None:
        cx.execute("INSERT INTO side VALUES (%s)", [bad.id])
        raise RuntimeError("handler bug")

    result = store.complete_many_tx([(a, _writer(a)), (bad, boom), (c, _writer(c))])
    assert result.completed == {a.id, c.id}
    assert set(result.failed) == {bad.id}
    assert isinstance(result.failed[bad.id], RuntimeError)
    assert sorted(_side(conn)) == sorted([a.id, c.id])
    assert store.get(bad.id).state is State.LEASED
    assert not store.effect_done(bad)


def test_a_callable_ending_the_batch_transaction_is_refused_alone(store: Store, conn: Any) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    store.enqueue_batch([new_job() for _ in range(2)])
    a, rude = store.claim(OWNER, ["default"], 2, TTL)
    result = store.complete_many_tx([(a, _writer(a)), (rude, lambda cx: cx.execute("ROLLBACK"))])
    assert result.completed == {a.id}
    assert isinstance(result.failed[rude.id], CommitRefused)
    assert _side(conn) == [a.id]


def test_jobs_sharing_an_effect_key_in_one_batch_run_one_callable(store: Store, conn: Any) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    store.enqueue(new_job(queue="a", idempotency_key="k"))
    store.enqueue(new_job(queue="b", idempotency_key="k"))
    first = store.claim(OWNER, ["a"], 1, TTL)[0]
    second = store.claim(OWNER, ["b"], 1, TTL)[0]
    result = store.complete_many_tx([(first, _writer(first)), (second, _writer(second))])
    assert result.completed == {first.id, second.id}
    assert len(_side(conn)) == 1


def test_complete_many_tx_refuses_mixed_owners_and_duplicates(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(2)])
    a = store.claim("one", ["default"], 1, TTL)[0]
    b = store.claim("two", ["default"], 1, TTL)[0]
    with pytest.raises(ValidationError):
        store.complete_many_tx([(a, None), (b, None)])
    with pytest.raises(ValidationError):
        store.complete_many_tx([(a, None), (a, None)])
    assert not store.complete_many_tx([]).completed


def test_a_heartbeat_skips_a_row_another_transaction_holds_and_still_keeps_it(
    store: Store, dsn: str
) -> None:
    store.enqueue_batch([new_job(), new_job()])
    held, free = store.claim(OWNER, ["default"], 2, TTL)
    until = store.now() + dt.timedelta(minutes=10)
    result: list[set[uuid.UUID]] = []
    leases = [(held.id, held.lease_token), (free.id, free.lease_token)]
    with psycopg.connect(dsn) as other:
        other.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s FOR UPDATE", [held.id])
        beat = threading.Thread(
            target=lambda: result.append(store.heartbeat(OWNER, leases, until))  # type: ignore[arg-type]
        )
        beat.start()
        beat.join(60)
        assert not beat.is_alive()  # it finished while the row was still held
        assert result == [{held.id, free.id}]
        other.rollback()
    assert store.get(free.id).lease_expires_at == until
    assert store.get(held.id).lease_expires_at == held.lease_expires_at


# -- the "already done" answer belongs to the claim that finished the job ------


def _stale_claim_after_a_retry_cycle(store: Store, conn: Any) -> tuple[Job, Job]:
    """w1's claim expires and is reaped dead; an operator retries the job
    (attempts back to 0); w2 claims it at the same attempt count as w1.
    Returns (w1's stale claim, w2's live claim)."""
    store.enqueue(new_job(max_attempts=1))
    stale = claim_one(store, owner="w1")
    expire(conn, stale.id)
    assert store.reap_expired(store.now(), 10).dead == [stale.id]
    store.retry(stale.id)
    live = claim_one(store, owner="w2")
    assert live.attempts == stale.attempts == 1
    return stale, live


def test_a_stale_complete_after_a_retry_cycle_is_lease_lost_not_success(
    store: Store, conn: Any
) -> None:
    stale, live = _stale_claim_after_a_retry_cycle(store, conn)
    store.complete(live)
    with pytest.raises(LeaseLost):
        store.complete(stale)
    with pytest.raises(LeaseLost):
        store.complete(stale, lambda c: None)


def test_a_stale_complete_many_after_a_retry_cycle_reports_the_lease_lost(
    store: Store, conn: Any
) -> None:
    stale, live = _stale_claim_after_a_retry_cycle(store, conn)
    store.complete_many([live])
    result = store.complete_many([stale])
    assert result.lease_lost == {stale.id} and not result.completed


def test_a_stale_complete_many_tx_after_a_retry_cycle_reports_the_lease_lost(
    store: Store, conn: Any
) -> None:
    stale, live = _stale_claim_after_a_retry_cycle(store, conn)
    store.complete_many_tx([(live, lambda c: None)])
    calls: list[int] = []
    result = store.complete_many_tx([(stale, lambda c: calls.append(1))])
    assert result.lease_lost == {stale.id} and not result.completed
    assert calls == []


def test_complete_many_retried_by_the_same_claim_reports_completed_and_cancelled(
    store: Store, conn: Any
) -> None:
    """The COMMIT reply of a batch was lost: the same claims ask again."""
    store.enqueue_batch([new_job(), new_job()])
    done, cancelled = store.claim(OWNER, ["default"], 2, TTL)
    store.cancel(cancelled.id)
    first = store.complete_many([done, cancelled])
    before = counts(conn)
    again = store.complete_many([done, cancelled])
    assert again == first
    assert again.completed == {done.id} and again.cancelled == {cancelled.id}
    assert counts(conn) == before


def test_complete_many_tx_retried_by_the_same_claim_reports_completed_without_rerunning(
    store: Store, conn: Any
) -> None:
    store.enqueue_batch([new_job(), new_job()])
    done, cancelled = store.claim(OWNER, ["default"], 2, TTL)
    store.cancel(cancelled.id)
    calls: list[uuid.UUID] = []
    items = [(j, lambda c, j=j: calls.append(j.id)) for j in (done, cancelled)]
    first = store.complete_many_tx(items)
    again = store.complete_many_tx(items)
    assert again.completed == first.completed == {done.id}
    assert again.cancelled == first.cancelled == {cancelled.id}
    assert calls == [done.id]


def test_a_retried_complete_of_a_cancelled_job_answers_cancelled_for_the_same_claim(
    store: Store,
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.cancel(job.id)
    assert store.complete(job).state is State.CANCELLED
    assert store.complete(job).state is State.CANCELLED


def test_the_finishing_claim_is_forgotten_when_the_job_is_retried(store: Store, conn: Any) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.complete(job)
    store.retry(job.id)
    assert conn.execute(
        "SELECT finished_token FROM jobrun.jobs WHERE id = %s", [job.id]
    ).fetchone() == (None,)
    with pytest.raises(LeaseLost):
        store.complete(job)


# -- a lease only moves forward ------------------------------------------------


def test_heartbeat_never_moves_a_lease_backwards(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store, ttl=dt.timedelta(minutes=10))
    assert job.lease_expires_at is not None and job.lease_token is not None
    kept = store.heartbeat(OWNER, [(job.id, job.lease_token)], store.now())
    assert kept == {job.id}
    assert store.get(job.id).lease_expires_at == job.lease_expires_at
    later = job.lease_expires_at + dt.timedelta(minutes=5)
    assert store.heartbeat(OWNER, [(job.id, job.lease_token)], later) == {job.id}
    assert store.get(job.id).lease_expires_at == later


# -- commit_timeout bounds the whole Complete ------------------------------------


@pytest.mark.parametrize("batched", [False, True], ids=["complete", "complete_many_tx"])
def test_commit_timeout_bounds_the_wait_for_the_job_rows_lock(
    make_store: Any, admin_dsn: str, batched: bool
) -> None:
    """Another transaction holds the job's row lock for 30 s; Complete gives up
    after commit_timeout (0.5 s) instead of waiting for it, and changes nothing."""
    store = make_store(commit_timeout=dt.timedelta(milliseconds=500))
    store.enqueue(new_job())
    job = claim_one(store)
    with psycopg.connect(admin_dsn) as holder:
        holder.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s FOR UPDATE", [job.id])
        holder.execute("SET statement_timeout = '60s'")
        started = time.monotonic()
        if batched:
            # A batch that fails is completed one by one; each try is bounded.
            result = store.complete_many_tx([(job, lambda c: None)])
            assert isinstance(result.failed[job.id], DatabaseError)
            assert "cancel" in str(result.failed[job.id])
        else:
            with pytest.raises(DatabaseError, match="cancel"):
                store.complete(job, lambda c: None)
        waited = time.monotonic() - started
        holder.rollback()
    assert waited < 15, f"Complete waited {waited:.1f} s for a row lock"
    assert store.get(job.id).state is State.LEASED


@pytest.mark.parametrize("batched", [False, True], ids=["complete", "complete_many_tx"])
def test_a_complete_whose_client_stops_talking_lets_go_of_the_job_within_commit_timeout(
    make_store: Any, batched: bool
) -> None:
    """The client of a Complete goes quiet inside its commit callable (a frozen
    worker: SIGSTOP, a VM pause) while holding the job's row lock. The server
    ends that transaction after commit_timeout (0.5 s) of silence, so the job's
    expired lease is reaped and the job runs again; the frozen Complete, when
    it wakes, finishes nothing. (No call_timeout: the client-side watchdog
    would close the connection itself, and a frozen process's watchdog is
    frozen with it.)"""
    store = make_store(commit_timeout=dt.timedelta(milliseconds=500), call_timeout=None)
    store.enqueue(new_job())
    job = claim_one(store, ttl=dt.timedelta(seconds=1))
    inside, wake = threading.Event(), threading.Event()

    def frozen(c: Any) -> None:
        c.execute("SELECT 1")
        inside.set()
        wake.wait(30)

    def complete() -> object:
        if batched:
            return store.complete_many_tx([(job, frozen)])
        return store.complete(job, frozen)

    with quiet_client(complete, inside, wake) as outcome:
        requeued_within(store, [job.id], 15)
    assert store.get(job.id).state is State.QUEUED
    assert not store.effect_done(job)
    (woken,) = outcome  # its COMMIT met a session the server had ended
    assert isinstance(woken, OutcomeUnknown), woken
