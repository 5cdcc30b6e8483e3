"""The capacity model's pieces that need no database (bench/capacity.py, docs/capacity.md)."""

from __future__ import annotations

import pytest

from bench.capacity import Costs, Counters, Latency, lease_time, predict


def test_hosts_add_throughput_until_the_cpu_per_job_fills_the_cores() -> None:
    costs = Costs(worker=250e-6, database=300e-6)  # one process: at most 4,000 jobs/s
    assert predict(1, costs, cores=8) == pytest.approx(4_000)
    assert predict(2, costs, cores=8) == pytest.approx(8_000)
    assert predict(4, costs, cores=2) == pytest.approx(2 / 550e-6)  # the cores are full
    assert predict(4, Costs(worker=250e-6, database=300e-6, pooler=50e-6), cores=2) == (
        pytest.approx(2 / 600e-6)
    )


def test_a_lone_worker_is_bound_by_two_batches_per_lease_time() -> None:
    costs = Costs(worker=250e-6, database=300e-6)
    latency = Latency(claim=0.004, complete=0.003, window=0.005)
    # R = 5 ms window + 16 x 0.25 ms of the worker's CPU + half of (4 ms claim + 3 ms complete).
    assert lease_time(latency, costs, 16) == pytest.approx(0.0125)
    assert predict(1, costs, cores=8, latency=latency, concurrency=16) == pytest.approx(2_560)
    assert predict(2, costs, cores=8, latency=latency, concurrency=16) == pytest.approx(5_120)
    # More hosts meet the machine's CPU instead: the latency bound no longer binds.
    assert predict(4, costs, cores=2, latency=latency, concurrency=16) == pytest.approx(2 / 550e-6)
    with pytest.raises(ValueError, match="concurrency"):
        predict(1, costs, cores=8, latency=latency)


def test_the_model_refuses_what_it_cannot_predict() -> None:
    with pytest.raises(ValueError):
        predict(0, Costs(worker=1e-4, database=1e-4), cores=2)
    with pytest.raises(ValueError):
        predict(1, Costs(worker=0.0, database=1e-4), cores=2)


def test_per_job_counts_what_was_written_between_two_readings() -> None:
    before = Counters(1_000, 10, 0, 5, 3, {"jobs": (10, 0, 0, 0)}, {"jobs_pkey": 8192}, {"jobs": 2})
    after = Counters(5_000, 50, 2, 9, 7, {"jobs": (12, 4, 2, 0)}, {"jobs_pkey": 16384}, {"jobs": 2})
    got = after.per_job(before, 2, own_xacts=2)
    assert got["wal_bytes"] == 2_000 and got["wal_records"] == 20 and got["wal_fpi"] == 1
    assert got["transactions"] == 1 and got["statements"] == 2
    assert got["tables"]["jobs"] == {
        "inserted": 1.0,
        "updated": 2.0,
        "hot_updated": 1.0,
        "deleted": 0.0,
    }
    assert got["tuples_written"] == 3
    # Inserts and non-HOT updates, in each of the table's 2 indexes: (2 + 4 - 2) * 2 / 2 jobs.
    assert got["index_entries_at_most"] == 4
    assert got["index_bytes"] == {"jobs_pkey": 4096}
