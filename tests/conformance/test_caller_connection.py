"""Enqueue on the caller's own connection (``conn=``), on either store.

Inside the caller's transaction the enqueue runs in a savepoint: the job,
its event and its wake-up exist only if the caller commits, and a failure
leaves the caller's transaction usable. A connection not in autocommit mode
is in the caller's transaction from its first statement on, the enqueue's
own included; only an autocommit connection gets a transaction of its own.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import AlreadyExists, IdempotencyConflict, ValidationError
from jobrun.job.model import State
from tests.conformance.conftest import Listener, delays
from tests.conformance.drive import Caller, Driven
from tests.postgres.conftest import counts, new_job


def test_a_job_enqueued_in_the_callers_transaction_exists_and_wakes_only_once_it_commits(
    store: Driven,
    caller: Callable[..., Caller],
    conn: psycopg.Connection[Any],
    listen: Callable[..., Listener],
) -> None:
    listener = listen()
    c = caller()
    c.execute("CREATE TEMP TABLE orders (id int)")
    job = store.enqueue(new_job(), conn=c)
    store.enqueue_batch([new_job(), new_job(idempotency_key="k")], conn=c)
    assert listener.payloads() == []
    assert counts(conn) == (0, 0, 0)  # not visible before COMMIT
    c.commit()
    assert listener.payloads() == ["default"]
    assert counts(conn) == (3, 3, 0)
    assert store.get(job.id).state is State.QUEUED


def test_a_job_enqueued_in_the_callers_transaction_is_stamped_with_its_clock(
    store: Driven, caller: Callable[..., Caller]
) -> None:
    """now() is the caller's transaction's start, by the database clock."""
    c = caller()
    ((started,),) = c.execute("SELECT now()")
    time.sleep(0.05)
    job = store.enqueue(new_job(), conn=c)
    c.commit()
    assert job.created_at == job.run_at == started


def test_a_rolled_back_caller_leaves_no_job_no_event_and_no_wakeup(
    store: Driven,
    client: Driven,
    caller: Callable[..., Caller],
    conn: psycopg.Connection[Any],
    listen: Callable[..., Listener],
) -> None:
    listener = listen()
    c = caller()
    c.execute("CREATE TEMP TABLE t (x int)")
    store.enqueue(new_job(delay=dt.timedelta(minutes=1)), conn=c)
    store.enqueue_batch([new_job(), new_job(idempotency_key="k")], conn=c)
    client.enqueue_many("t", [{"i": 1}, {"i": 2}], conn=c)
    c.rollback()
    assert listener.payloads() == []
    assert counts(conn) == (0, 0, 0)


def test_a_first_enqueue_on_a_connection_not_in_autocommit_joins_the_callers_transaction(
    store: Driven, client: Driven, caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    # psycopg's default: the caller's transaction begins with its first
    # statement, which here is the enqueue itself.
    c = caller()
    store.enqueue(new_job(), conn=c)
    c.rollback()
    c = caller()
    client.enqueue_many("t", [{"i": 1}], conn=c)
    c.rollback()
    assert counts(conn) == (0, 0, 0)
    c = caller()
    job = store.enqueue(new_job(), conn=c)
    store.enqueue_batch([new_job()], conn=c)
    assert counts(conn) == (0, 0, 0)
    c.commit()
    assert counts(conn) == (2, 2, 0)
    assert store.get(job.id).state is State.QUEUED


def test_a_failed_enqueue_leaves_the_callers_transaction_usable(
    store: Driven, caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    stored = store.enqueue(new_job(idempotency_key="k", payload={"a": 1}))
    c = caller()
    c.execute("CREATE TEMP TABLE t (x int)")
    with pytest.raises(IdempotencyConflict):
        store.enqueue(new_job(idempotency_key="k", payload={"a": 2}), conn=c)
    with pytest.raises(AlreadyExists):
        store.enqueue(new_job(id=stored.id, idempotency_key="fresh"), conn=c)
    with pytest.raises(IdempotencyConflict):
        store.enqueue_batch([new_job(), new_job(idempotency_key="k", payload={"a": 3})], conn=c)
    c.execute("INSERT INTO t VALUES (1)")  # still usable
    other = store.enqueue(new_job(), conn=c)
    c.commit()
    assert counts(conn) == (2, 2, 0)  # the stored job and the other one, nothing of the rest
    assert store.get(other.id).state is State.QUEUED


def test_an_autocommit_connection_gets_a_transaction_of_its_own(
    store: Driven, caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    c = caller(autocommit=True)
    job = store.enqueue(new_job(), conn=c)
    assert store.get(job.id).state is State.QUEUED  # committed before the call returned
    store.enqueue(new_job(idempotency_key="k", payload={"a": 1}), conn=c)
    with pytest.raises(IdempotencyConflict):  # and a batch is still all or nothing
        store.enqueue_batch(
            [new_job(), new_job(idempotency_key="k", payload={"a": 2}), new_job()], conn=c
        )
    assert counts(conn) == (2, 2, 0)


def test_an_aborted_transaction_or_something_else_than_a_connection_is_a_validation_error(
    store: Driven, caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    c = caller()
    with pytest.raises(psycopg.errors.DivisionByZero):
        c.execute("SELECT 1/0")
    with pytest.raises(ValidationError, match="aborted"):
        store.enqueue(new_job(), conn=c)
    with pytest.raises(ValidationError, match="aborted"):
        store.enqueue_batch([new_job()], conn=c)
    with pytest.raises(ValidationError):
        store.enqueue(new_job(), conn=object())
    assert counts(conn) == (0, 0, 0)


def test_the_returned_job_speaks_utc_whatever_the_callers_time_zone(
    store: Driven, caller: Callable[..., Caller]
) -> None:
    c = caller()
    c.execute("SET TIME ZONE 'Asia/Tokyo'")
    job = store.enqueue(new_job(run_at=dt.datetime(2031, 1, 1, tzinfo=dt.UTC)), conn=c)
    c.commit()
    assert job.created_at.tzinfo is dt.UTC and job.run_at.tzinfo is dt.UTC
    assert job == store.get(job.id)


def test_a_delayed_job_in_the_callers_transaction_wakes_its_queue_at_commit_with_its_delay(
    store: Driven, caller: Callable[..., Caller], listen: Callable[..., Listener]
) -> None:
    listener = listen()
    c = caller()
    store.enqueue(new_job(queue="later", delay=dt.timedelta(minutes=1)), conn=c)
    assert listener.payloads() == []
    c.commit()
    (ms,) = delays(listener.payloads(), "later")
    assert 50_000 < ms <= 60_000
