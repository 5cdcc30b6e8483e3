"""Real worker processes for the acceptance tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAST_ENV = {
    "JOBRUN_LEASE_TTL": "3s",
    "JOBRUN_HEARTBEAT_INTERVAL": "500ms",
    "JOBRUN_POLL_INTERVAL": "200ms",
    "JOBRUN_SHUTDOWN_GRACE": "20s",
}

TABLES = """
CREATE TABLE observed (job_id uuid, attempt int, what text, pid int, at timestamptz DEFAULT now());
CREATE TABLE effects (job_id uuid, attempt int, pid int, at timestamptz DEFAULT now());
"""


class WorkerProcess:
    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def tables(conn: Any) -> None:
    conn.execute(TABLES)


@pytest.fixture
def start_worker(dsn: str, tmp_path: Path) -> Iterator[Callable[..., WorkerProcess]]:
    procs: list[WorkerProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        log = tmp_path / f"worker-{len(procs)}.log"
        environ = {**os.environ, **FAST_ENV, "DATABASE_URL": dsn, **(env or {})}
        environ["PYTHONPATH"] = str(ROOT)
        handle = open(log, "w")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobrun.cli",
                "worker",
                "--app",
                "tests.acceptance.lifecycle_app:registry",
                *args,
            ],
            stdout=handle,
            stderr=subprocess.STDOUT,
            text=True,
            env=environ,
            cwd=ROOT,
        )
        handle.close()
        worker = WorkerProcess(proc, log)
        procs.append(worker)
        return worker

    yield start
    for w in procs:
        if w.proc.poll() is None:
            w.proc.send_signal(signal.SIGKILL)
            w.proc.wait(10)
