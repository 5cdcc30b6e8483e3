"""The job.Schedules half of the Store: cron schedules next to the jobs.

Materialising an occurrence
---------------------------
The leader asks :meth:`due_schedules` (``SELECT ... FOR UPDATE SKIP LOCKED``
in its own short transaction, defensive against two leaders), then calls
:meth:`materialize` for each. One materialisation is ONE transaction::

    1. enqueue the occurrence's job, idempotency key sched:<id>:<next_run>
       of the row as read (a replay when it was already enqueued)
    2. advance next_run_at from the value read to the first occurrence after
       now, as a compare-and-set (WHERE next_run_at = <value read>)
    3. commit -- or, when the compare-and-set matched nothing (another
       leader moved first), roll back

No occurrence is lost: until the commit nothing moved, and a crash before it
leaves next_run_at where it was, so the next tick enqueues the same
occurrence again. None runs twice: the enqueue and the advance commit
together, so an advanced schedule never re-enqueues an old occurrence; and
two leaders racing on one stored row compute the same key (from the row,
whatever ``now`` each read), so the second insert is a replay of the first,
and the loser's compare-and-set fails and rolls its transaction back. The
key is the durable guard; the row locks and the compare-and-set only keep
the losers cheap.

Misfires: after downtime spanning several periods only the latest due
occurrence is enqueued (coalesced, never a burst), at that occurrence's
time but keyed by the stored ``next_run_at`` it stands for
(``sched:<id>:<next_run>``, the spec's durable guard): the latest due
occurrence depends on the ``now`` each materialiser read, the stored value
does not, so two leaders straddling a cron boundary key the misfire alike.
A tick that is merely late (an every-second cron whose leader ticked a few
milliseconds after the next second, a statement that waited behind a
pooler) is not downtime: occurrences late by less than
:data:`MISFIRE_GRACE` are enqueued too, in the same transaction, so a
drifting tick never skips one.
Pausing keeps the schedule's row; resuming continues from the first
occurrence after now (occurrences missed while paused are not run).
Occurrences and next runs are computed from the database clock (the ``now``
the caller read with Store.now()); see jobrun.job.cron for the DST rule.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import uuid
from typing import Any, TypeVar

import psycopg

from jobrun.job import validate
from jobrun.job.errors import AlreadyExists, IdempotencyConflict, NotFound, ValidationError
from jobrun.job.model import Job, NewJob, Schedule, ScheduleSpec
from jobrun.postgres.convert import job_from_row, raw_json, schedule_from_row
from jobrun.postgres.enqueue import Enqueue
from jobrun.postgres.sqlc import Queries

log = logging.getLogger(__name__)

T = TypeVar("T")

MISFIRE_GRACE = dt.timedelta(seconds=1.5)
"""How late an occurrence may be and still run (beyond: coalesced into the latest)."""

_NONCE = re.compile(r"[A-Za-z0-9_.-]{1,64}")


class _LostRace(Exception):
    """Another materialiser advanced the schedule first: roll ours back."""


class SchedulesMixin(Enqueue):
    """Cron schedules (mixed into :class:`jobrun.postgres.store.Store`)."""

    # -- definitions -------------------------------------------------------------

    def create_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Create a schedule; AlreadyExists when its id is taken."""
        _check_spec(spec)

        def run(c: psycopg.Connection[Any]) -> Schedule:
            row = self.q.insert_schedule(c, **_row_args(spec, _first_run(self.q, c, spec)))
            if row is None:
                raise AlreadyExists("schedule", spec.id)
            return schedule_from_row(row)

        return self._with_tx(run)

    def upsert_schedule(self, spec: ScheduleSpec) -> Schedule:
        """Create or replace a schedule (an unchanged cron keeps its next run)."""
        _check_spec(spec)

        def run(c: psycopg.Connection[Any]) -> Schedule:
            row = self.q.upsert_schedule(c, **_row_args(spec, _first_run(self.q, c, spec)))
            assert row is not None
            return schedule_from_row(row)

        return self._with_tx(run)

    def get_schedule(self, schedule_id: str) -> Schedule:
        schedule_id = _check_id(schedule_id)
        row = self._on_pool_read(lambda c: self.q.get_schedule(c, id=schedule_id))
        if row is None:
            raise NotFound("schedule", schedule_id)
        return schedule_from_row(row)

    def list_schedules(self) -> list[Schedule]:
        return [schedule_from_row(r) for r in self._on_pool_read(self.q.list_schedules)]

    def delete_schedule(self, schedule_id: str) -> None:
        schedule_id = _check_id(schedule_id)
        deleted = self._on_pool(lambda c: self.q.delete_schedule(c, id=schedule_id))
        if not deleted:
            raise NotFound("schedule", schedule_id)

    def pause_schedule(self, schedule_id: str) -> Schedule:
        schedule_id = _check_id(schedule_id)
        row = self._on_pool(
            lambda c: self.q.set_schedule_paused(c, paused=True, next_run_at=None, id=schedule_id)
        )
        if row is None:
            raise NotFound("schedule", schedule_id)
        return schedule_from_row(row)

    def resume_schedule(self, schedule_id: str) -> Schedule:
        """Resume from the first occurrence after now."""
        schedule_id = _check_id(schedule_id)

        def run(c: psycopg.Connection[Any]) -> Schedule:
            current = self.q.get_schedule(c, id=schedule_id)
            if current is None:
                raise NotFound("schedule", schedule_id)
            now = self.q.db_now(c)
            assert now is not None
            following = schedule_from_row(current).cron_schedule.next_after(now)
            row = self.q.set_schedule_paused(c, paused=False, next_run_at=following, id=schedule_id)
            assert row is not None
            return schedule_from_row(row)

        return self._with_tx(run)

    def trigger_schedule(self, schedule_id: str, *, nonce: str | None = None) -> Job:
        """Enqueue one run of the schedule's job now, outside its cron (one transaction).

        The schedule is left as it is: its next run, its last fire and its
        pause (a paused schedule can be run by hand). The job's idempotency
        key is ``sched:<id>:manual:<nonce>``: the same ``nonce`` sent twice (a
        double click, a request retried after a lost reply) enqueues one job
        and returns it again; without one, every call enqueues a new job.
        """
        schedule_id = _check_id(schedule_id)
        if nonce is None:
            nonce = uuid.uuid4().hex
        elif not isinstance(nonce, str) or not _NONCE.fullmatch(nonce):
            raise ValidationError("nonce", "must be 1-64 characters of A-Z a-z 0-9 _ . -")

        def run(c: psycopg.Connection[Any]) -> Job:
            row = self.q.get_schedule(c, id=schedule_id)
            if row is None:
                raise NotFound("schedule", schedule_id)
            schedule = schedule_from_row(row)
            job = NewJob(
                type=schedule.type,
                payload=schedule.payload,
                queue=schedule.queue,
                priority=schedule.priority,
                max_attempts=schedule.max_attempts,
                backoff=schedule.backoff,
                idempotency_key=f"sched:{schedule.id}:manual:{nonce}",
            )
            try:
                return self._enqueue_on(c, job)
            except IdempotencyConflict as exc:
                # This trigger ran before the template changed: it is done all the same.
                stored = self.q.get_job(c, id=exc.existing_id) if exc.existing_id else None
                if stored is None:
                    raise
                return job_from_row(stored)

        return self._with_tx(run)

    # -- the leader's side -------------------------------------------------------

    def due_schedules(self, now: dt.datetime, limit: int) -> list[Schedule]:
        """Unpaused schedules whose next run is at or before ``now`` (db now), oldest first."""
        validate.aware_datetime("now", now)
        validate.batch_limit(limit, 10_000)
        rows = self._with_tx(lambda c: self.q.due_schedules(c, now=now, max_schedules=limit))
        return [schedule_from_row(r) for r in rows]

    def materialize(self, schedule: Schedule, now: dt.datetime) -> Job | None:
        """Enqueue the latest due occurrence of ``schedule`` and advance it (one transaction).

        The job is keyed by ``schedule.next_run_at`` (the row as read), not by
        the occurrence ``now`` selects (see the module docs on misfires).

        Returns the occurrence's job (possibly a replay), or None when nothing
        was due or another leader advanced the schedule first.
        """
        validate.aware_datetime("now", now)
        cron = schedule.cron_schedule
        occurrence = cron.latest_due(schedule.next_run_at, now)
        if occurrence is None:
            return None
        following = cron.next_after(now)
        # (when it runs, the occurrence its key names)
        occurrences: list[tuple[dt.datetime, dt.datetime]] = []
        late = schedule.next_run_at
        while late < occurrence and now - late < MISFIRE_GRACE and len(occurrences) < 10:
            occurrences.append((late, late))  # a late tick, not downtime: still run
            late = cron.next_after(late)
        # The latest due occurrence stands for every one from ``late`` on: it
        # is keyed by that first one, which ``now`` does not move (the stored
        # next run when nothing ran before it), so leaders that read different
        # nows key the same misfire the same way.
        occurrences.append((occurrence, late))
        jobs = [
            NewJob(
                type=schedule.type,
                payload=schedule.payload,
                queue=schedule.queue,
                priority=schedule.priority,
                max_attempts=schedule.max_attempts,
                backoff=schedule.backoff,
                run_at=when,
                idempotency_key=schedule.occurrence_key(keyed),
            )
            for when, keyed in occurrences
        ]

        def run(c: psycopg.Connection[Any]) -> Job:
            for job in jobs:
                try:
                    enqueued = self._enqueue_on(c, job)
                except IdempotencyConflict as exc:
                    # The occurrence was enqueued before the template changed:
                    # it is materialised all the same.
                    stored = self.q.get_job(c, id=exc.existing_id) if exc.existing_id else None
                    if stored is None:
                        raise
                    enqueued = job_from_row(stored)
            moved = self.q.advance_schedule(
                c, next_run_at=following, id=schedule.id, previous=schedule.next_run_at
            )
            if not moved:
                raise _LostRace
            return enqueued

        try:
            return self._with_tx(run)
        except _LostRace:
            log.info("schedule %s was advanced by another materialiser", schedule.id)
            return None


