"""Handlers for the fault-injection suite (``jobrun worker --app tests.faults.app:registry``).

Every handler appends to the **side log** (one JSON line per record, written
with a single ``os.write`` on an ``O_APPEND`` file, so it survives ``kill -9``)
in ``$JOBRUN_FAULTS_LOG/<pid>.jsonl``: ``start`` when it begins (with the
attempt's lease token), ``end`` when it returns, ``commit`` when its commit
callable runs. Transactional handlers (types ``tx.*``) write their effect
into the ``effects`` table from their commit callable, so the oracle can
count effects per key.

Payload knobs (every one optional):

``sleep``            seconds the handler works (``sleep_attempts`` limits it
                     to those attempt numbers; ``sleeps`` maps an attempt
                     number, as a string, to its own duration)
``honour_cancel``    wait on the cancel token instead of sleeping (default true)
``fail_attempts``    attempt numbers on which the handler raises
``commit_pg_sleep``  seconds of ``pg_sleep`` inside the commit callable
                     (``commit_sleep_attempts`` limits it to those attempts)
``commit_py_sleep``  seconds of Python sleep inside the commit callable (the
                     transaction sits idle meanwhile)
``leak_dsn``         the error raised quotes $DATABASE_URL (password included)
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

import psycopg

from jobrun import Job, JobContext, Registry
from jobrun.job.model import EffectKey

LOG_ENV = "JOBRUN_FAULTS_LOG"

registry = Registry()

_fds: dict[tuple[int, str], int] = {}


def side_log(event: str, job: Job, **extra: Any) -> None:
    """Append one record to this process's side log (a no-op without $JOBRUN_FAULTS_LOG)."""
    directory = os.environ.get(LOG_ENV)
    if not directory:
        return
    pid = os.getpid()
    fd = _fds.get((pid, directory))
    if fd is None:
        fd = os.open(
            os.path.join(directory, f"{pid}.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644
        )
        _fds[(pid, directory)] = fd
    record = {
        "event": event,
        "job": str(job.id),
        "type": job.type,
        "token": str(job.lease_token),
        "attempt": job.attempts,
        "owner": job.lease_owner,
        "pid": pid,
        "t": time.time(),
        **extra,
    }
    os.write(fd, (json.dumps(record) + "\n").encode())


def _applies(payload: dict[str, Any], key: str, attempt: int) -> bool:
    only = payload.get(key)
    return only is None or attempt in only


def _work(ctx: JobContext, job: Job) -> None:
    p = job.payload
    side_log("start", job)
    seconds = float(p.get("sleeps", {}).get(str(job.attempts), p.get("sleep", 0)))
    if seconds and _applies(p, "sleep_attempts", job.attempts):
        if p.get("honour_cancel", True):
            ctx.cancelled.wait(seconds)
        else:
            time.sleep(seconds)
    if job.attempts in p.get("fail_attempts", ()):
        side_log("raise", job)
        # An application error that quotes its connection string, as real ones do.
        leak = os.environ.get("DATABASE_URL", "") if p.get("leak_dsn") else ""
        raise RuntimeError(f"attempt {job.attempts} fails on purpose {leak}".strip())
    side_log("end", job, cancelled=ctx.is_cancelled)


def commit_for(job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    p = job.payload

    def commit(conn: psycopg.Connection[Any]) -> None:
        side_log("commit", job)
        pg_sleep = float(p.get("commit_pg_sleep", 0))
        if pg_sleep and _applies(p, "commit_sleep_attempts", job.attempts):
            conn.execute("SELECT pg_sleep(%s)", [pg_sleep])
        py_sleep = float(p.get("commit_py_sleep", 0))
        if py_sleep and _applies(p, "commit_sleep_attempts", job.attempts):
            time.sleep(py_sleep)
        key = EffectKey.of(job)
        conn.execute(
            "INSERT INTO effects (scope, key, job_id, attempt, token, pid)"
            " VALUES (%s, %s, %s, %s, %s, %s)",
            [key.scope, key.key, job.id, job.attempts, job.lease_token, os.getpid()],
        )

    return commit


@registry.handler("tx.work")
def tx_work(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    """Transactional: its effect row is written by its commit callable, exactly once."""
    _work(ctx, job)
    return commit_for(job)


@registry.handler("tx.tick")
def tx_tick(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    """The cron target: one effect per occurrence."""
    side_log("start", job)
    return commit_for(job)


@registry.handler("plain.work")
def plain_work(ctx: JobContext, job: Job) -> None:
    """The batched path (complete_many): at-least-once, no effect row of its own."""
    _work(ctx, job)


@registry.handler("plain.fast")
def plain_fast(ctx: JobContext, job: Job) -> None:
    """As little work as possible: one side-log line (the load test)."""
    side_log("start", job)


@registry.handler("tx.limited")
def tx_limited(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    """A job of a limited queue (tests/faults/test_limits.py): transactional like
    ``tx.work`` (payload ``sleep``), its side-log records also name its queue and
    concurrency key, so that a test can count the runs in progress per queue and key."""
    side_log("start", job, queue=job.queue, key=job.concurrency_key)
    seconds = float(job.payload.get("sleep", 0))
    if seconds:
        ctx.cancelled.wait(seconds)
    side_log("end", job, queue=job.queue, key=job.concurrency_key)
    return commit_for(job)
