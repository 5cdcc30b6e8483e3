"""The worker's round trip: complete, start and claim in one transaction.

A pipelined worker (:mod:`jobrun.worker.claimer`) keeps a buffer of jobs
claimed ahead of its free threads. Each of its rounds has up to three things
to tell the database: the successes its handlers returned since the last
round (to complete), the buffered jobs its freed threads are about to run
(to start: their attempt counts now, see migration 0010), and how many jobs
to claim next. Sent apart, they are three round trips and three commits;
here they are one transaction sent in one pipeline, so the database's
per-transaction cost and the network's latency are paid once per round,
whatever the batch sizes.

The transaction commits synchronously when it completes jobs (a success is
durable once COMMIT answers, as :meth:`Completion.complete_many` promises),
asynchronously otherwise, like a claim alone (a claim or a start lost in a
server crash is a job that never ran, and the fence keeps it safe). The
claim statements switch ``synchronous_commit`` off for their transaction,
so a round that completes jobs puts back the session's setting after its
claim. A fault leaves all three undone, or (OutcomeUnknown) all three
unknown: completing, starting and claiming again are each safe to repeat.

:meth:`Exchange.unclaim` gives a stopping worker's buffer back at once.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, State
from jobrun.job.ports import Exchanged
from jobrun.postgres.completion import Completion, _completed_outcome
from jobrun.postgres.convert import job_from_row, statement_timeout_setting, utc
from jobrun.postgres.events import EventMode
from jobrun.postgres.limits import ClaimedRow
from jobrun.postgres.plans import MAX_NOTIFY_QUEUE_USAGE, one_owners_leases
from jobrun.postgres.sqlc import jobs as q

_KEEP = "set_config('jobrun.commit_mode', current_setting('synchronous_commit'), true)"
_BOUND = "set_config('transaction_timeout', %s, true)"
_KEEP_COMMIT_MODE = f"SELECT {_KEEP}"
_GUARD = f"SELECT {_BOUND}"
"""The round's first statement from PostgreSQL 17 on: the server ends the
session if the round's transaction outlives its bound (see
:meth:`Exchange._round_bound`); with the commit mode kept when the round
both completes and claims (one statement, not two)."""
_GUARD_AND_KEEP_COMMIT_MODE = f"SELECT {_BOUND}, {_KEEP}"
TRANSACTION_TIMEOUT_SINCE = 170000
"""The server version with ``transaction_timeout`` (PostgreSQL 17)."""
_PUT_BACK_COMMIT_MODE = (
    "SELECT set_config('synchronous_commit', current_setting('jobrun.commit_mode'), true)"
)


class Exchange(Completion):
    """The worker's combined round trip (see the module docstring)."""

    def exchange(
        self,
        owner: str,
        *,
        complete: Sequence[Job] = (),
        results: Mapping[uuid.UUID, Any] | None = None,
        start: Sequence[Job] = (),
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start_now: int | None = None,
    ) -> Exchanged:
        """Complete ``complete``, start ``start`` and claim up to ``limit`` jobs of
        ``queues`` for ``owner`` (the first ``start_now`` of them started at
        once; None: all), in one transaction and one round trip. ``limit`` 0
        claims nothing. Every argument is checked before anything is sent."""
        names: builtins.list[str] = []
        claim_args: dict[str, Any] = {}
        if limit:
            names, claim_args = self._claim_args(owner, queues, limit, ttl, start_now)
        completing = self._complete_jobs_args(complete, results) if complete else None
        if completing is not None and completing["owner"] != owner:
            raise ValidationError("complete", "the jobs to complete are another owner's")
        starting = self._start_args(owner, start) if start else None
        limited = bool(names) and self._any_limited(names)
        if completing is None and starting is None and not limited:
            if not claim_args:
                return Exchanged(completed=None, started=[], claimed=[])
            # A claim alone: one statement, its own transaction (as Store.claim).
            alone = self._on_pool(lambda c: self.q.claim_jobs(c, **claim_args))
            return Exchanged(
                completed=None, started=[], claimed=[job_from_row(row) for row in alone]
            )

        keep_commit_mode = completing is not None and bool(claim_args) and not limited
        bound = [statement_timeout_setting(self._round_bound(ttl))]

        def round_trip(
            c: psycopg.Connection[Any], committing: list[bool]
        ) -> tuple[
            builtins.list[q.CompleteJobsRow],
            builtins.list[q.StartJobsRow],
            Sequence[ClaimedRow],
        ]:
            done: Callable[[], builtins.list[q.CompleteJobsRow]] = list
            started: Callable[[], builtins.list[q.StartJobsRow]] = list
            claimed: Callable[[], Sequence[ClaimedRow]] = list
            with c.pipeline():
                c.execute("BEGIN")
                if c.info.server_version >= TRANSACTION_TIMEOUT_SINCE:
                    c.execute(_GUARD_AND_KEEP_COMMIT_MODE if keep_commit_mode else _GUARD, bound)
                elif keep_commit_mode:
                    c.execute(_KEEP_COMMIT_MODE)
                if completing is not None:
                    done = self.q.complete_jobs_deferred(c, **completing)
                if starting is not None:
                    started = self.q.start_jobs_deferred(c, **starting)
                if limited:
                    claimed = self._limited_claim(
                        c, names, claim_args, committing, commit_async=completing is None
                    )
                else:
                    if claim_args:
                        claimed = self.q.claim_jobs_deferred(c, **claim_args)
                        if completing is not None:
                            c.execute(_PUT_BACK_COMMIT_MODE)
                    committing[0] = True
                    c.execute("COMMIT")
                return done(), started(), claimed()

        rows, started_rows, claimed_rows = self._with_explicit_tx(round_trip)
        by_id = {row.id: row for row in started_rows}
        return Exchanged(
            completed=_completed_outcome(complete, rows) if complete else None,
            started=[
                dataclasses.replace(
                    job, attempts=by_id[job.id].attempts, started_at=utc(by_id[job.id].started_at)
                )
                for job in start
                if job.id in by_id
            ],
            claimed=[job_from_row(row) for row in claimed_rows],
        )

    def _round_bound(self, ttl: dt.timedelta) -> float:
        """How long a round's transaction may last on the server: the call's
        bound (its deadline, else ``call_timeout``), else the lease TTL.

        The round's statements go out one by one, and a worker frozen between
        them (stopped, its VM paused, its watchdog frozen with it) would hold
        the rows it completes, starts and claims for as long as the freeze
        lasts, where the reaper, which skips locked rows, cannot take them.
        ``idle_in_transaction_session_timeout`` cannot end it: the server arms
        that timer only at a Sync, and a pipeline sends its Sync with COMMIT.
        ``transaction_timeout`` (PostgreSQL 17 and later) ends it whatever the
        session waits for; on older servers the rows wait for the worker."""
        seconds = self._left(self.call_timeout)
        return ttl.total_seconds() if seconds is None else seconds

    def _start_args(self, owner: str, jobs: Sequence[Job]) -> dict[str, Any]:
        held_by, ids, tokens = one_owners_leases(jobs, "exchange", "start")
        if held_by != owner:
            raise ValidationError("start", "the jobs to start are another owner's")
        return dict(ids=ids, tokens=tokens, owner=owner)

    def unclaim(self, jobs: Sequence[Job]) -> dict[uuid.UUID, State]:
        """Give back claimed jobs that never started (a stopping worker's buffer):
        queued again as they were, attempts untouched; a job whose cancel was
        requested ends cancelled. Returns the ids given back (or cancelled)
        with their state; a job left out had started, or its lease was gone."""
        if not jobs:
            return {}
        owner, ids, tokens = one_owners_leases(jobs, "unclaim")
        rows = self._on_pool(
            lambda c: self.q.unclaim_jobs(
                c,
                ids=ids,
                tokens=tokens,
                owner=owner,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
                channel=self.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
        )
        return {row.id: State(row.state.value) for row in rows}
