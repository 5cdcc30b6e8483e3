"""Why a job is not running, read from the database (``jobrun why``, the dashboard).

The snapshot that :func:`jobrun.job.why.explain` reasons about is read here
by one statement (db/query/why.sql's WhyJob) on one pooled connection, by
the database clock, so that every reason it names holds at one instant:
the job's row, its queue's pause and limits, the leases filling them, the
rate window, the jobs ahead of it and the live workers serving its queue.
Every count is bounded and read through an index; reading costs the same
in a queue of a million jobs.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

import psycopg

from jobrun.job.errors import NotFound, ValidationError
from jobrun.job.model import State
from jobrun.job.why import Diagnosis, Snapshot, explain
from jobrun.postgres.sqlc.why import Queries

if TYPE_CHECKING:
    from jobrun.postgres.store import Store

HOLDERS_SHOWN = 5
"""How many of the jobs holding a limit's slots a diagnosis names."""
AHEAD_CAP = 10_000
"""The jobs ahead of one are counted up to this many ("at least 10,000")."""


class Diagnose:
    """Reads what holds jobs back, on a Store's pool, in the Store's schema."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.q = Queries(schema=store.schema)

    def why(self, job_id: uuid.UUID) -> Diagnosis:
        """What holds ``job_id`` back, by the database's state now; NotFound if no such job."""
        if not isinstance(job_id, uuid.UUID):
            raise ValidationError("job_id", f"must be a uuid.UUID, not {type(job_id).__name__}")

        def read(conn: psycopg.Connection[Any]) -> Diagnosis:
            row = self.q.why_job(conn, id=job_id, holders=HOLDERS_SHOWN, ahead_cap=AHEAD_CAP)
            if row is None:
                raise NotFound("job", job_id)
            return explain(
                Snapshot(
                    id=row.id,
                    state=State(row.state),
                    queue=row.queue,
                    type=row.type,
                    run_at=row.run_at,
                    concurrency_key=row.concurrency_key,
                    cancel_requested=row.cancel_requested,
                    lease_owner=row.lease_owner,
                    lease_expires_at=row.lease_expires_at,
                    db_now=row.db_now,
                    paused_at=row.paused_at,
                    concurrency_limit=row.concurrency_limit,
                    per_key_limit=row.per_key_limit,
                    rate_limit=row.rate_limit,
                    rate_period_seconds=row.rate_period_seconds,
                    leased_in_queue=row.leased_in_queue,
                    queue_holders=tuple(row.queue_holders),
                    leased_for_key=row.leased_for_key,
                    key_holders=tuple(row.key_holders),
                    rate_used=row.rate_used,
                    rate_frees_at=row.rate_frees_at,
                    ahead=row.ahead,
                    ahead_cap=AHEAD_CAP,
                    serving=tuple(row.serving),
                    knowing=row.knowing,
                    pending_parents=row.pending_parents,
                    waiting_step=row.waiting_step,
                    waiting_signal=row.waiting_signal,
                )
            )

        return self.store._on_pool_read(read)
