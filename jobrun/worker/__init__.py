"""The threaded worker runtime."""

from jobrun.worker.context import JobContext
from jobrun.worker.hooks import JobOutcome, StoreCall, WorkerHooks
from jobrun.worker.registry import Done, Handler, PermanentFailure, Registry, Snooze
from jobrun.worker.worker import Worker, WorkerConfig, parse_queues

__all__ = [
    "Done",
    "Handler",
    "JobContext",
    "JobOutcome",
    "PermanentFailure",
    "Registry",
    "Snooze",
    "StoreCall",
    "Worker",
    "WorkerConfig",
    "WorkerHooks",
    "parse_queues",
]
