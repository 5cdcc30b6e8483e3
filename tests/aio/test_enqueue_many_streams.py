"""enqueue_many streams its payloads into the COPY, in the sync and the asyncio client alike.

The drift this pins: ``AsyncClient.enqueue_many`` built a whole chunk of
jobs (5,000) before it sent the first row, where ``Client.enqueue_many``
sends each row as it reads its payload, so that checking and serialising
overlap the server's inserts and memory stays bounded. Seen from the
database: while the generator hands out a payload of the first chunk, the
client's session is already inside its COPY.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import psycopg
import pytest

from jobrun import AsyncClient, Client
from jobrun.postgres.store import BATCH_CHUNK

Aio = Callable[[Awaitable[Any]], Any]
APP = "jobrun-streams"


def session_of(dsn: str) -> tuple[str, str]:
    """The (state, query) of the client's busy session, from another connection."""
    with psycopg.connect(dsn, autocommit=True) as other:
        rows = other.execute(
            "SELECT state, query FROM pg_stat_activity"
            " WHERE application_name = %s AND state <> 'idle'",
            [APP],
        ).fetchall()
    assert len(rows) == 1, rows
    state, query = rows[0]
    return state, query


@pytest.mark.parametrize("side", ["sync", "async"])
def test_enqueue_many_is_inside_its_copy_while_the_first_chunk_is_read(
    side: str, aio: Aio, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    total = 2 * BATCH_CHUNK + 1
    probe_at = BATCH_CHUNK // 2
    seen: list[tuple[str, str]] = []
    read = 0

    def payloads() -> Iterator[dict[str, int]]:
        nonlocal read
        for i in range(total):
            if i == probe_at:
                seen.append(session_of(dsn))
            read += 1
            yield {"i": i}

    if side == "sync":
        with Client.connect(dsn, application_name=APP) as client:
            result = client.enqueue_many("t", payloads())
    else:

        async def run() -> Any:
            aclient = await AsyncClient.connect(dsn, application_name=APP)
            try:
                return await aclient.enqueue_many("t", payloads())
            finally:
                await aclient.close()

        result = aio(run())
    assert read == total
    assert result.inserted == total
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (total,)
    ((state, query),) = seen
    assert state == "active"
    assert query.lstrip().upper().startswith("COPY"), query
