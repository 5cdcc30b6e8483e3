"""The handlers the benchmark's worker processes run.

``jobrun worker --app bench.app:registry`` (from the repository root):

bench.noop    returns None: completed in batches (``complete_many``)
bench.anoop   the same, ``async def``: run on the worker's event loop
bench.tx      returns a commit callable inserting one row into bench_sink:
              the transactional path, one Complete transaction per job
bench.pickup  notes ``time.time()`` as the handler starts, and writes it to
              bench_pickup through its commit callable (pickup latency)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from jobrun import Job, JobContext, Registry

registry = Registry()

if os.environ.get("BENCH_OTEL_SDK"):
    # The `observed` measurement's tracing variant: a real SDK pipeline whose
    # spans are dropped, so the figure is jobrun's cost plus the SDK's, not
    # an exporter's network.
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class _Dropped(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    _provider = TracerProvider()
    _provider.add_span_processor(BatchSpanProcessor(_Dropped()))
    trace.set_tracer_provider(_provider)


@registry.handler("bench.noop")
def noop(ctx: JobContext, job: Job) -> None:
    return None


@registry.handler("bench.anoop")
async def async_noop(ctx: JobContext, job: Job) -> None:
    return None


@registry.handler("bench.tx")
def transactional(ctx: JobContext, job: Job) -> Callable[[Any], None]:
    def commit(conn: Any) -> None:
        conn.execute("INSERT INTO bench_sink (job_id) VALUES (%s)", [job.id])

    return commit


@registry.handler("bench.pickup")
def pickup(ctx: JobContext, job: Job) -> Callable[[Any], None]:
    started = time.time()

    def commit(conn: Any) -> None:
        conn.execute(
            "INSERT INTO bench_pickup (job_id, started) VALUES (%s, %s)", [job.id, started]
        )

    return commit
