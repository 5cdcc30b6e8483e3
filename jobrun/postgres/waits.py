"""Durable sleeps and signal waits on the Store (tables of migration 0017).

Two calls, each fenced by the job's claim (owner + lease token; LeaseLost,
nothing written, when the claim no longer holds the job):

- :meth:`Waits.await_step`: one statement (``AwaitStep``) per turn of a
  wait: a signal delivered, or the deadline passed (recorded as the wait's
  step, in ``job_steps``, so that a retried attempt replays it), or the
  wait's deadline (written by the database clock on its first turn, never
  moved after) and the database's now, for the caller to park the job;
- :meth:`Waits.park`: one transaction: ``LockLease`` (the job row, FOR NO
  KEY UPDATE), then ``ParkJob`` (queued at the wait's deadline, or now when a
  signal it waits for is there already), with a wake-up of its queue that
  carries the delay until then (as a delayed enqueue's does). The
  row lock first is what makes a signal never missed: a signal's transaction
  (``client.signal``) locks the same row before it stores the signal, so
  whichever comes second sees what the first committed (ParkJob, as its own
  statement, reads with a snapshot taken after the lock was granted). A job
  of a workflow parking in a signal wait locks its workflow's row first
  (``LockWorkflowForPark``, FOR KEY SHARE), which a signal sent to the
  workflow locks FOR UPDATE: the same rule for workflow signals (migration
  0019), in the same lock order.

A wait takes the oldest signal of its name not delivered to the job, sent
to the job or to its workflow (see ``AwaitStep``).
"""

from __future__ import annotations

from typing import Any

from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import Job
from jobrun.job.signals import WaitTurn, signal_name, wait_seconds
from jobrun.job.steps import step_name
from jobrun.postgres.convert import job_from_row, utc
from jobrun.postgres.events import EventMode
from jobrun.postgres.plans import lease_of
from jobrun.postgres.sqlc import models
from jobrun.postgres.steps import Steps
from jobrun.postgres.transactions import Conn


class Waits(Steps):
    """The durable-waits half of the Store (see the module docstring)."""

    def await_step(self, job: Job, step: str, signal: str | None, seconds: float) -> WaitTurn:
        """One turn of the wait ``step`` of ``job`` (see :class:`~jobrun.job.signals.WaitTurn`).

        ``signal``: the name waited for (None: a sleep); ``seconds``: how long
        the wait lasts from its first turn (ignored on a later one: the
        deadline recorded then stands).
        """
        owner, token = lease_of(job)
        step = step_name(step)
        if signal is not None:
            signal = signal_name(signal, "signal")
        seconds = wait_seconds(seconds, "seconds")
        row = self._on_pool(
            lambda c: self.q.await_step(
                c,
                job_id=job.id,
                owner=owner,
                token=token,
                step=step,
                signal=signal,
                attempt=job.attempts,
                seconds=seconds,
                write_all=self.event_mode is EventMode.ALL,
            )
        )
        if row is None or not row.held:
            raise LeaseLost(job.id)
        now = utc(row.now)
        if not row.ended:
            return WaitTurn(None, utc(row.until), now)
        record: Any = row.result
        if record is None:  # pragma: no cover - recorded before by this claim: replay it
            record = self._stored(job, step).value
        if not isinstance(record, dict):  # pragma: no cover - a step of another kind
            raise ValidationError("step", f"step {step!r} is not a durable wait")
        return WaitTurn(record, None, now)

    def park(self, job: Job, step: str, *, signal: bool = True) -> Job:
        """Queue ``job`` again until its wait ``step`` is over, its lease cleared
        and the attempt its start counted given back (see the module docstring).

        Returns the job as parked: queued at the wait's deadline, or now when
        a signal it waits for is there already (its queue's workers are then
        woken). A job whose cancel was requested ends cancelled instead.
        LeaseLost when the claim no longer holds the job (nothing written).
        ``signal`` False says the wait is a sleep: no signal ends it, so the
        job's workflow's row is not locked (see the module docstring).
        """
        owner, token = lease_of(job)
        step = step_name(step)

        def run(c: Conn) -> Job:
            if signal and job.workflow_id is not None:
                # Before the job's row, as a workflow signal locks them: see
                # LockWorkflowForPark (nothing back: the workflow is gone).
                self.q.lock_workflow_for_park(c, workflow_id=job.workflow_id)
            if self.q.lock_lease(c, job_id=job.id, owner=owner, token=token) is None:
                raise LeaseLost(job.id)
            row = self.q.park_job(
                c,
                job_id=job.id,
                step=step,
                owner=owner,
                token=token,
                write_all=self.event_mode is EventMode.ALL,
                finish_channel=self.finish_channel,
            )
            if row is None:  # pragma: no cover - the row is locked for this claim
                raise LeaseLost(job.id)
            if row.state == models.JobState.QUEUED:
                # Due now (a signal is there already), or at the deadline: the
                # wake-up carries the delay, as a delayed enqueue's does, so
                # that a short sleep resumes when it ends, not at a poll.
                self._notify(c, row.queue, None if row.ready else row.run_at)
            return job_from_row(row)

        return self._with_tx(run)
