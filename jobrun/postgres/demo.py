"""The SQL of ``jobrun demo``: its effects table and the exactly-once check.

The demo's transactional handler writes one row per job into
``jobrun_demo_effects`` through its commit callable; the summary checks that
every succeeded job of the run has exactly one row and no other job has any.
The table is the demo's own (created on first use, outside the migrations).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

CREATE = """
CREATE TABLE IF NOT EXISTS jobrun_demo_effects (
    job_id     uuid        PRIMARY KEY,
    run        text        NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)
"""


def create_table(pool: ConnectionPool[Any]) -> None:
    with pool.connection() as conn:
        conn.execute(CREATE)


def write_effect(conn: psycopg.Connection[Any], job_id: uuid.UUID, run: str) -> None:
    """The commit callable's statement: inside Complete's transaction."""
    conn.execute("INSERT INTO jobrun_demo_effects (job_id, run) VALUES (%s, %s)", [job_id, run])


@dataclasses.dataclass(frozen=True)
class EffectCheck:
    succeeded_ledger_jobs: int
    effect_rows: int
    jobs_with_one_row: int
    rows_without_success: int

    @property
    def exactly_once(self) -> bool:
        return (
            self.effect_rows == self.succeeded_ledger_jobs == self.jobs_with_one_row
            and self.rows_without_success == 0
        )


def check_effects(pool: ConnectionPool[Any], run: str, queue: str, job_type: str) -> EffectCheck:
    with pool.connection() as conn:
        row = conn.execute(
            """
            SELECT
              (SELECT count(*) FROM jobs WHERE queue = %(q)s AND type = %(t)s
                 AND state = 'succeeded'),
              (SELECT count(*) FROM jobrun_demo_effects WHERE run = %(r)s),
              (SELECT count(*) FROM jobs j WHERE j.queue = %(q)s AND j.type = %(t)s
                 AND j.state = 'succeeded'
                 AND (SELECT count(*) FROM jobrun_demo_effects e WHERE e.job_id = j.id) = 1),
              (SELECT count(*) FROM jobrun_demo_effects e WHERE e.run = %(r)s AND NOT EXISTS (
                 SELECT 1 FROM jobs j WHERE j.id = e.job_id AND j.state = 'succeeded'))
            """,
            {"q": queue, "t": job_type, "r": run},
        ).fetchone()
    assert row is not None
    return EffectCheck(*row)
