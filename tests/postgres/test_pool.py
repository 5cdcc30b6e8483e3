"""The pool: production limits, roles in application_name, clear and secret-free errors."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from jobrun.job.errors import TransientError, ValidationError
from jobrun.job.validate import redact
from jobrun.postgres.embedded import free_port, throwaway_cluster
from jobrun.postgres.pool import RESERVED_CONNECTIONS, conninfo_with, open_pool

CANARY = "s3cr3t-canary-pw"


def test_pool_size_is_concurrency_plus_the_reserve(dsn: str) -> None:
    pool = open_pool(dsn, concurrency=4)
    try:
        assert pool.max_size == 4 + RESERVED_CONNECTIONS
        with pool.connection() as c:
            assert c.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_pool_connections_say_their_role_and_speak_utc(dsn: str, conn: Any) -> None:
    pool = open_pool(dsn, concurrency=1)
    try:
        with pool.connection() as c:
            pid = c.info.backend_pid
            assert c.execute("SHOW TimeZone").fetchone() == ("UTC",)
            assert c.autocommit
        (name,) = conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid]
        ).fetchone()
        assert name == "jobrun-pool"
    finally:
        pool.close()


def test_unreachable_server_is_a_clear_transient_error_without_the_password() -> None:
    url = f"postgresql://jobrun:{CANARY}@127.0.0.1:{free_port()}/jobrun?connect_timeout=2"
    with pytest.raises(TransientError) as info:
        open_pool(url)
    text = str(info.value)
    assert "cannot connect to PostgreSQL at jobrun@127.0.0.1" in text
    assert CANARY not in text
    assert CANARY not in repr(info.value)
    assert info.value.__cause__ is None or CANARY not in str(info.value.__cause__)


def test_wrong_password_is_a_clear_error_without_the_password() -> None:
    # A cluster of our own: its roles other than postgres must authenticate.
    with throwaway_cluster() as cluster, psycopg.connect(cluster.dsn(), autocommit=True) as c:
        c.execute(f"CREATE ROLE canary LOGIN PASSWORD '{CANARY}x'")
        url = f"postgresql://canary:{CANARY}@127.0.0.1:{cluster.port}/postgres"
        with pytest.raises(TransientError) as info:
            open_pool(url)
        assert "password authentication failed" in str(info.value)
        assert CANARY not in str(info.value)


def test_a_malformed_dsn_is_a_validation_error_without_the_password() -> None:
    with pytest.raises(ValidationError) as info:
        conninfo_with(f"host=x password={CANARY} =broken")
    assert CANARY not in str(info.value)


def test_client_side_bounds_are_added_unless_given() -> None:
    params = psycopg.conninfo.conninfo_to_dict(conninfo_with("host=db connect_timeout=3"))
    assert params["connect_timeout"] == "3"
    assert params["keepalives"] == "1" and "keepalives_idle" in params


@pytest.mark.parametrize(
    "text",
    [
        f"postgresql://u:{CANARY}@h/db",
        f"postgres://u:{CANARY}@h:5432/db?sslmode=require",
        f"host=h password={CANARY} user=u",
        f"host=h password='{CANARY} x' user=u",
        f"error near PASSWORD = {CANARY}",
    ],
)
def test_redact_removes_passwords(text: str) -> None:
    assert CANARY not in redact(text)


def test_concurrency_must_be_positive(dsn: str) -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValidationError):
            open_pool(dsn, concurrency=bad)  # type: ignore[arg-type]


def show_under_a_tiny_timeout(conn: Any, setting: str) -> str:
    """SHOW ``setting`` in a session whose own statements may time out after 1 ms:
    on a loaded machine even a SHOW can, and its value is what is checked, not
    its speed, so a cancelled SHOW is asked again."""
    for _ in range(200):
        try:
            row = conn.execute(f"SHOW {setting}").fetchone()
        except psycopg.errors.QueryCanceled:
            continue
        assert row is not None
        return str(row[0])
    raise AssertionError(f"SHOW {setting} was cancelled 200 times in a row")


@pytest.mark.parametrize("dsn_timeout", [None, "250ms"])
def test_new_sessions_speak_utc_and_keep_the_database_or_dsn_statement_timeout(
    dsn: str, database: str, conn: Any, dsn_timeout: str | None
) -> None:
    """The session set-up (UTC) switches the timeout off for itself only, so that a
    1 ms database timeout cannot cancel a cold session's first statement (the fault
    suite's tiny-timeouts scenario), and gives the session its own timeout back."""
    conn.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '1ms'")
    url = (
        dsn
        if dsn_timeout is None
        else conninfo_with(dsn, options=f"-c statement_timeout={dsn_timeout}")
    )
    try:
        for _ in range(10):  # ten cold sessions
            pool = open_pool(url, concurrency=1, min_size=1, timeout=5.0)
            try:
                with pool.connection() as c:
                    assert c.info.parameter_status("TimeZone") == "UTC"  # reported, no statement
                    expected = dsn_timeout or "1ms"
                    assert show_under_a_tiny_timeout(c, "statement_timeout") == expected
            finally:
                pool.close()
    finally:
        conn.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')