def _check_spec(spec: object) -> None:
    if not isinstance(spec, ScheduleSpec):
        raise ValidationError("spec", f"must be a jobrun.ScheduleSpec, not {type(spec).__name__}")


def _check_id(schedule_id: object) -> str:
    """A lookup key that can be sent: a non-empty str without NUL or lone surrogates.

    An id that breaks ScheduleSpec's pattern cannot exist, and is simply not found.
    """
    if not isinstance(schedule_id, str) or not schedule_id:
        raise ValidationError("schedule_id", "must be a non-empty str")
    return validate.text("schedule_id", schedule_id)


def _first_run(queries: Queries, conn: psycopg.Connection[Any], spec: ScheduleSpec) -> dt.datetime:
    now = queries.db_now(conn)
    assert now is not None
    return spec.schedule.next_after(now)


def _row_args(spec: ScheduleSpec, next_run_at: dt.datetime) -> dict[str, Any]:
    return {
        "id": spec.id,
        "cron": spec.cron,
        "timezone": spec.timezone,
        "queue": spec.queue,
        "type": spec.type,
        "payload": raw_json(spec.payload_json),  # the text ScheduleSpec checked
        "priority": spec.priority,
        "max_attempts": spec.max_attempts,
        "backoff": spec.backoff.to_json(),
        "next_run_at": next_run_at,
    }
