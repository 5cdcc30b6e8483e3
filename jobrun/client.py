"""The client: enqueue, inspect and administer jobs and schedules.

::

    import jobrun

    with jobrun.Client.connect() as client:      # DATABASE_URL, JOBRUN_SCHEMA, ...
        job = client.enqueue("email.send", {"to": "a@example.com"}, queue="emails")
        # inside your own transaction: the job exists iff you commit
        with psycopg.connect(dsn) as conn:
            conn.execute("INSERT INTO orders ...")
            client.enqueue("order.ship", {"order": 7}, conn=conn)

``Client.connect()`` reads its settings from the environment
(:meth:`jobrun.Settings.from_env`) unless given ``settings=``: the same
fields a worker reads, so that both agree on the schema, the event mode and
the notification channel. The database URL is the argument, else the
settings' ``database_url`` (``DATABASE_URL``), else the embedded PostgreSQL,
which is then announced by a WARNING of the ``jobrun`` logger (Python prints
it on stderr when the application has not configured logging). A library
says what it did through logging rather than writing to a stream the
application owns; the ``jobrun`` command prints its own line instead.

At connect, the schema's version is checked once (``check_schema=True``):
a database never migrated, or migrated by another jobrun version, raises
:class:`~jobrun.SchemaMismatch` naming the fix, instead of every later call
failing on a missing table.

The client wires the PostgreSQL adapter in; it never runs SQL itself.
"""

from __future__ import annotations

import builtins
import contextlib
import datetime as dt
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Unpack

from jobrun import producer, workflow
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.model import (
    KEEP,
    BatchResult,
    EffectKey,
    Event,
    Job,
    JSONValue,
    Keep,
    NewJob,
    QueueDepth,
    QueueLimits,
    RateLimit,
    Schedule,
    ScheduleSpec,
)
from jobrun.job.service import Closing
from jobrun.job.signals import SignalSent
from jobrun.job.workflow import (
    EnqueuedWorkflow,
    OnParentFailure,
    WorkflowCancelled,
    WorkflowGraph,
    WorkflowRetried,
    WorkflowSummary,
)
from jobrun.postgres.connect import ConnectionPool, caller_connection, database_url_or_embedded
from jobrun.postgres.pool import DEFAULT_POOL_TIMEOUT, open_pool
from jobrun.postgres.store import Store
from jobrun.producer import EnqueueOptions, JobOptions, ListFilters, WorkflowFilters
from jobrun.workflow import Workflow

_uuid = producer.job_id  # the old private name, for callers that borrowed it


def make_store(pool: ConnectionPool[Any], settings: Settings) -> Store:
    """A Store on ``pool`` with every store setting of ``settings``.

    The one place a Settings becomes a Store, for the client, the runtime and
    the command alike: a field added to one is never missed by another.
    """
    return Store(pool, commit_timeout=settings.commit_timeout, **producer.store_options(settings))


