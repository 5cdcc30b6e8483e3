"""Fixtures for the adapter tests: a Store on its own pool and database."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from jobrun.job.model import NewJob


def new_job(**fields: Any) -> NewJob:
    fields.setdefault("type", "test.job")
    return NewJob(**fields)


def counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    """Rows in (jobs, job_events, processed_effects): nothing-written checks compare these."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs), (SELECT count(*) FROM jobrun.job_events), "
        "(SELECT count(*) FROM jobrun.processed_effects)"
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


TTL = dt.timedelta(seconds=30)
