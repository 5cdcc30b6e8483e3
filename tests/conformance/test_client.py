"""The clients' own part, on either flavour: connect, its settings, ids given as text.

``Client.connect`` and ``AsyncClient.connect`` take the same arguments and
settings, check the schema once, and own (close) the pool they opened.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobrun.aio import AsyncClient
from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import ConnectionUnavailable, NotFound, SchemaMismatch, TransientError
from jobrun.job.model import State
from tests.conformance.conftest import Listener
from tests.conformance.drive import Driven, Flavour


@pytest.fixture
def connect(flavour: Flavour) -> Iterator[Callable[..., Driven]]:
    """``connect(url, **options)``: ``Client.connect`` or ``AsyncClient.connect``; closed after."""
    opened: list[Driven] = []

    def make(*args: Any, **options: Any) -> Driven:
        cls: Any = Client if flavour.name == "sync" else AsyncClient
        client = flavour.drive(flavour.call(lambda: cls.connect(*args, **options)))
        opened.append(client)
        return client

    yield make
    for client in opened:
        client.close()


def test_connect_takes_the_store_settings_and_close_closes_its_pool(
    connect: Callable[..., Driven], dsn: str, listen: Callable[..., Listener]
) -> None:
    settings = Settings(
        database_url=dsn,
        notify_channel="other_channel",
        job_events="terminal",
        call_timeout=dt.timedelta(seconds=3),
    )
    client = connect(settings=settings)
    store = client.store
    assert (store.notify_channel, store.finish_channel) == ("other_channel", "other_channel_done")
    assert store.call_timeout == 3.0
    listener = listen("other_channel")
    job = client.enqueue("t")
    assert listener.payloads() == ["default"]
    assert client.events(job.id) == []  # terminal: no "enqueued" event
    assert client.now().tzinfo is dt.UTC
    client.close()
    assert store.pool.closed


def test_connect_to_a_database_never_migrated_is_a_schema_mismatch(
    connect: Callable[..., Driven], empty_dsn: str
) -> None:
    with pytest.raises(SchemaMismatch):
        connect(empty_dsn)


def test_connect_to_nothing_is_a_transient_error_without_the_password(
    connect: Callable[..., Driven],
) -> None:
    with pytest.raises(TransientError) as info:
        connect("postgresql://someone:s3cret@127.0.0.1:1/nodb?connect_timeout=2")
    assert "s3cret" not in str(info.value)


def test_the_pool_timeout_bounds_the_wait_for_a_pooled_connection(
    flavour: Flavour, connect: Callable[..., Driven], dsn: str
) -> None:
    client = connect(dsn, pool_size=1, pool_timeout=0.5)
    pool = client.store.pool
    taken = [flavour.getconn(pool) for _ in range(pool.max_size)]
    try:
        started = time.monotonic()
        with pytest.raises(ConnectionUnavailable):
            client.get(uuid.uuid4())
        assert time.monotonic() - started < 10
    finally:
        for conn in taken:
            flavour.putconn(pool, conn)


def test_a_job_id_may_be_given_as_text(client: Driven) -> None:
    job = client.enqueue("t", {"a": 1})
    assert client.get(str(job.id)) == job
    assert [e.kind for e in client.events(str(job.id))] == ["enqueued"]
    assert [j.id for j in client.list(after=str(uuid.UUID(int=0)))] == [job.id]
    assert client.cancel(str(job.id)).state is State.CANCELLED
    assert client.retry(str(job.id)).state is State.QUEUED
    with pytest.raises(NotFound):
        client.get(str(uuid.uuid4()))