class Client(Closing):
    """Enqueue and administer jobs through a Store (usually from :meth:`connect`)."""

    def __init__(self, store: Store, *, owns_pool: bool = False) -> None:
        if isinstance(store, (str, bytes)):  # a URL where a Store belongs: say so now
            raise ValidationError(
                "store", "Client takes a Store; for a URL use Client.connect(url)"
            )
        self.store = store
        self._owns_pool = owns_pool

    @classmethod
    def connect(
        cls,
        database_url: str | None = None,
        *,
        settings: Settings | None = None,
        pool_size: int = 4,
        check_schema: bool = True,
        application_name: str = "jobrun-client",
        pool_timeout: float = DEFAULT_POOL_TIMEOUT,
    ) -> Client:
        """Open a pool (``pool_size`` + the reserve) and a Store on it. Close it when done.

        ``settings`` default to :meth:`Settings.from_env`; ``database_url``
        overrides theirs; with neither, the embedded PostgreSQL is started (or
        reused) and a WARNING says so (see the module docstring). With
        ``check_schema`` (the default) the schema version is read once and
        :class:`~jobrun.SchemaMismatch` raised when it is missing or not this
        code's; pass False for tools that inspect a database before migrating.
        ``pool_timeout``: the most a call waits for a pooled connection (while
        the database is away, a call fails after that with ConnectionUnavailable).
        """
        if settings is None:
            settings = Settings.from_env()
        url = database_url_or_embedded(database_url or settings.database_url)
        pool = open_pool(
            url,
            concurrency=pool_size,
            min_size=1,
            application_name=application_name,
            pooler=settings.pooler,
            timeout=pool_timeout,
        )
        try:
            store = make_store(pool, settings)
            if check_schema:
                store.check_schema()
        except BaseException:
            pool.close()
            raise
        return cls(store, owns_pool=True)

    def close(self) -> None:
        if self._owns_pool:
            self.store.pool.close()

    # -- enqueue -------------------------------------------------------------------

    def enqueue(
        self,
        type: str,
        payload: JSONValue = None,
        *,
        conn: Any = None,
        after: Iterable[uuid.UUID | Job | str] | uuid.UUID | Job | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
        **options: Unpack[EnqueueOptions],
    ) -> Job:
        """Enqueue one job; with ``conn``, inside that connection's transaction.

        ``after``: jobs (ids or Jobs, of any queue) it waits for: it is
        stored ``waiting`` and queued when the last of them finishes; a
        parent that ends dead or cancelled cancels it, unless
        ``on_parent_failure="run"`` (see :mod:`jobrun.workflow`). It takes
        no ``idempotency_key``.

        ``options`` (:class:`~jobrun.producer.EnqueueOptions`): ``queue``,
        ``priority``, ``max_attempts``, ``backoff``, ``run_at`` or ``delay``,
        ``idempotency_key``, ``id`` (new by default), ``concurrency_key``;
        :class:`~jobrun.NewJob`'s defaults apply.

        ``conn`` is a psycopg Connection, or a SQLAlchemy Session or
        Connection, or a Django connection: the job then exists exactly when
        that session, connection or ``atomic()`` block commits (see
        :func:`jobrun.contrib.caller_connection`).

        With an ``idempotency_key`` already used in the queue, an identical
        job returns the stored one (its id differs from ``id``), a different
        one raises IdempotencyConflict. ``concurrency_key`` (a tenant, an
        account) is what the queue's per-key limit counts the job under (see
        :meth:`set_queue_limits`); None counts it against the queue's own
        limits only.
        """
        job = producer.new_job(type, payload, options)
        if after is not None:
            return self.enqueue_job(
                job, conn=conn, after=after, on_parent_failure=on_parent_failure
            )
        if conn is None:  # the common call, without the caller-connection wrapper
            return self.store.enqueue(job)
        return self.enqueue_job(job, conn=conn)

    def enqueue_job(
        self,
        job: NewJob,
        *,
        conn: Any = None,
        after: Iterable[uuid.UUID | Job | str] | uuid.UUID | Job | None = None,
        on_parent_failure: OnParentFailure | str = OnParentFailure.CANCEL,
    ) -> Job:
        """Enqueue a NewJob (a typed task's ``task.new_job(...)``); ``after`` and
        ``on_parent_failure`` as in :meth:`enqueue`."""
        if after is not None:
            nodes = workflow.single(job, workflow.parent_ids(after), on_parent_failure)
            with _caller_connection(conn) as caller:
                return workflow.job_of(self.store.enqueue_graph(nodes, conn=caller))
        if conn is None:
            return self.store.enqueue(job)
        with _caller_connection(conn) as caller:
            return self.store.enqueue(job, conn=caller)

    def enqueue_many(
        self,
        type: str,
        payloads: Iterable[JSONValue],
        *,
        conn: Any = None,
        **options: Unpack[JobOptions],
    ) -> BatchResult:
        """Enqueue one job of ``type`` per payload (COPY), all or nothing.

        The fast form of a batch whose jobs differ only in their payload: the
        other fields (``options``: as :meth:`enqueue`'s, without a key or an
        id) are checked once, each payload as in :meth:`enqueue` (a bad one
        is a ValidationError naming its position, ``payloads[3]``). The
        payloads stream into the COPY as they are checked (bounded memory,
        and the checks overlap the server's work): a bad one rolls back what
        was sent, so nothing of the batch is written. Each job gets a new id:
        a batch you may have to retry after OutcomeUnknown is safer as NewJobs
        through :meth:`enqueue_batch`, where the ids you chose make the retry
        a replay.
        """
        template = producer.template(type, options)
        with _caller_connection(conn) as caller:
            return self.store.enqueue_many(template, payloads, conn=caller)

    def enqueue_batch(self, jobs: Iterable[NewJob], *, conn: Any = None) -> BatchResult:
        """Enqueue many jobs at once (COPY), all or nothing; streams any iterable."""
        with _caller_connection(conn) as caller:
            return self.store.enqueue_batch(jobs, conn=caller)

    def enqueue_workflow(self, flow: Workflow, *, conn: Any = None) -> EnqueuedWorkflow:
        """Enqueue every job of ``flow`` in one transaction (with ``conn``, in
        the caller's); its jobs by node name. The graph is checked first (a
        cycle, an unknown node, a missing parent: ValidationError, nothing
        written). See :mod:`jobrun.workflow`."""
        if not isinstance(flow, Workflow):
            raise ValidationError("flow", f"must be a jobrun.Workflow, not {type(flow).__name__}")
        with _caller_connection(conn) as caller:
            return self.store.enqueue_graph(
                flow.nodes, name=flow.name, workflow_id=flow.id, conn=caller
            )

    # -- inspect and administer ------------------------------------------------------

    def get(self, job_id: uuid.UUID | str) -> Job:
        return self.store.get(_uuid(job_id))

    def wait(
        self, job_id: uuid.UUID | str, timeout: float | None = None, *, poll_interval: float = 5.0
    ) -> Job:
        """Block until the job has finished (succeeded, dead or cancelled); return it.

        Woken by a notification sent in the transaction that ends the job, not
        by polling (the row is re-read every ``poll_interval`` s as a fallback).
        ``job.result`` is the handler's return value. Raises WaitTimeout (a
        TimeoutError carrying the job as it stood) after ``timeout`` seconds;
        ``None`` waits for ever. Uses one connection of its own while waiting.
        """
        return self.store.wait(_uuid(job_id), timeout, poll_interval=poll_interval)

    def list(self, **filters: Unpack[ListFilters]) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first; pass a page's last id as ``after``."""
        return self.store.list(**producer.list_filters(filters))

    def cancel(self, job_id: uuid.UUID | str) -> Job:
        return self.store.cancel(_uuid(job_id))

    def retry(self, job_id: uuid.UUID | str) -> Job:
        return self.store.retry(_uuid(job_id))

    def signal(
        self,
        job_id: uuid.UUID | str,
        name: str,
        payload: JSONValue = None,
        *,
        key: str | None = None,
    ) -> SignalSent:
        """Send signal ``name`` to a job or a workflow, with ``payload`` (any JSON value).

        ``job_id`` is a job's id or a workflow's. The job's
        ``ctx.wait_for_signal(name, ...)`` returns the payload, whether it
        began waiting before or after the send; a job parked in that wait
        runs again at once. A signal sent to a workflow is for every job of it
        that waits, now or later, for ``name``: each receives it once (those
        parked in that wait run again at once, ``SignalSent.woken``). ``key``
        makes a send idempotent: the same (job or workflow, name, key) again
        writes nothing (``sent`` is False), so the signal is delivered once;
        without a key every send is a signal of its own (waits of one name
        take them oldest first, one each, whether sent to the job or to its
        workflow). NotFound when the id is no job's nor workflow's,
        InvalidState when the job has finished (every job of the workflow
        has); ValidationError for a bad name (a non-empty str of at most 200
        characters), key (the same) or payload, before anything is written.
        """
        return self.store.signal(_uuid(job_id), name, payload, key=key)

    def events(self, job_id: uuid.UUID | str) -> builtins.list[Event]:
        return self.store.events(_uuid(job_id))

    # -- operating workflows -----------------------------------------------------------

    def workflows(self, **filters: Unpack[WorkflowFilters]) -> builtins.list[WorkflowSummary]:
        """Workflows newest first, each with its jobs counted by state.

        ``state`` (running, succeeded, failed, cancelled: see
        :class:`~jobrun.WorkflowState`) and ``name`` filter; ``limit`` (100)
        caps a page, and the page's last id as ``before`` gives the next one.
        """
        return self.store.workflows(**producer.workflow_filters(filters))

    def workflow(self, workflow_id: uuid.UUID | str) -> WorkflowGraph:
        """One workflow: its summary, its jobs parents first, and its edges (NotFound if none)."""
        return self.store.workflow(producer.workflow_id(workflow_id))

    def cancel_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowCancelled:
        """Cancel every job of a workflow not finished yet, in one transaction.

        Waiting and queued jobs are cancelled at once; running ones get a
        cancel request (their workers stop them), as :meth:`cancel` does to
        one job. Returns the counts; NotFound when there is no such workflow.
        """
        return self.store.cancel_workflow(producer.workflow_id(workflow_id))

    def retry_workflow(self, workflow_id: uuid.UUID | str) -> WorkflowRetried:
        """Run a workflow's dead and cancelled jobs again, in one transaction.

        A job that succeeded is never run again, nor a durable step that
        succeeded (a retried job skips its steps done). A retried job whose
        parents succeeded is queued now; one whose parent is retried too waits
        for it. Returns the counts; NotFound when there is no such workflow.
        """
        return self.store.retry_workflow(producer.workflow_id(workflow_id))

    def depth(self) -> builtins.list[QueueDepth]:
        return self.store.depth()

    def purge(self, older_than: dt.timedelta, *, batch: int = 1000) -> int:
        """Delete every terminal job finished more than ``older_than`` ago, in batches."""
        total = 0
        while (n := self.store.purge(older_than, batch)) > 0:
            total += n
            if n < batch:
                break
        return total

    def effect_done(self, job: Job | EffectKey) -> bool:
        return self.store.effect_done(job)

    def pause_queue(self, queue: str) -> None:
        self.store.pause_queue(queue)

    def resume_queue(self, queue: str) -> bool:
        return self.store.resume_queue(queue)

    def paused_queues(self) -> builtins.list[str]:
        return self.store.paused_queues()

    # -- flow control ----------------------------------------------------------------------

    def change_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        per_key: int | Keep | None = KEEP,
        rate: RateLimit | str | Keep | None = KEEP,
    ) -> QueueLimits:
        """Change only the limits named (None removes one) and keep the others,
        atomically (what ``jobrun queues limit`` does); removing the last lifts
        them all. The guarantees are :meth:`set_queue_limits`'s."""
        return self.store.change_queue_limits(
            queue, concurrency=concurrency, per_key=per_key, rate=rate
        )

    def set_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: RateLimit | str | None = None,
    ) -> QueueLimits:
        """Replace every limit of ``queue`` (None removes that one; give at least one).

        Every worker applies them to its next claim (within a second for a
        queue that had none), exactly, across hosts:

        - ``concurrency``: never more than this many of the queue's jobs leased
          at once; a crashed worker's job holds its slot until the reaper
          requeues it after its lease expires.
        - ``per_key``: never more than this many leased at once per
          ``concurrency_key``; a busy key is skipped, never blocks the others;
          jobs without a key count against ``concurrency`` only.
        - ``rate`` (``"100/s"``, ``"10/min"``, ``"5/10s"`` or a
          :class:`~jobrun.RateLimit`): at most that many jobs started (claimed)
          in any window of the period, by the database clock: a sliding
          window, no burst above it.

        Leases taken before are not revoked. Returns the limits as stored, with
        what they hold now. See :meth:`jobrun.postgres.store.Store.set_queue_limits`.
        """
        return self.store.set_queue_limits(
            queue, concurrency=concurrency, per_key=per_key, rate=rate
        )

    def clear_queue_limits(self, queue: str) -> bool:
        """Lift every limit of ``queue``; False when it had none."""
        return self.store.clear_queue_limits(queue)

    def queue_limits(self, queue: str) -> QueueLimits:
        """The queue's limits and what they hold now (leased jobs, jobs started in
        the rate window); every limit None when it has none."""
        return self.store.queue_limits(queue)

    def all_queue_limits(self) -> builtins.list[QueueLimits]:
        """Every limited queue's limits and what they hold now, by queue name."""
        return self.store.all_queue_limits()

    def now(self) -> dt.datetime:
        return self.store.now()

    # -- schedules -----------------------------------------------------------------------

    def create_schedule(self, spec: ScheduleSpec) -> Schedule:
        return self.store.create_schedule(spec)

    def upsert_schedule(self, spec: ScheduleSpec) -> Schedule:
        return self.store.upsert_schedule(spec)

    def get_schedule(self, schedule_id: str) -> Schedule:
        return self.store.get_schedule(schedule_id)

    def list_schedules(self) -> builtins.list[Schedule]:
        return self.store.list_schedules()

    def delete_schedule(self, schedule_id: str) -> None:
        self.store.delete_schedule(schedule_id)

    def pause_schedule(self, schedule_id: str) -> Schedule:
        return self.store.pause_schedule(schedule_id)

    def resume_schedule(self, schedule_id: str) -> Schedule:
        return self.store.resume_schedule(schedule_id)


@contextlib.contextmanager
def _caller_connection(conn: Any) -> Iterator[Any]:
    """The psycopg Connection under the caller's ``conn`` (None: none), lent for one call.

    An ORM's session or connection is resolved by
    :func:`jobrun.postgres.connect.caller_connection` (it imports no ORM itself).
    """
    if conn is None:
        yield None
        return
    with caller_connection(conn) as caller:
        yield caller
