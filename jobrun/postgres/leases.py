"""Leases: claim, start, heartbeat, progress, fail, release, reap.

A claim flips queued -> leased and gives the job a fresh ``lease_token``
made by the database. An attempt counts when it starts: the claim starts
the first ``start`` of its jobs (None: all); the others wait for a thread
and :meth:`Leases.start_jobs` starts them just before they run, so a
process that dies burns the attempts of the jobs it started and of no
other. Every call on a lease matches owner *and* token: after the reaper
requeued a job and anyone claimed it again, the old claim's calls raise
LeaseLost (or, for a heartbeat, omit the id) and change nothing.

Claims and heartbeats commit asynchronously (``synchronous_commit`` off for
their own transaction): a claim lost in a server crash is a job that was
never claimed, a heartbeat lost is a lease that looks shorter, and both are
covered by the fence. Everything that finishes a job commits synchronously.
Completion is :mod:`jobrun.postgres.completion`.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from jobrun.job import validate
from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import EventKind, Job, ReapResult, State
from jobrun.postgres.convert import job_from_row, utc
from jobrun.postgres.events import EventMode, EventRow, record
from jobrun.postgres.limits import ClaimedRow, Limits
from jobrun.postgres.plans import MAX_HEARTBEAT_IDS, lease_of, one_owners_leases
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import models


class Leases(Limits):
    """The lease half of the Store (see the module docstring)."""

    def claim(
        self,
        owner: str,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        *,
        start: int | None = None,
    ) -> builtins.list[Job]:
        """Lease up to ``limit`` runnable jobs of ``queues`` to ``owner`` for ``ttl``.

        The first ``start`` of them (claim order; None: all) start at once:
        their attempt is counted. The others are leased with their attempt
        uncounted (``started_at`` None) until :meth:`start_jobs` starts them;
        a lease that expires first gives the job back without burning one.
        """
        names, args = self._claim_args(owner, queues, limit, ttl, start)
        if not self._any_limited(names):
            rows: Sequence[ClaimedRow] = self._on_pool(lambda c: self.q.claim_jobs(c, **args))
        else:

            def locked(c: psycopg.Connection[Any], committing: list[bool]) -> Sequence[ClaimedRow]:
                with c.pipeline():
                    c.execute("BEGIN")
                    claimed = self._limited_claim(c, names, args, committing, commit_async=True)
                    return claimed()

            rows = self._with_explicit_tx(locked)
        return [job_from_row(r) for r in rows]

    def _claim_args(
        self,
        owner: str,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start: int | None,
    ) -> tuple[builtins.list[str], dict[str, Any]]:
        """The queues' names and a claim statement's arguments, all checked."""
        validate.owner(owner)
        if isinstance(queues, str) or not queues:
            raise ValidationError("queues", "must be a non-empty list of queue names")
        names = [validate.queue_name(name, "queues") for name in queues]
        validate.claim_limit(limit)
        starting = validate.claim_start(start, limit)
        validate.positive_duration("ttl", ttl)
        return names, dict(
            queues=names,
            max_jobs=limit,
            start=starting,
            owner=owner,
            ttl_seconds=ttl.total_seconds(),
            write_events=self.event_mode is EventMode.ALL,
        )

    def record_progress(self, job: Job, progress: float, message: str | None = None) -> dt.datetime:
        """Store a running job's progress (a fraction from 0 to 1, and a message).

        Fenced like a heartbeat: LeaseLost when the claim no longer holds the
        job. Returns when it was recorded (database clock). The worker's
        ``JobContext.progress`` throttles the calls.
        """
        owner, token = lease_of(job)
        value = validate.progress(progress)
        text = None if message is None else validate.progress_message(message)
        at = self._on_pool(
            lambda c: self.q.record_progress(
                c, progress=value, message=text, id=job.id, owner=owner, token=token
            )
        )
        if at is None:
            raise LeaseLost(job.id)
        return utc(at)

    def heartbeat(
        self, owner: str, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], until: dt.datetime
    ) -> set[uuid.UUID]:
        """Extend the live leases among ``leases`` (id, token) to ``until``; return the kept ids.

        An id left out was not extended: its lease expired, moved to another
        claim, or its cancel was requested. The worker cancels those jobs.
        """
        validate.owner(owner)
        validate.aware_datetime("until", until)
        if not leases:
            return set()
        if len(leases) > MAX_HEARTBEAT_IDS:
            raise ValidationError("leases", f"at most {MAX_HEARTBEAT_IDS} per heartbeat")
        pairs = dict(leases)  # duplicates collapse
        kept = self._on_pool(
            lambda c: self.q.heartbeat_jobs(
                c, until=until, ids=list(pairs), tokens=list(pairs.values()), owner=owner
            )
        )
        return set(kept)

    def start_jobs(self, jobs: Sequence[Job]) -> builtins.list[Job]:
        """Start claimed jobs their claim did not start: count each one's attempt
        just before its handler runs; return the jobs started, as they now stand.

        Fenced like a heartbeat (owner + token, a live lease, no cancel
        requested): a job left out must not run (its lease is gone, or its
        cancel was requested). A job this claim already started is returned
        as it is, counted once, so a call retried after a lost reply is safe.
        One owner's jobs, at most MAX_HEARTBEAT_IDS.
        """
        if not jobs:
            return []
        owner, ids, tokens = one_owners_leases(jobs, "start_jobs")
        rows = self._on_pool(lambda c: self.q.start_jobs(c, ids=ids, tokens=tokens, owner=owner))
        started = {row.id: row for row in rows}
        return [
            dataclasses.replace(
                j, attempts=started[j.id].attempts, started_at=utc(started[j.id].started_at)
            )
            for j in jobs
            if j.id in started
        ]

    def fail(
        self,
        job: Job,
        error: str,
        retry_at: dt.datetime | None,
        *,
        permanent: bool = False,
    ) -> Job:
        """Fail the current attempt: queued again at ``retry_at``, dead, or cancelled.

        Dead when ``permanent`` or no attempts are left; cancelled when cancel
        was requested. ``retry_at`` is db now (as read by the caller) plus the
        job's backoff; None means now.
        """
        owner, token = lease_of(job)
        if not isinstance(error, str):
            raise ValidationError("error", "must be a str")
        if retry_at is not None:
            validate.aware_datetime("retry_at", retry_at)
        text = validate.error_text(error)
        row = self._on_pool(
            lambda c: self.q.fail_job(
                c,
                permanent=bool(permanent),
                retry_at=retry_at,
                error=text,
                id=job.id,
                owner=owner,
                token=token,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
            )
        )
        if row is None:
            raise LeaseLost(job.id)
        return job_from_row(row)

    def release(self, job: Job, delay: dt.timedelta, reason: str, *, snooze: bool = False) -> Job:
        """Give a claimed job back without counting its attempt: queued again after
        ``delay`` (from the database clock), or cancelled when cancel was requested.

        For a worker that cannot run the job (no handler for its type, say,
        while a newer worker rolls out), so that a job is never burnt to dead
        by workers that do not know it. The caller bounds how often it does
        this; ``reason`` is kept as ``last_error`` and in the event. The
        attempt given back is the one its start counted: a job released
        before it started keeps its attempts as they are.

        ``snooze``: the handler asked to run again later (``jobrun.Snooze``).
        The attempt is given back all the same and ``snoozes`` counts it; the
        event is "snoozed" and ``last_error`` is left as it was (a snooze is
        no error).
        """
        owner, token = lease_of(job)
        validate.delay(delay)
        if not isinstance(reason, str):
            raise ValidationError("reason", "must be a str")
        text = validate.error_text(reason)
        row = self._on_pool(
            lambda c: self.q.release_job(
                c,
                snooze=bool(snooze),
                delay_seconds=delay.total_seconds(),
                reason=text,
                id=job.id,
                owner=owner,
                token=token,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
            )
        )
        if row is None:
            raise LeaseLost(job.id)
        return job_from_row(row)

    def reap_expired(self, now: dt.datetime, limit: int) -> ReapResult:
        """Requeue, kill or cancel up to ``limit`` jobs whose lease expired before ``now``.

        The verdict and backoff come from each job's own policy: cancelled
        when cancel was requested, dead when no attempts are left, otherwise
        queued after its backoff. A lease whose attempt never started (its
        job waited for a thread of a worker that died) burned nothing: the
        job is queued again at ``now`` with its attempts and ``last_error``
        unchanged, and its "reaped" event says ``"started": false``. A job
        that finished between the SELECT and the UPDATE is left alone (the
        UPDATE re-checks the lease).
        """
        validate.aware_datetime("now", now)
        validate.batch_limit(limit)

        def run(c: psycopg.Connection[Any]) -> ReapResult:
            rows = [
                job_from_row(r) for r in self.q.select_expired_leases(c, now=now, max_jobs=limit)
            ]
            if not rows:
                return ReapResult(requeued=[], dead=[], cancelled=[])
            params = []
            for job in rows:
                assert job.lease_token is not None  # leased rows carry a lease (CHECK)
                error: str | None = f"lease expired (owner {job.lease_owner})"
                if job.cancel_requested:
                    verdict, run_at = State.CANCELLED, None
                elif not job.started:
                    # Leased, never run: no attempt was burned, none is due.
                    verdict, run_at, error = State.QUEUED, now, None
                elif job.attempts >= job.max_attempts:
                    verdict, run_at = State.DEAD, None
                else:
                    verdict, run_at = State.QUEUED, now + job.backoff.delay(job.attempts)
                params.append(
                    q.ReapJobParams(
                        state=models.JobState(verdict.value),
                        run_at=run_at,
                        last_error=error,
                        id=job.id,
                        token=job.lease_token,
                        now=now,
                        finish_channel=self.finish_channel,
                    )
                )
            reaped = self.q.reap_job(c, params)
            result = ReapResult(requeued=[], dead=[], cancelled=[])
            events: builtins.list[EventRow] = []
            for job, p, got in zip(rows, params, reaped, strict=True):
                if got is None:
                    continue
                verdict = State(p.state.value)
                {
                    State.QUEUED: result.requeued,
                    State.DEAD: result.dead,
                    State.CANCELLED: result.cancelled,
                }[verdict].append(job.id)
                detail: dict[str, Any] = {"verdict": verdict.value, "owner": job.lease_owner}
                if not job.started:
                    detail["started"] = False
                events.append(EventRow(job.id, EventKind.REAPED, job.attempts, detail))
                if verdict.terminal:
                    events.append(
                        EventRow(job.id, EventKind(verdict.value), job.attempts, {"via": "reaper"})
                    )
            record(self.q, c, self.event_mode, events)
            return result

        return self._with_tx(run)
