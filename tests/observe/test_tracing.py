"""OpenTelemetry traces (jobrun.observe.tracing) in this process, against real PostgreSQL.

Spans are read back from the SDK's InMemorySpanExporter. Every test builds
its own TracerProvider and hands it to ``instrument`` and ``Tracing``: the
global provider, which can be set only once per process, is never touched.
A real worker process exporting its spans is tests/observe/test_tracing_process.py.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from jobrun.job.errors import AlreadyExists, TransientError, ValidationError
from jobrun.job.model import Backoff, Job, NewJob, State
from jobrun.observe import tracing
from jobrun.observe.tracing import Tracing
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry, Worker, WorkerConfig
from jobrun.worker.hooks import StoreCall, WorkerHooks
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
FAST = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=200),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(exporter))
    yield p
    p.shutdown()


@pytest.fixture
def tracer(provider: TracerProvider) -> trace.Tracer:
    """The application's own tracer (its request spans, its handlers' spans)."""
    return provider.get_tracer("tests.observe.app")


@pytest.fixture
def instrumented(provider: TracerProvider) -> Iterator[None]:
    tracing.instrument(tracer_provider=provider)
    try:
        yield
    finally:
        tracing.uninstrument()


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def make_worker(
    store: Store, registry: Registry, provider: TracerProvider
) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def make(
        *, hooks: list[WorkerHooks] | None = None, tracing_options: Any = None, **config: Any
    ) -> Worker:
        traced = Tracing(tracer_provider=provider, **(tracing_options or {}))
        worker = Worker(
            store, registry, WorkerConfig(**{**FAST, **config}), hooks=[traced, *(hooks or [])]
        )
        workers.append(worker)
        worker.start()
        return worker

    yield make
    for w in workers:
        w.stop(timeout=5)


# -- helpers ------------------------------------------------------------------------


def finished(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in finished(exporter) if s.name == name]


def attempts_of(exporter: InMemorySpanExporter, job: Job, count: int = 1) -> list[ReadableSpan]:
    """The job's ended consumer spans, in attempt order, once there are ``count``."""

    def spans() -> list[ReadableSpan]:
        found = [
            s
            for s in finished(exporter)
            if s.kind is SpanKind.CONSUMER and attr(s, "messaging.message.id") == str(job.id)
        ]
        return found if len(found) >= count else []

    return sorted(wait_for(spans), key=lambda s: attr(s, "jobrun.job.attempt"))


def attr(span: ReadableSpan, name: str) -> Any:
    return (span.attributes or {}).get(name)


def span_id(span: ReadableSpan | trace.Span) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def trace_id(span: ReadableSpan | trace.Span) -> int:
    context = span.get_span_context()
    assert context is not None
    return context.trace_id


