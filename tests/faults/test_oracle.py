"""The oracle itself: it must see every kind of violation it claims to check."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg

from jobrun.job.model import NewJob
from jobrun.postgres.store import Store
from tests.faults.harness import TTL
from tests.faults.oracle import Target, check


def test_the_oracle_reports_lost_jobs_double_effects_overlapping_leases_and_reruns(
    store: Store, conn: psycopg.Connection[Any], admin_dsn: str, tmp_path: Path
) -> None:
    overlapping = store.enqueue(NewJob(type="tx.work"))
    [claimed] = store.claim("a", ["default"], 1, TTL)
    spurious = store.enqueue(NewJob(type="tx.work"))
    conn.execute(
        "INSERT INTO jobrun.job_events (job_id, kind, attempt) VALUES (%s, 'claimed', 2),"
        " (%s, 'succeeded', 0)",
        [overlapping.id, spurious.id],
    )
    conn.execute("UPDATE jobrun.jobs SET attempts = 2 WHERE id = %s", [overlapping.id])
    for _ in range(2):
        conn.execute(
            "INSERT INTO effects (scope, key, job_id, attempt, pid)"
            " VALUES ('job:tx.x', 'k', %s, 1, 0)",
            [spurious.id],
        )
    log = tmp_path / "log"
    log.mkdir()
    record = {"event": "start", "job": str(claimed.id), "token": str(claimed.lease_token)}
    (log / "1.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(record) + "\n")
    lost = uuid.uuid4()

    problems = check(Target(url=admin_dsn, log_dir=log, enqueued={lost}, settled=True))
    text = "\n".join(problems)
    assert f"lost: job {lost}" in text
    assert "effect (job:tx.x, k) written 2 times" in text
    assert "has no ledger row" in text
    assert f"overlapping leases: job {overlapping.id}" in text
    assert f"spurious event: job {spurious.id}" in text
    assert f"claim {claimed.lease_token} of job {claimed.id} was run 2 times" in text
    assert f"job {overlapping.id} is still leased" in text

    # Leave a clean database for the oracle that runs after every test.
    conn.execute("DELETE FROM effects; DELETE FROM jobrun.job_events; DELETE FROM jobrun.jobs")
