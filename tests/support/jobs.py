"""A leased Job made by hand, for the unit tests that need one without a database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from jobrun.job.model import Backoff, Job, State


def leased_job(**fields: Any) -> Job:
    """A job as a claim returns it (queue ``q``, type ``t``, a new id and lease
    token, every time the current one); ``fields`` replace any of them."""
    now = dt.datetime.now(dt.UTC)
    job = Job(
        id=uuid.uuid4(), queue="q", type="t", payload={}, priority=0, state=State.LEASED,
        attempts=1, max_attempts=3, backoff=Backoff(), run_at=now, lease_owner="o",
        lease_token=uuid.uuid4(), lease_expires_at=now, cancel_requested=False,
        idempotency_key=None, last_error=None, created_at=now, updated_at=now, finished_at=None,
    )  # fmt: skip
    return dataclasses.replace(job, **fields)
