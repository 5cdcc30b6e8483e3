"""Store cancel, retry, purge, depth, list, get, events, prune_events, now, effect_done."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import InvalidState, NotFound, ValidationError
from jobrun.job.model import EffectKey, State
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job
from tests.postgres.test_store_enqueue import listen, pending_notifies
from tests.postgres.test_store_leases import OWNER, claim_one, event_kinds


def finish_long_ago(conn: psycopg.Connection[Any], job_id: uuid.UUID, days: int) -> None:
    conn.execute(
        "UPDATE jobrun.jobs SET finished_at = now() - make_interval(days => %s) WHERE id = %s",
        [days, job_id],
    )


# -- cancel --------------------------------------------------------------------


def test_cancel_of_a_queued_job_cancels_it_at_once(store: Store) -> None:
    job = store.enqueue(new_job())
    done = store.cancel(job.id)
    assert done.state is State.CANCELLED and done.finished_at is not None
    assert event_kinds(store, job.id) == ["enqueued", "cancelled"]


def test_cancel_of_a_leased_job_requests_cancellation(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    done = store.cancel(job.id)
    assert done.state is State.LEASED and done.cancel_requested
    assert store.heartbeat(OWNER, [(job.id, job.lease_token)], store.now() + TTL) == set()  # type: ignore[list-item]


def test_cancel_twice_records_one_request(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    store.cancel(job.id)
    store.cancel(job.id)
    assert event_kinds(store, job.id).count("cancel_requested") == 1


def test_cancel_of_a_terminal_job_returns_it_unchanged(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    done = store.complete(job)
    assert store.cancel(job.id) == done
    assert event_kinds(store, job.id)[-1] == "succeeded"


def test_cancel_of_an_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.cancel(uuid.uuid4())


# -- retry ---------------------------------------------------------------------


@pytest.mark.parametrize("end", ["dead", "cancelled", "succeeded"])
def test_retry_of_a_finished_job_queues_it_now_with_attempts_reset(
    store: Store, dsn: str, end: str
) -> None:
    store.enqueue(new_job(max_attempts=1))
    job = claim_one(store)
    if end == "dead":
        store.fail(job, "boom", None)
    elif end == "cancelled":
        store.cancel(job.id)
        store.complete(job)
    else:
        store.complete(job)
    with listen(dsn) as listener:
        retried = store.retry(job.id)
        assert pending_notifies(listener) == ["default"]
    assert retried.state is State.QUEUED
    assert retried.attempts == 0
    assert retried.finished_at is None and not retried.cancel_requested
    assert retried.run_at == retried.updated_at
    assert event_kinds(store, job.id)[-1] == "retried"
    if end == "dead":
        assert retried.last_error == "boom"  # kept until the next attempt
    again = claim_one(store)
    assert again.attempts == 1


def test_retry_of_a_queued_job_makes_it_runnable_now(store: Store) -> None:
    job = store.enqueue(new_job(delay=dt.timedelta(hours=1)))
    retried = store.retry(job.id)
    assert retried.run_at <= store.now()
    assert claim_one(store).id == job.id


def test_retry_of_a_leased_job_is_invalid_state(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    with pytest.raises(InvalidState) as info:
        store.retry(job.id)
    assert info.value.state == "leased"


def test_retry_of_an_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.retry(uuid.uuid4())


# -- purge ---------------------------------------------------------------------


def test_purge_deletes_only_terminal_jobs_older_than_the_age(store: Store, conn: Any) -> None:
    old = store.enqueue(new_job())
    store.cancel(old.id)
    finish_long_ago(conn, old.id, 10)
    recent = store.enqueue(new_job())
    store.cancel(recent.id)
    waiting = store.enqueue(new_job())
    assert store.purge(dt.timedelta(days=7), 100) == 1
    with pytest.raises(NotFound):
        store.get(old.id)
    assert store.get(recent.id).state is State.CANCELLED
    assert store.get(waiting.id).state is State.QUEUED


def test_purge_works_in_bounded_batches(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job() for _ in range(5)])
    conn.execute(
        "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now() - interval '30 days'"
    )
    assert store.purge(dt.timedelta(days=1), 2) == 2
    assert store.purge(dt.timedelta(days=1), 2) == 2
    assert store.purge(dt.timedelta(days=1), 2) == 1
    assert store.purge(dt.timedelta(days=1), 2) == 0


# -- depth, list, get ------------------------------------------------------------


def test_depth_counts_ready_scheduled_leased_and_dead_per_queue(store: Store) -> None:
    store.enqueue_batch([new_job(queue="a") for _ in range(3)])
    store.enqueue(new_job(queue="a", delay=dt.timedelta(hours=1)))
    store.enqueue(new_job(queue="b", max_attempts=1))
    store.claim(OWNER, ["a"], 1, TTL)
    dead = store.claim(OWNER, ["b"], 1, TTL)[0]
    store.fail(dead, "boom", None)
    depth = {d.queue: d for d in store.depth()}
    assert (depth["a"].ready, depth["a"].scheduled, depth["a"].leased, depth["a"].dead) == (
        2,
        1,
        1,
        0,
    )
    assert (depth["b"].ready, depth["b"].dead) == (0, 1)


def test_list_filters_by_queue_state_and_type_with_keyset_pagination(store: Store) -> None:
    ids = [store.enqueue(new_job(queue="a", type="t.one")).id for _ in range(5)]
    store.enqueue(new_job(queue="b", type="t.one"))
    store.enqueue(new_job(queue="a", type="t.two"))
    store.cancel(ids[4])
    page1 = store.list(queue="a", type="t.one", state=State.QUEUED, limit=2)
    page2 = store.list(queue="a", type="t.one", state="queued", limit=2, after=page1[-1].id)
    page3 = store.list(queue="a", type="t.one", state=State.QUEUED, limit=2, after=page2[-1].id)
    assert [j.id for j in page1 + page2] == ids[:4]
    assert page3 == []
    assert len(store.list()) == 7


def test_list_rejects_bad_filters(store: Store) -> None:
    with pytest.raises(ValidationError):
        store.list(state="running")
    with pytest.raises(ValidationError):
        store.list(limit=0)
    with pytest.raises(ValidationError):
        store.list(queue="NO SPACES")


def test_get_of_an_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound) as info:
        store.get(uuid.uuid4())
    assert info.value.what == "job"


def test_get_refuses_a_non_uuid(store: Store) -> None:
    with pytest.raises(ValidationError):
        store.get("not-a-uuid")  # type: ignore[arg-type]


# -- events, prune, now, effects -------------------------------------------------


def test_events_tell_the_whole_story_in_all_mode(store: Store) -> None:
    store.enqueue(new_job(max_attempts=2))
    job = claim_one(store)
    store.fail(job, "first", None)
    job = claim_one(store)
    store.complete(job)
    events = store.events(job.id)
    assert [str(e.kind) for e in events] == [
        "enqueued",
        "claimed",
        "retrying",
        "claimed",
        "succeeded",
    ]
    assert [e.attempt for e in events] == [0, 1, 1, 2, 2]
    assert events[2].detail == {"via": "fail", "error": "first", "permanent": False}
    assert all(e.at.tzinfo is dt.UTC for e in events)


def test_terminal_mode_records_one_event_per_finished_job(terminal_store: Store) -> None:
    terminal_store.enqueue_batch([new_job() for _ in range(3)])
    a, b, c = terminal_store.claim(OWNER, ["default"], 3, TTL)
    terminal_store.complete(a)
    terminal_store.complete_many([b])
    terminal_store.cancel(c.id)
    terminal_store.complete(c)
    assert [event_kinds(terminal_store, j.id) for j in (a, b, c)] == [
        ["succeeded"],
        ["succeeded"],
        ["cancelled"],
    ]


def test_prune_events_deletes_old_events_in_bounded_batches(store: Store, conn: Any) -> None:
    store.enqueue_batch([new_job() for _ in range(5)])
    conn.execute("UPDATE jobrun.job_events SET at = now() - interval '40 days'")
    store.enqueue(new_job())
    assert store.prune_events(dt.timedelta(days=30), 3) == 3
    assert store.prune_events(dt.timedelta(days=30), 3) == 2
    assert store.prune_events(dt.timedelta(days=30), 3) == 0
    assert conn.execute("SELECT count(*) FROM jobrun.job_events").fetchone() == (1,)


def test_now_is_the_database_clock_in_utc(store: Store, conn: Any) -> None:
    now = store.now()
    assert now.tzinfo is dt.UTC
    (db,) = conn.execute("SELECT now()").fetchone()
    assert abs((db - now).total_seconds()) < 60


def test_effect_keys_are_shared_across_queues_for_one_type_and_key(store: Store) -> None:
    store.enqueue(new_job(queue="a", idempotency_key="k"))
    store.enqueue(new_job(queue="b", idempotency_key="k"))
    first = store.claim(OWNER, ["a"], 1, TTL)[0]
    second = store.claim(OWNER, ["b"], 1, TTL)[0]
    calls: list[str] = []
    store.complete(first, lambda c: calls.append("a"))
    store.complete(second, lambda c: calls.append("b"))
    assert calls == ["a"]
    assert store.effect_done(EffectKey("job:test.job", "k"))


def test_effect_key_without_an_idempotency_key_is_the_job_id(store: Store) -> None:
    store.enqueue(new_job())
    job = claim_one(store)
    assert EffectKey.of(job) == EffectKey("job:test.job", str(job.id))
    assert not store.effect_done(job)
    store.complete(job)
    assert store.effect_done(job)


# -- paused queues ---------------------------------------------------------------


def test_a_paused_queue_is_not_claimed_from_but_accepts_jobs(store: Store, dsn: str) -> None:
    store.pause_queue("emails")
    store.pause_queue("emails")  # twice is fine
    job = store.enqueue(new_job(queue="emails"))
    store.enqueue(new_job(queue="other"))
    assert store.paused_queues() == ["emails"]
    assert [j.queue for j in store.claim(OWNER, ["emails", "other"], 10, TTL)] == ["other"]
    with listen(dsn) as listener:
        assert store.resume_queue("emails")
        assert pending_notifies(listener) == ["emails"]
    assert not store.resume_queue("emails")
    assert [j.id for j in store.claim(OWNER, ["emails"], 10, TTL)] == [job.id]
    assert store.paused_queues() == []


@pytest.fixture
def notify_probe(dsn: str, conn: psycopg.Connection[Any]) -> Iterator[Store]:
    """A Store whose every pg_notify and every write to a watched table record the
    transaction they ran in (table ``probe``), to tell one transaction from two.

    A ``pg_notify`` of our own in ``public``, first on the pool's search_path,
    stands in for the catalog's (and calls it).
    """
    conn.execute("CREATE TABLE public.probe (what text, xid xid8 DEFAULT pg_current_xact_id())")
    conn.execute(
        "CREATE FUNCTION public.pg_notify(channel text, payload text) RETURNS void"
        " LANGUAGE sql AS $$ INSERT INTO public.probe (what) VALUES ('notify');"
        " SELECT pg_catalog.pg_notify(channel, payload) $$"
    )
    conn.execute(
        "CREATE FUNCTION probe_write() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO public.probe (what) VALUES (TG_TABLE_NAME); RETURN NULL; END $$"
    )
    for table in ("queue_pauses", "jobs"):
        conn.execute(
            f"CREATE TRIGGER probe_{table} AFTER INSERT OR UPDATE OR DELETE ON jobrun.{table}"
            " FOR EACH ROW EXECUTE FUNCTION probe_write()"
        )
    pool = open_pool(dsn + " options='-c search_path=public,pg_catalog'", max_size=2)
    try:
        yield Store(pool)
    finally:
        pool.close()


def probe_transactions(conn: psycopg.Connection[Any]) -> dict[str, set[int]]:
    """The transactions each probe entry ran in."""
    found: dict[str, set[int]] = {}
    for what, xid in conn.execute("SELECT what, xid::text::int8 FROM public.probe").fetchall():
        found.setdefault(what, set()).add(xid)
    conn.execute("DELETE FROM public.probe")
    return found


def test_resume_queue_sends_its_wake_up_in_the_transaction_that_lifts_the_pause(
    notify_probe: Store, conn: psycopg.Connection[Any]
) -> None:
    notify_probe.pause_queue("emails")
    probe_transactions(conn)
    assert notify_probe.resume_queue("emails")
    seen = probe_transactions(conn)
    assert seen["notify"] == seen["queue_pauses"] and len(seen["notify"]) == 1


def test_retry_sends_its_wake_up_in_the_transaction_that_requeues_the_job(
    notify_probe: Store, conn: psycopg.Connection[Any]
) -> None:
    job = notify_probe.enqueue(new_job())
    notify_probe.cancel(job.id)
    probe_transactions(conn)
    notify_probe.retry(job.id)
    seen = probe_transactions(conn)
    assert seen["notify"] == seen["jobs"] and len(seen["notify"]) == 1


def test_state_counts_give_jobs_and_attempts_per_state(store: Store) -> None:
    store.enqueue(new_job(queue="a"))
    job = store.claim(OWNER, ["a"], 1, TTL)[0]
    store.fail(job, "x", None)
    job = store.claim(OWNER, ["a"], 1, TTL)[0]
    store.complete(job)
    store.enqueue_batch([new_job(queue="a") for _ in range(2)] + [new_job(queue="b")])
    counts_a = store.state_counts("a")
    assert counts_a[State.QUEUED].jobs == 2
    assert counts_a[State.SUCCEEDED].jobs == 1 and counts_a[State.SUCCEEDED].attempts == 2
    assert sum(c.jobs for c in store.state_counts().values()) == 4
