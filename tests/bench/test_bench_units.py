"""The benchmark's pieces that need no database: percentiles, targets, options."""

from __future__ import annotations

import pytest

from bench import measure
from bench.peers import run as peers
from bench.run import parse_args
from bench.stats import Figure, at_least, percentile, ratio_at_least
from bench.sustained import interval_of


def test_percentile() -> None:
    assert percentile([5.0], 99) == 5.0
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile(list(range(101)), 95) == 95
    assert percentile([3, 1, 2], 0) == 1 and percentile([3, 1, 2], 100) == 3
    with pytest.raises(ValueError):
        percentile([], 50)


def test_figures_and_targets() -> None:
    f = Figure("x", "jobs/s", [3.0, 1.0, 2.0], target=at_least(2, "jobs/s", ratio=1.5))
    assert (f.median, f.min, f.max) == (2.0, 1.0, 3.0)
    assert f.verdict == "n/a"  # no ceiling in this run
    f.ratio = 1.4
    assert f.verdict == "MISS"
    f.ratio = 1.6
    assert f.verdict == "PASS"
    assert Figure("y", "jobs/s", [1.0], target=ratio_at_least(0.6)).verdict == "n/a"
    record = f.record()
    assert record["median"] == 2.0 and record["runs"] == 3 and record["verdict"] == "PASS"


def test_options() -> None:
    args = parse_args(["--quick", "--only", "pickup,ceiling", "--size", "pickup_seconds=1"])
    assert args.names == ["ceiling", "pickup"]  # the ceiling first
    assert args.runs == 1
    assert args.sizes.pickup_seconds == 1.0
    assert parse_args([]).runs == 3
    assert parse_args([]).sizes == measure.Sizes()
    with pytest.raises(SystemExit):
        parse_args(["--only", "nope"])
    with pytest.raises(SystemExit):
        parse_args(["--size", "nope=3"])


def test_sustained_sizes_and_intervals() -> None:
    args = parse_args(["--only", "sustained", "--size", "sustained_seconds=60"])
    assert args.names == ["sustained"]
    assert args.sizes.sustained_seconds == 60.0
    assert measure.Sizes().sustained_seconds == 600  # the 10 minutes
    assert measure.Sizes().sustained_load == 0.8
    # A minute per interval for the full run; a sixth of a short one, so that a
    # 60-second CI run still compares a first and a last interval.
    assert interval_of(600, 0) == 60
    assert interval_of(60, 0) == 10
    assert interval_of(3, 0) == 1
    assert interval_of(600, 30) == 30


def test_peers_drain_cells_carry_both_cpus() -> None:
    f = peers.Figure("drain_best", "jobrun", "128 threads", "jobs/s")
    for rate, worker, server in ((9_000.0, 0.6, 0.5), (9_500.0, 0.7, 0.6), (8_000.0, 0.5, None)):
        f.values.append(rate)
        f.details.append({"worker_cpu_cores": worker, "server_cpu_cores": server})
    cell = peers._cell(f)
    assert cell is not None
    assert cell["cpu_cores"] == {"worker": 0.6, "server": 0.55}  # medians of what was read
    text = peers._rate_text(cell, spread=False, setting=True, sep="; ")
    assert text == "9,000 /s; 128 threads; worker 0.60 + server 0.55 = 1.15 cores"
    enqueue = peers.Figure("enqueue_one", "jobrun", "", "jobs/s", [2_000.0], [{"seconds": 1}])
    assert "cpu_cores" not in (peers._cell(enqueue) or {})
