"""``jobrun worker`` and ``jobrun scheduler`` serving probes and metrics, as real processes.

With port 0 the process takes a free port and its INFO line names it: the
tests read it there, as a person starting it by hand would.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.lifecycle_app:registry"
FAST_ENV = {
    "JOBRUN_LEASE_TTL": "3s",
    "JOBRUN_HEARTBEAT_INTERVAL": "500ms",
    "JOBRUN_POLL_INTERVAL": "200ms",
    "JOBRUN_SHUTDOWN_GRACE": "20s",
}
SERVING = re.compile(r"serving (?P<paths>/\S+(?:, /\S+)*) on http://127\.0\.0\.1:(?P<port>\d+)")


class Process:
    def __init__(self, proc: subprocess.Popen[str], log: Path) -> None:
        self.proc = proc
        self.log = log

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def served(self) -> dict[str, str]:
        """The base URL of each path, from the INFO lines, once they are all there."""
        matches = wait_for(lambda: list(SERVING.finditer(self.output())), timeout=60)
        where = {}
        for match in matches:
            for path in match["paths"].split(", "):
                where[path] = f"http://127.0.0.1:{match['port']}"
        return where

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(60)


@pytest.fixture
def start(dsn: str, tmp_path: Path) -> Iterator[Callable[..., Process]]:
    procs: list[Process] = []

    def run(*args: str, env: dict[str, str] | None = None, python: str = "") -> Process:
        log = tmp_path / f"process-{len(procs)}.log"
        environ = {**os.environ, **FAST_ENV, "DATABASE_URL": dsn, **(env or {})}
        environ["PYTHONPATH"] = str(ROOT)
        command = (
            [sys.executable, "-c", python + "\nfrom jobrun.cli import main; sys.exit(main())"]
            if python
            else [sys.executable, "-m", "jobrun.cli"]
        )
        with open(log, "w") as handle:
            proc = subprocess.Popen(
                [*command, *args],
                stdout=handle,
                stderr=subprocess.STDOUT,
                text=True,
                env=environ,
                cwd=ROOT,
            )
        made = Process(proc, log)
        procs.append(made)
        return made

    yield run
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait(10)


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return reply.status, reply.read().decode(), reply.headers["Content-Type"]
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read().decode(), exc.headers["Content-Type"]


def test_jobrun_worker_serves_health_on_the_port_its_log_names(
    start: Callable[..., Process],
) -> None:
    worker = start(
        "worker",
        "--app",
        APP,
        "--no-scheduler",
        "--health-port",
        "0",
        "--observe-host",
        "127.0.0.1",
    )
    where = worker.served()
    assert sorted(where) == ["/healthz", "/readyz"]
    base = where["/healthz"]
    assert wait_for(lambda: get(f"{base}/healthz")[:2] == (200, "ok\n"))
    assert get(f"{base}/readyz")[:2] == (200, "ok\n")
    assert get(f"{base}/metrics")[0] == 404  # no metrics port asked for
    assert worker.stop() == 0, worker.output()
    assert "GET /healthz" not in worker.output()  # probes are not logged at INFO


def test_jobrun_worker_serves_metrics_and_the_probes_on_the_metrics_port(
    start: Callable[..., Process],
) -> None:
    worker = start("worker", "--app", APP, "--metrics-port", "0", "--observe-host", "127.0.0.1")
    where = worker.served()
    assert sorted(where) == ["/healthz", "/metrics", "/readyz"]
    base = where["/metrics"]
    status, body, content_type = get(f"{base}/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    names = {
        line.split("{")[0].split(" ")[0] for line in body.splitlines() if line and line[0] != "#"
    }
    assert "jobrun_worker_handler_threads" in names, sorted(names)
    assert not [name for name in names if name.endswith("_created")], sorted(names)
    # No job ran: the outcome counter is declared, with no series yet (none pre-created at 0).
    assert "# TYPE jobrun_jobs_finished_total counter" in body
    assert not any(name.startswith("jobrun_jobs_finished") for name in names), sorted(names)
    assert wait_for(lambda: get(f"{base}/healthz")[:2] == (200, "ok\n"))
    assert get(f"{base}/readyz")[:2] == (200, "ok\n")
    assert worker.stop() == 0, worker.output()


def test_jobrun_worker_serves_the_probes_apart_when_both_ports_are_given(
    start: Callable[..., Process],
) -> None:
    worker = start(
        "worker",
        "--app",
        APP,
        "--no-scheduler",
        "--metrics-port",
        "0",
        "--health-port",
        "0",
        "--observe-host",
        "127.0.0.1",
    )
    servers = wait_for(lambda: len(SERVING.findall(worker.output())) == 2 and worker.output())
    lines = {m["paths"]: m["port"] for m in SERVING.finditer(servers)}
    assert sorted(lines) == ["/healthz, /readyz", "/healthz, /readyz, /metrics"]
    probes = f"http://127.0.0.1:{lines['/healthz, /readyz']}"
    assert wait_for(lambda: get(f"{probes}/healthz")[0] == 200)
    assert get(f"{probes}/metrics")[0] == 404
    assert worker.stop() == 0, worker.output()


def test_jobrun_scheduler_serves_health(start: Callable[..., Process]) -> None:
    scheduler = start("scheduler", "--health-port", "0", "--observe-host", "127.0.0.1")
    base = scheduler.served()["/healthz"]
    assert wait_for(lambda: get(f"{base}/healthz")[:2] == (200, "ok\n"))
    assert get(f"{base}/readyz")[:2] == (200, "ok\n")
    assert scheduler.stop() == 0, scheduler.output()


def test_a_health_port_in_use_stops_the_worker_with_a_line_naming_it(
    start: Callable[..., Process],
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        worker = start(
            "worker",
            "--app",
            APP,
            "--no-scheduler",
            "--health-port",
            str(port),
            "--observe-host",
            "127.0.0.1",
        )
        assert worker.proc.wait(60) == 7, worker.output()
    last = worker.output().strip().splitlines()[-1]
    assert last.startswith(f"jobrun: JOBRUN_HEALTH_PORT: cannot listen on 127.0.0.1:{port}: ")
    assert "Traceback" not in worker.output()


@pytest.mark.parametrize(
    ("flags", "hidden", "setting", "extra"),
    [
        (("--metrics-port", "0"), "prometheus_client", "JOBRUN_METRICS_PORT", "metrics"),
        (("--tracing", "otel"), "opentelemetry", "JOBRUN_TRACING", "otel"),
    ],
)
def test_a_missing_extra_is_one_line_naming_the_setting_and_what_to_install(
    start: Callable[..., Process], flags: tuple[str, ...], hidden: str, setting: str, extra: str
) -> None:
    worker = start(
        "worker",
        "--app",
        APP,
        *flags,
        python=f"import sys\nsys.modules[{hidden!r}] = None  # as if not installed",
    )
    assert worker.proc.wait(60) == 7, worker.output()
    assert worker.output().strip().splitlines() == [
        f"jobrun: {setting}: needs {'prometheus-client' if extra == 'metrics' else 'OpenTelemetry'}"
        f": pip install 'jobrun[{extra}]'"
    ]


def test_the_tracing_flag_off_wins_over_the_environment(start: Callable[..., Process]) -> None:
    # OpenTelemetry hidden: asking for it would end the command at once.
    worker = start(
        "worker",
        "--app",
        APP,
        "--no-scheduler",
        "--tracing",
        "off",
        "--health-port",
        "0",
        "--observe-host",
        "127.0.0.1",
        env={"JOBRUN_TRACING": "otel"},
        python="import sys\nsys.modules['opentelemetry'] = None  # as if not installed",
    )
    base = worker.served()["/healthz"]
    assert wait_for(lambda: get(f"{base}/healthz")[0] == 200)
    assert worker.stop() == 0, worker.output()
