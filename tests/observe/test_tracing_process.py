"""One trace across processes: an enqueue here, the attempts in a real worker process.

The worker's app is tests/observe/apps/traced.py, whose module sets an SDK
TracerProvider that writes every span to a JSON-lines file. It runs either
as ``jobrun worker --app ... --tracing otel`` (the command imports the app,
then builds the Runtime with a Tracing hook) or as a program of its own that
builds ``jobrun.Runtime(..., hooks=[Tracing()])``; both until SIGTERM. The
test process traces its own enqueue with an in-memory exporter; the
creation context travels only through the job's row.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jobrun.job.model import Backoff, NewJob, State
from jobrun.observe import tracing
from jobrun.postgres.store import Store
from tests.acceptance.conftest import FAST_ENV
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)

pytestmark = pytest.mark.slow

LAUNCHERS = {
    "jobrun worker --tracing otel": [
        "-m",
        "jobrun.cli",
        "worker",
        "--app",
        "tests.observe.apps.traced:registry",
        "--no-scheduler",
        "--tracing",
        "otel",
    ],
    "Runtime(hooks=[Tracing()])": ["-m", "tests.observe.apps.traced"],
}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    """This process's spans (the enqueueing side), instrumented."""
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.instrument(tracer_provider=p)
    try:
        yield p
    finally:
        tracing.uninstrument()
        p.shutdown()


def read_spans(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def hex_ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_real_worker_process_continues_the_trace_of_the_enqueue(
    launcher: str,
    store: Store,
    dsn: str,
    tmp_path: Path,
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
) -> None:
    tracer = provider.get_tracer("tests.observe.request")
    with tracer.start_as_current_span("POST /orders") as request:
        ok = store.enqueue(NewJob(type="traced.ok", payload={"n": 7}))
        flaky = store.enqueue(NewJob(type="traced.flaky", max_attempts=2, backoff=NO_WAIT))
    trace_hex, request_hex = hex_ids(request)
    sends = {
        span.attributes["messaging.message.id"]: hex_ids(span)[1]
        for span in exporter.get_finished_spans()
        if span.name == "enqueue default"
    }
    assert set(sends) == {str(ok.id), str(flaky.id)}

    spans_file = tmp_path / "spans.jsonl"
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        **FAST_ENV,
        "DATABASE_URL": dsn,
        "JOBRUN_TEST_SPANS": str(spans_file),
        "PYTHONPATH": str(ROOT),
    }
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, *LAUNCHERS[launcher]],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        wait_for(lambda: store.get(ok.id).state is State.SUCCEEDED, timeout=60)
        wait_for(lambda: store.get(flaky.id).state is State.SUCCEEDED, timeout=60)

        def processed() -> list[dict[str, Any]]:
            found = [s for s in read_spans(spans_file) if s["kind"] == "CONSUMER"]
            return found if len(found) >= 3 else []

        wait_for(processed, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    worker_spans = read_spans(spans_file)
    assert {s["service"] for s in worker_spans} == {"traced-worker"}
    ours = [s for s in worker_spans if s["trace_id"] == trace_hex]
    # One trace: the request, its two enqueues (here), three attempts and the
    # handler's own span (there), each span's parent inside the trace.
    by_id = {s["span_id"]: s for s in ours}
    known = {request_hex, *sends.values(), *by_id}
    assert all(s["parent_span_id"] in known for s in ours)
    attempts = sorted(
        (s for s in ours if s["kind"] == "CONSUMER"),
        key=lambda s: (s["attributes"]["jobrun.job.type"], s["attributes"]["jobrun.job.attempt"]),
    )
    assert [
        (
            s["name"],
            s["attributes"]["jobrun.job.type"],
            s["attributes"]["jobrun.job.attempt"],
            s["attributes"]["jobrun.job.outcome"],
            s["status"],
            s["parent_span_id"],
        )
        for s in attempts
    ] == [
        ("process default", "traced.flaky", 1, "failed", "ERROR", sends[str(flaky.id)]),
        ("process default", "traced.flaky", 2, "succeeded", "UNSET", sends[str(flaky.id)]),
        ("process default", "traced.ok", 1, "succeeded", "UNSET", sends[str(ok.id)]),
    ]
    assert attempts[0]["events"] == ["exception"]
    (work,) = [s for s in ours if s["name"] == "handler work"]
    assert work["parent_span_id"] == attempts[2]["span_id"]
    assert work["attributes"] == {"job.payload.n": 7}
    # The worker's round trips are traced too, each in a trace of its own.
    round_trips = [s for s in worker_spans if s["kind"] == "CLIENT"]
    assert {s["attributes"]["messaging.operation.name"] for s in round_trips} >= {
        "claim",
        "complete",
        "fail",
    }
    assert all(s["trace_id"] != trace_hex and s["parent_span_id"] is None for s in round_trips)
