"""LeaseLocker: the lease-row leader with a fencing term (jobrun.postgres.leader).

Run here directly, and again through PgBouncer in transaction mode
(tests/pgbouncer/test_via_pgbouncer_leader.py), which is what it is for.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import LeaderLost, ValidationError
from jobrun.job.model import LeaderTerm
from jobrun.postgres.leader import LeaseLocker, election_name
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store
from tests.postgres.conftest import counts


def _expire(conn: psycopg.Connection[Any], name: str) -> None:
    """Let the election's lease run out now (as a crashed leader's would)."""
    conn.execute(
        "UPDATE jobrun.leader SET expires_at = now() - interval '1 second' WHERE name = %s",
        [name],
    )


def test_the_first_candidate_gets_term_one_and_a_second_is_refused(store: Store) -> None:
    a, b = LeaseLocker(store, "t"), LeaseLocker(store, "t")
    assert a.try_acquire() is True
    assert a.term() == LeaderTerm(name="scheduler:t", holder=a.holder, term=1)
    assert b.try_acquire() is False
    assert b.term() is None
    row = a.current()
    assert row is not None and row.holder == a.holder and row.term == 1 and row.running


def test_the_leader_renews_its_lease_by_the_database_clock(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    a = LeaseLocker(store, "t", ttl=5)
    assert a.try_acquire()
    first = a.current()
    assert first is not None
    time.sleep(0.05)
    assert a.held(force=True) is True
    again = a.current()
    assert again is not None and again.expires_at > first.expires_at
    assert again.term == 1
    (left,) = conn.execute(
        "SELECT extract(epoch FROM expires_at - now()) FROM jobrun.leader"
        " WHERE name = 'scheduler:t'"
    ).fetchone() or (0,)
    assert 4 < float(left) <= 5


def test_an_expired_lease_is_taken_over_with_the_next_term(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    a, b = LeaseLocker(store, "t"), LeaseLocker(store, "t")
    assert a.try_acquire()
    _expire(conn, "scheduler:t")
    assert b.try_acquire() is True
    assert b.term() is not None and b.term().term == 2  # type: ignore[union-attr]
    # The old leader finds out at its next renewal and steps down.
    assert a.held(force=True) is False
    assert a.losses == 1 and a.term() is None
    assert a.try_acquire() is False


def test_resigning_frees_the_election_at_once_and_terms_keep_growing(store: Store) -> None:
    a, b = LeaseLocker(store, "t"), LeaseLocker(store, "t")
    assert a.try_acquire()
    a.release()
    a.release()  # twice is fine
    assert a.term() is None
    assert b.try_acquire() is True
    assert b.term().term == 2  # type: ignore[union-attr]
    b.close()
    assert a.try_acquire() is True
    assert a.term().term == 3  # type: ignore[union-attr]


def test_a_leader_that_cannot_renew_steps_down_when_its_lease_must_have_run_out(
    store: Store,
) -> None:
    a = LeaseLocker(store, "t", ttl=0.3, check_interval=0.1)
    assert a.try_acquire()
    time.sleep(0.35)
    assert a.held() is False
    assert "ran out" in (a.last_error or "")


def test_a_fenced_store_refuses_every_action_once_its_term_is_over(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    a, b = LeaseLocker(store, "t"), LeaseLocker(store, "t")
    assert a.try_acquire()
    old = a.term()
    assert old is not None
    fenced = store.fenced(old)
    assert fenced.purge(dt.timedelta(days=1), 10) == 0  # accepted while the term runs
    _expire(conn, "scheduler:t")
    assert b.try_acquire()
    before = counts(conn)
    with pytest.raises(LeaderLost) as caught:
        fenced.reap_expired(store.now(), 10)
    assert caught.value.term == old.term
    with pytest.raises(LeaderLost):
        fenced.prune_events(dt.timedelta(days=1), 10)
    assert counts(conn) == before
    # The new term's fence passes.
    new = b.term()
    assert new is not None
    assert store.fenced(new).reap_expired(store.now(), 10).total == 0


def test_a_takeover_waits_for_the_old_terms_action_in_flight(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    """Two leaders never overlap, by the term: term n's action commits before term n + 1."""
    a, b = LeaseLocker(store, "t", ttl=1, check_interval=0.1), LeaseLocker(store, "t")
    assert a.try_acquire()
    term = a.term()
    assert term is not None
    inside, finish = threading.Event(), threading.Event()
    committed_at: list[float] = []

    def action(c: psycopg.Connection[Any]) -> None:
        inside.set()
        finish.wait(10)

    def run() -> None:
        store.fenced(term)._with_tx(action)
        committed_at.append(time.monotonic())

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(10)
    time.sleep(1.2)  # the lease runs out (database clock) while the action holds the row
    assert conn.execute(
        "SELECT expires_at <= now() FROM jobrun.leader WHERE name = 'scheduler:t'"
    ).fetchone() == (True,)
    taken: list[bool] = []
    taker = threading.Thread(target=lambda: taken.append(b.try_acquire()))
    taker.start()
    time.sleep(0.3)
    assert taken == []  # the takeover waits for the old term's transaction
    finish.set()
    thread.join(10)
    taker.join(10)
    assert taken == [True] and committed_at
    row = b.current()
    assert row is not None and row.term == term.term + 1
    assert row.elected_at.timestamp() > 0


@pytest.fixture
def session_dsn(dsn: str) -> str:
    """Where a session lock can be taken (the pooler suite points it past PgBouncer)."""
    return dsn


def test_a_lease_candidate_defers_to_a_session_lock_leader(store: Store, session_dsn: str) -> None:
    """One deployment never elects a second leader by the other mechanism."""
    with AdvisoryLocker(session_dsn, "t") as session_leader:
        if not session_leader.try_acquire():
            pytest.fail("the advisory lock was not free")
        assert LeaseLocker(store, "t").try_acquire() is False
    assert LeaseLocker(store, "t").try_acquire() is True


def test_bad_arguments_are_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError, match="ttl"):
        LeaseLocker(store, ttl=0)
    with pytest.raises(ValidationError, match="check_interval"):
        LeaseLocker(store, ttl=1, check_interval=2)
    with pytest.raises(ValidationError, match="name"):
        election_name("")
    with pytest.raises(ValidationError, match="term"):
        store.fenced(3)  # type: ignore[arg-type]
    assert conn.execute("SELECT count(*) FROM jobrun.leader").fetchone() == (0,)
