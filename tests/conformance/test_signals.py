"""client.signal on either client (Client, AsyncClient): stored once per key, the
parked job woken with its queue's workers, refused before writing when it
cannot apply. The wait's side (claim, await_step, park) is the worker's
sync Store."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import InvalidState, NotFound, ValidationError
from jobrun.job.model import EventKind, NewJob, State
from jobrun.postgres.store import Store
from jobrun.workflow import Workflow
from tests.conformance.conftest import TTL, Listener
from tests.conformance.drive import Driven
from tests.postgres.conftest import new_job


def test_a_signal_wakes_the_job_parked_for_it_once_per_key(
    client: Driven,
    worker_store: Store,
    conn: psycopg.Connection[Any],
    listen: Callable[..., Listener],
) -> None:
    job = client.enqueue("signup", {"to": "ada"})
    (claimed,) = worker_store.claim("w", ["default"], 1, TTL)
    turn = worker_store.await_step(claimed, "confirm", "confirmed", 3600.0)
    parked = worker_store.park(claimed, "confirm")
    assert parked.state is State.QUEUED and parked.run_at == turn.until
    listener = listen()
    sent = client.signal(str(job.id), "confirmed", {"ok": True}, key="click")
    assert (sent.job_id, sent.name, sent.key, sent.sent, sent.woke) == (
        job.id,
        "confirmed",
        "click",
        True,
        True,
    )
    assert client.get(job.id).run_at <= client.now()
    assert listener.payloads() == ["default"]  # the queue's workers are woken
    again = client.signal(job.id, "confirmed", {"ok": False}, key="click")
    assert not again.sent and not again.woke
    stored = conn.execute("SELECT key, payload FROM jobrun.job_signals").fetchall()
    assert stored == [("click", {"ok": True})]
    kinds = [e.kind for e in client.events(job.id)]
    assert kinds.count(EventKind.SIGNAL_SENT) == 1


def test_a_signal_without_a_key_is_a_signal_of_its_own(
    client: Driven, conn: psycopg.Connection[Any]
) -> None:
    job = client.enqueue("signup", {})
    first = client.signal(job.id, "tick", 1)
    second = client.signal(job.id, "tick", 1)
    assert first.sent and second.sent and first.key != second.key
    assert len(uuid.UUID(first.key).hex) == 32


def test_a_signal_is_refused_before_anything_is_written(
    client: Driven, worker_store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(NotFound):
        client.signal(uuid.uuid4(), "x")
    job = worker_store.enqueue(new_job(max_attempts=1))
    (claimed,) = worker_store.claim("w", ["default"], 1, TTL)
    worker_store.fail(claimed, "boom", None)
    with pytest.raises(InvalidState, match="cannot signal"):
        client.signal(job.id, "x")
    for name, payload, key in [("", None, None), ("x", {1: 2}, None), ("x", None, "")]:
        with pytest.raises(ValidationError):
            client.signal(job.id, name, payload, key=key)
    assert conn.execute("SELECT count(*) FROM jobrun.job_signals").fetchone() == (0,)


def test_a_signal_to_a_workflow_wakes_its_parked_job_and_is_refused_once_it_finished(
    client: Driven, worker_store: Store, conn: psycopg.Connection[Any]
) -> None:
    wf = Workflow("signup")
    wf.add(NewJob(type="signup", payload={}), name="account")
    run = client.enqueue_workflow(wf)
    (claimed,) = worker_store.claim("w", ["default"], 1, TTL)
    worker_store.await_step(claimed, "confirm", "confirmed", 3600.0)
    worker_store.park(claimed, "confirm")
    sent = client.signal(run.id, "confirmed", {"ok": True}, key="click")
    assert (sent.job_id, sent.workflow_id, sent.sent, sent.woken) == (
        None,
        run.id,
        True,
        (claimed.id,),
    )
    assert not client.signal(str(run.id), "confirmed", None, key="click").sent
    assert client.get(claimed.id).run_at <= client.now()
    client.cancel(claimed.id)
    with pytest.raises(InvalidState, match="cannot signal workflow"):
        client.signal(run.id, "confirmed", None)
    assert conn.execute("SELECT count(*) FROM jobrun.workflow_signals").fetchone() == (1,)
