"""Waiting for a job to finish, woken by a notification rather than a busy poll.

The source of :mod:`jobrun.postgres.wait` (``make generate``): edit this
file, never the generated one.

The waiter opens one connection of its own (``jobrun-waiter``; a pooled one
would be handed to someone else while it listens), LISTENs on the store's
finish channel, and only then asks for the job to be watched: from that
moment every transition that ends the job sends its id, in the transaction
that ends it, so the notification cannot be missed and cannot come early.
A job that had already finished is answered at once. The job is re-read
every ``poll_interval`` as well: a notification is a hint, the row is the truth.

Behind a transaction pooler a LISTEN would be left on whichever server
session ran it: the waiter connects to the store's ``direct_url`` when it
has one, and otherwise does without notifications, re-reading the job
every ``poll_interval`` (at most 1 s apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import sql

from jobrun.job.errors import WaitTimeout
from jobrun.job.model import Job
from jobrun.postgres.convert import translate_errors
from jobrun.postgres.plans import wait_args
from jobrun.postgres.pool import async_conninfo, conninfo_with, pooler_of

DEFAULT_POLL_INTERVAL = 5.0


async def wait_finished(
    pool: Any,
    job_id: uuid.UUID,
    timeout: float | None,
    *,
    finish_channel: str,
    direct_url: str | None,
    watch: Callable[[uuid.UUID], Awaitable[Job]],
    get: Callable[[uuid.UUID], Awaitable[Job]],
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> Job:
    """The job once it is succeeded, dead or cancelled; WaitTimeout after ``timeout`` s.

    ``watch`` and ``get`` are the store's (the job watched, the job read).
    """
    wait_args(timeout, poll_interval)
    deadline = None if timeout is None else time.monotonic() + timeout
    if direct_url is None and pooler_of(pool) == "transaction":
        every = min(poll_interval, 1.0)
        job = await watch(job_id)
        while not job.state.terminal:
            left = _left(job, deadline, timeout)
            await asyncio.sleep(every if left is None else min(every, left))
            job = await get(job_id)
        return job
    target = direct_url or await async_conninfo(pool)
    conninfo = conninfo_with(target, application_name="jobrun-waiter")
    with translate_errors():
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(finish_channel)))
            job = await watch(job_id)
            wanted = str(job_id)
            while not job.state.terminal:
                left = _left(job, deadline, timeout)
                await _wait_for(
                    conn, wanted, poll_interval if left is None else min(poll_interval, left)
                )
                job = await get(job_id)
            return job


def _left(job: Job, deadline: float | None, timeout: float | None) -> float | None:
    """Seconds left until ``deadline`` (None: no deadline); WaitTimeout once none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise WaitTimeout(job, float(timeout or 0))
    return left


async def _wait_for(conn: psycopg.AsyncConnection[Any], payload: str, seconds: float) -> None:
    """Return when ``payload`` is notified or ``seconds`` have passed."""
    # closing: the generator holds the connection's lock until it is closed.
    async with contextlib.aclosing(conn.notifies(timeout=seconds)) as notes:
        async for note in notes:
            if note.payload == payload:
                return
