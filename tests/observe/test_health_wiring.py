"""What a Runtime switches on from its Settings: metrics on its worker, tracing, and nothing else.

(The metrics and spans themselves are tested in test_metrics*.py and
test_tracing*.py; here, that the Runtime wires them in.)
"""

from __future__ import annotations

import datetime as dt
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from jobrun.config import Settings
from jobrun.job.model import NewJob, State
from jobrun.observe import tracing
from jobrun.postgres.store import Store
from jobrun.runtime import Runtime
from jobrun.worker import Registry
from jobrun.worker.context import JobContext
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAST: dict[str, Any] = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=200),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}


def ok_registry() -> Registry:
    registry = Registry()

    @registry.handler("ok")
    def ok(ctx: JobContext, job: Any) -> None:
        return None

    return registry


def scrape(runtime: Runtime) -> list[str]:
    assert runtime.observe is not None
    (server,) = runtime.observe.servers
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as reply:
        return [line for line in reply.read().decode().splitlines() if not line.startswith("#")]


def metrics_settings(dsn: str) -> Settings:
    return Settings(database_url=dsn, metrics_port=0, observe_host="127.0.0.1", **FAST)


def test_the_metrics_port_counts_the_runtimes_own_worker(dsn: str, store: Store) -> None:
    with Runtime(metrics_settings(dsn), ok_registry(), scheduler=False) as runtime:
        job = store.enqueue(NewJob(type="ok"))
        wait_for(lambda: store.get(job.id).state is State.SUCCEEDED)

        def succeeded() -> list[str]:
            return [
                line
                for line in scrape(runtime)
                if line.startswith("jobrun_jobs_finished_total{")
                and 'outcome="succeeded"' in line
                and 'type="ok"' in line
            ]

        assert len(wait_for(lambda: [x for x in succeeded() if x.endswith(" 1.0")])) == 1
        # No scheduler here, so never the leader: the cluster-wide series are someone else's.
        assert not [x for x in scrape(runtime) if x.startswith("jobrun_queue_jobs")]


def test_the_cluster_series_come_from_the_process_whose_scheduler_leads(dsn: str) -> None:
    with Runtime(metrics_settings(dsn), ok_registry()) as runtime:
        assert runtime.scheduler is not None
        scheduler = runtime.scheduler
        wait_for(lambda: scheduler.is_leader)
        wait_for(lambda: [x for x in scrape(runtime) if x.startswith("jobrun_queue_jobs")])


def test_tracing_otel_traces_the_worker_and_the_enqueues_while_the_runtime_runs(
    dsn: str,
) -> None:
    tracing.uninstrument()
    runtime = Runtime(Settings(database_url=dsn, tracing="otel", **FAST), ok_registry())
    try:
        assert runtime.observe is not None
        assert isinstance(runtime.observe.tracing, tracing.Tracing)
        assert runtime.observe.health is None and runtime.observe.servers == []  # no port
        assert not tracing.is_instrumented()
        runtime.start()
        assert tracing.is_instrumented()
    finally:
        runtime.stop()
    assert not tracing.is_instrumented()


def test_a_process_that_instrumented_itself_stays_instrumented_after_the_runtime(
    dsn: str,
) -> None:
    tracing.instrument()
    try:
        with Runtime(Settings(database_url=dsn, tracing="otel", **FAST), ok_registry()):
            assert tracing.is_instrumented()
        assert tracing.is_instrumented()
    finally:
        tracing.uninstrument()


def test_a_runtime_asking_for_nothing_imports_no_observability_module(dsn: str) -> None:
    script = (
        "import sys\n"
        "from jobrun import Registry, Runtime, Settings\n"
        f"with Runtime(Settings(database_url={dsn!r}), Registry()) as runtime:\n"
        "    assert runtime.observe is None\n"
        "print(sorted(m for m in sys.modules\n"
        "      if m.startswith(('jobrun.observe', 'prometheus_client', 'opentelemetry'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_same_number_for_both_ports_is_one_server(dsn: str) -> None:
    with socket.socket() as probe:  # a port free a moment ago
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    settings = Settings(
        database_url=dsn, metrics_port=port, health_port=port, observe_host="127.0.0.1", **FAST
    )
    with Runtime(settings, ok_registry(), scheduler=False) as runtime:
        assert runtime.observe is not None
        (server,) = runtime.observe.servers
        assert server.port == port
        assert server.paths == ["/healthz", "/readyz", "/metrics"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=30) as reply:
            assert reply.status == 200
