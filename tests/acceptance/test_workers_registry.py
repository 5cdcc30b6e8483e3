"""The workers' registry and the type-aware claim, across real worker processes.

Two `jobrun worker` processes on one queue, each knowing one job type: both
listed by `jobrun workers` while idle, with their pid and types; each job
runs on the process that knows its type, none released (parked); one
scheduler leader named as its worker; a killed worker shown gone, then
pruned by the other's idle heartbeat after ten lease TTLs; a stopped worker
takes its row away.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from jobrun.job.model import NewJob, State
from jobrun.job.workers import PRUNE_FACTOR
from jobrun.postgres.store import Store
from tests.acceptance.conftest import ROOT, WorkerProcess
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

APPS = "tests.acceptance.apps.kinds"
TTL_SECONDS = 1.0
QUICK = {"JOBRUN_LEASE_TTL": "1s", "JOBRUN_HEARTBEAT_INTERVAL": "250ms"}
"""For the pruning test: gone after a second, pruned after ten."""
STEADY = {"JOBRUN_LEASE_TTL": "15s", "JOBRUN_HEARTBEAT_INTERVAL": "1s"}
"""For the others: a worker stays live through a loaded machine's stalls
(with a 1 s lease a busy CI host can let a heartbeat slip past it, and the
worker then counts as gone: another one takes and parks its types)."""


def listed(dsn: str) -> list[dict[str, Any]]:
    """`jobrun workers --json`, as an operator runs it."""
    done = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", "workers", "--json"],
        env={**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(done.stdout)
    return rows


def by_pid(dsn: str) -> dict[int, dict[str, Any]]:
    return {r["pid"]: r for r in listed(dsn)}


def start_two(
    start_worker: Callable[..., WorkerProcess], dsn: str, env: dict[str, str] = STEADY
) -> tuple[Any, Any]:
    a = start_worker("--app", f"{APPS}:registry_a", env=env)
    b = start_worker("--app", f"{APPS}:registry_b", env=env)
    wait_for(lambda: {a.pid, b.pid} <= set(by_pid(dsn)), timeout=60, interval=0.5)
    return a, b


def test_idle_workers_are_listed_with_their_types_and_one_leader(
    dsn: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    a, b = start_two(start_worker, dsn)
    rows = by_pid(dsn)
    assert rows[a.pid]["types"] == ["kind.a"] and rows[b.pid]["types"] == ["kind.b"]
    for pid in (a.pid, b.pid):
        row = rows[pid]
        assert row["queues"] == ["default"] and row["leased"] == 0 and row["live"]
        assert row["status"].startswith("idle")
    # Both run a scheduler candidate: exactly one is the leader, named as its worker.
    wait_for(lambda: sum(r["leader"] for r in by_pid(dsn).values()) == 1, timeout=30, interval=0.5)
    text = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", "workers"],
        env={**os.environ, "DATABASE_URL": dsn, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=True,
    ).stdout
    assert "kind.a" in text and "kind.b" in text and "leader" in text


def test_each_job_runs_on_the_worker_that_knows_its_type_and_none_is_parked(
    dsn: str, store: Store, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    a, b = start_two(start_worker, dsn)
    out = tmp_path / "ran"
    out.mkdir()
    jobs = [
        store.enqueue(NewJob(type=kind, payload={"dir": str(out)}))
        for _ in range(10)
        for kind in ("kind.a", "kind.b")
    ]
    wait_for(
        lambda: all(store.get(j.id).state is State.SUCCEEDED for j in jobs),
        timeout=60,
        interval=0.5,
    )
    ran = {p.name: p.read_text().split() for p in out.iterdir()}
    for job in jobs:
        kind, pid = ran[str(job.id)]
        assert kind == job.type
        assert int(pid) == (a.pid if job.type == "kind.a" else b.pid)
        stored = store.get(job.id)
        assert stored.releases == 0 and stored.attempts == 1
        assert "released" not in [str(e.kind) for e in store.events(job.id)]


def test_a_killed_worker_is_shown_gone_then_pruned_and_a_stopped_one_leaves(
    dsn: str, start_worker: Callable[..., WorkerProcess]
) -> None:
    a, b = start_two(start_worker, dsn, QUICK)
    a.signal(signal.SIGKILL)
    a.wait(10)
    killed_at = time.monotonic()
    wait_for(lambda: not by_pid(dsn)[a.pid]["live"], timeout=30, interval=0.5)
    assert by_pid(dsn)[a.pid]["status"].startswith("gone")
    # b's idle heartbeats register it again, and each registration prunes.
    wait_for(lambda: a.pid not in by_pid(dsn), timeout=60, interval=0.5)
    assert time.monotonic() - killed_at >= PRUNE_FACTOR * TTL_SECONDS - 2
    assert b.pid in by_pid(dsn)
    b.signal(signal.SIGTERM)
    assert b.wait(60) == 0, b.output()
    assert listed(dsn) == []
