"""Waiting for a job to finish, woken by a notification rather than a busy poll.

The waiter opens one connection of its own (``jobrun-waiter``; a pooled one
would be handed to someone else while it listens), LISTENs on the Store's
finish channel, and only then asks for the job to be watched
(:meth:`Store.watch <jobrun.postgres.store.Store.watch>`): from that
moment every transition that ends the job sends its id, in the transaction
that ends it, so the notification cannot be missed and cannot come early.
A job that had already finished is answered at once. The job is re-read
every ``poll_interval`` as well: a notification is a hint (the notification
queue may be full, a connection may drop), the row is the truth.

Behind a transaction pooler a LISTEN would be left on whichever server
session ran it: the waiter connects to the Store's ``direct_url`` when it
has one, and otherwise does without notifications, re-reading the job
every ``poll_interval`` (at most 1 s apart).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from jobrun.job import validate
from jobrun.job.errors import ValidationError, WaitTimeout
from jobrun.job.model import Job
from jobrun.postgres.convert import translate_errors
from jobrun.postgres.pool import conninfo_with, pooler_of

if TYPE_CHECKING:
    from jobrun.postgres.store import Store

DEFAULT_POLL_INTERVAL = 5.0


def wait_finished(
    store: Store,
    job_id: uuid.UUID,
    timeout: float | None,
    *,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> Job:
    """The job once it is succeeded, dead or cancelled; WaitTimeout after ``timeout`` s."""
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
    ):
        raise ValidationError("timeout", "must be a number of seconds >= 0, or None")
    if isinstance(poll_interval, bool) or not isinstance(poll_interval, int | float):
        raise ValidationError("poll_interval", "must be a number of seconds")
    validate.positive_duration("poll_interval", dt.timedelta(seconds=poll_interval))
    deadline = None if timeout is None else time.monotonic() + timeout
    pooled = store.pool.conninfo
    target = store.direct_url
    if target is None and pooler_of(store.pool) == "transaction":
        return _poll_finished(store, job_id, deadline, timeout, min(poll_interval, 1.0))
    conninfo = conninfo_with(
        target or (pooled() if callable(pooled) else pooled), application_name="jobrun-waiter"
    )
    with translate_errors(), psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(store.finish_channel)))
        job = store.watch(job_id)
        wanted = str(job_id)
        while not job.state.terminal:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise WaitTimeout(job, float(timeout or 0))
            slice_ = poll_interval if left is None else min(poll_interval, left)
            _wait_for(conn, wanted, slice_)
            job = store.get(job_id)
        return job


def _poll_finished(
    store: Store, job_id: uuid.UUID, deadline: float | None, timeout: float | None, every: float
) -> Job:
    """:func:`wait_finished` without notifications: the row, every ``every`` seconds."""
    job = store.watch(job_id)
    while not job.state.terminal:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise WaitTimeout(job, float(timeout or 0))
        time.sleep(every if left is None else min(every, left))
        job = store.get(job_id)
    return job


def _wait_for(conn: psycopg.Connection[Any], payload: str, seconds: float) -> None:
    """Return when ``payload`` is notified or ``seconds`` have passed."""
    for note in conn.notifies(timeout=seconds):
        if note.payload == payload:
            return
