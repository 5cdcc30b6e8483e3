"""The pools the stores run on (``open_pool``, ``open_async_pool``): size, sessions, errors.

Every timestamp jobrun reads must come back in UTC, so a pooled session's
set-up says ``SET TIME ZONE 'UTC'``; that set-up is a cold session's first
statement, which a tiny database- or role-wide ``statement_timeout`` must
not cancel (the pool would then never hand out a connection).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import TransientError, ValidationError
from jobrun.job.model import State
from jobrun.postgres.embedded import free_port
from jobrun.postgres.pool import RESERVED_CONNECTIONS
from tests.conformance.drive import Driven, Flavour
from tests.postgres.conftest import new_job


@pytest.fixture
def tokyo(conn: psycopg.Connection[Any], database: str) -> Iterator[None]:
    """The test's database speaks Asia/Tokyo unless a session says otherwise."""
    conn.execute(f"ALTER DATABASE \"{database}\" SET TimeZone = 'Asia/Tokyo'")
    yield
    conn.execute(f'ALTER DATABASE "{database}" RESET TimeZone')


def test_a_pool_is_sized_for_its_concurrency_plus_the_reserve(flavour: Flavour, dsn: str) -> None:
    pool = flavour.open_pool(dsn, concurrency=3)
    try:
        assert pool.max_size == 3 + RESERVED_CONNECTIONS
    finally:
        flavour.close_pool(pool)


def test_a_pooled_session_is_autocommit_speaks_utc_and_says_its_role(
    flavour: Flavour, dsn: str, conn: psycopg.Connection[Any], tokyo: None
) -> None:
    pool = flavour.open_pool(dsn, concurrency=1, application_name="jobrun-test")
    try:
        with flavour.pooled(pool) as session:
            assert session.raw.autocommit
            assert session.execute("SHOW TimeZone") == [("UTC",)]
            pid = session.raw.info.backend_pid
        row = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        assert row == ("jobrun-test",)
    finally:
        flavour.close_pool(pool)


def test_a_tiny_database_statement_timeout_never_cancels_a_new_sessions_set_up(
    flavour: Flavour,
    dsn: str,
    database: str,
    conn: psycopg.Connection[Any],
    tokyo: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nine cold sessions set up under a 1 ms database-wide statement_timeout: each
    on its first try (no "statement timeout" while connecting), each in UTC, each
    keeping the database's timeout for its own statements.

    The pool is opened before the timeout is set (its ping, a cold session's
    first catalog read, would be cancelled too); the sessions it then opens to
    lend ten at once are set up under it. The time zone is read from the
    server's report (ParameterStatus), without a statement.
    """
    pool = flavour.open_pool(dsn, concurrency=10, min_size=1, max_size=10, timeout=10.0)
    try:
        conn.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '1ms'")
        with caplog.at_level(logging.INFO):
            sessions = [flavour.getconn(pool) for _ in range(10)]
        try:
            assert len({s.info.backend_pid for s in sessions}) == 10
            assert {s.info.parameter_status("TimeZone") for s in sessions} == {"UTC"}
            try:
                shown = flavour.connect_of(sessions[-1]).execute("SHOW statement_timeout")
            except psycopg.errors.QueryCanceled:
                shown = [("1ms",)]  # cancelled by it: the session kept the tiny timeout
            assert shown == [("1ms",)]
        finally:
            for s in sessions:
                flavour.putconn(pool, s)
    finally:
        conn.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')
        flavour.close_pool(pool)
    cancelled = [r.getMessage() for r in caplog.records if "statement timeout" in r.getMessage()]
    assert cancelled == []


def test_a_pool_wants_a_positive_int_concurrency_before_connecting(flavour: Flavour) -> None:
    nowhere = f"postgresql://jobrun@127.0.0.1:{free_port()}/jobrun?connect_timeout=2"
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValidationError):
            flavour.open_pool(nowhere, concurrency=bad)


def test_an_unreachable_server_is_a_transient_error_without_the_password(flavour: Flavour) -> None:
    canary = "s3cr3t-canary-pw"
    url = f"postgresql://jobrun:{canary}@127.0.0.1:{free_port()}/jobrun?connect_timeout=2"
    with pytest.raises(TransientError) as info:
        flavour.open_pool(url)
    assert "cannot connect to PostgreSQL at jobrun@127.0.0.1" in str(info.value)
    assert canary not in str(info.value) and canary not in repr(info.value)


def test_behind_a_transaction_pooler_no_session_state_and_every_time_still_in_utc(
    flavour: Flavour, dsn: str, tokyo: None, store_on: Callable[..., Driven]
) -> None:
    """A pooler in transaction mode may run each transaction on another server
    session: the pool sets no session state (its sessions keep the database's
    time zone), and the stores make every timestamp UTC themselves."""
    pool = flavour.open_pool(dsn, concurrency=1, pooler="transaction")
    try:
        with flavour.pooled(pool) as session:
            assert session.execute("SHOW TimeZone") == [("Asia/Tokyo",)]
        store = store_on(pool)
        job = store.enqueue(new_job())
        assert job.created_at.tzinfo is dt.UTC and job.run_at.tzinfo is dt.UTC
        assert store.get(job.id) == job
        store.cancel(job.id)
        # No LISTEN behind such a pooler: wait re-reads the row instead.
        assert store.wait(job.id, timeout=5, poll_interval=0.1).state is State.CANCELLED
        assert store.now().tzinfo is dt.UTC  # the database clock, in UTC
    finally:
        flavour.close_pool(pool)
