"""A real ``jobrun worker --metrics-port`` under load: what it exports, checked against the
database (issue 12's "done when": every metric, values the database agrees with)."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobrun.job.model import Backoff, NewJob
from jobrun.job.model import State as JobState
from jobrun.postgres.store import Store
from tests.observe.test_health_cli import SERVING
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.apps.outcomes:registry"
NOW = Backoff(kind="constant", base=0.0, jitter=0.0)

pytestmark = pytest.mark.slow


def scrape(base: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
        text = reply.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = defaultdict(list)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name].append((dict(sample.labels), sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **match: str) -> float:
    return sum(
        value
        for labels, value in samples.get(name, [])
        if all(labels.get(k) == v for k, v in match.items())
    )


def test_a_worker_under_load_exports_what_the_database_holds(
    store: Store, dsn: str, conn: Any, tmp_path: Path
) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS effects (job_id uuid, attempt int, pid int)")
    store.pause_queue("default")  # the whole load is queued before the worker claims
    batches = {"ok": 400, "result": 100, "flaky": 50, "boom": 20, "perm": 10, "nobody": 5}
    for job_type, n in batches.items():
        store.enqueue_batch(NewJob(type=job_type, max_attempts=2, backoff=NOW) for _ in range(n))
    later = store.enqueue(NewJob(type="ok", queue="later", delay=dt.timedelta(hours=1)))

    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "PYTHONPATH": str(ROOT),
        "JOBRUN_POLL_INTERVAL": "200ms",
        "JOBRUN_LOG_SUCCESS": "debug",
    }
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "jobrun.cli", "worker", "--app", APP),
                *("--queues", "default,later", "--concurrency", "8"),
                *("--metrics-port", "0", "--observe-host", "127.0.0.1"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        match = wait_for(lambda: SERVING.search(log.read_text()), timeout=60)
        base = f"http://127.0.0.1:{match['port']}"
        store.resume_queue("default")

        def settled() -> bool:
            row = conn.execute(
                "SELECT count(*) FROM jobrun.jobs WHERE queue = 'default'"
                " AND (state IN ('succeeded', 'dead') OR (state = 'queued' AND type = 'nobody'))"
            ).fetchone()
            return bool(row[0] == sum(batches.values()))

        wait_for(settled, timeout=120)
        # Outcomes are counted once recorded, and the cluster cache lasts 10 s:
        # wait for the scrape to agree, then compare everything at once.
        finished = defaultdict(float)
        for kind, events in conn.execute(
            "SELECT kind, count(*) FROM jobrun.job_events e JOIN jobrun.jobs j ON j.id = e.job_id"
            " WHERE j.queue = 'default' GROUP BY kind"
        ).fetchall():
            finished[kind] = float(events)
        expected_succeeded = float(batches["ok"] + batches["result"] + batches["flaky"])
        samples = wait_for(
            lambda: (
                got
                if total(got := scrape(base), "jobrun_jobs_finished_total", outcome="succeeded")
                == expected_succeeded
                and total(got, "jobrun_queue_jobs", queue="later", state="scheduled") == 1
                else None
            ),
            timeout=60,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()

    # The endpoint's shape: no _created samples, and an outcome series only once it happened
    # (the queue "later" ran nothing, so no per-job series names it).
    assert [name for name in samples if name.endswith("_created")] == []
    per_job = ("jobrun_jobs_finished_total", "jobrun_jobs_started_total")
    assert [(n, lab) for n in per_job for lab, v in samples[n] if v == 0] == []
    assert not [
        labels for name in per_job for labels, _ in samples[name] if labels["queue"] != "default"
    ]

    def finished_by(**match: str) -> float:
        return total(samples, "jobrun_jobs_finished_total", **match)

    # Per worker: outcomes against the jobs and their events.
    dead = float(batches["boom"] + batches["perm"])
    assert finished_by(outcome="dead") == dead == finished["dead"]
    retried = float(batches["flaky"] + batches["boom"])  # each failed one attempt and ran again
    assert finished_by(outcome="failed") == retried == finished["retrying"]
    assert finished_by(outcome="released") >= batches["nobody"]  # no handler: released, not failed
    assert finished_by(type="unknown") == finished_by(outcome="released")
    for job_type in ("ok", "result", "flaky"):
        states = conn.execute(
            "SELECT count(*) FROM jobrun.jobs WHERE type = %s AND state = 'succeeded'", [job_type]
        ).fetchone()
        assert finished_by(type=job_type, outcome="succeeded") == float(states[0])
    claimed = finished["claimed"]
    started = total(samples, "jobrun_jobs_started_total")
    assert started == claimed - finished_by(outcome="released")  # every claim ran a handler...
    assert total(samples, "jobrun_job_run_duration_seconds_count") == started
    assert total(samples, "jobrun_job_pickup_latency_seconds_count") == claimed  # every claim
    assert total(samples, "jobrun_store_call_jobs_sum", operation="claim") == claimed
    completed = total(samples, "jobrun_store_call_completed_jobs_sum")
    assert completed == expected_succeeded  # in the completer's batches or with the claims
    assert total(samples, "jobrun_store_call_completed_jobs_count") < completed  # batched
    assert total(samples, "jobrun_store_call_duration_seconds_count", operation="fail") >= retried
    assert total(samples, "jobrun_worker_handler_threads") == 8
    assert 0 <= total(samples, "jobrun_worker_handler_threads_busy") <= 8
    assert total(samples, "jobrun_pool_connections_max") >= 8
    assert total(samples, "jobrun_store_call_errors_total") == 0

    # Cluster-wide, from this worker as the scheduler leader: the database's own counts.
    depth = dict(
        conn.execute(
            "SELECT state::text, count(*) FROM jobrun.jobs WHERE queue = 'default'"
            " AND state IN ('queued', 'leased', 'dead') GROUP BY state"
        ).fetchall()
    )
    assert total(samples, "jobrun_queue_jobs", queue="default", state="dead") == depth["dead"]
    queued_default = total(samples, "jobrun_queue_jobs", queue="default", state="ready") + total(
        samples, "jobrun_queue_jobs", queue="default", state="scheduled"
    )
    assert queued_default == depth.get("queued", 0) == batches["nobody"]
    assert total(samples, "jobrun_queue_jobs", queue="later", state="scheduled") == 1
    assert total(samples, "jobrun_queue_oldest_ready_age_seconds", queue="later") == 0
    assert total(samples, "jobrun_leader_present") == 1
    ((leader, _),) = samples["jobrun_leader_info"]
    assert leader["application_name"] == "jobrun-leader"
    usage = total(samples, "jobrun_notification_queue_usage_ratio")
    assert 0 <= usage < 0.5
    assert total(samples, "jobrun_cluster_stats_up") == 1
    assert store.get(later.id).state is JobState.QUEUED
