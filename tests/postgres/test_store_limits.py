"""Flow control in the claim: the limits in queue_limits, exact across claimers.

Every limit is checked two ways where concurrency matters: the claims'
answers, and an oracle inside the database (a trigger that, at every claim,
counts the queue's leases with a fresh snapshot and records any count above
the limit), so a violation between two samples cannot hide.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import IdempotencyConflict, LeaseLost, ValidationError
from jobrun.job.model import EventKind, QueueLimits, RateLimit, State
from jobrun.postgres.store import _LIMITED_CLAIM_IDLE_TIMEOUT, LIMITED_CLAIM_IDLE_SECONDS, Store
from tests.postgres.conftest import TTL, new_job

OWNER = "w1"


def _enqueue(store: Store, n: int, queue: str = "q", **fields: Any) -> None:
    store.enqueue_batch([new_job(queue=queue, **fields) for _ in range(n)])


def _leased(conn: psycopg.Connection[Any], queue: str = "q") -> int:
    row = conn.execute(
        "SELECT count(*) FROM jobrun.jobs WHERE state = 'leased' AND queue = %s", (queue,)
    ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_queue_without_limits_claims_as_many_as_asked(store: Store) -> None:
    _enqueue(store, 10)
    assert len(store.claim(OWNER, ["q"], 8, TTL)) == 8


def test_a_concurrency_limit_caps_the_leases_of_the_queue(store: Store) -> None:
    _enqueue(store, 10)
    store.set_queue_limits("q", concurrency=3)
    first = store.claim(OWNER, ["q"], 10, TTL)
    assert len(first) == 3
    assert store.claim("w2", ["q"], 10, TTL) == []
    store.complete(first[0])
    assert len(store.claim("w2", ["q"], 10, TTL)) == 1
    assert store.claim(OWNER, ["q"], 10, TTL) == []


def test_a_limit_on_one_queue_leaves_the_others_of_the_claim_alone(store: Store) -> None:
    _enqueue(store, 5, "limited")
    _enqueue(store, 5, "free")
    store.set_queue_limits("limited", concurrency=1)
    jobs = store.claim(OWNER, ["limited", "free"], 10, TTL)
    assert sorted(j.queue for j in jobs) == ["free"] * 5 + ["limited"]


def test_an_expired_lease_holds_its_slot_until_the_reaper_requeues_it(store: Store) -> None:
    _enqueue(store, 3)
    store.set_queue_limits("q", concurrency=1)
    assert len(store.claim(OWNER, ["q"], 5, dt.timedelta(milliseconds=200))) == 1
    time.sleep(0.4)
    assert store.claim("w2", ["q"], 5, TTL) == []  # expired, not yet reaped: still leased
    assert len(store.reap_expired(store.now(), 100).requeued) == 1
    assert len(store.claim("w2", ["q"], 5, TTL)) == 1


def test_clearing_the_limits_lets_the_queue_be_claimed_freely_again(store: Store) -> None:
    _enqueue(store, 6)
    store.set_queue_limits("q", concurrency=2)
    assert len(store.claim(OWNER, ["q"], 6, TTL)) == 2
    assert store.clear_queue_limits("q") is True
    assert store.clear_queue_limits("q") is False
    assert len(store.claim(OWNER, ["q"], 6, TTL)) == 4


def test_a_paused_limited_queue_yields_nothing(store: Store) -> None:
    _enqueue(store, 3)
    store.set_queue_limits("q", concurrency=2)
    store.pause_queue("q")
    assert store.claim(OWNER, ["q"], 5, TTL) == []
    assert store.limits_hold_back(["q"]) is None


def test_limits_hold_back_tells_a_full_queue_from_an_empty_one(store: Store) -> None:
    store.set_queue_limits("q", concurrency=1)
    assert store.limits_hold_back(["q"]) is None  # nothing queued
    _enqueue(store, 2)
    assert len(store.claim(OWNER, ["q"], 5, TTL)) == 1
    assert store.limits_hold_back(["q"]) == 0.0  # held back until a slot frees
    assert store.limits_hold_back(["other"]) is None


def test_limits_hold_back_says_when_a_full_rate_window_opens(store: Store) -> None:
    _enqueue(store, 5)
    store.set_queue_limits("q", rate="2/10s")
    assert len(store.claim(OWNER, ["q"], 5, TTL)) == 2
    wait = store.limits_hold_back(["q"])
    assert wait is not None and 9.0 < wait <= 10.0


def test_a_limit_set_through_another_store_is_never_overshot_by_a_stale_route(
    make_store: Any, conn: psycopg.Connection[Any]
) -> None:
    a, b = make_store(), make_store()
    _enqueue(a, 10)
    assert a.claim(OWNER, ["q"], 1, TTL)  # a now routes "q" lock-free for a second
    b.set_queue_limits("q", concurrency=2)
    # a's route is stale: its lock-free claim skips the limited queue instead
    # of overshooting it.
    assert a.claim(OWNER, ["q"], 10, TTL) == []
    time.sleep(1.1)
    assert len(a.claim(OWNER, ["q"], 10, TTL)) == 1  # 2 less the one already leased
    assert _leased(conn) == 2


def test_per_key_limits_hold_each_key_to_its_count(store: Store) -> None:
    for key in ("a", "b"):
        _enqueue(store, 4, concurrency_key=key)
    _enqueue(store, 2)  # no key: only the queue's limits apply
    store.set_queue_limits("q", per_key=2)
    jobs = store.claim(OWNER, ["q"], 20, TTL)
    by_key = sorted((j.concurrency_key or "-") for j in jobs)
    assert by_key == ["-", "-", "a", "a", "b", "b"]
    assert store.claim(OWNER, ["q"], 20, TTL) == []
    store.complete(next(j for j in jobs if j.concurrency_key == "a"))
    again = store.claim(OWNER, ["q"], 20, TTL)
    assert [j.concurrency_key for j in again] == ["a"]


def test_a_busy_hot_key_never_blocks_the_cold_keys_behind_it(store: Store) -> None:
    _enqueue(store, 500, concurrency_key="hot")  # ahead of every cold job
    cold = [f"cold-{i}" for i in range(30)]
    store.enqueue_batch([new_job(queue="q", concurrency_key=k) for k in cold])
    store.set_queue_limits("q", per_key=1)
    claimed: list[Any] = []
    for _ in range(3):  # a claim may come back short once; never blocked
        claimed += store.claim(OWNER, ["q"], 40, TTL)
    keys = [j.concurrency_key for j in claimed]
    assert keys.count("hot") == 1
    assert sorted(k for k in keys if k != "hot") == sorted(cold)


def test_per_key_and_concurrency_limits_hold_together(store: Store) -> None:
    for key in "abcdef":
        _enqueue(store, 3, concurrency_key=key)
    store.set_queue_limits("q", concurrency=4, per_key=1)
    jobs = store.claim(OWNER, ["q"], 20, TTL)
    assert len(jobs) == 4
    assert len({j.concurrency_key for j in jobs}) == 4


def test_a_rate_limit_starts_at_most_its_count_in_any_window(store: Store) -> None:
    _enqueue(store, 20)
    store.set_queue_limits("q", rate=RateLimit(5, dt.timedelta(seconds=1)))
    first = store.claim(OWNER, ["q"], 20, TTL)
    assert len(first) == 5
    for job in first:
        store.complete(job)  # finishing frees no rate: the window counts starts
    assert store.claim(OWNER, ["q"], 20, TTL) == []
    wait = store.limits_hold_back(["q"])
    assert wait is not None and 0 < wait <= 1.0
    time.sleep(wait + 0.05)
    assert len(store.claim(OWNER, ["q"], 20, TTL)) == 5


def test_a_rate_limit_given_as_text_is_parsed(store: Store) -> None:
    limits = store.set_queue_limits("q", rate="10/min")
    assert limits.rate == RateLimit(10, dt.timedelta(minutes=1))
    assert str(limits.rate) == "10/min"


def test_queue_limits_reads_back_what_was_set_and_what_it_holds(store: Store) -> None:
    _enqueue(store, 4)
    store.set_queue_limits("q", concurrency=3, per_key=2, rate="100/s")
    store.claim(OWNER, ["q"], 2, TTL)
    got = store.queue_limits("q")
    assert (got.concurrency, got.per_key, got.rate) == (
        3,
        2,
        RateLimit(100, dt.timedelta(seconds=1)),
    )
    assert got.leased == 2
    assert got.started_in_window == 2
    assert got.describe() == "concurrency 3, per key 2, rate 100/s"
    assert store.queue_limits("none") == QueueLimits(queue="none")
    assert [lim.queue for lim in store.all_queue_limits()] == ["q"]
    # set replaces every limit: one left out is lifted
    assert store.set_queue_limits("q", concurrency=5).per_key is None


def test_a_limits_row_written_by_hand_that_no_call_could_write_is_left_out(
    store: Store, conn: psycopg.Connection[Any], caplog: pytest.LogCaptureFixture
) -> None:
    store.set_queue_limits("good", concurrency=2)
    conn.execute("INSERT INTO jobrun.queue_limits (queue, concurrency) VALUES ('bad name!', 3)")
    assert [lim.queue for lim in store.all_queue_limits()] == ["good"]
    assert "ignoring the queue_limits row of queue 'bad name!'" in caplog.text


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"per_key": -1}, "per_key"),
        ({"concurrency": 1.5}, "concurrency"),
        ({"rate": "fast"}, "rate"),
        ({"rate": "0/s"}, "rate"),
        ({"rate": "5/2d"}, "rate"),
        ({}, "limits"),
    ],
)
def test_bad_limits_are_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any], fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(ValidationError) as err:
        store.set_queue_limits("q", **fields)
    assert err.value.field == field
    assert conn.execute("SELECT count(*) FROM jobrun.queue_limits").fetchone() == (0,)


def test_bad_concurrency_keys_are_refused_on_the_job() -> None:
    for bad in ("", "a\x00b", 5):
        with pytest.raises(ValidationError) as err:
            new_job(concurrency_key=bad)
        assert err.value.field == "concurrency_key"


def test_the_concurrency_key_is_stored_by_every_enqueue_path(store: Store) -> None:
    one = store.enqueue(new_job(concurrency_key="t1"))
    keyed = store.enqueue(new_job(concurrency_key="t2", idempotency_key="k"))
    batch = [new_job(concurrency_key="t3"), new_job(concurrency_key="t4", idempotency_key="k2")]
    assert store.enqueue_batch(batch).inserted == 2
    assert store.get(one.id).concurrency_key == "t1"
    assert store.get(keyed.id).concurrency_key == "t2"
    assert [store.get(j.id).concurrency_key for j in batch] == ["t3", "t4"]


def test_a_replay_with_another_concurrency_key_is_an_idempotency_conflict(store: Store) -> None:
    store.enqueue(new_job(concurrency_key="t1", idempotency_key="k"))
    with pytest.raises(IdempotencyConflict):
        store.enqueue(new_job(concurrency_key="t2", idempotency_key="k"))


# -- exact under concurrency ----------------------------------------------------


_ORACLE = """
CREATE TABLE public.limit_violations (queue text, key text, seen int);
CREATE FUNCTION public.check_limits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE lim jobrun.queue_limits; n int;
BEGIN
  SELECT * INTO lim FROM jobrun.queue_limits WHERE queue = NEW.queue;
  IF lim.concurrency IS NOT NULL THEN
    SELECT count(*) INTO n FROM jobrun.jobs WHERE state = 'leased' AND queue = NEW.queue;
    IF n > lim.concurrency THEN
      INSERT INTO public.limit_violations (queue, seen) VALUES (NEW.queue, n);
    END IF;
  END IF;
  IF lim.per_key IS NOT NULL AND NEW.concurrency_key IS NOT NULL THEN
    SELECT count(*) INTO n FROM jobrun.jobs
    WHERE state = 'leased' AND queue = NEW.queue AND concurrency_key = NEW.concurrency_key;
    IF n > lim.per_key THEN
      INSERT INTO public.limit_violations VALUES (NEW.queue, NEW.concurrency_key, n);
    END IF;
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER check_limits AFTER UPDATE OF state ON jobrun.jobs
FOR EACH ROW WHEN (NEW.state = 'leased' AND OLD.state <> 'leased')
EXECUTE FUNCTION public.check_limits();
"""


def _install_oracle(conn: psycopg.Connection[Any]) -> None:
    """At every claim of a job, its queue's and key's leases counted afresh
    (a plpgsql statement in READ COMMITTED takes a new snapshot: it sees every
    claim committed before, and this one's own rows)."""
    conn.execute(_ORACLE)


def _hammer(
    make_store: Any,
    conn: psycopg.Connection[Any],
    claimers: int,
    seconds: float,
    hold: float,
    *,
    complete_with_claims: bool = False,
) -> dict[str, int]:
    """``claimers`` threads, each with its own store, claiming batches and
    finishing each job after ``hold`` seconds, for ``seconds``; with
    ``complete_with_claims``, every other claimer completes its jobs with its
    next claim (complete_and_claim), as a worker filling the limit does."""
    stop = time.monotonic() + seconds
    done = {"claimed": 0}
    lock = threading.Lock()
    errors: list[BaseException] = []

    def run(i: int) -> None:
        store = make_store()
        together = complete_with_claims and i % 2 == 1
        try:
            jobs: list[Any] = []
            while time.monotonic() < stop:
                if together and jobs:
                    outcome, jobs = store.complete_and_claim(jobs, queues=["q"], limit=4, ttl=TTL)
                    assert not outcome.lease_lost
                else:
                    jobs = store.claim(f"w{i}", ["q"], 4, TTL)
                if not jobs:
                    time.sleep(0.002)
                    continue
                time.sleep(hold)
                if not together:
                    for job in jobs:
                        store.complete(job)
                with lock:
                    done["claimed"] += len(jobs)
            if jobs and together:
                store.complete_many(jobs)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(claimers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return done


def test_concurrent_claimers_never_lease_more_than_the_concurrency_limit(
    make_store: Any, store: Store, conn: psycopg.Connection[Any]
) -> None:
    _install_oracle(conn)
    _enqueue(store, 3000)
    store.set_queue_limits("q", concurrency=5)
    done = _hammer(make_store, conn, claimers=12, seconds=4.0, hold=0.003)
    assert done["claimed"] > 100
    assert conn.execute("SELECT * FROM public.limit_violations").fetchall() == []


def test_claimers_completing_with_their_claims_never_lease_more_than_the_limit(
    make_store: Any, store: Store, conn: psycopg.Connection[Any]
) -> None:
    _install_oracle(conn)
    _enqueue(store, 3000)
    store.set_queue_limits("q", concurrency=5)
    done = _hammer(
        make_store, conn, claimers=12, seconds=4.0, hold=0.003, complete_with_claims=True
    )
    assert done["claimed"] > 100
    assert conn.execute("SELECT * FROM public.limit_violations").fetchall() == []
    assert _leased(conn) == 0


def test_concurrent_claimers_never_lease_more_than_the_per_key_limit(
    make_store: Any, store: Store, conn: psycopg.Connection[Any]
) -> None:
    _install_oracle(conn)
    store.enqueue_batch([new_job(queue="q", concurrency_key=f"k{i % 7}") for i in range(3000)])
    store.set_queue_limits("q", per_key=2)
    done = _hammer(make_store, conn, claimers=12, seconds=4.0, hold=0.003)
    assert done["claimed"] > 100
    assert conn.execute("SELECT * FROM public.limit_violations").fetchall() == []


def test_concurrent_claimers_never_start_more_than_the_rate_in_any_window(
    make_store: Any, store: Store, conn: psycopg.Connection[Any]
) -> None:
    _enqueue(store, 3000)
    store.set_queue_limits("q", rate=RateLimit(40, dt.timedelta(milliseconds=500)))
    done = _hammer(make_store, conn, claimers=12, seconds=3.0, hold=0.0)
    # Every window of 500 ms that ends at a claim holds at most 40 starts.
    worst = conn.execute(
        """
        SELECT max(n) FROM (
          SELECT count(*) OVER (ORDER BY at RANGE BETWEEN '499.999 ms' PRECEDING
                                AND CURRENT ROW) AS n
          FROM jobrun.job_events WHERE kind = 'claimed'
        ) AS w
        """
    ).fetchone()
    assert worst is not None
    assert 30 <= worst[0] <= 40
    # The rate was reached, not just respected: about 40 per half second.
    assert 200 <= done["claimed"] <= 40 * (3.0 / 0.5 + 1)


# -- snooze and progress --------------------------------------------------------


def test_a_snooze_gives_the_attempt_back_and_counts_the_snooze(store: Store) -> None:
    job = store.enqueue(new_job())
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    assert claimed.attempts == 1
    snoozed = store.release(claimed, dt.timedelta(seconds=30), "waiting for the bank", snooze=True)
    assert (snoozed.state, snoozed.attempts, snoozed.snoozes) == (State.QUEUED, 0, 1)
    assert snoozed.last_error is None
    assert snoozed.run_at >= store.now() + dt.timedelta(seconds=29)
    kinds = [e.kind for e in store.events(job.id)]
    assert kinds[-1] is EventKind.SNOOZED
    assert store.events(job.id)[-1].detail == {
        "via": "snooze",
        "reason": "waiting for the bank",
        "delay_seconds": 30.0,
    }


def test_a_release_is_counted_in_its_own_column_and_a_snooze_is_not(store: Store) -> None:
    # The worker's unknown-type limit reads this count (it used to parse
    # last_error); a retry from a terminal state starts the count again.
    job = store.enqueue(new_job())
    for expected in (1, 2):
        [claimed] = store.claim(OWNER, ["default"], 1, TTL)
        released = store.release(claimed, dt.timedelta(0), "no handler here")
        assert (released.releases, released.snoozes) == (expected, 0)
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    snoozed = store.release(claimed, dt.timedelta(0), "later", snooze=True)
    assert (snoozed.releases, snoozed.snoozes) == (2, 1)
    assert store.retry(job.id).releases == 2  # still queued: the count goes on
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    store.fail(claimed, "dead now", None, permanent=True)
    assert store.get(job.id).releases == 2
    assert store.retry(job.id).releases == 0


def test_a_release_that_meets_a_requested_cancel_is_not_counted(store: Store) -> None:
    job = store.enqueue(new_job())
    [claimed] = store.claim(OWNER, ["default"], 1, TTL)
    store.cancel(job.id)
    cancelled = store.release(claimed, dt.timedelta(0), "no handler here")
    assert (cancelled.state, cancelled.releases) == (State.CANCELLED, 0)


def test_progress_is_recorded_on_the_running_job_and_cleared_by_its_next_claim(
    store: Store,
) -> None:
    store.enqueue(new_job())
    [job] = store.claim(OWNER, ["default"], 1, TTL)
    at = store.record_progress(job, 0.25, "a quarter")
    got = store.get(job.id)
    assert (got.progress, got.progress_message, got.progress_at) == (0.25, "a quarter", at)
    store.fail(job, "boom", None)
    [again] = store.claim(OWNER, ["default"], 1, TTL)
    assert again.progress is None and again.progress_message is None


def test_progress_of_a_lost_lease_is_lease_lost(store: Store) -> None:
    store.enqueue(new_job())
    [job] = store.claim(OWNER, ["default"], 1, TTL)
    store.complete(job)
    with pytest.raises(LeaseLost):
        store.record_progress(job, 0.5)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), "half", True])
