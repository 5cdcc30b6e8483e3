"""The fault suite's handlers plus a durable job of steps (tests/faults/test_workflows.py).

``jobrun worker --app tests.faults.workflow_app:registry`` runs the handlers
of :mod:`tests.faults.app` (a workflow's parents, children and fan-ins are
``tx.work`` jobs: their effects are counted by the oracle) and ``tx.steps``:

- ``fetch``, a plain ``ctx.step``: its run writes a ``step`` record to the
  side log (its effect), sleeps ``pause`` and returns a fresh nonce; the run
  is at-least-once (a kill before its checkpoint commits runs it again), its
  stored value is what every later step sees;
- ``t1``, ``t2``, ``t3``, ``ctx.transaction_step`` s: each writes a row of
  ``step_effects`` (with the nonce it was given) in the step's transaction,
  so a step recorded once has exactly one row whatever was killed when;
- then, as every ``tx.*`` handler, its commit callable's effect.

``tx.aligned`` (a fan-in's parents): as ``tx.work``, but its handler returns at
the next multiple of ``align`` seconds of the host's clock (at least a tenth
of it away), so two parents started in the same window on two worker
processes return at the same instant and their Complete transactions race
for their child's row.

Payload ``pause``: seconds slept before each step and before returning, so
that a kill -9 lands between steps as well as inside them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from jobrun import Job, JobContext
from tests.faults.app import commit_for, registry, side_log

__all__ = ["STEP_EFFECTS_DDL", "TX_STEPS", "registry"]

TX_STEPS = ("t1", "t2", "t3")

STEP_EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS step_effects (
    job_id  uuid        NOT NULL,
    step    text        NOT NULL,
    attempt integer     NOT NULL,
    nonce   text        NOT NULL,
    pid     integer     NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


@registry.handler("tx.aligned")
def tx_aligned(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    side_log("start", job)
    align = float(job.payload.get("align", 0.5))
    now = time.time()
    until = (now // align + 1) * align
    if until - now < align / 10:
        until += align
    time.sleep(until - now)
    side_log("end", job)
    return commit_for(job)


@registry.handler("tx.steps")
def tx_steps(ctx: JobContext, job: Job) -> Callable[[psycopg.Connection[Any]], None]:
    """One plain step, three transactional steps, then a commit callable."""
    pause = float(job.payload.get("pause", 0))
    side_log("start", job)

    def fetch() -> dict[str, Any]:
        side_log("step", job, step="fetch")  # its effect, done: a kill from here on
        time.sleep(pause)  # and before the checkpoint commits runs it again
        return {"nonce": uuid.uuid4().hex, "attempt": job.attempts}

    nonce = ctx.step("fetch", fetch)["nonce"]
    for name in TX_STEPS:
        time.sleep(pause)

        def write(conn: psycopg.Connection[Any], name: str = name) -> str:
            side_log("step", job, step=name)
            conn.execute(
                "INSERT INTO step_effects (job_id, step, attempt, nonce, pid)"
                " VALUES (%s, %s, %s, %s, %s)",
                [job.id, name, job.attempts, nonce, os.getpid()],
            )
            time.sleep(pause / 2)  # the step's transaction open: a kill here rolls it back
            return f"{name}@{job.attempts}"

        ctx.transaction_step(name, write)
    time.sleep(pause)
    side_log("end", job)
    return commit_for(job)
