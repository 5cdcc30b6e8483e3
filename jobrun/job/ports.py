"""The ports: what the worker and the scheduler need from the outside world.

They are ``typing.Protocol``s so that the runtime depends on behaviour, not on
PostgreSQL; :mod:`jobrun.postgres` implements them, and the runtime is tested
against that real implementation, never a mock.

Time arguments (``until``, ``now``, ``retry_at``) are "database now as read
by the caller" (``Store.now()``), never this host's clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from jobrun.job.model import (
    BatchResult,
    CompleteManyResult,
    Event,
    Job,
    LeaderTerm,
    NewJob,
    QueueDepth,
    QueueLimits,
    ReapResult,
    Schedule,
    State,
)
from jobrun.job.signals import WaitStore
from jobrun.job.steps import StepStore
from jobrun.job.workers import WorkerInfo

CommitCallable = Callable[[Any], None]
"""The transactional path: called with the open psycopg connection inside
Complete's transaction. It may run statements, never commit or roll back."""


@dataclasses.dataclass(frozen=True, slots=True)
class Exchanged:
    """What one round of :meth:`Store.exchange` got back."""

    completed: CompleteManyResult | None
    """The completions' outcome (None: the round completed nothing)."""
    started: list[Job]
    """The buffered jobs started, as they now stand (attempt counted); one
    left out must not run: its lease is gone, or its cancel was requested."""
    claimed: list[Job]
    """The jobs claimed, in claim order: the first ``start_now`` started."""


class Schedules(Protocol):
    """Cron schedules, stored next to the jobs."""

    def due_schedules(self, now: dt.datetime, limit: int) -> list[Schedule]: ...

    def materialize(self, schedule: Schedule, now: dt.datetime) -> Job | None: ...


class Store(Schedules, StepStore, WaitStore, Protocol):
    """Durable job storage. Every mutating method is exactly one transaction."""

    def now(self) -> dt.datetime: ...

    def fenced(self, term: LeaderTerm) -> Store:
        """This store with every transaction fenced by ``term``: each checks the
        term first and raises ``LeaderLost`` (nothing done) once it is over."""
        ...

    def bounded(self, seconds: float) -> AbstractContextManager[None]:
        """Give up on the calls this thread makes inside the block ``seconds``
        from now (the worker completes jobs within their leases)."""
        ...

    def enqueue(self, job: NewJob, *, conn: Any = None) -> Job: ...

    def enqueue_batch(self, jobs: Iterable[NewJob], *, conn: Any = None) -> BatchResult: ...

    def claim(
        self,
        owner: str,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        *,
        start: int | None = None,
    ) -> list[Job]:
        """Lease up to ``limit`` jobs; the first ``start`` (None: all) start at
        once, their attempt counted; the others count theirs in :meth:`start_jobs`."""
        ...

    def start_jobs(self, jobs: Sequence[Job]) -> list[Job]:
        """Start claimed jobs their claim did not start (count their attempt),
        fenced; the jobs left out must not run."""
        ...

    def exchange(
        self,
        owner: str,
        *,
        complete: Sequence[Job] = (),
        results: Mapping[uuid.UUID, Any] | None = None,
        start: Sequence[Job] = (),
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start_now: int | None = None,
    ) -> Exchanged:
        """A pipelined worker's round: complete ``complete``, start ``start`` (jobs
        claimed earlier without their start) and claim up to ``limit`` jobs (the
        first ``start_now`` started; None: all), in one transaction."""
        ...

    def unclaim(self, jobs: Sequence[Job]) -> dict[uuid.UUID, State]:
        """Give back claimed jobs that never started (attempts untouched); a job
        whose cancel was requested ends cancelled. The ids given back, with
        their state; one left out had started or lost its lease."""
        ...

    def heartbeat(
        self, owner: str, leases: Sequence[tuple[uuid.UUID, uuid.UUID]], until: dt.datetime
    ) -> set[uuid.UUID]: ...

    def register_worker(self, info: WorkerInfo) -> int:
        """Insert or refresh this worker's registry row (last seen: the database's
        now); prune the rows of workers gone for long; return how many."""
        ...

    def unregister_worker(self, worker_id: str) -> None:
        """Take a worker's registry row away (a clean stop)."""
        ...

    def mark_leader(self, worker_id: str, session_pid: int | None) -> bool:
        """Note that this worker's scheduler was elected, on session ``session_pid``;
        False when the worker has no row (yet)."""
        ...

    def complete(
        self, job: Job, commit: CommitCallable | None = None, *, result: Any = None
    ) -> Job:
        """Finish a claimed job (cancelled when cancel was requested); ``result``
        is stored with the success, in the same transaction."""
        ...

    def complete_many(
        self, jobs: Sequence[Job], *, results: Mapping[uuid.UUID, Any] | None = None
    ) -> CompleteManyResult:
        """Complete many claimed jobs without commit callables, each fenced;
        ``results`` maps a job's id to its result."""
        ...

    def complete_and_claim(
        self,
        jobs: Sequence[Job],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
        queues: Sequence[str],
        limit: int,
        ttl: dt.timedelta,
        start: int | None = None,
    ) -> tuple[CompleteManyResult, list[Job]]:
        """:meth:`complete_many` of one owner's jobs and :meth:`claim` for that
        owner in one transaction: the claim counts the slots they free."""
        ...

    def complete_many_tx(
        self,
        items: Sequence[tuple[Job, CommitCallable | None]],
        *,
        results: Mapping[uuid.UUID, Any] | None = None,
    ) -> CompleteManyResult:
        """Complete many claimed jobs of one owner, each with its commit callable."""
        ...

    def release(self, job: Job, delay: dt.timedelta, reason: str, *, snooze: bool = False) -> Job:
        """Give a claimed job back without counting its attempt: queued again
        after ``delay``, or cancelled when cancel was requested. ``snooze``:
        the handler asked for it (counted in ``snoozes``, a "snoozed" event)."""
        ...

    def record_progress(self, job: Job, progress: float, message: str | None = None) -> dt.datetime:
        """Store a running job's progress (fenced like a heartbeat: LeaseLost
        when the claim no longer holds the job); when, by the database clock."""
        ...

    def all_queue_limits(self) -> list[QueueLimits]:
        """Every limited queue's limits (for the worker's start banner)."""
        ...

    def queues_limited(self, queues: Sequence[str]) -> bool:
        """Whether a queue limit applies to one of ``queues`` (cached: cheap)."""
        ...

    def limited_queues(self, queues: Sequence[str]) -> Mapping[str, int | None]:
        """The limited queues among ``queues``, each with its global
        concurrency limit or None (cached like :meth:`queues_limited`:
        possibly a second old)."""
        ...

    def slot_limited_queues(self, queues: Sequence[str]) -> frozenset[str]:
        """The queues among ``queues`` with a limit whose slots a finished job
        frees (concurrency, global or per key; not a rate), cached likewise."""
        ...

    def limits_hold_back(self, queues: Sequence[str]) -> float | None:
        """After a short claim: None when no queue limit held back ready jobs of
        ``queues`` (the claim was short for want of work), else the seconds
        until a claim may get some (0: unknown, a slot frees when a job ends)."""
        ...

    def fail(
        self,
        job: Job,
        error: str,
        retry_at: dt.datetime | None,
        *,
        permanent: bool = False,
    ) -> Job: ...

    def reap_expired(self, now: dt.datetime, limit: int) -> ReapResult: ...

    def get(self, job_id: uuid.UUID) -> Job: ...

    def watch(self, job_id: uuid.UUID) -> Job:
        """Ask for the end of the job to be announced; the job as it is now."""
        ...

    def wait(
        self, job_id: uuid.UUID, timeout: float | None = None, *, poll_interval: float = 5.0
    ) -> Job:
        """The job once it has finished (succeeded, dead or cancelled);
        ``WaitTimeout`` after ``timeout`` seconds."""
        ...

    def cancel(self, job_id: uuid.UUID) -> Job: ...

    def retry(self, job_id: uuid.UUID) -> Job: ...

    def purge(self, older_than: dt.timedelta, limit: int) -> int: ...

    def depth(self) -> list[QueueDepth]: ...

    def events(self, job_id: uuid.UUID) -> list[Event]: ...

    def prune_events(self, older_than: dt.timedelta, limit: int) -> int: ...

    def list(
        self,
        *,
        queue: str | None = None,
        state: State | None = None,
        type: str | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
    ) -> list[Job]: ...


