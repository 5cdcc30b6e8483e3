"""A traced worker process whose spans go to a JSON-lines file (test_tracing_process.py).

Importing this module sets the global TracerProvider, exporting every span as
it ends to the file named by ``JOBRUN_TEST_SPANS`` (one JSON object a line):
an application module that configures OpenTelemetry at import, the way
``jobrun worker --app ... --tracing`` expects. Run as a program
(``python -m tests.observe.apps.traced``), it builds
``jobrun.Runtime(Settings.from_env(), registry, hooks=[Tracing()])`` and runs
it until SIGTERM.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import jobrun
from jobrun import Job, JobContext, Registry
from jobrun.observe.tracing import Tracing

SPANS_ENV = "JOBRUN_TEST_SPANS"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the test reads of a span: ids in hex, as W3C traceparent writes them."""
    context = span.get_span_context()
    assert context is not None
    return {
        "name": span.name,
        "kind": span.kind.name,
        "trace_id": f"{context.trace_id:032x}",
        "span_id": f"{context.span_id:016x}",
        "parent_span_id": None if span.parent is None else f"{span.parent.span_id:016x}",
        "links": [f"{link.context.span_id:016x}" for link in span.links],
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "start": span.start_time,
        "end": span.end_time,
        "service": (span.resource.attributes.get("service.name") if span.resource else None),
    }


class JsonLinesExporter(SpanExporter):
    """Appends each span to a file as it ends (SimpleSpanProcessor: nothing buffered)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(json.dumps(span_record(s)) + "\n" for s in spans)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(text)
        return SpanExportResult.SUCCESS


provider = TracerProvider(resource=Resource.create({"service.name": "traced-worker"}))
provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(Path(os.environ[SPANS_ENV]))))
trace.set_tracer_provider(provider)

app_tracer = trace.get_tracer("tests.observe.apps.traced")
registry = Registry()


@registry.handler("traced.ok")
def ok(ctx: JobContext, job: Job) -> dict[str, Any]:
    """Does its work in a span of its own, which must be a child of the attempt's."""
    with app_tracer.start_as_current_span("handler work") as span:
        span.set_attribute("job.payload.n", job.payload.get("n", 0))
    return {"traced": True}


@registry.handler("traced.flaky")
def flaky(ctx: JobContext, job: Job) -> None:
    """Fails its first attempt, succeeds on the second."""
    if job.attempts == 1:
        raise ValueError("first attempt fails")


def main() -> None:
    runtime = jobrun.Runtime(
        jobrun.Settings.from_env(), registry, scheduler=False, hooks=[Tracing()]
    )
    try:
        runtime.run()
    finally:
        provider.shutdown()


if __name__ == "__main__":
    main()
