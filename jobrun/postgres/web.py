"""The web dashboard's reads: what :mod:`jobrun.web` shows, on a Store's pool.

The dashboard runs no SQL of its own (its actions are the Store's methods);
what it reads that the Store has no method for is here, in the one package
that runs SQL, as the queries of db/query/web.sql. Each page is one pooled
connection and a few statements, read-only, bounded client-side like every
Store read (the Store's ``call_timeout``); every age and "now" on a page is
the database clock's, read in the same round.

Big tables: a jobs page is keyset-paged by id, newest first (ids are
UUIDv7, time-ordered), the page bound and the id-prefix filter being one
range on the primary key, so that a deep page is as cheap as the first;
the states with a partial index are read through it. The overview reads
only partial indexes, the last hour of ``jobs_finished_at_idx`` and of
``job_events_at_idx``. tests/web/test_web_queries.py EXPLAINs every
statement on a table of many finished rows: none reads ``jobs`` by a
sequential scan.

Filters no index holds (any state but queued, leased and dead; a type; a
queue without a state) are read by a bounded scan: at most
:data:`SCAN_ROWS` jobs backwards along the primary key per page, the
matching ones kept. A page may then hold fewer jobs than asked for and
still have older ones after it: :attr:`JobsPage.next_before` says where the
next page starts (the last job shown when the page filled, else the oldest
job the scan read), so that no request reads more than a bounded number of
rows, however rare the filter's matches.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from jobrun.job import validate
from jobrun.job.errors import NotFound, ValidationError
from jobrun.job.model import EffectKey, Event, Job, State
from jobrun.job.workflow import MAX_NODES, WorkflowState, WorkflowSummary
from jobrun.postgres.convert import event_from_row, job_from_row
from jobrun.postgres.sqlc import models
from jobrun.postgres.sqlc.web import Queries
from jobrun.postgres.stats import ClusterSnapshot, ClusterStats, workflow_summary

if TYPE_CHECKING:
    from jobrun.postgres.store import Store

MAX_PAGE = 500
"""The most jobs one page (or one step of a bulk walk) reads."""
SCAN_ROWS = 20_000
"""The most jobs a bounded scan reads for one page (see the module docstring)."""
RUNNING_SHOWN = 200
"""The most running jobs the overview lists under their workers."""
MAX_PREFIX_COUNT = 1000
"""An id prefix matching more jobs than this is counted as "more than" this many."""
MIN_SHORT_HEX = 12
"""Short ids show at least this many hex digits: the creation millisecond of a UUIDv7
(``0190a0a0-0000``, the dashboard's short form)."""
FILTER_MAX_CHARS = 1000
"""Longer filter values are refused (no queue, type or key is that long)."""
WORKFLOW_SCAN = 2000
"""The most workflows one page of the workflows list reads to fill it under a state
filter (a workflow's state is derived from its jobs, so no index holds it)."""
MAX_EDGES_READ = 1_000_000
"""The most edges a workflow's page reads (a workflow of MAX_NODES jobs, ten parents each)."""
WORKFLOW_BATCH = 100
"""Workflows read per statement while a filtered page fills."""

_LOWEST = uuid.UUID(int=0)
_HIGHEST = uuid.UUID(int=(1 << 128) - 1)
_HEX = re.compile(r"[0-9a-f]{0,32}")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobFilter:
    """What a jobs page (or a bulk action) is restricted to; None: any.

    ``id_prefix`` is the start of a job id in hex (dashes ignored, any case):
    for UUIDv7 ids, a prefix is a span of creation time.
    """

    queue: str | None = None
    state: State | None = None
    type: str | None = None
    idempotency_key: str | None = None
    id_prefix: str | None = None

    def __post_init__(self) -> None:
        for name in ("queue", "type", "idempotency_key"):
            value = getattr(self, name)
            if value is not None:
                _text(name, value)
        if self.state is not None and not isinstance(self.state, State):
            raise ValidationError("state", "must be a jobrun.State")
        if self.id_prefix is not None:
            object.__setattr__(self, "id_prefix", normalize_id_prefix(self.id_prefix))

    @property
    def empty(self) -> bool:
        return all(
            v is None
            for v in (self.queue, self.state, self.type, self.idempotency_key, self.id_prefix)
        )

    def id_range(self, before: uuid.UUID | None = None) -> tuple[uuid.UUID, uuid.UUID] | None:
        """The ids the filter allows below ``before``, inclusive; None when there are none."""
        prefix = self.id_prefix or ""
        low = uuid.UUID(hex=prefix.ljust(32, "0"))
        high = uuid.UUID(hex=prefix.ljust(32, "f"))
        if before is not None:
            if before.int == 0:
                return None
            high = min(high, uuid.UUID(int=before.int - 1))
        if high < low:
            return None
        return low, high


def normalize_id_prefix(text: str) -> str | None:
    """``text`` as lower-case hex without dashes (None when blank); ValidationError if not hex."""
    if not isinstance(text, str):
        raise ValidationError("id_prefix", f"must be a str, not {type(text).__name__}")
    digits = text.strip().replace("-", "").lower()
    if not digits:
        return None
    if not _HEX.fullmatch(digits):
        raise ValidationError(
            "id_prefix", "must be the start of a job id: hexadecimal digits (dashes allowed)"
        )
    return digits


def _common_hex(a: uuid.UUID, b: uuid.UUID) -> int:
    """How many leading hex digits ``a`` and ``b`` share."""
    return (128 - (a.int ^ b.int).bit_length()) // 4


def id_prefix_text(job_id: uuid.UUID, digits: int) -> str:
    """The first ``digits`` hex digits of ``job_id`` as its text shows them, dashes included."""
    text = str(job_id)
    seen = 0
    for end, char in enumerate(text, 1):
        if char != "-":
            seen += 1
            if seen == digits:
                return text[:end]
    return text


def _text(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError(field, "must be a non-empty str")
    if len(value) > FILTER_MAX_CHARS:
        raise ValidationError(field, f"must be at most {FILTER_MAX_CHARS} characters")
    return validate.text(field, value)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobsPage:
    jobs: tuple[Job, ...]
    """Newest first."""
    next_before: uuid.UUID | None
    """Where the next (older) page starts, ``before=`` this id; None: nothing older matches.

    The last job shown when the page filled; after a bounded scan that ran
    out first, the oldest job it read (every job between matched nothing)."""
    scanned: int | None
    """How many jobs a bounded scan read for this page (None: read through an index)."""
    db_now: dt.datetime

    @property
    def more(self) -> bool:
        return self.next_before is not None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Minute:
    """One minute of throughput, by the database clock."""

    minute: dt.datetime
    succeeded: int
    failed: int
    """Failed attempts: retrying and dead events, and leases the reaper requeued."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LeaseOwner:
    """A worker seen holding leases now, with the jobs it runs (as many as were listed)."""

    owner: str
    running: int
    """Its leases whose attempt started: handlers running (or about to)."""
    waiting: int = 0
    """Its leases claimed ahead of its free threads, not started: waiting for a thread."""
    last_seen_at: dt.datetime
    """Its most recent claim or heartbeat of a job it still holds."""
    lease_expires_at: dt.datetime
    """Its latest lease expiry: in the past, the owner stopped heartbeating."""
    jobs: tuple[Job, ...]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Overview:
    cluster: ClusterSnapshot
    throughput: tuple[Minute, ...]
    """The last 60 minutes, oldest first."""
    workers: tuple[LeaseOwner, ...]
    running_listed: int
    """How many leased jobs are listed under the workers (at most RUNNING_SHOWN)."""
    waiting_by_queue: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Per queue, the leased jobs waiting for a thread (claimed ahead, not started):
    queues with none are absent."""

    @property
    def db_now(self) -> dt.datetime:
        return self.cluster.db_now


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EffectRecord:
    """The ledger row of a job's effect key."""

    key: EffectKey
    job_id: uuid.UUID
    """The job whose completion wrote it (another job sharing the key, possibly)."""
    created_at: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobDetail:
    job: Job
    events: tuple[Event, ...]
    effect_key: EffectKey
    effect: EffectRecord | None
    """None: nothing committed under the job's effect key."""
    db_now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ScheduleInfo:
    id: str
    cron: str
    timezone: str
    queue: str
    type: str
    priority: int
    max_attempts: int
    next_run_at: dt.datetime
    last_fired_at: dt.datetime | None
    """When the leader last materialised an occurrence; None before the first."""
    paused: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowsPage:
    """A page of the workflows list, newest first."""

    workflows: tuple[WorkflowSummary, ...]
    next_before: uuid.UUID | None
    """The workflow the next (older) page starts after (``before=`` it); None: no more.

    The last one shown when the page filled; under a state filter, the oldest
    one read when :data:`WORKFLOW_SCAN` workflows were read first."""
    scanned: int
    """Workflows read for this page."""
    db_now: dt.datetime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowJob:
    """A job of a workflow as its page shows it (no payload, no result)."""

    id: uuid.UUID
    node: str
    type: str
    queue: str
    state: State
    attempts: int
    max_attempts: int
    created_at: dt.datetime
    finished_at: dt.datetime | None
    last_error: str | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class WorkflowDetail:
    """A workflow, its jobs (in the order they were enqueued) and the edges between them."""

    summary: WorkflowSummary
    jobs: tuple[WorkflowJob, ...]
    edges: tuple[tuple[uuid.UUID, uuid.UUID], ...]
    """(parent, child) for every parent of the workflow's jobs, outside ones included."""
    db_now: dt.datetime


class DashboardReads:
    """The dashboard's read queries on a Store's pool, in the Store's schema.

    ``leader_key`` and ``election`` are the scheduler's leader lock key and
    lease row for the Store's schema (see :class:`jobrun.postgres.stats.ClusterStats`).
    """

    def __init__(
        self,
        store: Store,
        *,
        leader_key: tuple[int, int] | None = None,
        election: str | None = None,
    ) -> None:
        self.store = store
        self.q = Queries(schema=store.schema)
        self.stats = ClusterStats(store, leader_key=leader_key, election=election)

    # -- overview ------------------------------------------------------------------

    def overview(self) -> Overview:
        """Queues, throughput, the leader and the workers, in one round on one connection."""
        return self.store._on_pool_read(self._overview)

    def _overview(self, conn: psycopg.Connection[Any]) -> Overview:
        cluster = self.stats._read(conn)
        minutes = tuple(
            Minute(minute=r.minute, succeeded=r.succeeded, failed=r.failed)
            for r in self.q.web_throughput(conn)
        )
        owners = self.q.web_lease_owners(conn)
        waiting = {r.queue: r.waiting for r in self.q.web_waiting_by_queue(conn)}
        running = [job_from_row(r) for r in self.q.web_running_jobs(conn, max_rows=RUNNING_SHOWN)]
        by_owner: dict[str, list[Job]] = {}
        for job in running:
            by_owner.setdefault(job.lease_owner or "", []).append(job)
        return Overview(
            cluster=cluster,
            throughput=minutes,
            workers=tuple(
                LeaseOwner(
                    owner=o.owner,
                    running=o.leased - o.waiting,
                    waiting=o.waiting,
                    last_seen_at=o.last_seen_at,
                    lease_expires_at=o.lease_expires_at,
                    jobs=tuple(by_owner.get(o.owner, ())),
                )
                for o in owners
            ),
            running_listed=len(running),
            waiting_by_queue=waiting,
        )

    # -- jobs ----------------------------------------------------------------------

    def jobs(
        self, where: JobFilter, *, before: uuid.UUID | None = None, limit: int = 50
    ) -> JobsPage:
        """A page of matching jobs, newest first, older than ``before`` when given."""
        validate.batch_limit(limit, MAX_PAGE)

        def run(conn: psycopg.Connection[Any]) -> JobsPage:
            now = self.store.q.db_now(conn)
            assert now is not None
            jobs, next_before, scanned = self._page(conn, where, before, limit)
            return JobsPage(jobs=tuple(jobs), next_before=next_before, scanned=scanned, db_now=now)

        return self.store._on_pool_read(run)

    def matching(
        self, where: JobFilter, *, upto: uuid.UUID | None = None, page: int = MAX_PAGE
    ) -> Iterator[Job]:
        """Every matching job with an id up to ``upto`` (inclusive), newest first, a page
        per round trip: what a bulk action walks (each page read before acting on it)."""
        validate.batch_limit(page, MAX_PAGE)
        before = None if upto is None or upto.int == _HIGHEST.int else uuid.UUID(int=upto.int + 1)
        while True:
            read = functools.partial(self._page, where=where, before=before, limit=page)
            jobs, before, _ = self.store._on_pool_read(read)
            yield from jobs
            if before is None:
                return

    def ids_with_prefix(
        self, prefix: str, *, count_upto: int = MAX_PREFIX_COUNT
    ) -> tuple[list[uuid.UUID], int]:
        """The jobs whose id starts with ``prefix`` (hex, dashes ignored): at most two ids,
        and how many there are, counted up to ``count_upto + 1``.

        The dashboard's id filter as a lookup: one bounded scan of the
        prefix's span of the primary key (:meth:`JobFilter.id_range`), so a
        prefix as short as ``0`` costs ``count_upto`` rows, not the table.
        """
        span = JobFilter(id_prefix=prefix).id_range()
        if span is None:
            return [], 0
        low, high = span
        validate.batch_limit(count_upto, SCAN_ROWS)
        found = self.store._on_pool_read(
            lambda conn: self.q.web_scan_jobs(
                conn,
                id_low=low,
                id_high=high,
                state=None,
                queue=None,
                type=None,
                max_rows=2,
                scan_rows=count_upto + 1,
            )
        )
        assert found is not None  # an aggregate always returns its row
        return list(found.ids), found.scanned

    def workflow_ids_with_prefix(self, prefix: str) -> list[uuid.UUID]:
        """The workflows whose id starts with ``prefix`` (hex, dashes ignored):
        at most two, which is all a caller needs to tell one from several."""
        span = JobFilter(id_prefix=prefix).id_range()
        if span is None:
            return []
        low, high = span
        return self.store._on_pool_read(
            lambda conn: list(
                self.q.web_workflow_ids_in_range(conn, id_low=low, id_high=high, max_rows=2)
            )
        )

    def short_ids(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, str]:
        """Each id's shortest unique prefix (at least :data:`MIN_SHORT_HEX` hex digits),
        as the text of the id's start: ``0190a0a0-0000-7``.

        Unique against the whole table when read (its two neighbours along
        the primary key), so that ``jobrun get`` takes it back; a job
        enqueued later may make it ambiguous, which the lookup then says.
        """
        if not ids:
            return {}
        rows = self.store._on_pool_read(
            lambda conn: self.q.web_job_id_neighbours(conn, ids=list(ids))
        )
        short = {}
        for r in rows:
            apart = [_common_hex(r.id, n) + 1 for n in (r.below, r.above) if n is not None]
            digits = min(32, max([MIN_SHORT_HEX, *apart]))
            short[r.id] = id_prefix_text(r.id, digits)
        return short

    def _page(
        self,
        conn: psycopg.Connection[Any],
        where: JobFilter,
        before: uuid.UUID | None,
        limit: int,
    ) -> tuple[list[Job], uuid.UUID | None, int | None]:
        """Up to ``limit`` matching jobs below ``before``, newest first; where the next
        page starts (None: nothing older); how many rows a bounded scan read."""
        span = where.id_range(before)
        if span is None:
            return [], None, None
        low, high = span
        state = None if where.state is None else models.JobState(where.state.value)
        common: dict[str, Any] = dict(
            id_low=low, id_high=high, queue=where.queue, type=where.type, max_rows=limit + 1
        )
        if where.idempotency_key is not None:
            rows = self.q.web_keyed_jobs_page(
                conn, idempotency_key=where.idempotency_key, state=state, **common
            )
        elif where.state is State.QUEUED:
            rows = self.q.web_queued_jobs_page(conn, **common)
        elif where.state is State.LEASED:
            rows = self.q.web_leased_jobs_page(conn, **common)
        elif where.state is State.DEAD:
            rows = self.q.web_dead_jobs_page(conn, **common)
        else:
            return self._scan(conn, state, common, limit)
        jobs = [job_from_row(r) for r in rows]
        if len(jobs) > limit:
            return jobs[:limit], jobs[limit - 1].id, None
        return jobs, None, None

    def _scan(
        self,
        conn: psycopg.Connection[Any],
        state: models.JobState | None,
        common: dict[str, Any],
        limit: int,
    ) -> tuple[list[Job], uuid.UUID | None, int]:
        found = self.q.web_scan_jobs(conn, state=state, scan_rows=SCAN_ROWS, **common)
        assert found is not None  # an aggregate always returns its row
        ids = found.ids[:limit]
        by_id = {r.id: job_from_row(r) for r in self.store.q.get_jobs_by_ids(conn, ids=ids)}
        jobs = [by_id[i] for i in ids if i in by_id]  # one purged in between is gone
        if len(found.ids) > limit:
            return jobs, ids[-1], found.scanned
        if found.scanned >= SCAN_ROWS and found.oldest_scanned > common["id_low"]:
            return jobs, found.oldest_scanned, found.scanned
        return jobs, None, found.scanned

    def job(self, job_id: uuid.UUID) -> JobDetail:
        """A job, its events (oldest first) and its effect's ledger row; NotFound if none."""
        if not isinstance(job_id, uuid.UUID):
            raise ValidationError("job_id", f"must be a uuid.UUID, not {type(job_id).__name__}")

        def run(conn: psycopg.Connection[Any]) -> JobDetail:
            row = self.store.q.get_job(conn, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            job = job_from_row(row)
            events = tuple(event_from_row(e) for e in self.store.q.list_events(conn, job_id=job_id))
            key = EffectKey.of(job)
            ledger = self.q.web_effect(conn, scope=key.scope, key=key.key)
            now = self.store.q.db_now(conn)
            assert now is not None
            return JobDetail(
                job=job,
                events=events,
                effect_key=key,
                effect=None
                if ledger is None
                else EffectRecord(key=key, job_id=ledger.job_id, created_at=ledger.created_at),
                db_now=now,
            )

        return self.store._on_pool_read(run)

    # -- workflows -----------------------------------------------------------------

    def workflows(
        self,
        *,
        state: WorkflowState | None = None,
        before: uuid.UUID | None = None,
        limit: int = 50,
    ) -> WorkflowsPage:
        """A page of workflows, newest first, older than the workflow ``before``.

        With ``state``, the page is filled from at most :data:`WORKFLOW_SCAN`
        workflows read (their state is their jobs'): fewer may match, and
        :attr:`WorkflowsPage.next_before` says where to go on.
        """
        validate.batch_limit(limit, MAX_PAGE)
        if state is not None and not isinstance(state, WorkflowState):
            raise ValidationError("state", "must be a jobrun WorkflowState")

        def run(conn: psycopg.Connection[Any]) -> WorkflowsPage:
            now = self.store.q.db_now(conn)
            assert now is not None
            found: list[WorkflowSummary] = []
            scanned = 0
            after = before
            batch = limit + 1 if state is None else WORKFLOW_BATCH
            while True:
                rows = self.q.web_workflows_page(conn, before=after, max_rows=batch)
                scanned += len(rows)
                for r in rows:
                    summary = workflow_summary(r)
                    if state is None or summary.state is state:
                        found.append(summary)
                if len(found) > limit:
                    shown = found[:limit]
                    return WorkflowsPage(
                        workflows=tuple(shown),
                        next_before=shown[-1].id,
                        scanned=scanned,
                        db_now=now,
                    )
                if len(rows) < batch:
                    return WorkflowsPage(
                        workflows=tuple(found), next_before=None, scanned=scanned, db_now=now
                    )
                after = rows[-1].id
                if scanned >= WORKFLOW_SCAN:
                    return WorkflowsPage(
                        workflows=tuple(found), next_before=after, scanned=scanned, db_now=now
                    )

        return self.store._on_pool_read(run)

    def workflow(self, workflow_id: uuid.UUID) -> WorkflowDetail:
        """A workflow with its jobs and edges (at most MAX_NODES jobs: a workflow's
        limit); NotFound if there is no such workflow."""
        if not isinstance(workflow_id, uuid.UUID):
            raise ValidationError(
                "workflow_id", f"must be a uuid.UUID, not {type(workflow_id).__name__}"
            )

        def run(conn: psycopg.Connection[Any]) -> WorkflowDetail:
            row = self.store.q.get_workflow(conn, id=workflow_id)
            if row is None:
                raise NotFound("workflow", workflow_id)
            jobs = tuple(
                WorkflowJob(
                    id=r.id,
                    node=r.workflow_node or str(r.id),
                    type=r.type,
                    queue=r.queue,
                    state=State(r.state.value),
                    attempts=r.attempts,
                    max_attempts=r.max_attempts,
                    created_at=r.created_at,
                    finished_at=r.finished_at,
                    last_error=r.last_error,
                )
                for r in self.store.q.workflow_nodes(conn, id=workflow_id, max_rows=MAX_NODES)
            )
            edges = tuple(
                (e.parent_id, e.child_id)
                for e in self.store.q.workflow_edges(conn, id=workflow_id, max_rows=MAX_EDGES_READ)
            )
            now = self.store.q.db_now(conn)
            assert now is not None
            counts: dict[State, int] = {}
            for j in jobs:
                counts[j.state] = counts.get(j.state, 0) + 1
            running = WorkflowState.of(counts) is WorkflowState.RUNNING
            finishes = [j.finished_at for j in jobs if j.finished_at is not None]
            summary = WorkflowSummary(
                id=row.id,
                name=row.name,
                created_at=row.created_at,
                finished_at=None if running or not finishes else max(finishes),
                jobs=counts,
            )
            return WorkflowDetail(summary=summary, jobs=jobs, edges=edges, db_now=now)

        return self.store._on_pool_read(run)

    # -- schedules -----------------------------------------------------------------

    def schedules(self) -> tuple[dt.datetime, tuple[ScheduleInfo, ...]]:
        """The database clock and every schedule, by id."""

        def run(conn: psycopg.Connection[Any]) -> tuple[dt.datetime, tuple[ScheduleInfo, ...]]:
            now = self.store.q.db_now(conn)
            assert now is not None
            rows = self.q.web_schedules(conn)
            return now, tuple(
                ScheduleInfo(
                    id=r.id,
                    cron=r.cron,
                    timezone=r.timezone,
                    queue=r.queue,
                    type=r.type,
                    priority=r.priority,
                    max_attempts=r.max_attempts,
                    next_run_at=r.next_run_at,
                    last_fired_at=r.last_fired_at,
                    paused=r.paused,
                )
                for r in rows
            )

        return self.store._on_pool_read(run)


__all__ = [
    "MAX_PAGE",
    "MAX_PREFIX_COUNT",
    "MIN_SHORT_HEX",
    "DashboardReads",
    "EffectRecord",
    "JobDetail",
    "JobFilter",
    "JobsPage",
    "LeaseOwner",
    "Minute",
    "Overview",
    "ScheduleInfo",
    "WorkflowDetail",
    "WorkflowJob",
    "WorkflowsPage",
    "id_prefix_text",
    "normalize_id_prefix",
]
