"""Durable steps and fencing tokens on the Store (tables of migration 0015).

Three writes, each fenced by the job's claim (owner + lease token) and
holding the job row FOR SHARE until it commits, so that the reaper (which
skips locked rows) cannot take the job from under it, and a stale claim (its
lease reaped, the job claimed again) writes nothing and gets ``LeaseLost``:

- :meth:`Steps.record_step`: one statement, the checkpoint of a step whose
  work is done (``RecordStep``);
- :meth:`Steps.transaction_step`: one transaction, ``HoldStepLease``, the
  step's own statements on the same connection, its checkpoint
  (``InsertStep``), COMMIT: the step's writes and its checkpoint commit
  together or not at all, like a commit callable and its ledger row;
- :meth:`Steps.issue_fencing_token`: the job's next fencing token
  (``IssueFencingToken``).

And one read, :meth:`Steps.load_steps`, once per attempt. A value is
encoded by the job result's rules (:func:`jobrun.job.validate.result`, a
ValidationError before anything is sent) and comes back as jsonb stores it,
so a step's first run and its replays return the same value.
"""

from __future__ import annotations

from typing import Any

import psycopg

from jobrun.job import validate
from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import Job
from jobrun.job.steps import StepRecord, TransactionStepFn, step_name
from jobrun.postgres import effects
from jobrun.postgres.completion import Completion
from jobrun.postgres.convert import raw_json
from jobrun.postgres.plans import lease_of


class Steps(Completion):
    """The durable-steps half of the Store (see the module docstring)."""

    def load_steps(self, job: Job) -> dict[str, StepRecord]:
        """Every step of ``job`` recorded so far, by name (one query)."""
        if not isinstance(job, Job):
            raise ValidationError("job", f"must be a jobrun.Job, not {type(job).__name__}")
        rows = self._on_pool_read(lambda c: self.q.load_steps(c, job_id=job.id))
        return {r.name: StepRecord(r.result, r.attempt) for r in rows}

    def record_step(self, job: Job, name: str, value: object) -> StepRecord:
        """Record step ``name`` of ``job`` done with ``value``, fenced by its claim.

        ``value`` is any JSON value (the job result's rules; a
        ValidationError naming the step otherwise, before anything is sent).
        Returns the record as stored. LeaseLost when the claim no longer
        holds the job (nothing written).
        """
        owner, token = lease_of(job)
        name = step_name(name)
        text = _encoded(name, value)
        row = self._on_pool(
            lambda c: self.q.record_step(
                c,
                job_id=job.id,
                owner=owner,
                token=token,
                name=name,
                attempt=job.attempts,
                result_=None if text is None else raw_json(text),
            )
        )
        if row is None or not row.held:
            raise LeaseLost(job.id)
        if not row.recorded:  # already there: what is stored is the step's value
            return self._stored(job, name)
        return StepRecord(row.result, job.attempts)

    def transaction_step(self, job: Job, name: str, fn: TransactionStepFn) -> StepRecord:
        """Run ``fn(conn)`` and record step ``name`` with its value, in one transaction.

        The transaction's first statement holds the job row for this claim
        (LeaseLost, ``fn`` not called, when the claim no longer holds it);
        ``fn`` runs its statements on ``conn``; its value is checked and
        inserted as the step's checkpoint; COMMIT. A failing ``fn``, a value
        that cannot be stored, or a lost connection roll everything back:
        the step's writes land exactly when its checkpoint does. The
        statements run under ``commit_timeout`` (as a commit callable's);
        ``fn`` may not commit or roll back (CommitRefused).
        """
        owner, token = lease_of(job)
        name = step_name(name)
        if not callable(fn):
            raise ValidationError("fn", "must be callable")
        begin = self._begin_with_timeout()

        def run(c: psycopg.Connection[Any], committing: list[bool]) -> StepRecord:
            c.execute(begin)
            if self.q.hold_step_lease(c, job_id=job.id, owner=owner, token=token) is None:
                raise LeaseLost(job.id)
            value = effects.run_step(c, fn, job, name)
            text = _encoded(name, value)
            row = self.q.insert_step(
                c,
                job_id=job.id,
                name=name,
                attempt=job.attempts,
                result_=None if text is None else raw_json(text),
            )
            if row is None:
                # Already recorded (never by another claim: the row is held):
                # this run's writes go, the stored value stays.
                c.execute("ROLLBACK")
                return self._stored(job, name)
            committing[0] = True
            c.execute("COMMIT")
            return StepRecord(row.result, job.attempts)

        return self._with_explicit_tx(run, timeout=self._commit_bound())

    def issue_fencing_token(self, job: Job) -> int:
        """The next fencing token of ``job``, for the claim holding it.

        One more than the last one issued for the job (1 for the first), in
        a statement that holds the job row for this claim: every later run of
        the job gets a greater one, and a stale claim none (LeaseLost).
        """
        owner, token = lease_of(job)
        issued = self._on_pool(
            lambda c: self.q.issue_fencing_token(c, job_id=job.id, owner=owner, token=token)
        )
        if issued is None:
            raise LeaseLost(job.id)
        return issued

    def _stored(self, job: Job, name: str) -> StepRecord:
        stored = self.load_steps(job).get(name)
        if stored is None:  # pragma: no cover - a step row is only deleted with its job
            raise LeaseLost(job.id)
        return stored


def _encoded(name: str, value: object) -> str | None:
    """A step's value as the JSON text to store, or a ValidationError naming the step."""
    try:
        return validate.result(value)
    except ValidationError as exc:
        raise ValidationError(
            "step", f"step {name!r} returned a value that cannot be stored: {exc.message}"
        ) from None
