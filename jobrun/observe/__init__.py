"""Observability, behind extras: what an operator sees of a running jobrun.

- :mod:`jobrun.observe.metrics` (``jobrun[metrics]``): Prometheus metrics,
  per worker and cluster-wide;
- :mod:`jobrun.observe.tracing` (``jobrun[otel]``): OpenTelemetry spans from
  the enqueue to the handler;
- :mod:`jobrun.observe.health`: ``/healthz`` and ``/readyz`` for probes
  (standard library only).

All of them are built on the worker's hooks (:mod:`jobrun.worker.hooks`),
the extension point users plug their own tools into. The core never imports
this package; importing it imports no optional library either.
"""