class Waiter(Protocol):
    """One subscriber's wake-up slot (see Dispatcher)."""

    def wait(self, timeout: float) -> bool:
        """True when woken (notification, reconnect or ``wake``), False on timeout."""
        ...

    def wake(self) -> None:
        """Wake this waiter now (a worker that is stopping uses it)."""
        ...

    def close(self) -> None: ...


class Dispatcher(Protocol):
    """Wake-ups for idle workers. A hint only: workers poll as well.

    Wake-ups coalesce (a burst of notifications costs one wake-up) and are
    kept while the worker is busy: one that arrives between two ``wait``
    calls of the same thread for the same queues makes the next call return
    at once. After the notification source reconnects, every waiter is woken
    once, since notifications sent during the gap are lost. The Postgres
    adapter is ``jobrun.postgres.notify.Notifier``.
    """

    def subscribe(self, queues: Sequence[str]) -> Waiter:
        """A waiter for ``queues`` that a worker registers once and waits on repeatedly."""
        ...

    def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a job may be ready in one of ``queues`` or ``timeout`` passes.

        True when woken by a notification (or a reconnect), False on timeout.
        With notifications disabled it simply sleeps and returns False.
        """
        ...

    def close(self) -> None: ...


class Locker(Protocol):
    """A leadership lock: at most one holder among all processes.

    A leader calls ``held()`` before every leader action and steps down as
    soon as it returns False; leader actions must still tolerate one action
    of overlap with a successor (see ``jobrun.postgres.lock``).
    """

    def try_acquire(self) -> bool:
        """Take the lock if free, without blocking; True when held afterwards.

        A connection fault counts as False (the next call reconnects).
        """
        ...

    def held(self, *, force: bool = False) -> bool:
        """Whether the lock is still held; False once its connection is gone."""
        ...

    def release(self) -> None:
        """Give the lock up; safe to call twice and after the connection died."""
        ...

    def term(self) -> LeaderTerm | None:
        """The running term's fence while held, for ``Store.fenced``; None when
        the lock has no term to fence by (a session lock) or is not held."""
        ...

    def close(self) -> None:
        """Release and close the lock's connection for good."""
        ...
