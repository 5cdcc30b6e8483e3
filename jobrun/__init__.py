"""jobrun: a durable background-job system on PostgreSQL.

Enqueue with a :class:`Client` (inside your own transaction if you like), run
handlers from a :class:`Registry` with a :class:`Worker` (or ``jobrun worker
--app module:registry``), and let the :class:`SchedulerService` fire cron
schedules and rescue expired leases.
"""

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import (
    AlreadyExists,
    CommitRefused,
    DatabaseError,
    IdempotencyConflict,
    InvalidState,
    JobrunError,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    TransientError,
    ValidationError,
)
from jobrun.job.model import (
    Backoff,
    BatchResult,
    EffectKey,
    Event,
    EventKind,
    Job,
    NewJob,
    QueueDepth,
    Schedule,
    ScheduleSpec,
    State,
)
from jobrun.postgres.events import EventMode
from jobrun.postgres.migrate import migrate
from jobrun.runtime import Runtime
from jobrun.scheduler import SchedulerConfig, SchedulerService
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker, WorkerConfig

__version__ = "0.1.0"

__all__ = [
    "AlreadyExists",
    "Backoff",
    "BatchResult",
    "Client",
    "CommitRefused",
    "DatabaseError",
    "EffectKey",
    "Event",
    "EventKind",
    "EventMode",
    "IdempotencyConflict",
    "InvalidState",
    "Job",
    "JobContext",
    "JobrunError",
    "LeaseLost",
    "NewJob",
    "NotFound",
    "OutcomeUnknown",
    "PermanentFailure",
    "QueueDepth",
    "Registry",
    "Runtime",
    "Schedule",
    "ScheduleSpec",
    "SchedulerConfig",
    "SchedulerService",
    "Settings",
    "State",
    "TransientError",
    "ValidationError",
    "Worker",
    "WorkerConfig",
    "__version__",
    "migrate",
]
