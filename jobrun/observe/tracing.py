"""OpenTelemetry traces from the enqueue to the handler (``pip install 'jobrun[otel]'``).

Two halves, each switched on where it runs::

    from jobrun.observe import tracing

    tracing.instrument()                        # the producer side, process-wide
    with jobrun.Runtime(settings, registry, hooks=[tracing.Tracing()]):   # the worker side
        ...

**Enqueue** (:func:`instrument`): every ``enqueue`` (one job, a batch, inside
the caller's transaction or not) runs in a ``PRODUCER`` span named
``enqueue <queue>``, and the W3C trace context of that span is stored with
each job (``jobs.trace_context``): the job's *creation context*. A job that
brings its own (``NewJob(trace_context=...)``) keeps it, and the span links
to it. A batch is one span, whose context every job of the batch carries
(no per-job "create" spans: a batch of 100,000 jobs stays one span).
:func:`uninstrument` reverses it. Without :func:`instrument`, jobs carry no
context (NULL) and enqueue pays one ``is None`` check.

**Worker** (:class:`Tracing`, a :class:`~jobrun.worker.hooks.WorkerHooks`):
each attempt is a ``CONSUMER`` span named ``process <queue>``, a child of
the job's creation context (the OpenTelemetry messaging conventions allow
the creation context as parent for single-message processing; it is also
linked, as they recommend), so the enqueueing request, the attempts and
whatever the handler does form one trace. The span is current on the
handler's thread while the handler runs: the handler's own spans (and any
instrumented library it calls) are its children. It ends when the outcome is
recorded, with ``jobrun.job.outcome``; a failed or dead attempt, or a lost
lease, has status ERROR, ``error.type`` and the exception as an event.
``Tracing(child_of_enqueue=False)`` makes it a root span that only links to
the creation context (the conventions' default, for producers whose traces
should stay short).

The worker's own round trips (claim, complete, fail, heartbeat) are
``CLIENT`` spans of their own traces (never inside a job's trace), built
from the ``store_call`` hook after the fact with explicit start and end
times, and sampled by the provider's sampler like any root span. A claim that
found nothing is not traced unless ``Tracing(empty_claims=True)``: an idle
worker polls every few seconds, and those spans would say only that.

Attributes follow the OpenTelemetry semantic conventions for messaging
spans: ``messaging.system`` = ``jobrun``, ``messaging.operation.type``
(``send``, ``receive``, ``process``, ``settle``) and
``messaging.operation.name`` (``enqueue``, ``claim``, ``process``,
``complete``, ``complete_tx``, ``fail``, ``heartbeat``),
``messaging.destination.name`` (the queue), ``messaging.message.id`` (the
job id), ``messaging.batch.message_count`` for batch operations,
``messaging.client.id`` (the worker that holds the lease), plus
``jobrun.job.type``, ``jobrun.job.attempt`` and ``jobrun.job.outcome``. An
enqueue says whether it ran in the caller's transaction
(``jobrun.enqueue.transactional``) and whether it was an idempotent replay
(``jobrun.enqueue.replayed``, ``jobrun.enqueue.replayed_count`` for a
batch): the job stored earlier keeps the context of the trace that first
enqueued it, so its attempts do not appear in the replaying trace.

Spans go to ``tracer_provider`` when given, else to the global provider
(``opentelemetry.trace.set_tracer_provider``), which may be set after the
:class:`Tracing` is made: the tracer follows it. The stored carrier is
always W3C Trace Context, whatever propagators the process configures for
its own transports.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, SpanContext, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        f"jobrun.observe.tracing needs OpenTelemetry: pip install 'jobrun[otel]' ({exc.msg})"
    ) from exc

from jobrun.job import propagation
from jobrun.job.model import BatchResult, Job, NewJob
from jobrun.worker.hooks import JobOutcome, StoreCall, WorkerHooks
from jobrun.worker.logs import version

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.trace import Tracer, TracerProvider

    from jobrun.worker.context import JobContext

__all__ = ["Tracing", "instrument", "is_instrumented", "uninstrument"]

SYSTEM = "jobrun"
TRACER_NAME = "jobrun"

# Attribute names (OpenTelemetry semantic conventions for messaging, and jobrun's own).
MESSAGING_SYSTEM = "messaging.system"
OPERATION_TYPE = "messaging.operation.type"
OPERATION_NAME = "messaging.operation.name"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
CLIENT_ID = "messaging.client.id"
ERROR_TYPE = "error.type"
JOB_TYPE = "jobrun.job.type"
JOB_ATTEMPT = "jobrun.job.attempt"
JOB_MAX_ATTEMPTS = "jobrun.job.max_attempts"
JOB_OUTCOME = "jobrun.job.outcome"
NEXT_RUN_AT = "jobrun.job.next_run_at"
TRANSACTIONAL = "jobrun.enqueue.transactional"
REPLAYED = "jobrun.enqueue.replayed"
REPLAYED_COUNT = "jobrun.enqueue.replayed_count"
QUEUES = "jobrun.queues"

_W3C = TraceContextTextMapPropagator()
_EMPTY = Context()
_ERROR_OUTCOMES = frozenset({"failed", "dead", "lease_lost"})
# messaging.operation.type of the worker's own round trips (heartbeat has none).
_STORE_OPERATION_TYPES = {
    "claim": "receive",
    "complete": "settle",
    "complete_tx": "settle",
    "fail": "settle",
}
_SINGLE_JOB_OPERATIONS = frozenset({"fail"})


def _tracer(tracer_provider: TracerProvider | None) -> Tracer:
    return trace.get_tracer(TRACER_NAME, version(), tracer_provider=tracer_provider)


def creation_context(carrier: Mapping[str, str] | None) -> SpanContext | None:
    """The span context a job's stored carrier names; None when it names none (or garbage)."""
    if not carrier:
        return None
    extracted = _W3C.extract(carrier, context=_EMPTY)
    span_context = trace.get_current_span(extracted).get_span_context()
    return span_context if span_context.is_valid else None


