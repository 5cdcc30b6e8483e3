"""The processed_effects ledger: the exactly-once half of the transactional path.

Complete inserts ``(scope, key) = EffectKey(job)`` in its transaction *before*
running the handler's commit callable (in its first statement,
CompleteBegin), and runs the callable only when that row is new. Both commit
together or not at all, so a callable's writes land at most once per key,
however many times the job runs (a crash, a lost COMMIT reply, an operator's
retry). Keys are ``("job:" + type, idempotency_key or id)``: across queues,
two jobs of one type and key share one effect.

A commit callable gets the connection *inside* Complete's transaction and may
only run statements on it: committing or rolling back there would split the
effect from the job's own state change, and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

from jobrun.job.errors import CommitRefused
from jobrun.job.model import Job
from jobrun.job.ports import CommitCallable


def run_commit(conn: psycopg.Connection[Any], commit: CommitCallable, job: Job) -> None:
    """Run the handler's commit callable and check that it left the transaction open."""
    _inside(conn, commit, f"the commit callable of job {job.id}", "Complete's transaction")


def run_step(conn: psycopg.Connection[Any], fn: Callable[[Any], Any], job: Job, name: str) -> Any:
    """Run a transactional step's function (:mod:`jobrun.postgres.steps`) and check
    that it left the transaction open; its value is the step's."""
    return _inside(conn, fn, f"step {name!r} of job {job.id}", "the step's transaction")


def _inside(conn: psycopg.Connection[Any], fn: Callable[[Any], Any], who: str, tx: str) -> Any:
    try:
        value = fn(conn)
    except psycopg.ProgrammingError as exc:
        if "forbidden" in str(exc) and ("commit" in str(exc) or "rollback" in str(exc)):
            raise CommitRefused(f"{who} tried to end {tx}") from exc
        raise
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise CommitRefused(
            f"{who} committed or rolled back {tx}; it may only run statements on the connection"
        )
    return value
