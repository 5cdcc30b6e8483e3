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
server crash is a job that never ran, and the fence keeps it safe). A
claim switches ``synchronous_commit`` off for its transaction unless it is
told otherwise: a round that completes and claims names its claim to the
database first (``jobrun_continue.to``), and such a claim keeps the
session's setting; a limited claim is told by its ``commit_async``. A fault
leaves all three undone, or (OutcomeUnknown) all three unknown: completing,
starting and claiming again are each safe to repeat.

The named claim serves the release too: a child the round's completions
release, and that the claim would take, is leased to the claim by the
release itself, one row version instead of a release and then a claim, and
the claim returns it (a continuation lease, migration 0025).

:meth:`Exchange.unclaim` gives a stopping worker's buffer back at once.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import json
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

_BOUND = "set_config('transaction_timeout', %s, true)"
_CONTINUE = "set_config('jobrun_continue.to', %s, true)"
_NAME_THE_CLAIM = f"SELECT {_CONTINUE}"
"""The first statement of a round that completes and claims: its claim named
for the release (a continuation lease) and for the claim itself, which then
keeps the session's commit mode, so that the completions are durable once
COMMIT answers (migration 0025)."""
_GUARD = f"SELECT {_BOUND}"
"""The round's first statement from PostgreSQL 17 on: the server ends the
session if the round's transaction outlives its bound (see
:meth:`Exchange._round_bound`); with the claim named when the round both
completes and claims (one statement, not two)."""
_GUARD_AND_NAME_THE_CLAIM = f"SELECT {_BOUND}, {_CONTINUE}"
TRANSACTION_TIMEOUT_SINCE = 170000
"""The server version with ``transaction_timeout`` (PostgreSQL 17)."""


def _continuation(claim_args: Mapping[str, Any]) -> str:
    """The round's claim as ``jobrun_continue.to`` names it (JSON): the
    children its completions release that this claim would take are leased to
    it at once, one row version instead of two (migration 0025)."""
    return json.dumps(
        {
            "owner": claim_args["owner"],
            "queues": claim_args["queues"],
            "room": claim_args["max_jobs"],
            "start": claim_args["start"],
            "ttl": claim_args["ttl_seconds"],
            "events": claim_args["write_events"],
        },
        separators=(",", ":"),
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

        completes_and_claims = completing is not None and bool(claim_args) and not limited
        bound = statement_timeout_setting(self._round_bound(ttl))
        continuation = _continuation(claim_args) if completes_and_claims else ""

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
                    if completes_and_claims:
                        c.execute(_GUARD_AND_NAME_THE_CLAIM, [bound, continuation])
                    else:
                        c.execute(_GUARD, [bound])
                elif completes_and_claims:
                    c.execute(_NAME_THE_CLAIM, [continuation])
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
