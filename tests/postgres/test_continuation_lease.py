"""A continuation lease: the child a worker's round releases, leased to that round.

A round (``Store.exchange``) that completes a parent and claims releases the
parent's children and leases the ones its claim would take straight away
(waiting -> leased, migration 0025): the claim returns them with the jobs it
claims, their events are the same as a release then a claim, and the claim's
order, room, starts, pauses, limits and worker types hold as if the claim
had taken them from the queue.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg

import jobrun
from jobrun.job.model import Job, State
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL
from tests.postgres.test_workers_registry import info

OWNER = "w1"


def _parent_with_children(
    store: Store, children: int = 1, queue: str = "q", child_queue: str = "q", **child: Any
) -> tuple[Job, list[uuid.UUID]]:
    """A parent in ``queue`` claimed by OWNER, and its children, waiting."""
    client = jobrun.Client(store)
    parent = client.enqueue("step", queue=queue)
    kids = [
        client.enqueue("child", after=[parent], queue=child_queue, **child).id
        for _ in range(children)
    ]
    [claimed] = store.claim(OWNER, [queue], 1, TTL)
    assert claimed.id == parent.id
    return claimed, kids


def _kinds(store: Store, job_id: uuid.UUID) -> list[tuple[str, Any]]:
    return [(str(e.kind), e.detail) for e in store.events(job_id)]


def _wakes(dsn: str, action: Any) -> list[str]:
    """The wake-ups sent while ``action`` runs (and commits)."""
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN jobrun_jobs")
        action()
        return [n.payload for n in listener.notifies(timeout=0.5)]


def test_the_child_a_round_releases_is_leased_to_that_round_without_a_wake_up(
    store: Store, dsn: str
) -> None:
    parent, [kid] = _parent_with_children(store)
    got: list[Any] = []
    woken = _wakes(
        dsn,
        lambda: got.append(
            store.exchange(OWNER, complete=[parent], queues=["q"], limit=4, ttl=TTL, start_now=4)
        ),
    )
    [answer] = got
    assert answer.completed is not None and answer.completed.completed == {parent.id}
    [child] = answer.claimed
    assert child.id == kid and child.started and child.attempts == 1
    row = store.get(kid)
    assert row.state is State.LEASED and row.lease_owner == OWNER
    assert row.lease_token == child.lease_token
    released, claimed = _kinds(store, kid)[1:]
    assert released == (
        "released",
        {"via": "dependency", "parent": str(parent.id), "parent_state": "succeeded"},
    )
    assert claimed == ("claimed", None)
    assert woken == []  # nobody else needs to look: the round took it
    # The lease is an ordinary one: the child completes with it.
    store.complete(child)
    assert store.get(kid).state is State.SUCCEEDED


def test_a_round_leases_no_more_children_than_its_room_and_starts_only_its_free_threads(
    store: Store, dsn: str
) -> None:
    parent, kids = _parent_with_children(store, children=3)
    got: list[Any] = []
    woken = _wakes(
        dsn,
        lambda: got.append(
            store.exchange(OWNER, complete=[parent], queues=["q"], limit=2, ttl=TTL, start_now=1)
        ),
    )
    claimed = got[0].claimed
    assert [j.id for j in claimed] == kids[:2]  # the claim's order: the oldest first
    assert [(j.started, j.attempts) for j in claimed] == [(True, 1), (False, 0)]
    assert _kinds(store, claimed[1].id)[-1] == ("claimed", {"started": False})
    assert store.get(kids[2]).state is State.QUEUED
    assert woken == ["q"]  # the child left queued wakes the queue's workers


def test_the_round_claims_what_its_room_has_left_after_the_children_it_continues(
    store: Store,
) -> None:
    parent, [kid] = _parent_with_children(store)
    other = jobrun.Client(store).enqueue("plain", queue="q")
    answer = store.exchange(OWNER, complete=[parent], queues=["q"], limit=2, ttl=TTL, start_now=1)
    assert {j.id for j in answer.claimed} == {kid, other.id}
    assert sum(j.started for j in answer.claimed) == 1
    assert store.get(kid).state is State.LEASED and store.get(other.id).state is State.LEASED


def test_a_child_waits_its_turn_behind_a_queued_job_of_better_priority(store: Store) -> None:
    parent, [kid] = _parent_with_children(store, priority=5)
    better = jobrun.Client(store).enqueue("urgent", queue="q", priority=1)
    answer = store.exchange(OWNER, complete=[parent], queues=["q"], limit=1, ttl=TTL)
    assert [j.id for j in answer.claimed] == [better.id]
    assert store.get(kid).state is State.QUEUED


def test_a_child_waits_its_turn_behind_an_older_job_of_another_queue_the_worker_claims(
    store: Store,
) -> None:
    older = jobrun.Client(store).enqueue("plain", queue="first")
    parent, [kid] = _parent_with_children(store)
    answer = store.exchange(OWNER, complete=[parent], queues=["q", "first"], limit=1, ttl=TTL)
    assert [j.id for j in answer.claimed] == [older.id]
    assert store.get(kid).state is State.QUEUED


def test_a_child_in_a_queue_the_round_does_not_claim_or_that_is_paused_is_only_released(
    store: Store,
) -> None:
    parent, [elsewhere] = _parent_with_children(store, child_queue="other")
    answer = store.exchange(OWNER, complete=[parent], queues=["q"], limit=4, ttl=TTL)
    assert answer.claimed == [] and store.get(elsewhere).state is State.QUEUED

    store.pause_queue("held")
    parent, [held] = _parent_with_children(store, child_queue="held")
    answer = store.exchange(OWNER, complete=[parent], queues=["q", "held"], limit=4, ttl=TTL)
    assert answer.claimed == [] and store.get(held).state is State.QUEUED


def test_a_child_of_a_limited_queue_is_claimed_under_its_limits_not_continued(
    store: Store,
) -> None:
    store.set_queue_limits("lim", concurrency=1)
    busy = jobrun.Client(store).enqueue("busy", queue="lim")
    [holding] = store.claim(OWNER, ["lim"], 1, TTL)
    assert holding.id == busy.id
    parent, [kid] = _parent_with_children(store, child_queue="lim")
    answer = store.exchange(OWNER, complete=[parent], queues=["q", "lim"], limit=4, ttl=TTL)
    assert answer.claimed == []  # the limit's one slot is taken
    assert store.get(kid).state is State.QUEUED


def test_a_child_whose_type_the_worker_does_not_know_is_left_for_a_worker_that_does(
    store: Store,
) -> None:
    store.register_worker(info(OWNER, queues=("q",), types=("step",)))
    store.register_worker(info("w2", queues=("q",), types=("child",)))
    parent, [kid] = _parent_with_children(store)
    answer = store.exchange(OWNER, complete=[parent], queues=["q"], limit=4, ttl=TTL)
    assert answer.claimed == []
    assert store.get(kid).state is State.QUEUED
    [taken] = store.claim("w2", ["q"], 4, TTL)
    assert taken.id == kid


def test_a_completion_outside_a_round_only_releases_the_child(store: Store) -> None:
    parent, [kid] = _parent_with_children(store)
    store.complete(parent)
    assert store.get(kid).state is State.QUEUED
    assert [k for k, _ in _kinds(store, kid)] == ["enqueued", "released"]
