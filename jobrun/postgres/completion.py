"""Completion: complete (with a commit callable), complete_many, complete_and_claim,
complete_many_tx.

Complete is BEGIN with the commit_timeout as the transaction's
statement_timeout; one statement locking the row (owner + token check) and
inserting its effect-ledger row; the commit callable (skipped when the
effect row existed); the finishing UPDATE pipelined with COMMIT. A Complete
retried with the same claim after its COMMIT reply was lost answers success
and runs nothing again. Cancel wins: a job whose cancel was requested ends
``cancelled``, with no callable run and no effect row written. The batched
forms keep those guarantees per job, one COMMIT for many.
"""

from __future__ import annotations

import builtins
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from jobrun.job import validate
from jobrun.job.errors import LeaseLost, OutcomeUnknown, TransientError, ValidationError
from jobrun.job.model import CompleteManyResult, EffectKey, Job, State
from jobrun.job.ports import CommitCallable
from jobrun.postgres import effects
from jobrun.postgres.convert import (
    BinaryArray,
    job_from_row,
    raw_json,
    statement_timeout_setting,
    utc,
)
from jobrun.postgres.leases import Leases
from jobrun.postgres.limits import ClaimedRow
from jobrun.postgres.plans import MAX_HEARTBEAT_IDS, lease_of, one_owners_leases
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import models

log = logging.getLogger("jobrun.postgres.store")  # the name users filter on


