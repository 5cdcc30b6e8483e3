"""Durable steps and the keys of a job's effects beyond the database (issue 29).

A step is a named part of a handler whose value is stored when it returns,
so that a retried attempt (after an exception, a crash, a lost lease)
returns the stored value instead of running it again. This module is the
domain half: what a step name may be, the record of a step done, the port a
store implements, and the idempotency keys a handler hands to the APIs it
calls (a payment provider, an e-mail service, an object store), which can
never join jobrun's transaction.

Idempotency keys are derived, never stored: a UUID (36 characters, accepted
by every API that takes a key: Stripe's ``Idempotency-Key``, PayPal's
``PayPal-Request-Id``, S3's object names) made by UUIDv5 from the job's
effect key (``("job:" + type, idempotency_key or id)``, the key of its
commit callable's ledger row) and, for a step, its name. So it is the same
on every attempt, on every worker, after a crash and after an operator's
retry; and two jobs enqueued with one idempotency key (the second after the
first was purged) share it, as they share the commit callable's effect.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import EffectKey, Job

MAX_STEP_NAME_CHARS = 200
"""The longest step name (the table's check says the same)."""

KEY_NAMESPACE = uuid.UUID("5f0c0a52-3b1e-5d7a-9a57-6a6f6272756e")
"""The UUIDv5 namespace of jobrun's idempotency keys (fixed forever: a key
must come out the same from every version)."""

TransactionStepFn = Callable[[Any], Any]
"""A transactional step: called with the open psycopg connection inside the
step's transaction; its return value is the step's value. It may run
statements, never commit or roll back."""


def step_name(value: object) -> str:
    """A valid step name: a non-empty str of at most MAX_STEP_NAME_CHARS
    characters (no NUL, no lone surrogate); a ValidationError otherwise."""
    message = f"must be a non-empty str of at most {MAX_STEP_NAME_CHARS} characters"
    if not isinstance(value, str):
        raise ValidationError("step", f"{message}, not {type(value).__name__}")
    value = validate.text("step", str(value))
    if not value or len(value) > MAX_STEP_NAME_CHARS:
        raise ValidationError("step", message)
    return value


def idempotency_key(job: Job, step: str | None = None) -> str:
    """The job's idempotency key for APIs outside the database, or its step's.

    Deterministic (see the module docstring): ``str(uuid5(KEY_NAMESPACE,
    scope + "\\n" + key [+ "\\n" + step]))`` of the job's effect key.
    """
    effect = EffectKey.of(job)
    name = f"{effect.scope}\n{effect.key}"
    if step is not None:
        name = f"{name}\n{step_name(step)}"
    return str(uuid.uuid5(KEY_NAMESPACE, name))


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """A step done: its value as stored, and the attempt that recorded it."""

    value: Any
    """The step's value as JSON gave it back (None when it returned None)."""
    attempt: int
    """The attempt (``Job.attempts``) that ran it."""


class StepStore(Protocol):
    """What durable steps need of the store. Every write is fenced by the job's
    claim (owner and lease token) and raises ``LeaseLost``, having written
    nothing, when the claim no longer holds the job."""

    def load_steps(self, job: Job) -> dict[str, StepRecord]:
        """Every step of ``job`` recorded so far, by name (one query)."""
        ...

    def record_step(self, job: Job, name: str, value: object) -> StepRecord:
        """Record step ``name`` done with ``value`` (a JSON value, checked by the
        result's rules: a ValidationError before anything is written)."""
        ...

    def transaction_step(self, job: Job, name: str, fn: TransactionStepFn) -> StepRecord:
        """Run ``fn(conn)`` and record step ``name`` with its value in one
        transaction: both commit, or neither."""
        ...

    def issue_fencing_token(self, job: Job) -> int:
        """A fencing token for ``job``'s claim, greater than every one issued
        for the job before."""
        ...
