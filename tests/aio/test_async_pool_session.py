"""The asyncio pool's new sessions: set up as the sync pool's (drift fix, issue 26).

The sync pool guarded a cold session's first statement against a tiny
database-wide statement_timeout; the asyncio pool ran a bare ``SET TIME ZONE``,
which such a timeout can cancel, so that the pool never handed out a
connection. Both now run the one set-up of :mod:`jobrun.postgres.session`.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from jobrun.postgres.async_store import open_async_pool
from jobrun.postgres.pool import conninfo_with


async def _session_settings(url: str) -> tuple[Any, Any]:
    pool = await open_async_pool(url, concurrency=1, min_size=1, timeout=5.0)
    try:
        async with pool.connection() as c:
            zone = await (await c.execute("SHOW TimeZone")).fetchone()
            timeout = await (await c.execute("SHOW statement_timeout")).fetchone()
        return zone, timeout
    finally:
        await pool.close()


@pytest.mark.parametrize("dsn_timeout", [None, "250ms"])
def test_new_async_sessions_speak_utc_despite_a_tiny_database_statement_timeout(
    dsn: str, database: str, conn: Any, dsn_timeout: str | None
) -> None:
    """Ten cold sessions under a 1 ms database-wide statement_timeout each get
    their UTC time zone and keep the database's (or the DSN's) timeout."""
    conn.execute(f"ALTER DATABASE \"{database}\" SET statement_timeout = '1ms'")
    url = (
        dsn
        if dsn_timeout is None
        else conninfo_with(dsn, options=f"-c statement_timeout={dsn_timeout}")
    )
    try:
        for _ in range(10):  # ten cold sessions
            zone, timeout = asyncio.run(_session_settings(url))
            assert zone == ("UTC",)
            assert timeout == (dsn_timeout or "1ms",)
    finally:
        conn.execute(f'ALTER DATABASE "{database}" RESET statement_timeout')