class Completion(Leases):
    """The completion half of the Store (see the module docstring)."""

    commit_timeout: dt.timedelta | None

    def complete(
        self, job: Job, commit: CommitCallable | None = None, *, result: Any = None
    ) -> Job:
        """Finish a claimed job: succeeded, or cancelled when cancel was requested.

        With ``commit``, the handler's callable runs inside this transaction
        after the effect row is inserted, and only when that row is new. A
        lost lease, a failing callable or ``commit_timeout`` rolls everything
        back, the callable's writes included. ``result`` (any JSON value, the
        handler's return value) is stored with the success, in the same
        transaction; a cancelled job keeps none.
        """
        owner, token = lease_of(job)
        if commit is not None and not callable(commit):
            raise ValidationError("commit", "must be callable")
        result_text = validate.result(result)

        key = EffectKey.of(job)
        begin = self._begin_with_timeout()

        def run(c: psycopg.Connection[Any], committing: list[bool]) -> Job:
            # BEGIN with the timeout (one simple-protocol round trip), then one
            # statement: lock, fence check, ledger row. The timeout is in force
            # before the row lock is requested, so it bounds that wait too.
            # (Pipelining these measured slower than plain round trips: leaving
            # pipeline mode costs a Sync round trip of its own.)
            c.execute(begin)
            row = self.q.complete_begin(
                c,
                owner=owner,
                token=token,
                id=job.id,
                scope=key.scope,
                key=key.key,
            )
            if row is None:
                raise LeaseLost(job.id)  # the job is gone (purged)
            if not row.owned:
                # This very claim finished the job (its token is the row's
                # finished_token): a Complete retried after its COMMIT reply
                # was lost answers with the job as that Complete left it.
                # Any other claim, stale after a reap and a retry cycle that
                # repeated the same attempt count included, lost its lease.
                if row.finished_by_claim:
                    done = self.q.get_job(c, id=job.id)
                    assert done is not None
                    return job_from_row(done)
                raise LeaseLost(job.id)
            detail: dict[str, str] | None
            if row.cancel_requested:
                # Cancel wins: no callable, no effect row.
                state, detail = models.JobState.CANCELLED, {"via": "complete"}
            else:
                if row.effect_new and commit is not None:
                    effects.run_commit(c, commit, job)
                state = models.JobState.SUCCEEDED
                detail = (
                    None
                    if commit is None
                    else {"effect": "applied" if row.effect_new else "already_applied"}
                )
            # Round trip 3: the finishing statement and COMMIT, pipelined.
            # (The row is ours and locked: the statement matches it. Any error
            # comes back at the sync and rolls the whole transaction back.)
            state_now = State(state.value)
            committing[0] = True
            with c.pipeline():
                self.q.complete_finish(
                    c,
                    state=state,
                    id=job.id,
                    owner=owner,
                    token=token,
                    detail=detail,
                    result_json=None if result_text is None else raw_json(result_text),
                    finish_channel=self.finish_channel,
                )
                c.execute("COMMIT")
            return dataclasses.replace(
                job,
                state=state_now,
                cancel_requested=row.cancel_requested,
                lease_owner=None,
                lease_token=None,
                lease_expires_at=None,
                finished_at=utc(row.now),
                updated_at=utc(row.now),
                result=(
                    (result.value if isinstance(result, validate.CheckedResult) else result)
                    if state_now is State.SUCCEEDED and result_text is not None
                    else None
                ),
            )

        return self._with_explicit_tx(run, timeout=self._commit_bound())

    def complete_many(
        self, jobs: Sequence[Job], *, results: Mapping[uuid.UUID, Any] | None = None
    ) -> CompleteManyResult:
        """Complete many claimed jobs (no commit callables) in one statement, each fenced.

        ``results`` maps a job's id to its handler's return value (stored with
        its success); every value is checked before any SQL runs.
        """
        if not jobs:
            return CompleteManyResult(
                completed=frozenset(), cancelled=frozenset(), lease_lost=frozenset()
            )
        args = self._complete_jobs_args(jobs, results)
        rows = self._on_pool(lambda c: self.q.complete_jobs(c, **args))
        return _completed_outcome(jobs, rows)

    def _complete_jobs_args(
        self, jobs: Sequence[Job], results: Mapping[uuid.UUID, Any] | None
    ) -> dict[str, Any]:
        """CompleteJobs' arguments for ``jobs`` (one owner's, at most
        MAX_HEARTBEAT_IDS), every result checked before any SQL runs."""
        if len(jobs) > MAX_HEARTBEAT_IDS:
            raise ValidationError("jobs", f"at most {MAX_HEARTBEAT_IDS} jobs per call")
        # One pass. The effect key of a keyed job is the statement's to read
        # from the row (EffectKey.of's scope and key), so it is not sent.
        owners: set[str] = set()
        ids: builtins.list[uuid.UUID] = []
        tokens: builtins.list[uuid.UUID] = []
        for job in jobs:
            owner, token = lease_of(job)
            owners.add(owner)
            ids.append(job.id)
            tokens.append(token)
        if len(owners) != 1:
            raise ValidationError("jobs", "complete_many takes the jobs of one owner")
        return dict(
            ids=BinaryArray(ids),
            tokens=BinaryArray(tokens),
            results=_result_texts(jobs, results) if results else None,
            owner=owners.pop(),
            finish_channel=self.finish_channel,
        )

    def complete_and_claim(
        self,
        jobs: Sequence[Job],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start: int | None = None,
    ) -> tuple[CompleteManyResult, builtins.list[Job]]:
        """:meth:`complete_many` of ``jobs`` and :meth:`claim` for their owner, in
        one transaction (one round trip): the claim counts the slots of a
        queue's limits that the completions free.

        For a worker whose queue a global concurrency limit keeps full: apart,
        a completion frees slots while the previous claim is still on its way
        and the next one comes a round trip later; together, a finished job's
        slot is taken again in the statement after its completion. The
        transaction commits synchronously (the completions' durability); a
        fault leaves both undone, or (OutcomeUnknown) both unknown, and
        retrying either alone is safe. ``start`` as in :meth:`claim`.
        """
        if not jobs:
            raise ValidationError("jobs", "must not be empty (claim alone: Store.claim)")
        names, args = self._claim_args(jobs[0].lease_owner or "", queues, limit, ttl, start)
        completing = self._complete_jobs_args(jobs, results)

        def both(
            c: psycopg.Connection[Any], committing: list[bool]
        ) -> tuple[list[q.CompleteJobsRow], Sequence[ClaimedRow]]:
            with c.pipeline():
                c.execute("BEGIN")
                completed = self.q.complete_jobs_deferred(c, **completing)
                claimed = self._limited_claim(c, names, args, committing, commit_async=False)
                return completed(), claimed()

        rows, claimed = self._with_explicit_tx(both)
        return _completed_outcome(jobs, rows), [job_from_row(r) for r in claimed]

    def complete_many_tx(
        self,
        items: Sequence[tuple[Job, CommitCallable | None]],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
    ) -> CompleteManyResult:
        """Complete many claimed jobs of one owner, each with its commit callable, in one
        transaction: the transactional path past the one-COMMIT-per-job ceiling.

        Every job keeps Complete's guarantees: fenced by owner and token, its
        effect row inserted before its callable runs, the callable skipped
        when that row existed, cancel wins. The batch commits once. When a
        callable raises (or a statement fails), the whole batch rolls back
        and each job is completed alone with :meth:`complete`, so one bad
        callable costs the others a retry, never their effect; the jobs that
        fail alone are returned in ``failed``. Database faults
        (TransientError, OutcomeUnknown) are raised for the caller to retry:
        a retry is safe, since a job this claim completed reports completed.
        """
        if not items:
            return CompleteManyResult(
                completed=frozenset(), cancelled=frozenset(), lease_lost=frozenset()
            )
        jobs = [job for job, _ in items]
        owner, ids, tokens = one_owners_leases(jobs, "complete_many_tx", "items")
        if len(set(ids)) != len(jobs):
            raise ValidationError("items", "a job appears twice")
        for _, commit in items:
            if commit is not None and not callable(commit):
                raise ValidationError("commit", "must be callable")
        keys = [EffectKey.of(j) for j in jobs]
        texts = dict(zip((j.id for j in jobs), _result_texts(jobs, results), strict=True))
        begin = self._begin_with_timeout()

        def run(c: psycopg.Connection[Any], committing: list[bool]) -> CompleteManyResult:
            c.execute(begin)
            rows = self.q.complete_begin_many(
                c,
                ids=BinaryArray(ids),
                tokens=BinaryArray(tokens),
                scopes=BinaryArray(k.scope for k in keys),
                keys=BinaryArray(k.key for k in keys),
                owner=owner,
            )
            by_id = {r.id: r for r in rows}
            completed: set[uuid.UUID] = set()
            cancelled: set[uuid.UUID] = set()
            lost: set[uuid.UUID] = set()
            finish: list[tuple[uuid.UUID, models.JobState, dict[str, str] | None]] = []
            for job, commit in items:
                row = by_id.get(job.id)
                if row is None or not row.owned:
                    # Finished by this very claim before (a retried batch)?
                    if row is not None and row.finished_by_claim:
                        done = row.state == models.JobState.SUCCEEDED
                        (completed if done else cancelled).add(job.id)
                    else:
                        lost.add(job.id)
                    continue
                if row.cancel_requested:
                    cancelled.add(job.id)
                    finish.append((job.id, models.JobState.CANCELLED, {"via": "complete"}))
                    continue
                if row.effect_new and commit is not None:
                    effects.run_commit(c, commit, job)
                detail = (
                    None
                    if commit is None
                    else {"effect": "applied" if row.effect_new else "already_applied"}
                )
                completed.add(job.id)
                finish.append((job.id, models.JobState.SUCCEEDED, detail))
            committing[0] = True
            with c.pipeline():
                if finish:
                    self.q.complete_finish_many(
                        c,
                        ids=[f[0] for f in finish],
                        states=[f[1] for f in finish],
                        details=[f[2] for f in finish],
                        results=[texts[f[0]] for f in finish],
                        owner=owner,
                        finish_channel=self.finish_channel,
                    )
                c.execute("COMMIT")
            return CompleteManyResult(
                completed=frozenset(completed),
                cancelled=frozenset(cancelled),
                lease_lost=frozenset(lost),
            )

        try:
            return self._with_explicit_tx(run, timeout=self._commit_bound())
        except (TransientError, OutcomeUnknown):
            raise
        except Exception as exc:  # noqa: BLE001 - a commit callable's own error, whatever it is
            log.info(
                "a batch of %d completions rolled back (%s); completing one by one", len(items), exc
            )
            return self._complete_one_by_one(items, results or {})

    def _complete_one_by_one(
        self,
        items: Sequence[tuple[Job, CommitCallable | None]],
        results: Mapping[uuid.UUID, Any],
    ) -> CompleteManyResult:
        completed: set[uuid.UUID] = set()
        cancelled: set[uuid.UUID] = set()
        lost: set[uuid.UUID] = set()
        failed: dict[uuid.UUID, BaseException] = {}
        for job, commit in items:
            try:
                done = self.complete(job, commit, result=results.get(job.id))
            except LeaseLost:
                lost.add(job.id)
            except (TransientError, OutcomeUnknown):
                raise
            except Exception as exc:  # noqa: BLE001 - reported per job, as the caller's to handle
                failed[job.id] = exc
            else:
                (cancelled if done.state is State.CANCELLED else completed).add(job.id)
        return CompleteManyResult(
            completed=frozenset(completed),
            cancelled=frozenset(cancelled),
            lease_lost=frozenset(lost),
            failed=failed,
        )

    def _begin_with_timeout(self) -> str:
        """BEGIN, with commit_timeout as the transaction's statement_timeout
        and as its idle_in_transaction_session_timeout.

        Sent as one simple-protocol string (one round trip), so the timeout
        is in force before Complete's first statement waits for the row lock.
        The idle bound is for a client that stops talking while it holds the
        job's row lock (a frozen worker: SIGSTOP, a VM pause, its watchdog
        frozen with it): the server ends the session, the lock goes, and the
        reaper can requeue the job once its lease runs out; otherwise the
        reaper skips the locked row for as long as the freeze lasts, and the
        job's dependents wait with it.
        """
        seconds = None if self.commit_timeout is None else self.commit_timeout.total_seconds()
        seconds = self._left(seconds)  # within the caller's deadline (see bounded)
        if seconds is None:
            return "BEGIN"
        ms = statement_timeout_setting(seconds)
        return (
            f"BEGIN; SET LOCAL statement_timeout = {ms};"
            f" SET LOCAL idle_in_transaction_session_timeout = {ms}"
        )

    def _commit_bound(self) -> float | None:
        """The client-side bound of a Complete: its commit callables may take
        commit_timeout per statement, on top of the ordinary call bound."""
        if self.commit_timeout is None or self.call_timeout is None:
            return None
        return self.call_timeout + self.commit_timeout.total_seconds()


def _completed_outcome(
    jobs: Sequence[Job], rows: Sequence[q.CompleteJobsRow]
) -> CompleteManyResult:
    """CompleteJobs' rows as an outcome: the jobs finished now, and those this
    very claim finished before (a call retried after its COMMIT reply was
    lost); the others lost their lease."""
    completed: set[uuid.UUID] = set()
    cancelled: set[uuid.UUID] = set()
    succeeded, ended_cancelled = models.JobState.SUCCEEDED, models.JobState.CANCELLED
    for r in rows:
        if r.state is succeeded:
            completed.add(r.id)
        elif r.state is ended_cancelled:
            cancelled.add(r.id)
    lost = frozenset(j.id for j in jobs).difference(completed, cancelled)
    return CompleteManyResult(
        completed=frozenset(completed), cancelled=frozenset(cancelled), lease_lost=lost
    )


def _result_texts(
    jobs: Sequence[Job], results: Mapping[uuid.UUID, Any] | None
) -> builtins.list[Jsonb | None]:
    """Each job's result as stored (checked, serialised once), aligned with ``jobs``."""
    if not results:
        return [None] * len(jobs)
    texts = [validate.result(results.get(j.id)) for j in jobs]
    return [None if t is None else raw_json(t) for t in texts]
