"""The benchmark runs end to end (``--quick``: small sizes, one run) and records
every figure with its context. Behaviour only: no figure is held to a speed."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import jobrun
from bench import measure
from tests.support.database import TestServer

# Real worker processes, about 95 s (30 s of them sustained, 15 s workflows).
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "ceiling",
    "enqueue_one",
    "enqueue_batch",
    "enqueue_batch.rss",
    "enqueue_batch.stream",
    "enqueue_batch.stream.rss",
    *(f"drain.{kind}.{c}" for kind in ("noop", "tx") for c in ("c1", "c8", "c32", "p2x8")),
    *(f"drain.{kind}.{c}.rss" for kind in ("noop", "tx") for c in ("c1", "c8", "c32", "p2x8")),
    "drain.noop.best",
    "drain.tx.best",
    "drain.noop.best.cores",
    "drain.tx.best.cores",
    "worker_rss.drain",
    "worker_rss",
    *(f"drain.observed.{v}" for v in ("off", "metrics", "otel")),
    *(f"drain.observed.{v}.cpu_per_job" for v in ("off", "metrics", "otel")),
    "drain.observed.metrics.cost",
    "drain.observed.otel.cost",
    *(f"drain.handlers.{v}" for v in ("plain", "async")),
    *(f"drain.handlers.{v}.cpu_per_job" for v in ("plain", "async")),
    "drain.handlers.async.ratio",
    *(f"drain.limits.{v}" for v in ("off", "concurrency", "concurrency_1000", "per_key", "rate")),
    *(f"drain.limits.{v}.ratio" for v in ("concurrency", "concurrency_1000", "per_key", "rate")),
    *(
        f"limits.claim.{v}.{q}"
        for v in ("none", "concurrency", "per_key", "rate")
        for q in ("p50", "p99")
    ),
    *(
        f"limits.claim.{v}.ratio_{q}"
        for v in ("concurrency", "per_key", "rate")
        for q in ("p50", "p99")
    ),
    "pickup.p50",
    "pickup.p95",
    "pickup.p99",
    "growth.claim.empty.p50",
    "growth.claim.empty.p95",
    "growth.claim.large.p50",
    "growth.claim.large.p95",
    "growth.claim.ratio_p50",
    "growth.claim.ratio_p95",
    "growth.claim_plan.seq_scans",
    *(
        f"dashboard.{page}.{q}"
        for page in ("overview", "jobs", "jobs_queued", "jobs_deep")
        for q in ("p50", "p95")
    ),
    "sustained.peak",
    "sustained.first",
    "sustained.last",
    "sustained.ratio",
    *(f"sustained.{t}.{v}" for t in ("jobs", "job_events") for v in ("mb", "dead_tuples")),
    "workflows.plain.cpu_per_job",
    *(
        f"workflows.{g}.{v}"
        for g in ("fanout", "chains")
        for v in ("cpu_per_node", "ratio", "wall_ratio")
    ),
    *(f"workflows.fanin_pickup.{q}" for q in ("p50", "p95", "p99")),
}
FIELDS = {
    "name",
    "unit",
    "median",
    "min",
    "max",
    "runs",
    "values",
    "parameters",
    "ratio_to_ceiling",
    "target",
    "verdict",
    "timestamp",
    "postgres",
    "machine",
    "jobrun",
    "options",
}
TARGETED = {
    "enqueue_one",
    "enqueue_batch",
    "enqueue_batch.stream.rss",
    "drain.noop.best",
    "drain.tx.best",
    "worker_rss",
    "drain.observed.metrics.cost",
    *(f"drain.limits.{v}.ratio" for v in ("concurrency", "per_key", "rate")),
    *(
        f"limits.claim.{v}.ratio_{q}"
        for v in ("concurrency", "per_key", "rate")
        for q in ("p50", "p99")
    ),
    "pickup.p50",
    "pickup.p99",
    "growth.claim.ratio_p50",
    "growth.claim_plan.seq_scans",
    "dashboard.overview.p50",
    "dashboard.jobs.p50",
    "sustained.ratio",
    "workflows.fanout.ratio",
    "workflows.chains.ratio",
    "workflows.fanin_pickup.p50",
}


@pytest.fixture(scope="module")
def quick_run(pg_server: TestServer, tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("bench-results")
    env = {**os.environ, "DATABASE_URL": pg_server.admin_dsn, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    files = list(out.glob("*.jsonl"))
    assert len(files) == 1, files
    records = [json.loads(line) for line in files[0].read_text().splitlines()]
    return {r["name"]: r for r in records}, records, proc.stdout


def test_every_figure_is_recorded_once(quick_run: Any) -> None:
    by_name, records, _ = quick_run
    assert set(by_name) == EXPECTED
    assert len(records) == len(EXPECTED)


def test_every_line_has_every_field(quick_run: Any) -> None:
    _, records, _ = quick_run
    for r in records:
        assert set(r) == FIELDS, r["name"]
        assert r["runs"] == len(r["values"]) == 1, r["name"]
        assert r["min"] <= r["median"] <= r["max"], r["name"]
        assert all(math.isfinite(v) for v in r["values"]), r["name"]
        assert isinstance(r["parameters"], dict) and r["parameters"], r["name"]
        assert r["unit"] in {
            "tx/s",
            "jobs/s",
            "MB",
            "ms",
            "x",
            "nodes",
            "%",
            "us",
            "cores",
            "rows",
        }, r["name"]
        if r["name"] in TARGETED:
            assert r["target"], r["name"]
            assert r["verdict"] in ("PASS", "MISS"), r["name"]
        else:
            assert r["target"] is None and r["verdict"] is None, r["name"]


def test_the_context_of_the_run(quick_run: Any) -> None:
    _, records, _ = quick_run
    first = records[0]
    for r in records:  # the same context on every line
        for key in ("timestamp", "postgres", "machine", "jobrun", "options"):
            assert r[key] == first[key]
    pg = first["postgres"]
    assert re.match(r"\d+(\.\d+)?", pg["version"])
    assert pg["version_num"] >= 140000
    assert pg["source"] == "DATABASE_URL"
    for setting in ("synchronous_commit", "fsync", "shared_buffers", "max_connections"):
        assert pg["settings"][setting], setting
    machine = first["machine"]
    assert machine["cpu_count"] >= 1
    assert machine["ram_gb"] > 0
    assert machine["kernel"]
    assert machine["cpu_model"]
    assert first["jobrun"]["version"] == jobrun.__version__
    commit = first["jobrun"]["git_commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit)
    assert first["options"]["quick"] is True
    assert first["options"]["sizes"]["drain_jobs"] == measure.QUICK.drain_jobs


def test_sane_values(quick_run: Any) -> None:
    by_name, records, _ = quick_run
    ceiling = by_name["ceiling"]["median"]
    assert ceiling > 0
    for r in records:
        if r["unit"] in ("jobs/s", "tx/s"):
            assert r["median"] > 0, r["name"]
            assert r["ratio_to_ceiling"] == pytest.approx(r["median"] / ceiling), r["name"]
        else:
            assert r["ratio_to_ceiling"] is None, r["name"]
        if r["unit"] == "MB" and not r["name"].startswith("sustained."):  # peak RSS
            assert 5 < r["median"] < 10_000, r["name"]
        if r["name"].startswith("workflows.fanin_pickup."):
            # 0 when the worker that completed the last parent claimed the
            # fan-in in that transaction (both times are its now()).
            assert r["median"] >= 0, r["name"]
        elif r["unit"] in ("ms", "x"):
            assert r["median"] > 0, r["name"]
    assert by_name["pickup.p50"]["median"] <= by_name["pickup.p95"]["median"]
    assert by_name["pickup.p95"]["median"] <= by_name["pickup.p99"]["median"]
    assert by_name["pickup.p50"]["parameters"]["jobs"] == 40
    for case in ("empty", "large"):
        assert (
            by_name[f"growth.claim.{case}.p50"]["median"]
            <= by_name[f"growth.claim.{case}.p95"]["median"]
        )
    # The best drain is one of the single-process drains, figures and all.
    for kind in ("noop", "tx"):
        best = by_name[f"drain.{kind}.best"]
        assert best["parameters"]["processes"] == 1
        assert best["values"] in [by_name[n]["values"] for n in best["parameters"]["best_of"]]
    assert by_name["drain.noop.p2x8"]["parameters"]["processes"] == 2
    # The limited drains ran under their limits, the per-key one over its keys;
    # each ratio is its drain over the unlimited drain of the same run.
    assert by_name["drain.limits.off"]["parameters"]["limits"] is None
    assert by_name["drain.limits.concurrency"]["parameters"]["limits"] == {"concurrency": 50}
    assert by_name["drain.limits.per_key"]["parameters"]["concurrency_keys"] == 1_000
    off = by_name["drain.limits.off"]["values"][0]
    for v in ("concurrency", "concurrency_1000", "per_key", "rate"):
        ratio = by_name[f"drain.limits.{v}.ratio"]
        assert ratio["values"][0] == pytest.approx(by_name[f"drain.limits.{v}"]["values"][0] / off)
    # A limit of 50 holds the drain to 50 leases at once.
    assert by_name["drain.limits.concurrency"]["parameters"]["leased_peak"] <= 50
    for v in ("concurrency", "per_key", "rate"):
        for q in ("p50", "p99"):
            assert by_name[f"limits.claim.{v}.{q}"]["median"] > 0
    assert by_name["limits.claim.none.p50"]["median"] <= by_name["limits.claim.none.p99"]["median"]
    # The best drain's CPU is the worker's (+ the server's when it is ours to read).
    for kind in ("noop", "tx"):
        cores = by_name[f"drain.{kind}.best.cores"]
        worker = cores["parameters"]["worker_cpu_cores"]  # rounded to 0.01
        assert worker > 0 and cores["median"] >= worker - 0.005
        best = by_name[f"drain.{kind}.best"]
        assert cores["parameters"]["drain"] in best["parameters"]["best_of"]
        assert best["values"] == by_name[cores["parameters"]["drain"]]["values"]
    # The sustained run: the producer's rate is the load times the peak measured
    # first; every job it enqueued in an interval shows in that interval; the
    # tables grew from empty and their samples run from the start to the end.
    ratio = by_name["sustained.ratio"]["parameters"]
    peak = by_name["sustained.peak"]["median"]
    assert ratio["producer_jobs_per_s"] == pytest.approx(peak * ratio["load"], rel=0.01)
    assert ratio["seconds"] == measure.QUICK.sustained_seconds
    intervals = int(ratio["seconds"] // ratio["interval_s"])
    assert len(ratio["completed_per_interval"]) == intervals >= 2
    assert sum(ratio["enqueued_per_interval"]) <= ratio["producer"]["enqueued"]
    assert ratio["producer"]["enqueued"] > 0
    assert by_name["sustained.first"]["median"] == ratio["completed_per_s"][0]
    assert by_name["sustained.last"]["median"] == ratio["completed_per_s"][-1]
    assert by_name["sustained.ratio"]["median"] == pytest.approx(
        ratio["completed_per_s"][-1] / ratio["completed_per_s"][0]
    )
    samples = ratio["samples"]
    assert len(samples) >= intervals + 1
    assert samples[0]["jobs.bytes"] < samples[-1]["jobs.bytes"]
    assert samples[0]["job_events.bytes"] < samples[-1]["job_events.bytes"]
    assert by_name["sustained.jobs.mb"]["median"] == samples[-1]["jobs.bytes"] / 1e6
    # The workflow figures: each ratio is its graph's CPU per node (worker and
    # server) over the plain drain's per job of the same run.
    plain = by_name["workflows.plain.cpu_per_job"]["values"][0]
    for graph in ("fanout", "chains"):
        ratio = by_name[f"workflows.{graph}.ratio"]["values"][0]
        per_node = by_name[f"workflows.{graph}.cpu_per_node"]["values"][0]
        assert ratio == pytest.approx(per_node / plain)
        split = by_name[f"workflows.{graph}.cpu_per_node"]["parameters"]["cpu_us"][0]
        # The server's part is 0 on a server not started by the bench (unknown).
        assert split[f"{graph}_worker_us"] > 0 and split[f"{graph}_server_us"] >= 0
    assert by_name["workflows.fanin_pickup.p50"]["parameters"]["fan_ins"] == 20
    # The claim plan is a behaviour, not a speed: it must use the index.
    plan = by_name["growth.claim_plan.seq_scans"]
    assert plan["median"] == 0
    assert plan["parameters"]["uses_jobs_claim_idx"] is True


def test_the_table_is_printed(quick_run: Any) -> None:
    _, _, stdout = quick_run
    assert "targets met:" in stdout
    for name in ("ceiling", "enqueue_one", "pickup.p99", "drain.tx.best", "sustained.ratio"):
        assert name in stdout
