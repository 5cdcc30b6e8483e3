"""The benchmark's pieces that need no database: percentiles, targets, options."""

from __future__ import annotations

import pytest

from bench import measure
from bench.run import parse_args
from bench.stats import Figure, at_least, percentile, ratio_at_least


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
