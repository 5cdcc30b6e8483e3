"""A pipelined worker's round trip: complete, start and claim in one transaction.

``Store.exchange`` sends what a round has (successes to record, buffered
jobs to start, a claim) as one transaction; ``Store.unclaim`` gives a
stopping worker's unstarted buffer back. The round's completions are as
durable as ``complete_many``'s, its claim as cheap as a claim alone.
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Any

import pytest

from jobrun.job.errors import OutcomeUnknown, TransientError, ValidationError
from jobrun.job.model import State
from jobrun.postgres.exchange import TRANSACTION_TIMEOUT_SINCE
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job
from tests.postgres.test_store_leases import OWNER, expire, quiet_client, requeued_within


def test_one_round_completes_starts_and_claims(store: Store) -> None:
    store.enqueue_batch([new_job(priority=p) for p in range(6)])
    first = store.claim(OWNER, ["default"], 3, TTL, start=1)
    done, waiting = first[0], first[1:]
    got = store.exchange(
        OWNER, complete=[done], start=waiting, queues=["default"], limit=3, ttl=TTL, start_now=1
    )
    assert got.completed is not None and got.completed.completed == {done.id}
    assert store.get(done.id).state is State.SUCCEEDED
    assert [(j.id, j.attempts, j.started) for j in got.started] == [
        (j.id, 1, True) for j in waiting
    ]
    assert [j.priority for j in got.claimed] == [3, 4, 5]
    assert [j.started for j in got.claimed] == [True, False, False]
    assert all(store.get(j.id).state is State.LEASED for j in got.claimed)


def test_a_round_that_completes_commits_synchronously_though_its_claim_does_not(
    dsn: str, conn: Any
) -> None:
    # The claim turns synchronous_commit off for its own transaction; a round
    # that also completes jobs puts the session's setting back before COMMIT
    # (here the database's, "local", which the test cluster's "off" would
    # hide). A deferred trigger records the setting in force at each COMMIT.
    conn.execute(
        "DO $$ BEGIN EXECUTE format("
        "'ALTER DATABASE %I SET synchronous_commit = local', current_database()); END $$"
    )
    conn.execute("CREATE TABLE public.commit_modes (mode text)")
    conn.execute(
        "CREATE FUNCTION public.note_commit_mode() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO public.commit_modes"
        " VALUES (current_setting('synchronous_commit')); RETURN NULL; END $$"
        " SECURITY DEFINER"
    )
    conn.execute(
        "CREATE CONSTRAINT TRIGGER note_commit_mode AFTER UPDATE ON jobrun.jobs"
        " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.note_commit_mode()"
    )
    pool = open_pool(dsn, concurrency=2)
    try:
        store = Store(pool)
        store.enqueue_batch([new_job() for _ in range(3)])
        [job] = store.claim(OWNER, ["default"], 1, TTL)
        conn.execute("DELETE FROM public.commit_modes")
        store.exchange(OWNER, complete=[job], queues=["default"], limit=1, ttl=TTL)
        with_completions = {r[0] for r in conn.execute("SELECT mode FROM public.commit_modes")}
        conn.execute("DELETE FROM public.commit_modes")
        store.exchange(OWNER, queues=["default"], limit=1, ttl=TTL)
        claim_alone = {r[0] for r in conn.execute("SELECT mode FROM public.commit_modes")}
    finally:
        pool.close()
        conn.execute("DROP TRIGGER note_commit_mode ON jobrun.jobs")
        conn.execute("DROP FUNCTION public.note_commit_mode()")
        conn.execute("DROP TABLE public.commit_modes")
    assert with_completions == {"local"}
    assert claim_alone == {"off"}


def test_a_round_may_only_complete_and_start(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(3)])
    done, waiting = store.claim(OWNER, ["default"], 2, TTL, start=1)
    for _ in range(2):  # the session's settings of one round do not leak into the next
        got = store.exchange(
            OWNER, complete=[done], start=[waiting], queues=["default"], limit=0, ttl=TTL
        )
        assert got.completed is not None and got.completed.completed == {done.id}
        assert [j.id for j in got.started] == [waiting.id] and got.claimed == []
    assert store.get(done.id).state is State.SUCCEEDED


def test_a_round_leaves_out_a_buffered_job_whose_cancel_was_requested(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(2)])
    jobs = store.claim(OWNER, ["default"], 2, TTL, start=0)
    store.cancel(jobs[1].id)  # requested: it is leased
    got = store.exchange(OWNER, start=jobs, queues=["default"], limit=0, ttl=TTL)
    assert [j.id for j in got.started] == [jobs[0].id]
    assert got.claimed == [] and got.completed is None


def test_a_round_refuses_another_owners_jobs_before_sending_anything(store: Store) -> None:
    store.enqueue_batch([new_job() for _ in range(2)])
    [job] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    with pytest.raises(ValidationError):
        store.exchange("someone-else", start=[job], queues=["default"], limit=1, ttl=TTL)
    with pytest.raises(ValidationError):
        store.exchange("someone-else", complete=[job], queues=["default"], limit=1, ttl=TTL)
    assert store.get(job.id).attempts == 0  # nothing was sent


def test_unclaim_gives_unstarted_jobs_back_as_they_were(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job(priority=p) for p in range(3)])
    jobs = store.claim(OWNER, ["default"], 3, TTL, start=1)
    store.cancel(jobs[2].id)
    given = store.unclaim(jobs)
    # The started one is not given back; the cancelled one ends cancelled.
    assert given == {jobs[1].id: State.QUEUED, jobs[2].id: State.CANCELLED}
    back = store.get(jobs[1].id)
    assert (back.state, back.attempts, back.releases, back.run_at) == (
        State.QUEUED,
        0,
        0,
        jobs[1].run_at,
    )
    event = store.events(back.id)[-1]
    assert (event.kind, event.detail["via"]) == ("released", "unclaim")
    assert store.get(jobs[0].id).state is State.LEASED
    # Claimed again, it runs its first attempt.
    [again] = store.claim(OWNER, ["default"], 1, TTL)
    assert (again.id, again.attempts) == (back.id, 1)


def test_unclaim_is_fenced_by_the_claims_token(store: Store, conn: Any) -> None:
    store.enqueue(new_job())
    [stale] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    expire(conn, stale.id)
    store.reap_expired(store.now(), 10)
    [fresh] = store.claim(OWNER, ["default"], 1, TTL, start=0)
    assert store.unclaim([stale]) == {}
    assert store.get(fresh.id).lease_token == fresh.lease_token


@pytest.mark.parametrize("claims", [False, True], ids=["complete", "complete_and_claim"])
def test_a_round_whose_worker_stops_talking_mid_transaction_lets_go_of_its_rows(
    make_store: Any, claims: bool
) -> None:
    """The round's statements go out one by one. A worker frozen after its
    completion statement (SIGSTOP, a VM pause; no watchdog of its own then,
    hence no call_timeout here) would hold the rows it completed, and the
    reaper skips locked rows: the server ends the silent transaction after
    the round's bound (transaction_timeout: here the lease TTL, 1 s), so the expired leases are
    reaped and nothing of the round is recorded."""
    store = make_store(call_timeout=None)
    with store.pool.connection() as c:
        if c.info.server_version < TRANSACTION_TIMEOUT_SINCE:
            pytest.skip("no transaction_timeout before PostgreSQL 17: the rows wait (documented)")
    store.enqueue_batch([new_job() for _ in range(3)])
    ttl = dt.timedelta(seconds=1)
    jobs = store.claim(OWNER, ["default"], 2, ttl)
    inside, wake = threading.Event(), threading.Event()

    class FreezingAfterCompletions:
        """The store's queries, but the worker freezes once its completion
        statement is on the server."""

        def __init__(self, queries: Any) -> None:
            self._queries = queries

        def __getattr__(self, name: str) -> Any:
            return getattr(self._queries, name)

        def complete_jobs_deferred(self, c: Any, **kwargs: Any) -> Any:
            rows = self._queries.complete_jobs_deferred(c, **kwargs)
            c.pgconn.flush()
            inside.set()
            wake.wait(30)
            return rows

    store.q = FreezingAfterCompletions(store.q)

    def round_trip() -> object:
        return store.exchange(OWNER, complete=jobs, queues=["default"], limit=int(claims), ttl=ttl)

    with quiet_client(round_trip, inside, wake) as outcome:
        requeued_within(store, [j.id for j in jobs], 15)
    (woken,) = outcome
    assert isinstance(woken, (OutcomeUnknown, TransientError)), woken
    assert {store.get(j.id).state for j in jobs} == {State.QUEUED}
    assert store.get(jobs[0].id).attempts == 1  # the reaper's verdict, nothing of the round