def _inject() -> propagation.Carrier | None:
    """The current span's W3C carrier; None when there is no valid span (a no-op provider)."""
    carrier: propagation.Carrier = {}
    _W3C.inject(carrier)
    return carrier or None


def _error_type(error: BaseException | None) -> str:
    if error is None:
        return "_OTHER"
    kind = type(error)
    if kind.__module__ == "builtins":
        return kind.__qualname__
    return f"{kind.__module__}.{kind.__qualname__}"


def _fail_span(
    span: Span,
    error: BaseException | None,
    description: str | None,
    *,
    error_type: str | None = None,
    timestamp: int | None = None,
) -> None:
    """Status ERROR, ``error.type`` and the exception as an event (the conventions' way)."""
    span.set_attribute(ERROR_TYPE, error_type or _error_type(error))
    if error is not None:
        span.record_exception(error, timestamp=timestamp)
    span.set_status(Status(StatusCode.ERROR, description))


# -- the producer side -------------------------------------------------------------


class _Producer:
    """The enqueue spans; installed in :mod:`jobrun.job.propagation` by :func:`instrument`."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    def enqueue(
        self,
        job: NewJob,
        transactional: bool,
        send: Callable[[propagation.Carrier | None], Job],
    ) -> Job:
        custom = creation_context(job.trace_context)
        attributes: dict[str, Any] = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "enqueue",
            DESTINATION: job.queue,
            MESSAGE_ID: str(job.id),
            JOB_TYPE: job.type,
            TRANSACTIONAL: transactional,
        }
        with self._span(f"enqueue {job.queue}", attributes, custom) as span:
            stored = send(_inject())
            if stored.id != job.id:
                # An idempotent replay: the job stored earlier, with its own context.
                span.set_attribute(MESSAGE_ID, str(stored.id))
                span.set_attribute(REPLAYED, True)
            return stored

    def enqueue_batch(
        self,
        jobs: Sequence[NewJob] | None,
        transactional: bool,
        send: Callable[[propagation.Carrier | None], BatchResult],
    ) -> BatchResult:
        attributes: dict[str, Any] = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_TYPE: "send",
            OPERATION_NAME: "enqueue",
            TRANSACTIONAL: transactional,
        }
        name = "enqueue"
        if jobs:
            attributes[BATCH_COUNT] = len(jobs)
            queues = {job.queue for job in jobs}
            if len(queues) == 1:
                (queue,) = queues
                attributes[DESTINATION] = queue
                name = f"enqueue {queue}"
        with self._span(name, attributes, None) as span:
            result = send(_inject())
            if jobs is None:
                span.set_attribute(BATCH_COUNT, result.inserted + len(result.replayed))
            if result.replayed:
                span.set_attribute(REPLAYED_COUNT, len(result.replayed))
            return result

    def _span(
        self, name: str, attributes: dict[str, Any], link: SpanContext | None
    ) -> _ProducerSpan:
        return _ProducerSpan(
            self.tracer.start_span(
                name,
                kind=SpanKind.PRODUCER,
                attributes=attributes,
                links=None if link is None else [Link(link)],
            )
        )


class _ProducerSpan:
    """The producer span made current around ``send``, its failure recorded with error.type."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self._token: Token[Context] | None = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            if exc is not None:
                _fail_span(self.span, exc, f"{type(exc).__name__}: {exc}")
        finally:
            if self._token is not None:
                otel_context.detach(self._token)
            self.span.end()


def instrument(tracer_provider: TracerProvider | None = None) -> None:
    """Trace every enqueue of this process and store its context with the jobs.

    ``tracer_provider`` defaults to the global one (followed if set later).
    Calling it again replaces the provider.
    """
    propagation.install(_Producer(_tracer(tracer_provider)))


