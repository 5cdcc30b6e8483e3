"""The enqueue side's one seam for tracing: who, if anyone, wraps an enqueue.

A job carries the trace context of the span that enqueued it (the W3C
``traceparent``/``tracestate`` carrier, stored in ``jobs.trace_context``), so
that the worker's span for each attempt joins the producer's trace.
:func:`jobrun.observe.tracing.instrument` installs a :class:`Producer` here;
the Store's enqueue paths read :data:`producer` once per call. The core
never imports OpenTelemetry: with nothing installed (the default) an enqueue
pays one ``is None`` check and stores NULL.

A producer wraps the whole enqueue (its span measures the round trip and
records the error it raised) and hands the Store, through ``send``, the
carrier to store with each job that brings none of its own
(:attr:`jobrun.NewJob.trace_context` set by the caller wins: a custom
creation context is never replaced).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

if TYPE_CHECKING:
    from jobrun.job.model import BatchResult, Job, NewJob

Carrier: TypeAlias = dict[str, str]
"""A W3C trace context carrier: ``{"traceparent": ..., "tracestate": ...}``."""


class Producer(Protocol):
    """Wraps an enqueue; ``send(carrier)`` runs it and stores ``carrier`` with the jobs.

    ``transactional`` is True when the enqueue runs in the caller's
    transaction (the jobs exist only if the caller commits). ``send(None)``
    stores no context. Whatever ``send`` raises must propagate unchanged.
    """

    def enqueue(
        self, job: NewJob, transactional: bool, send: Callable[[Carrier | None], Job]
    ) -> Job: ...

    def enqueue_batch(
        self,
        jobs: Sequence[NewJob] | None,
        transactional: bool,
        send: Callable[[Carrier | None], BatchResult],
    ) -> BatchResult:
        """``jobs`` is the batch when the caller gave a sequence; None for a stream."""
        ...


producer: Producer | None = None
"""The installed producer; None (the default) traces nothing."""


def install(new: Producer | None) -> Producer | None:
    """Install ``new`` process-wide (None removes it); return the one it replaces."""
    global producer  # the one process-wide switch, by design
    previous, producer = producer, new
    return previous
