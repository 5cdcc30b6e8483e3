"""Every call on a pooled connection is bounded by the store's ``call_timeout``.

A call past its deadline has its socket shut, fails as a connection fault
(TransientError), and the pool drops that connection: the next call gets a
fresh one. A batch is not bounded (a streamed batch may take minutes).
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import ConnectionUnavailable, OutcomeUnknown, TransientError
from jobrun.job.model import State
from tests.conformance.drive import Caller, Driven, Flavour
from tests.postgres.conftest import counts, new_job

BOUND = dt.timedelta(milliseconds=500)


def test_a_call_waiting_past_the_call_timeout_fails_as_a_connection_fault(
    make_store: Callable[..., Driven], dsn: str
) -> None:
    store = make_store(call_timeout=BOUND)
    job = store.enqueue(new_job())
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT 1 FROM jobrun.jobs WHERE id = %s FOR UPDATE", [job.id])
        started = time.monotonic()
        with pytest.raises(TransientError):
            store.cancel(job.id)  # waits on the row lock: cut at the deadline
        assert time.monotonic() - started < 10
    assert store.cancel(job.id).state is State.CANCELLED  # on a fresh connection


def test_an_enqueue_waiting_on_a_key_past_the_call_timeout_is_an_unknown_outcome(
    make_store: Callable[..., Driven], caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    store = make_store(call_timeout=BOUND)
    holder = caller()
    store.enqueue(new_job(idempotency_key="k"), conn=holder)  # not committed yet
    spec = new_job(idempotency_key="k", payload={"mine": True})
    started = time.monotonic()
    # A lone write cut mid-way: whether it committed cannot be known (the
    # server may still run it once the holder lets go).
    with pytest.raises(OutcomeUnknown):
        store.enqueue(spec)  # waits for the holder's verdict
    assert time.monotonic() - started < 10
    holder.rollback()
    assert store.enqueue(spec).id == spec.id  # the retry the error asks for: one job
    assert counts(conn) == (1, 1, 0)


def test_a_batch_is_not_bounded_by_the_call_timeout(
    make_store: Callable[..., Driven], caller: Callable[..., Caller], conn: psycopg.Connection[Any]
) -> None:
    store = make_store(call_timeout=BOUND)
    holder = caller()
    store.enqueue(new_job(idempotency_key="k"), conn=holder)
    release = threading.Timer(2 * BOUND.total_seconds(), holder.rollback)
    release.start()
    try:
        result = store.enqueue_batch([new_job(), new_job(idempotency_key="k")])
    finally:
        release.join()
    assert result.inserted == 2
    assert counts(conn) == (2, 2, 0)


def test_a_call_finding_the_pool_exhausted_fails_after_the_pool_timeout(
    flavour: Flavour, dsn: str, store_on: Callable[..., Driven]
) -> None:
    pool = flavour.open_pool(dsn, concurrency=1, min_size=1, max_size=2, timeout=0.5)
    taken = [flavour.getconn(pool) for _ in range(2)]
    try:
        store = store_on(pool)
        started = time.monotonic()
        with pytest.raises(ConnectionUnavailable):
            store.get(uuid.uuid4())
        assert time.monotonic() - started < 10
    finally:
        for conn in taken:
            flavour.putconn(pool, conn)
        flavour.close_pool(pool)
