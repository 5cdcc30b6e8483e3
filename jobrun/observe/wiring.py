"""What a :class:`jobrun.Runtime` switches on from its Settings: metrics, tracing, health.

The Runtime imports this module only when ``metrics_port``, ``health_port``
or ``tracing`` asks for something, so a process that asks for nothing never
imports :mod:`jobrun.observe`; and this module imports prometheus-client
(``metrics_port``) or OpenTelemetry (``tracing=otel``) only when asked to,
failing with a ValidationError that names the setting and the extra to
install when the library is missing.

- ``metrics_port``: a :class:`~jobrun.observe.metrics.Metrics` hook on the
  worker, which it watches; the cluster-wide series are collected where the
  scheduler leads. ``/metrics``, ``/healthz`` and ``/readyz`` on that port.
- ``health_port``: ``/healthz`` and ``/readyz`` on a port of their own
  (one server when it is the metrics port's number).
- ``tracing=otel``: a :class:`~jobrun.observe.tracing.Tracing` hook, and
  :func:`~jobrun.observe.tracing.instrument` (the producer side) from start
  to stop unless the process had instrumented itself already. Spans go to
  the global TracerProvider, which ``jobrun worker --app`` lets the app set
  up on import, before the Runtime is built.

A :class:`~jobrun.observe.health.Health` hook is on the worker whenever a
port is set.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.observe.health import Health, SchemaCheck
from jobrun.observe.http import ObserveServer
from jobrun.worker.hooks import WorkerHooks

if TYPE_CHECKING:
    from jobrun.postgres.store import Store
    from jobrun.scheduler.service import SchedulerService
    from jobrun.worker.worker import Worker

__all__ = ["Observability"]

log = logging.getLogger("jobrun")


def _optional(module: str, library: str, setting: str, extra: str, what: str) -> Any:
    """Import ``module``; its optional ``library`` missing is a ValidationError naming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        cause = exc.__cause__
        missing = exc.name or (cause.name if isinstance(cause, ImportError) else None) or ""
        if missing == library or missing.startswith(library + "."):
            raise ValidationError(setting, f"needs {what}: pip install 'jobrun[{extra}]'") from None
        raise


class Observability:
    """The hooks and servers ``settings`` ask for; made before the worker, started with it."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.metrics: Any = None
        """A jobrun.observe.metrics.Metrics, with ``metrics_port``."""
        self.tracing: Any = None
        """A jobrun.observe.tracing.Tracing, with ``tracing=otel``."""
        self.health: Health | None = None
        self.servers: list[ObserveServer] = []
        self._tracing_module: Any = None
        self._instrumented = False
        if settings.metrics_port is not None:
            metrics = _optional(
                "jobrun.observe.metrics",
                "prometheus_client",
                "JOBRUN_METRICS_PORT",
                "metrics",
                "prometheus-client",
            )
            self.metrics = metrics.Metrics()
        if settings.tracing == "otel":
            self._tracing_module = _optional(
                "jobrun.observe.tracing", "opentelemetry", "JOBRUN_TRACING", "otel", "OpenTelemetry"
            )
            self.tracing = self._tracing_module.Tracing()
        if settings.metrics_port is not None or settings.health_port is not None:
            self.health = Health(stale_after=settings.health_stale_after)

    @property
    def hooks(self) -> list[WorkerHooks]:
        """The worker hooks to add (given at the worker's construction)."""
        hooks: list[WorkerHooks | None] = [self.metrics, self.tracing, self.health]
        return [hook for hook in hooks if hook is not None]

    def attach(
        self,
        *,
        worker: Worker | None,
        worker_store: Store | None,
        scheduler: SchedulerService | None,
        scheduler_store: Store | None,
    ) -> None:
        """Watch what the Runtime built: the worker, the scheduler and their stores."""
        if self.health is not None:
            readiness: SchemaCheck | None = worker_store or scheduler_store
            self.health.store = readiness
            if scheduler is not None:
                self.health.watch_scheduler(scheduler)
        if self.metrics is not None:
            if worker is not None:
                self.metrics.watch_worker(worker)
            cluster_store = scheduler_store or worker_store
            if cluster_store is not None:
                self.metrics.watch_cluster(
                    cluster_store,
                    is_leader=lambda: scheduler is not None and scheduler.is_leader,
                )

    def start(self, worker: Worker | None) -> None:
        """Serve (one INFO line per server says where), just before the worker starts.

        A port that cannot be bound raises a ValidationError naming its setting.
        """
        if self._tracing_module is not None and not self._tracing_module.is_instrumented():
            self._tracing_module.instrument()
            self._instrumented = True
        if self.health is not None and worker is not None:
            self.health.watch_worker(worker)
        host = self.settings.observe_host
        metrics_port, health_port = self.settings.metrics_port, self.settings.health_port
        planned: list[tuple[str, ObserveServer]] = []
        if metrics_port is not None:
            registry = self.metrics.registry
            planned.append(
                (
                    "JOBRUN_METRICS_PORT",
                    ObserveServer(self.health, registry, host=host, port=metrics_port),
                )
            )
        if health_port is not None and (health_port != metrics_port or health_port == 0):
            planned.append(
                (
                    "JOBRUN_HEALTH_PORT",
                    ObserveServer(self.health, None, host=host, port=health_port),
                )
            )
        try:
            for setting, server in planned:
                try:
                    server.start()
                except ValidationError as exc:
                    raise ValidationError(setting, exc.message) from None
                self.servers.append(server)
                log.info(
                    "serving %s on %s",
                    ", ".join(server.paths),
                    server.url,
                    extra={"observe_url": server.url, "observe_paths": server.paths},
                )
        except BaseException:
            self.stop()
            raise

    def stopping(self) -> None:
        """The Runtime began to stop: readiness fails from now on."""
        if self.health is not None:
            self.health.mark_stopping()

    def stop(self) -> None:
        """Stop the servers and the producer tracing this started. Safe to call twice."""
        servers, self.servers = self.servers, []
        for server in servers:
            server.stop()
        if self._instrumented:
            self._instrumented = False
            self._tracing_module.uninstrument()
