"""Store load_steps, record_step, transaction_step, issue_fencing_token: durable
steps and fencing tokens, fenced by the claim (migration 0015)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import CommitRefused, LeaseLost, ValidationError
from jobrun.job.model import Backoff, Job
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job

NOW = Backoff(base=0.0, jitter=0.0)


def claim_one(store: Store, owner: str = "w1") -> Job:
    (job,) = store.claim(owner, ["default"], 1, TTL)
    return job


def expire_and_reap(store: Store, conn: psycopg.Connection[Any], job: Job) -> None:
    """The claim's lease runs out and the reaper queues the job again."""
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [job.id],
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]


def step_rows(conn: psycopg.Connection[Any]) -> list[tuple[str, int, Any]]:
    return conn.execute(
        "SELECT name, attempt, result FROM jobrun.job_steps ORDER BY name"
    ).fetchall()


def test_a_recorded_step_is_loaded_by_the_next_claim_with_its_value_as_stored(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    assert store.load_steps(job) == {}
    first = store.record_step(job, "fetch", {"rows": [1, 2.5, "x"], "big": 1e20})
    nothing = store.record_step(job, "none", None)
    # As jsonb gives it back: 1e20 is a number jsonb returns as an int.
    assert first.value == {"rows": [1, 2.5, "x"], "big": 100000000000000000000}
    assert first.attempt == 1 and nothing.value is None
    store.fail(job, "boom", retry_at=store.now())
    again = claim_one(store)
    loaded = store.load_steps(again)
    assert loaded == {"fetch": first, "none": nothing}
    assert [(n, a) for n, a, _ in step_rows(conn)] == [("fetch", 1), ("none", 1)]


def test_a_stale_claim_cannot_record_a_step(store: Store, conn: psycopg.Connection[Any]) -> None:
    store.enqueue(new_job(backoff=NOW))
    stale = claim_one(store, "w1")
    expire_and_reap(store, conn, stale)
    fresh = claim_one(store, "w1")  # the same worker again: only the token tells them apart
    with pytest.raises(LeaseLost):
        store.record_step(stale, "charge", {"ok": True})
    ran: list[bool] = []
    with pytest.raises(LeaseLost):
        store.transaction_step(stale, "write", lambda c: ran.append(True))
    assert ran == [] and step_rows(conn) == []
    store.record_step(fresh, "charge", {"ok": False})
    assert step_rows(conn) == [("charge", 2, {"ok": False})]


def test_a_transaction_steps_writes_and_checkpoint_commit_together_or_not_at_all(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    conn.execute("CREATE TABLE public.side (x int)")
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)

    def failing(c: psycopg.Connection[Any]) -> None:
        c.execute("INSERT INTO public.side VALUES (1)")
        raise RuntimeError("after the write")

    with pytest.raises(RuntimeError):
        store.transaction_step(job, "write", failing)
    assert conn.execute("SELECT count(*) FROM public.side").fetchone() == (0,)
    assert step_rows(conn) == []

    def unstorable(c: psycopg.Connection[Any]) -> object:
        c.execute("INSERT INTO public.side VALUES (2)")
        return {1, 2}

    with pytest.raises(ValidationError, match="step 'write'"):
        store.transaction_step(job, "write", unstorable)
    assert conn.execute("SELECT count(*) FROM public.side").fetchone() == (0,)

    def good(c: psycopg.Connection[Any]) -> int:
        c.execute("INSERT INTO public.side VALUES (3)")
        return 3

    assert store.transaction_step(job, "write", good).value == 3
    assert conn.execute("SELECT x FROM public.side").fetchall() == [(3,)]
    assert step_rows(conn) == [("write", 1, 3)]


def test_a_transaction_step_may_not_end_its_transaction(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    with pytest.raises(CommitRefused, match="step 'sneaky'"):
        store.transaction_step(job, "sneaky", lambda c: c.execute("COMMIT"))
    assert step_rows(conn) == []


def test_a_transaction_step_holds_the_job_so_the_reaper_waits_for_its_commit(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    job = claim_one(store)
    conn.execute(  # the lease runs out while the step is in flight
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [job.id],
    )
    inside, release = threading.Event(), threading.Event()

    def slow(c: psycopg.Connection[Any]) -> str:
        inside.set()
        release.wait(5)
        return "done"

    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(store.transaction_step(job, "s", slow)))
    t.start()
    assert inside.wait(5)
    reaped = store.reap_expired(store.now(), 10)
    assert reaped.requeued == []  # the held row is skipped: not taken from under the step
    release.set()
    t.join(5)
    assert result[0].value == "done"
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    assert step_rows(conn) == [("s", 1, "done")]


def test_the_fencing_token_of_a_later_claim_is_greater_across_a_lease_expiry(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    first = claim_one(store, "w1")
    token1 = store.issue_fencing_token(first)
    assert token1 >= 1
    expire_and_reap(store, conn, first)
    second = claim_one(store, "w1")
    token2 = store.issue_fencing_token(second)
    assert token2 > token1
    with pytest.raises(LeaseLost):
        store.issue_fencing_token(first)  # the stale claim gets none
    # A release gives the attempt back (attempts do not increase): the token still does.
    store.release(second, dt.timedelta(0), "snoozing", snooze=True)
    third = claim_one(store, "w2")
    assert third.attempts == second.attempts
    assert store.issue_fencing_token(third) > token2


def test_the_fencing_token_is_not_issued_to_an_unclaimed_job(store: Store) -> None:
    job = store.enqueue(new_job())
    with pytest.raises(ValidationError, match="no lease"):
        store.issue_fencing_token(job)


def test_purging_a_job_removes_its_steps_and_fence(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.record_step(job, "a", 1)
    store.issue_fencing_token(job)
    store.complete(job)
    time.sleep(0.01)
    assert store.purge(dt.timedelta(0), 100) == 1
    assert step_rows(conn) == []
    assert conn.execute("SELECT count(*) FROM jobrun.job_fences").fetchone() == (0,)


@pytest.mark.parametrize("name", ["", "x" * 201, "a\x00b", 7, None])
def test_a_bad_step_name_is_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any], name: Any
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    with pytest.raises(ValidationError, match="step"):
        store.record_step(job, name, 1)
    assert step_rows(conn) == []


def test_a_step_value_that_json_cannot_hold_is_refused_naming_the_step(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    with pytest.raises(ValidationError, match="step 'fetch' returned a value that cannot"):
        store.record_step(job, "fetch", object())
    assert step_rows(conn) == []


def test_an_operators_retry_keeps_the_steps_and_the_token_still_grows(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(new_job(backoff=NOW))
    first = claim_one(store)
    store.record_step(first, "download", [1, 2])
    token1 = store.issue_fencing_token(first)
    store.fail(first, "dead at once", None, permanent=True)
    store.retry(first.id)  # attempts start again from 0: the token does not
    again = claim_one(store)
    assert again.attempts == 1
    assert store.load_steps(again) == {"download": store.load_steps(first)["download"]}
    assert store.issue_fencing_token(again) > token1