def uninstrument() -> None:
    """Stop tracing enqueues: jobs enqueued from now on carry no trace context."""
    if isinstance(propagation.producer, _Producer):
        propagation.install(None)


def is_instrumented() -> bool:
    return isinstance(propagation.producer, _Producer)


# -- the worker side ---------------------------------------------------------------


def _claim_key(job: Job) -> tuple[uuid.UUID, uuid.UUID | None]:
    """One attempt: the job and the lease token of its claim."""
    return (job.id, job.lease_token)


class Tracing(WorkerHooks):
    """Worker hooks that trace each attempt and the worker's round trips (module docstring).

    Pass it to ``Worker(..., hooks=[tracing])`` or ``Runtime(..., hooks=[tracing])``.
    """

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        *,
        child_of_enqueue: bool = True,
        empty_claims: bool = False,
    ) -> None:
        self.tracer = _tracer(tracer_provider)
        self.child_of_enqueue = child_of_enqueue
        self.empty_claims = empty_claims
        # Single dict operations (atomic under the GIL): job_started adds on a
        # handler thread, job_finished pops on that thread or the completer's.
        self._spans: dict[tuple[uuid.UUID, uuid.UUID | None], Span] = {}
        # Popped only by job_returned, on the thread that attached it: a span
        # ended early (a lease lost while the handler runs) is still detached
        # where it was made current.
        self._tokens: dict[tuple[uuid.UUID, uuid.UUID | None], Token[Context]] = {}

    def _start(self, job: Job) -> Span:
        creation = creation_context(job.trace_context)
        parent = _EMPTY
        if creation is not None and self.child_of_enqueue:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(creation), _EMPTY)
        attributes: dict[str, Any] = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_TYPE: "process",
            OPERATION_NAME: "process",
            DESTINATION: job.queue,
            MESSAGE_ID: str(job.id),
            JOB_TYPE: job.type,
            JOB_ATTEMPT: job.attempts,
            JOB_MAX_ATTEMPTS: job.max_attempts,
        }
        if job.lease_owner is not None:
            attributes[CLIENT_ID] = job.lease_owner
        return self.tracer.start_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            links=None if creation is None else [Link(creation)],
        )

    def job_started(self, job: Job, ctx: JobContext) -> None:
        span = self._start(job)
        key = _claim_key(job)
        self._spans[key] = span
        self._tokens[key] = otel_context.attach(trace.set_span_in_context(span, _EMPTY))

    def job_returned(self, job: Job, error: BaseException | None) -> None:
        token = self._tokens.pop(_claim_key(job), None)
        if token is not None:
            otel_context.detach(token)

    def job_finished(self, outcome: JobOutcome) -> None:
        job = outcome.job
        span = self._spans.pop(_claim_key(job), None)
        if span is None:
            # No handler ran (an unknown type given back): the attempt still
            # shows in the job's trace, as a span of no length.
            span = self._start(job)
        span.set_attribute(JOB_OUTCOME, outcome.kind)
        if outcome.next_run_at is not None:
            span.set_attribute(NEXT_RUN_AT, outcome.next_run_at.isoformat())
        if outcome.kind in _ERROR_OUTCOMES:
            description = outcome.error_text or outcome.kind.replace("_", " ")
            lost = outcome.kind == "lease_lost" and outcome.error is None
            _fail_span(
                span,
                outcome.error,
                description.split("\n", 1)[0],
                error_type="jobrun.LeaseLost" if lost else None,
            )
        span.end()

    def store_call(self, call: StoreCall) -> None:
        empty = call.operation == "claim" and not call.jobs and call.error is None
        if empty and not self.empty_claims:
            return
        end = time.time_ns()
        start = end - max(int(call.seconds * 1e9), 0)
        attributes: dict[str, Any] = {
            MESSAGING_SYSTEM: SYSTEM,
            OPERATION_NAME: call.operation,
        }
        operation_type = _STORE_OPERATION_TYPES.get(call.operation)
        if operation_type is not None:
            attributes[OPERATION_TYPE] = operation_type
        if call.operation not in _SINGLE_JOB_OPERATIONS:
            attributes[BATCH_COUNT] = call.jobs
        name: str = call.operation
        if len(call.queues) == 1:
            attributes[DESTINATION] = call.queues[0]
            name = f"{call.operation} {call.queues[0]}"
        elif call.queues:
            attributes[QUEUES] = list(call.queues)
        # A root span: the worker's round trips never join a job's trace (nor
        # a span the embedding program happens to have current).
        span = self.tracer.start_span(
            name, context=_EMPTY, kind=SpanKind.CLIENT, attributes=attributes, start_time=start
        )
        if call.error is not None:
            _fail_span(
                span, call.error, f"{type(call.error).__name__}: {call.error}", timestamp=end
            )
        span.end(end_time=end)
