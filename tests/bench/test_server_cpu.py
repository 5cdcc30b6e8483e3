"""The benchmark's CPU readings (bench/cpu.py) count a real process tree: a parent,
its live children and the children it has reaped, and a PostgreSQL server's
backends while they run and after they exit."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from bench import cpu
from tests.support.database import TestServer

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"

PARENT = """
import subprocess, sys
burn = {burn!r}
subprocess.run([sys.executable, "-c", burn])  # a child that exits (reaped)
live = subprocess.Popen(  # one that burns as much, then waits, alive
    [sys.executable, "-c", burn + "print(flush=True)\\nimport time\\ntime.sleep(60)"],
    stdout=subprocess.PIPE,
)
live.stdout.readline()
print("ready", flush=True)
sys.stdin.readline()
live.kill()
live.wait()
"""


def test_a_tree_counts_its_reaped_and_its_live_children() -> None:
    seconds = 0.4
    burn = BURN.format(s=seconds)
    with subprocess.Popen(
        [sys.executable, "-c", PARENT.format(burn=burn)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as parent:
        assert parent.stdin is not None and parent.stdout is not None
        try:
            assert parent.stdout.readline().strip() == "ready"
            own = cpu.process_cpu_seconds(parent.pid)
            tree = cpu.tree_cpu_seconds(parent.pid)
        finally:
            parent.stdin.write("\n")
            parent.stdin.flush()
    # Two children burned ``seconds`` each (the live one at least that by now):
    # the parent's own CPU is an interpreter's start-up, the tree's holds both.
    assert tree - own >= 2 * seconds - 0.05, (tree, own)


def test_the_server_reading_counts_a_backend_before_and_after_it_exits(
    pg_server: TestServer,
) -> None:
    if pg_server.cluster is None:
        pytest.skip("the test server is not a local cluster: its processes are not ours")
    datadir: Path = pg_server.cluster.datadir
    before = cpu.server_cpu_seconds(datadir)
    assert before is not None
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        backend = int(row[0])
        started = cpu.process_cpu_seconds(backend)
        conn.execute("SELECT count(*) FROM generate_series(1, 3000000)")
        used = cpu.process_cpu_seconds(backend) - started
        live = cpu.server_cpu_seconds(datadir)
    assert used > 0.05  # the query did burn CPU in that backend
    assert live is not None and live - before >= used - 0.02, (before, live, used)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{backend}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # exited and reaped by the postmaster
    after = cpu.server_cpu_seconds(datadir)
    # Its CPU moved to the postmaster's reaped-children time: nothing was lost.
    assert after is not None and after >= live - 0.02, (live, after)


def test_no_server_no_reading(tmp_path: Path) -> None:
    assert cpu.server_cpu_seconds(tmp_path) is None
    assert cpu.cores(None, 3.0, 1.0) is None
    assert cpu.cores(1.0, 3.0, 2.0) == 1.0
    assert cpu.text(0.66, 0.58) == "worker 0.66 + server 0.58 = 1.24 cores"
    assert cpu.text(0.66, None) == "worker 0.66 cores"