def test_bad_progress_is_refused_before_anything_is_written(store: Store, bad: Any) -> None:
    store.enqueue(new_job())
    [job] = store.claim(OWNER, ["default"], 1, TTL)
    with pytest.raises(ValidationError):
        store.record_progress(job, bad)
    assert store.get(job.id).progress is None


def test_change_queue_limits_sets_the_named_and_keeps_the_others(store: Store) -> None:
    store.change_queue_limits("q", concurrency=5)
    store.change_queue_limits("q", rate="10/s")
    got = store.change_queue_limits("q", per_key=2)
    assert got.describe() == "concurrency 5, per key 2, rate 10/s"
    assert store.change_queue_limits("q", rate=None).describe() == "concurrency 5, per key 2"
    assert store.change_queue_limits("q").describe() == "concurrency 5, per key 2"
    store.change_queue_limits("q", concurrency=None, per_key=None)
    assert store.all_queue_limits() == []
    assert store.change_queue_limits("absent", rate=None) == QueueLimits(queue="absent")


def test_two_changes_of_different_limits_at_once_both_land(make_store: Any) -> None:
    a, b = make_store(), make_store()
    a.set_queue_limits("q", concurrency=1, per_key=1)
    start = threading.Barrier(2)

    def bump(store: Store, field: str) -> None:
        start.wait()
        for n in range(2, 40):
            store.change_queue_limits("q", **{field: n})

    threads = [
        threading.Thread(target=bump, args=(a, "concurrency")),
        threading.Thread(target=bump, args=(b, "per_key")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = a.queue_limits("q")
    assert (got.concurrency, got.per_key) == (39, 39)


def test_a_bad_change_is_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.set_queue_limits("q", concurrency=3)
    for bad in ({"concurrency": 0}, {"per_key": "x"}, {"rate": "fast"}):
        with pytest.raises(ValidationError):
            store.change_queue_limits("q", **bad)
    with pytest.raises(ValidationError):
        store.change_queue_limits("bad name!", concurrency=1)
    assert store.queue_limits("q").describe() == "concurrency 3"


def test_a_claimer_frozen_inside_its_limited_claim_holds_the_queue_back_only_briefly(
    store: Store, dsn: str
) -> None:
    _enqueue(store, 4)
    store.set_queue_limits("q", concurrency=2)
    # A claimer that took the queue's lock and claimed, then froze before COMMIT.
    frozen = psycopg.connect(dsn, autocommit=True)
    frozen.execute("BEGIN")
    frozen.execute(_LIMITED_CLAIM_IDLE_TIMEOUT)
    store.q.lock_queue_limits(frozen, queues=["q"])
    assert (
        len(
            store.q.claim_limited_jobs(
                frozen,
                queues=["q"],
                max_jobs=2,
                start=2,
                owner="frozen",
                ttl_seconds=30.0,
                write_events=True,
                commit_async=True,
            )
        )
        == 2
    )
    started = time.monotonic()
    jobs = store.claim(OWNER, ["q"], 5, TTL)  # waits for the lock, then the server ends it
    waited = time.monotonic() - started
    assert len(jobs) == 2  # the frozen claim was rolled back: its two slots are free
    assert waited < LIMITED_CLAIM_IDLE_SECONDS + 5
    assert all(j.lease_owner == OWNER for j in jobs)
    with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
        frozen.execute("COMMIT")
    frozen.close()


# -- complete_and_claim -------------------------------------------------------


def test_complete_and_claim_claims_the_slots_its_completions_free(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    _enqueue(store, 10)
    store.set_queue_limits("q", concurrency=3)
    held = store.claim(OWNER, ["q"], 10, TTL)
    assert len(held) == 3
    outcome, claimed = store.complete_and_claim(held[:2], queues=["q"], limit=10, ttl=TTL)
    assert outcome.completed == {j.id for j in held[:2]}
    assert not outcome.cancelled and not outcome.lease_lost
    assert len(claimed) == 2  # the two slots freed in the same transaction
    assert {j.lease_owner for j in claimed} == {OWNER}
    assert _leased(conn) == 3
    assert {store.get(j.id).state for j in held[:2]} == {State.SUCCEEDED}


def test_complete_and_claim_stores_results_and_events_like_complete_many(store: Store) -> None:
    _enqueue(store, 2)
    store.set_queue_limits("q", concurrency=1)
    [job] = store.claim(OWNER, ["q"], 5, TTL)
    _, [nxt] = store.complete_and_claim(
        [job], results={job.id: {"n": 1}}, queues=["q"], limit=5, ttl=TTL
    )
    done = store.get(job.id)
    assert done.state == State.SUCCEEDED and done.result == {"n": 1}
    kinds = [e.kind for e in store.events(job.id)]
    assert kinds[-2:] == [EventKind.CLAIMED, EventKind.SUCCEEDED]
    assert store.get(nxt.id).state == State.LEASED


def test_complete_and_claim_fences_a_stale_claim_and_claims_anyway(store: Store) -> None:
    _enqueue(store, 3)
    store.set_queue_limits("q", concurrency=2)
    [first, second] = store.claim(OWNER, ["q"], 5, TTL)
    stale = dataclasses.replace(first, lease_token=uuid.uuid4())
    outcome, claimed = store.complete_and_claim([stale, second], queues=["q"], limit=5, ttl=TTL)
    assert outcome.lease_lost == {first.id} and outcome.completed == {second.id}
    assert len(claimed) == 1  # the one slot that second freed
    assert store.get(first.id).state == State.LEASED


def test_complete_and_claim_again_after_a_lost_reply_reports_the_jobs_completed(
    store: Store,
) -> None:
    _enqueue(store, 4)
    store.set_queue_limits("q", concurrency=1)
    [job] = store.claim(OWNER, ["q"], 5, TTL)
    store.complete_and_claim([job], queues=["q"], limit=5, ttl=TTL)
    again, claimed = store.complete_and_claim([job], queues=["q"], limit=5, ttl=TTL)
    assert again.completed == {job.id}
    assert claimed == []  # the first call's claim holds the one slot


def test_complete_and_claim_commits_synchronously_and_a_claim_alone_does_not(
    store: Store, dsn: str
) -> None:
    _enqueue(store, 2)
    store.set_queue_limits("q", concurrency=5)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("SET synchronous_commit = on")  # the test cluster's default is off
        for commit_async, expected in ((False, "on"), (True, "off")):
            c.execute("BEGIN")
            store.q.lock_queue_limits(c, queues=["q"])
            store.q.claim_limited_jobs(
                c,
                queues=["q"],
                max_jobs=1,
                start=1,
                owner=OWNER,
                ttl_seconds=30.0,
                write_events=False,
                commit_async=commit_async,
            )
            row = c.execute("SHOW synchronous_commit").fetchone()
            c.execute("ROLLBACK")
            assert row is not None and row[0] == expected


@pytest.mark.parametrize(
    ("jobs", "queues", "limit", "field"),
    [
        ("none", ["q"], 5, "jobs"),
        ("held", [], 5, "queues"),
        ("held", ["bad queue!"], 5, "queues"),
        ("held", ["q"], 0, "limit"),
        ("two owners", ["q"], 5, "jobs"),
    ],
)
def test_complete_and_claim_refuses_bad_input_before_anything_is_written(
    store: Store,
    conn: psycopg.Connection[Any],
    jobs: str,
    queues: list[str],
    limit: int,
    field: str,
) -> None:
    _enqueue(store, 4)
    store.set_queue_limits("q", concurrency=3)
    held = store.claim(OWNER, ["q"], 1, TTL) + store.claim("w2", ["q"], 1, TTL)
    given = {"none": [], "held": held[:1], "two owners": held}[jobs]
    with pytest.raises(ValidationError) as err:
        store.complete_and_claim(given, queues=queues, limit=limit, ttl=TTL)
    assert err.value.field == field
    assert _leased(conn) == 2
    assert {store.get(j.id).state for j in held} == {State.LEASED}
