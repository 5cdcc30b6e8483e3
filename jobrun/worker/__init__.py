"""The worker runtime: plain handlers on threads, async handlers on one event loop."""

from jobrun.worker.context import JobContext
from jobrun.worker.hooks import JobOutcome, StoreCall, WorkerHooks
from jobrun.worker.registry import Done, Handler, PermanentFailure, Registry, Snooze
from jobrun.worker.tasks import ContextTask, Task
from jobrun.worker.worker import Worker, WorkerConfig, parse_queues

__all__ = [
    "ContextTask",
    "Done",
    "Handler",
    "JobContext",
    "JobOutcome",
    "PermanentFailure",
    "Registry",
    "Snooze",
    "StoreCall",
    "Task",
    "Worker",
    "WorkerConfig",
    "WorkerHooks",
    "parse_queues",
]