def parent_id(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def traceparent(span: ReadableSpan | trace.Span) -> str:
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def stored_contexts(conn: psycopg.Connection[Any]) -> dict[Any, Any]:
    return dict(conn.execute("SELECT id, trace_context FROM jobrun.jobs").fetchall())


# -- the producer side ---------------------------------------------------------------


@pytest.mark.usefixtures("instrumented")
def test_an_enqueue_is_a_producer_span_whose_context_is_stored_with_the_job(
    store: Store, exporter: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    with tracer.start_as_current_span("request") as request:
        job = store.enqueue(NewJob(type="email.send", queue="emails"))

    (send,) = named(exporter, "enqueue emails")
    assert send.kind is SpanKind.PRODUCER
    assert parent_id(send) == span_id(request)
    assert trace_id(send) == trace_id(request)
    assert dict(send.attributes or {}) == {
        "messaging.system": "jobrun",
        "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue",
        "messaging.destination.name": "emails",
        "messaging.message.id": str(job.id),
        "jobrun.job.type": "email.send",
        "jobrun.enqueue.transactional": False,
    }
    assert send.status.status_code is StatusCode.UNSET
    # The creation context is the producer span's own, read back on every path.
    assert job.trace_context == {"traceparent": traceparent(send)}
    assert store.get(job.id).trace_context == {"traceparent": traceparent(send)}
    assert [j.trace_context for j in store.list()] == [{"traceparent": traceparent(send)}]


@pytest.mark.usefixtures("instrumented")
def test_a_failed_enqueue_ends_its_span_with_the_error(
    store: Store, exporter: InMemorySpanExporter
) -> None:
    taken = store.enqueue(NewJob(type="t"))
    with pytest.raises(AlreadyExists):
        store.enqueue(NewJob(type="other", id=taken.id))  # the id belongs to another job

    failed = named(exporter, "enqueue default")[-1]
    assert failed.status.status_code is StatusCode.ERROR
    assert attr(failed, "error.type") == "jobrun.job.errors.AlreadyExists"
    assert [e.name for e in failed.events] == ["exception"]


@pytest.mark.usefixtures("instrumented")
def test_every_job_of_a_batch_carries_the_batch_spans_context(
    store: Store, exporter: InMemorySpanExporter, tracer: trace.Tracer, conn: Any
) -> None:
    plain = [NewJob(type="t", queue="bulk", payload={"n": n}) for n in range(3)]  # COPY
    keyed = [NewJob(type="t", queue="bulk", idempotency_key=f"k{n}") for n in range(2)]
    with tracer.start_as_current_span("import"):
        store.enqueue_batch([*plain, *keyed])

    (send,) = named(exporter, "enqueue bulk")
    assert send.kind is SpanKind.PRODUCER
    assert attr(send, "messaging.batch.message_count") == 5
    assert attr(send, "messaging.destination.name") == "bulk"
    assert attr(send, "messaging.message.id") is None  # a batch: no one message
    contexts = stored_contexts(conn)
    assert {contexts[j.id]["traceparent"] for j in [*plain, *keyed]} == {traceparent(send)}


@pytest.mark.usefixtures("instrumented")
def test_a_streamed_batch_over_several_queues_counts_its_jobs_once_sent(
    store: Store, exporter: InMemorySpanExporter, conn: Any
) -> None:
    jobs = [NewJob(type="t", queue=q) for q in ("a", "b", "b")]
    store.enqueue_batch(job for job in jobs)

    (send,) = named(exporter, "enqueue")
    assert attr(send, "messaging.batch.message_count") == 3
    assert attr(send, "messaging.destination.name") is None  # not one queue
    assert list(stored_contexts(conn).values()) == [{"traceparent": traceparent(send)}] * 3


@pytest.mark.usefixtures("instrumented")
def test_a_transactional_enqueue_stores_its_context_only_if_the_caller_commits(
    store: Store, exporter: InMemorySpanExporter, tracer: trace.Tracer, dsn: str, conn: Any
) -> None:
    with psycopg.connect(dsn) as caller:
        with caller.transaction(), tracer.start_as_current_span("order"):
            kept = store.enqueue(NewJob(type="ship"), conn=caller)
            store.enqueue_batch([NewJob(type="ship"), NewJob(type="ship")], conn=caller)
        with pytest.raises(RuntimeError), caller.transaction():
            dropped = store.enqueue(NewJob(type="ship"), conn=caller)
            raise RuntimeError("the caller rolls back")

    one, batch, rolled_back = named(exporter, "enqueue default")
    assert [attr(s, "jobrun.enqueue.transactional") for s in (one, batch, rolled_back)] == [
        True,
        True,
        True,
    ]
    contexts = stored_contexts(conn)
    assert dropped.id not in contexts
    assert contexts.pop(kept.id) == {"traceparent": traceparent(one)}
    assert list(contexts.values()) == [{"traceparent": traceparent(batch)}] * 2


def test_with_tracing_off_jobs_carry_no_trace_context(
    store: Store, tracer: trace.Tracer, dsn: str, conn: Any
) -> None:
    assert not tracing.is_instrumented()
    with tracer.start_as_current_span("request"):  # a live span, but enqueue is not traced
        store.enqueue(NewJob(type="t"))
        store.enqueue(NewJob(type="t", idempotency_key="k"))
        store.enqueue_batch([NewJob(type="t"), NewJob(type="t", idempotency_key="k2")])
        with psycopg.connect(dsn) as caller:
            store.enqueue(NewJob(type="t"), conn=caller)
    assert conn.execute("SELECT count(*), count(trace_context) FROM jobrun.jobs").fetchone() == (
        5,
        0,
    )


def test_uninstrument_stops_storing_contexts(
    store: Store, provider: TracerProvider, tracer: trace.Tracer
) -> None:
    tracing.instrument(tracer_provider=provider)
    try:
        assert tracing.is_instrumented()
        with tracer.start_as_current_span("request"):
            traced = store.enqueue(NewJob(type="t"))
    finally:
        tracing.uninstrument()
    assert not tracing.is_instrumented()
    with tracer.start_as_current_span("request"):
        untraced = store.enqueue(NewJob(type="t"))
    assert store.get(traced.id).trace_context is not None
    assert store.get(untraced.id).trace_context is None


@pytest.mark.usefixtures("instrumented")
def test_a_jobs_own_trace_context_is_stored_as_given_and_the_enqueue_span_links_to_it(
    store: Store, exporter: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    with tracer.start_as_current_span("elsewhere") as origin:
        given = {"traceparent": traceparent(origin), "tracestate": "vendor=1"}
    job = store.enqueue(NewJob(type="t", trace_context=given))
    batch = [NewJob(type="t", trace_context=given), NewJob(type="t")]
    store.enqueue_batch(batch)

    assert store.get(job.id).trace_context == given
    single, sent_batch = named(exporter, "enqueue default")
    assert [link.context.span_id for link in single.links] == [span_id(origin)]
    assert store.get(batch[0].id).trace_context == given  # never replaced
    assert store.get(batch[1].id).trace_context == {"traceparent": traceparent(sent_batch)}


@pytest.mark.usefixtures("instrumented")
def test_an_idempotent_replay_from_another_trace_is_still_a_replay(
    store: Store, exporter: InMemorySpanExporter, tracer: trace.Tracer
) -> None:
    with tracer.start_as_current_span("first"):
        first = store.enqueue(NewJob(type="t", idempotency_key="once", payload={"a": 1}))
    with tracer.start_as_current_span("second"):
        again = store.enqueue(NewJob(type="t", idempotency_key="once", payload={"a": 1}))
        result = store.enqueue_batch([NewJob(type="t", idempotency_key="once", payload={"a": 1.0})])

    original, replay, batch = named(exporter, "enqueue default")
    assert again.id == first.id
    assert again.trace_context == first.trace_context == {"traceparent": traceparent(original)}
    assert [j.id for j in result.replayed] == [first.id]
    assert result.inserted == 0
    assert attr(replay, "jobrun.enqueue.replayed") is True
    assert attr(replay, "messaging.message.id") == str(first.id)
    assert attr(batch, "jobrun.enqueue.replayed_count") == 1
    assert trace_id(replay) != trace_id(original)


def test_a_new_jobs_trace_context_must_be_a_mapping_of_strings() -> None:
    given = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
    job = NewJob(type="t", trace_context=given)
    given["traceparent"] = "changed"
    assert job.trace_context == {
        "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    }
    for bad in ("00-abc", {"traceparent": 1}, {2: "x"}, {"traceparent": "a\x00b"}):
        with pytest.raises(ValidationError, match="trace_context"):
            NewJob(type="t", trace_context=bad)  # type: ignore[arg-type]


# -- the worker side ------------------------------------------------------------------


@pytest.mark.usefixtures("instrumented")
def test_each_attempt_is_a_consumer_span_child_of_the_enqueue_span_in_one_trace(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
    tracer: trace.Tracer,
) -> None:
    seen: list[dict[str, str] | None] = []
    registry.register("email.send", lambda ctx, job: seen.append(job.trace_context))
    with tracer.start_as_current_span("request") as request:
        job = store.enqueue(NewJob(type="email.send", queue="emails", max_attempts=3))
    worker = make_worker(queues=["emails"])

    (process,) = attempts_of(exporter, job)
    (send,) = named(exporter, "enqueue emails")
    assert process.name == "process emails"
    assert process.kind is SpanKind.CONSUMER
    assert trace_id(process) == trace_id(request)
    assert parent_id(process) == span_id(send)
    assert [link.context.span_id for link in process.links] == [span_id(send)]
    assert dict(process.attributes or {}) == {
        "messaging.system": "jobrun",
        "messaging.operation.type": "process",
        "messaging.operation.name": "process",
        "messaging.destination.name": "emails",
        "messaging.message.id": str(job.id),
        "messaging.client.id": worker.owner,
        "jobrun.job.type": "email.send",
        "jobrun.job.attempt": 1,
        "jobrun.job.max_attempts": 3,
        "jobrun.job.outcome": "succeeded",
    }
    assert process.status.status_code is StatusCode.UNSET
    assert seen == [{"traceparent": traceparent(send)}]  # the claimed job carries it


@pytest.mark.usefixtures("instrumented")
def test_a_failed_attempt_has_error_status_and_the_exception_and_a_dead_one_too(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        if job.payload["always"] or job.attempts == 1:
            raise ValueError("the mail server said no")

    registry.register("t", handler)
    flaky = store.enqueue(NewJob(type="t", payload={"always": False}, backoff=NO_WAIT))
    doomed = store.enqueue(
        NewJob(type="t", payload={"always": True}, max_attempts=1, backoff=NO_WAIT)
    )
    make_worker()

    first, second = attempts_of(exporter, flaky, 2)
    (dead,) = attempts_of(exporter, doomed)
    send = next(
        s
        for s in named(exporter, "enqueue default")
        if attr(s, "messaging.message.id") == str(flaky.id)
    )
    for failed, outcome in ((first, "failed"), (dead, "dead")):
        assert attr(failed, "jobrun.job.outcome") == outcome
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.status.description == "ValueError: the mail server said no"
        assert attr(failed, "error.type") == "ValueError"
        (event,) = failed.events
        assert event.name == "exception"
        assert (event.attributes or {})["exception.type"] == "ValueError"
        assert (event.attributes or {})["exception.message"] == "the mail server said no"
    assert attr(first, "jobrun.job.next_run_at") is not None
    assert attr(second, "jobrun.job.outcome") == "succeeded"
    assert second.status.status_code is StatusCode.UNSET
    assert attr(second, "jobrun.job.attempt") == 2
    assert parent_id(first) == parent_id(second) == span_id(send)  # attempts are siblings


class _CurrentSpanProbe(WorkerHooks):
    """Runs after Tracing's hooks: what is current on the handler thread at each step."""

    def __init__(self) -> None:
        self.started: list[trace.Span] = []
        self.returned: list[trace.Span] = []

    def job_started(self, job: Job, ctx: JobContext) -> None:
        self.started.append(trace.get_current_span())

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        self.returned.append(trace.get_current_span())


@pytest.mark.usefixtures("instrumented")
def test_a_handlers_own_spans_are_children_of_the_attempts_span_and_only_while_it_runs(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
    tracer: trace.Tracer,
) -> None:
    def handler(ctx: JobContext, job: Job) -> None:
        with tracer.start_as_current_span("render template"):
            pass

    registry.register("t", handler)
    with tracer.start_as_current_span("request"):
        first = store.enqueue(NewJob(type="t"))
    second = store.enqueue(NewJob(type="t"))  # a trace of its own
    probe = _CurrentSpanProbe()
    make_worker(concurrency=1, hooks=[probe])

    spans = {job.id: attempts_of(exporter, job)[0] for job in (first, second)}
    rendered = named(exporter, "render template")
    assert sorted(parent_id(s) or 0 for s in rendered) == sorted(span_id(s) for s in spans.values())
    for span in rendered:
        owner = next(p for p in spans.values() if span_id(p) == parent_id(span))
        assert trace_id(span) == trace_id(owner)
    assert trace_id(spans[first.id]) != trace_id(spans[second.id])
    # Current on the handler thread from job_started to job_returned, never after.
    assert sorted(span_id(s) for s in probe.started) == sorted(span_id(s) for s in spans.values())
    assert [s.get_span_context().is_valid for s in probe.returned] == [False, False]


@pytest.mark.usefixtures("instrumented")
def test_a_job_enqueued_by_a_handler_continues_the_trace_of_the_job_that_enqueued_it(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
    tracer: trace.Tracer,
) -> None:
    follow_ups: list[Job] = []
    registry.register(
        "order", lambda ctx, job: follow_ups.append(store.enqueue(NewJob(type="mail")))
    )
    registry.register("mail", lambda ctx, job: None)
    with tracer.start_as_current_span("checkout") as checkout:
        order = store.enqueue(NewJob(type="order"))
    make_worker()

    (ordered,) = attempts_of(exporter, order)
    wait_for(lambda: follow_ups)
    (mailed,) = attempts_of(exporter, follow_ups[0])
    send_mail = next(
        s for s in named(exporter, "enqueue default") if parent_id(s) == span_id(ordered)
    )
    assert parent_id(mailed) == span_id(send_mail)
    assert trace_id(mailed) == trace_id(ordered) == trace_id(checkout)


@pytest.mark.usefixtures("instrumented")
def test_jobs_of_a_batch_run_as_children_of_the_batch_span(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
) -> None:
    registry.register("t", lambda ctx, job: None)
    jobs = [NewJob(type="t"), NewJob(type="t"), NewJob(type="t", idempotency_key="k")]
    store.enqueue_batch(jobs)
    make_worker(concurrency=3)

    (send,) = named(exporter, "enqueue default")
    stored = [store.get(j.id) for j in jobs]
    assert all(parent_id(attempts_of(exporter, j)[0]) == span_id(send) for j in stored)


def test_jobs_without_a_context_run_in_root_spans(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
) -> None:
    registry.register("t", lambda ctx, job: None)
    job = store.enqueue(NewJob(type="t"))  # not instrumented: no creation context
    make_worker()

    (process,) = attempts_of(exporter, job)
    assert process.parent is None
    assert list(process.links) == []


@pytest.mark.usefixtures("instrumented")
def test_without_child_of_enqueue_the_attempt_is_a_root_span_linked_to_the_enqueue(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
) -> None:
    registry.register("t", lambda ctx, job: None)
    job = store.enqueue(NewJob(type="t"))
    make_worker(tracing_options={"child_of_enqueue": False})

    (process,) = attempts_of(exporter, job)
    (send,) = named(exporter, "enqueue default")
    assert process.parent is None
    assert trace_id(process) != trace_id(send)
    assert [link.context.span_id for link in process.links] == [span_id(send)]


@pytest.mark.usefixtures("instrumented")
def test_a_job_of_an_unknown_type_shows_its_released_attempt_in_its_trace(
    store: Store, make_worker: Callable[..., Worker], exporter: InMemorySpanExporter
) -> None:
    job = store.enqueue(NewJob(type="nobody.handles.this"))
    make_worker()

    released = attempts_of(exporter, job)[0]
    (send,) = named(exporter, "enqueue default")
    assert attr(released, "jobrun.job.outcome") == "released"
    assert released.status.status_code is StatusCode.UNSET
    assert parent_id(released) == span_id(send)


@pytest.mark.usefixtures("instrumented")
def test_an_attempt_whose_lease_was_lost_ends_in_error(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
    conn: Any,
) -> None:
    stolen = threading.Event()
    registry.register("t", lambda ctx, job: stolen.wait(30))
    job = store.enqueue(NewJob(type="t"))
    make_worker()
    wait_for(lambda: store.get(job.id).state is State.LEASED)
    # Another claim took the job: this worker's token no longer matches.
    conn.execute("UPDATE jobrun.jobs SET lease_token = gen_random_uuid() WHERE id = %s", [job.id])
    stolen.set()

    (lost,) = attempts_of(exporter, job)
    assert attr(lost, "jobrun.job.outcome") == "lease_lost"
    assert lost.status.status_code is StatusCode.ERROR
    assert attr(lost, "error.type") == "jobrun.LeaseLost"


# -- the worker's own round trips ------------------------------------------------------


@pytest.mark.usefixtures("instrumented")
def test_claim_complete_fail_and_heartbeat_are_client_spans_of_their_own_traces(
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    exporter: InMemorySpanExporter,
) -> None:
    def slow(ctx: JobContext, job: Job) -> None:
        # Runs until the worker has heartbeated it: no sleep, no timing.
        wait_for(lambda: named(exporter, "heartbeat"))

    registry.register("slow", slow)
    registry.register("bad", lambda ctx, job: 1 / 0)
    good = store.enqueue(NewJob(type="slow"))
    bad = store.enqueue(NewJob(type="bad", max_attempts=1))
    make_worker(concurrency=2)
    wait_for(lambda: store.get(good.id).state is State.SUCCEEDED)
    wait_for(lambda: store.get(bad.id).state is State.DEAD)
    wait_for(lambda: named(exporter, "complete") and named(exporter, "fail"))

    job_traces = {trace_id(s) for s in finished(exporter) if s.kind is not SpanKind.CLIENT}
    claims = named(exporter, "claim default")
    expected = {
        "claim default": ("receive", True),
        "complete": ("settle", True),
        "fail": ("settle", False),
        "heartbeat": (None, True),
    }
    for name, (operation_type, batch) in expected.items():
        for span in named(exporter, name):
            assert span.kind is SpanKind.CLIENT
            assert span.parent is None
            assert trace_id(span) not in job_traces
            assert attr(span, "messaging.system") == "jobrun"
            assert attr(span, "messaging.operation.name") == name.split()[0]
            assert attr(span, "messaging.operation.type") == operation_type
            assert (attr(span, "messaging.batch.message_count") is not None) == batch
            assert span.start_time is not None and span.end_time is not None
            assert span.start_time <= span.end_time
    assert sum(attr(s, "messaging.batch.message_count") for s in claims) == 2
    assert all(attr(s, "messaging.destination.name") == "default" for s in claims)
    # An idle worker's empty claims are left out by default.
    assert all(attr(s, "messaging.batch.message_count") > 0 for s in claims)


def test_empty_claims_are_traced_when_asked(
    registry: Registry, make_worker: Callable[..., Worker], exporter: InMemorySpanExporter
) -> None:
    make_worker(tracing_options={"empty_claims": True})
    empty = wait_for(lambda: named(exporter, "claim default"))
    assert attr(empty[0], "messaging.batch.message_count") == 0


def test_a_store_call_span_spans_exactly_the_calls_duration_and_records_its_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    hooks = Tracing(tracer_provider=provider)
    error = TransientError("the database went away")
    hooks.store_call(StoreCall("claim", 0.25, 0, error=error, queues=("a", "b")))

    (span,) = finished(exporter)
    assert span.name == "claim"
    assert span.end_time is not None and span.start_time is not None
    assert span.end_time - span.start_time == 250_000_000
    assert attr(span, "jobrun.queues") == ("a", "b")
    assert attr(span, "messaging.destination.name") is None
    assert span.status.status_code is StatusCode.ERROR
    assert attr(span, "error.type") == "jobrun.job.errors.TransientError"
    (event,) = span.events
    assert event.name == "exception"
    assert event.timestamp == span.end_time


# -- the optional dependency ---------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_without_opentelemetry_the_module_names_the_extra_to_install() -> None:
    proc = _python(
        "import sys; sys.modules['opentelemetry'] = None\n"
        "import jobrun\n"
        "try:\n"
        "    import jobrun.observe.tracing\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'jobrun[otel]'" in proc.stdout


def test_jobrun_and_its_observe_package_import_no_opentelemetry() -> None:
    proc = _python(
        "import sys, jobrun, jobrun.observe, jobrun.job.propagation, jobrun.postgres.store\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
