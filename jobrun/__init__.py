"""jobrun: a durable background-job system on PostgreSQL.

Enqueue with a :class:`Client` (inside your own transaction if you like), run
handlers from a :class:`Registry` with ``jobrun worker --app module:registry``
or, inside your own program, a :class:`Runtime` (a worker and a scheduler
candidate: ``with jobrun.Runtime(settings, registry): ...``). One
:class:`Settings` (``Settings.from_env()``) configures both sides. The
:class:`SchedulerService` fires cron schedules and rescues expired leases;
:class:`Worker` is the bare claim loop on a Store, for those who wire their
own. :func:`migrate` applies the schema, :func:`migration_sql` prints it for
another migration tool, and every entry point raises :class:`SchemaMismatch`
at start when the two disagree. ``jobrun.testing.run_jobs`` runs queued jobs
inside a test.
"""

import typing as _typing

from jobrun import runtime as _runtime

# jobrun.testing imported here makes ``import jobrun; jobrun.testing.run_jobs``
# work; it needs nothing the facade does not import anyway.
from jobrun import testing as testing
from jobrun._version import __version__ as __version__
from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import (
    AlreadyExists,
    CommitRefused,
    DatabaseError,
    IdempotencyConflict,
    InvalidState,
    JobrunError,
    LeaderLost,
    LeaseLost,
    NotFound,
    OutcomeUnknown,
    PoolerError,
    SchemaMismatch,
    TransientError,
    ValidationError,
    WaitTimeout,
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
    QueueLimits,
    RateLimit,
    Schedule,
    ScheduleSpec,
    State,
)
from jobrun.job.signals import SignalSent, SignalTimeout
from jobrun.job.workflow import (
    EnqueuedWorkflow,
    OnParentFailure,
    ParentResult,
    ParentResults,
    WorkflowCancelled,
    WorkflowGraph,
    WorkflowNode,
    WorkflowRetried,
    WorkflowState,
    WorkflowSummary,
)
from jobrun.postgres.events import EventMode
from jobrun.postgres.migrate import migrate, migration_sql
from jobrun.runtime import Runtime
from jobrun.scheduler import SchedulerConfig, SchedulerService
from jobrun.worker import (
    ContextTask,
    Done,
    JobContext,
    JobOutcome,
    PermanentFailure,
    Registry,
    Snooze,
    StoreCall,
    Task,
    Worker,
    WorkerConfig,
    WorkerHooks,
)
from jobrun.workflow import NodeRef, Workflow

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Backoff",
    "BatchResult",
    "Client",
    "CommitRefused",
    "ContextTask",
    "DatabaseError",
    "Done",
    "EffectKey",
    "EnqueuedWorkflow",
    "Event",
    "EventKind",
    "EventMode",
    "IdempotencyConflict",
    "InvalidState",
    "Job",
    "JobContext",
    "JobOutcome",
    "JobrunError",
    "LeaderLost",
    "LeaseLost",
    "NewJob",
    "NodeRef",
    "NotFound",
    "OnParentFailure",
    "OutcomeUnknown",
    "ParentResult",
    "ParentResults",
    "PermanentFailure",
    "PoolerError",
    "QueueDepth",
    "QueueLimits",
    "RateLimit",
    "Registry",
    "Runtime",
    "Schedule",
    "ScheduleSpec",
    "SchedulerConfig",
    "SchedulerService",
    "SchemaMismatch",
    "Settings",
    "SignalSent",
    "SignalTimeout",
    "Snooze",
    "State",
    "StoreCall",
    "Task",
    "TransientError",
    "ValidationError",
    "WaitTimeout",
    "Worker",
    "WorkerConfig",
    "WorkerHooks",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowGraph",
    "WorkflowNode",
    "WorkflowRetried",
    "WorkflowState",
    "WorkflowSummary",
    "__version__",
    "migrate",
    "migration_sql",
]


def _observability(settings: Settings) -> _runtime.Observer | None:
    """Metrics, traces and health for a Runtime, when ``settings`` ask for them.

    Plugged in here, in the package every jobrun import passes through, so
    that ``jobrun.runtime`` (the core) never imports :mod:`jobrun.observe`,
    and :mod:`jobrun.observe` is imported only by a process that asks for it.
    """
    if settings.metrics_port is None and settings.health_port is None and settings.tracing == "off":
        return None
    from jobrun.observe.wiring import Observability  # noqa: PLC0415 - the optional part

    return Observability(settings)


_runtime.observe_with(_observability)

# AsyncClient is loaded on first use: ``import jobrun`` stays free of the
# asyncio layer. (Type checkers see the import; the __getattr__ is hidden from
# them, so that a misspelt ``jobrun.X`` is still an error.)
if _typing.TYPE_CHECKING:
    from jobrun.aio import AsyncClient as AsyncClient
else:

    def __getattr__(name: str) -> object:
        if name == "AsyncClient":
            from jobrun.aio import AsyncClient  # noqa: PLC0415

            return AsyncClient
        raise AttributeError(f"module 'jobrun' has no attribute {name!r}")
