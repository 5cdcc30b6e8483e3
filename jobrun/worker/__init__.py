"""The threaded worker runtime."""

from jobrun.worker.context import JobContext
from jobrun.worker.registry import Done, Handler, PermanentFailure, Registry
from jobrun.worker.worker import Worker, WorkerConfig, parse_queues

__all__ = [
    "Done",
    "Handler",
    "JobContext",
    "PermanentFailure",
    "Registry",
    "Worker",
    "WorkerConfig",
    "parse_queues",
]
