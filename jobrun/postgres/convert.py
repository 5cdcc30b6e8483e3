"""Row <-> domain conversion, and the one translator of psycopg errors.

The translator is the only place that knows which database errors mean what
to a jobrun caller::

    PoolTimeout, connection lost, admin shutdown,
    cannot connect now, read-only transaction,
    too many connections                           -> TransientError (retry later)
    session lost while COMMIT was in flight (or
    during a lone autocommit statement)            -> OutcomeUnknown
    a prepared statement missing, duplicated or
    mismatched on the server session (a
    transaction pooler moved the client)           -> PoolerError (names JOBRUN_POOLER)
    a statement the server answered with an ERROR
    (class 08 included: the session lives on), or
    one an earlier error aborted in a pipeline     -> DatabaseError, never OutcomeUnknown
    query canceled (statement_timeout)             -> DatabaseError
    deadlock, serialization failure                -> retried once by the store,
                                                      then DatabaseError
    anything else (a commit callable's own error)  -> unchanged
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Protocol

import psycopg
import psycopg.errors
from psycopg.types.array import ListBinaryDumper
from psycopg.types.json import Jsonb, JsonbLoader
from psycopg_pool import PoolTimeout

from jobrun.job import propagation
from jobrun.job.errors import DatabaseError, OutcomeUnknown, PoolerError, TransientError
from jobrun.job.model import Backoff, Event, EventKind, Job, NewJob, Schedule, State
from jobrun.job.validate import redact
from jobrun.job.workflow import ParentResults
from jobrun.postgres.sqlc import jobs as q
from jobrun.postgres.sqlc import models

UTC = dt.UTC

_backoffs: dict[tuple[Any, ...], Backoff] = {}


def backoff_from_row(data: Mapping[str, Any]) -> Backoff:
    """The policy stored in a row; cached, because a claim converts many identical ones.

    Keyed by the items in their stored order (jsonb keeps one order for the
    same keys): no sort per row, and another order is only a cache miss.
    """
    key = tuple(data.items())
    policy = _backoffs.get(key)
    if policy is None:
        policy = Backoff.from_json(data)
        if len(_backoffs) < 1024:
            _backoffs[key] = policy
    return policy


def utc(value: dt.datetime) -> dt.datetime:
    """Normalise an aware timestamp to UTC (our pool's sessions already are)."""
    return value if value.tzinfo is UTC else value.astimezone(UTC)


def utc_or_none(value: dt.datetime | None) -> dt.datetime | None:
    return None if value is None else utc(value)


class JobRow(Protocol):
    """A row carrying every column of ``jobs``: the table's model, or a query's row
    that adds columns of its own (EnqueueJob's notify_queue_usage)."""

    @property
    def id(self) -> uuid.UUID: ...
    @property
    def queue(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def payload(self) -> Any: ...
    @property
    def priority(self) -> int: ...
    @property
    def state(self) -> models.JobState: ...
    @property
    def attempts(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def backoff(self) -> Any: ...
    @property
    def run_at(self) -> dt.datetime: ...
    @property
    def lease_owner(self) -> str | None: ...
    @property
    def lease_token(self) -> uuid.UUID | None: ...
    @property
    def lease_expires_at(self) -> dt.datetime | None: ...
    @property
    def cancel_requested(self) -> bool: ...
    @property
    def idempotency_key(self) -> str | None: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def created_at(self) -> dt.datetime: ...
    @property
    def updated_at(self) -> dt.datetime: ...
    @property
    def finished_at(self) -> dt.datetime | None: ...
    @property
    def result(self) -> Any: ...
    @property
    def trace_context(self) -> Any: ...
    @property
    def concurrency_key(self) -> str | None: ...
    @property
    def snoozes(self) -> int: ...
    @property
    def releases(self) -> int: ...
    @property
    def progress(self) -> float | None: ...
    @property
    def progress_message(self) -> str | None: ...
    @property
    def progress_at(self) -> dt.datetime | None: ...
    @property
    def started_at(self) -> dt.datetime | None: ...
    @property
    def pending_parents(self) -> int: ...
    @property
    def has_dependents(self) -> bool: ...
    @property
    def workflow_id(self) -> uuid.UUID | None: ...
    @property
    def workflow_node(self) -> str | None: ...


_STATES: dict[models.JobState, State] = {state: State(state.value) for state in models.JobState}
"""The domain's state of each row state (a lookup, not an enum call per row)."""


def job_from_row(row: JobRow) -> Job:
    return Job(
        id=row.id,
        queue=row.queue,
        type=row.type,
        payload=row.payload,
        priority=row.priority,
        state=_STATES[row.state],
        attempts=row.attempts,
        max_attempts=row.max_attempts,
        backoff=backoff_from_row(row.backoff),
        run_at=utc(row.run_at),
        lease_owner=row.lease_owner,
        lease_token=row.lease_token,
        lease_expires_at=utc_or_none(row.lease_expires_at),
        cancel_requested=row.cancel_requested,
        idempotency_key=row.idempotency_key,
        last_error=row.last_error,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        finished_at=utc_or_none(row.finished_at),
        result=row.result,
        trace_context=row.trace_context,
        concurrency_key=row.concurrency_key,
        snoozes=row.snoozes,
        releases=row.releases,
        progress=row.progress,
        progress_message=row.progress_message,
        progress_at=utc_or_none(row.progress_at),
        started_at=utc_or_none(row.started_at),
        pending_parents=row.pending_parents,
        has_dependents=row.has_dependents,
        workflow_id=row.workflow_id,
        workflow_node=row.workflow_node,
        # Only a claim's rows carry it (ClaimJobs), and only for a job with parents.
        parent_results=_parents(getattr(row, "parent_results", None)),
        dependents_pending=getattr(row, "dependents_pending", None),
    )


def _parents(value: str | None) -> ParentResults | None:
    """The claim's aggregate of a job's parents (its JSON text) as the domain's,
    decoded when the handler first reads it (None: no parents)."""
    if value is None:
        return None
    return ParentResults.decoded_later(value)


class InsertedRow(Protocol):
    """What EnqueueJob and EnqueueKeyedJob return: the columns the database decided."""

    @property
    def run_at(self) -> dt.datetime: ...
    @property
    def created_at(self) -> dt.datetime: ...
    @property
    def updated_at(self) -> dt.datetime: ...


def job_from_insert(job: NewJob, row: InsertedRow, trace_context: dict[str, str] | None) -> Job:
    """The job an enqueue just inserted: ``job``'s own values, the column defaults of
    a new job, and what the database decided (``row``), without reading the row
    back. ``trace_context`` is the creation context stored with it."""
    return Job(
        id=job.id,
        queue=job.queue,
        type=job.type,
        payload=job.payload,
        priority=job.priority,
        state=State.QUEUED,
        attempts=0,
        max_attempts=job.max_attempts,
        backoff=job.backoff,
        run_at=utc(row.run_at),
        lease_owner=None,
        lease_token=None,
        lease_expires_at=None,
        cancel_requested=False,
        idempotency_key=job.idempotency_key,
        last_error=None,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
        finished_at=None,
        result=None,
        trace_context=trace_context,
        concurrency_key=job.concurrency_key,
    )


def event_from_row(row: models.JobEvent) -> Event:
    return Event(
        id=row.id,
        job_id=row.job_id,
        kind=EventKind(row.kind),
        attempt=row.attempt,
        at=utc(row.at),
        detail=row.detail,
    )


def schedule_from_row(row: models.Schedule) -> Schedule:
    return Schedule(
        id=row.id,
        cron=row.cron,
        timezone=row.timezone,
        queue=row.queue,
        type=row.type,
        payload=row.payload,
        priority=row.priority,
        max_attempts=row.max_attempts,
        backoff=backoff_from_row(row.backoff),
        next_run_at=utc(row.next_run_at),
        paused=row.paused,
        created_at=utc(row.created_at),
        updated_at=utc(row.updated_at),
    )


# The server answered with an error: nothing committed, try again later.
_TRANSIENT = (
    psycopg.errors.CannotConnectNow,  # 57P03: starting up / shutting down
    psycopg.errors.ReadOnlySqlTransaction,  # 25006: a read-only (or demoted) primary
    psycopg.errors.TooManyConnections,  # 53300
)
# The session died under us: if that happened during COMMIT, nobody knows
# whether the commit record made it.
_SESSION_LOST = (
    psycopg.errors.AdminShutdown,  # 57P01: terminated by administrator / server restart
    psycopg.errors.CrashShutdown,  # 57P02
    psycopg.errors.IdleInTransactionSessionTimeout,  # 25P03
)

RETRYABLE = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)


_PREPARED = (
    psycopg.errors.InvalidSqlStatementName,  # 26000: prepared statement "_pg3_0" does not exist
    psycopg.errors.DuplicatePreparedStatement,  # 42P05: prepared statement "_pg3_0" already exists
)


def _pooler_failure(exc: psycopg.Error) -> bool:
    """Whether ``exc`` is a transaction pooler's trace: prepared statements gone astray.

    A prepared statement is per server session; behind PgBouncer in
    transaction mode the next transaction may run on another session, where
    it is missing, exists under the same name with other parameters
    (``bind message supplies 5 parameters, but prepared statement "_pg3_1"
    requires 14``: SQLSTATE 08P01, a protocol violation the server answers
    with an ERROR and survives) or is already taken.
    """
    if isinstance(exc, _PREPARED):
        return True
    return isinstance(exc, psycopg.errors.ProtocolViolation) and "prepared statement" in str(exc)


def _server_rejected(exc: psycopg.Error) -> bool:
    """Whether a connection-class error is the server's ERROR answer to a live session.

    SQLSTATE class 08 usually means the connection is gone, but a server (or
    a pooler speaking for it) also answers a malformed message with an
    ERROR of that class (08P01 protocol violation) and carries on. Such a
    statement did nothing (an ERROR during COMMIT rolls back): its outcome
    is known. Only a FATAL or PANIC ends the session, and only that, or no
    answer at all, can leave a COMMIT's outcome unknown.
    """
    if isinstance(exc, psycopg.errors.PipelineAborted):
        return True  # an earlier statement of the pipeline failed; this one never ran
    severity = exc.diag.severity_nonlocalized or exc.diag.severity
    return (exc.sqlstate or "").startswith("08") and severity == "ERROR"


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, RETRYABLE)


@contextlib.contextmanager
def translate_errors(*, committing: list[bool] | None = None) -> Iterator[None]:
    """Map psycopg's errors to jobrun's (see the module docstring).

    ``committing`` is a one-element flag the caller sets just before COMMIT
    (or to True for a lone autocommit statement), so a session lost at that
    moment becomes OutcomeUnknown.
    """
    try:
        yield
    except PoolTimeout as exc:
        raise TransientError(f"no database connection available: {exc}") from exc
    except _TRANSIENT as exc:
        raise TransientError(_first_line(exc)) from exc
    except psycopg.errors.QueryCanceled as exc:
        raise DatabaseError(f"statement canceled: {_first_line(exc)}") from exc
    except RETRYABLE as exc:
        raise DatabaseError(_first_line(exc)) from exc
    except _PREPARED as exc:
        raise PoolerError(_first_line(exc), sqlstate=exc.sqlstate) from exc
    except psycopg.OperationalError as exc:
        if _pooler_failure(exc):
            raise PoolerError(_first_line(exc), sqlstate=exc.sqlstate) from exc
        if _server_rejected(exc) and not isinstance(exc, _SESSION_LOST):
            raise DatabaseError(f"the server refused the statement: {_first_line(exc)}") from exc
        # _SESSION_LOST, class 08, or no SQLSTATE at all (the socket closed).
        if isinstance(exc, _SESSION_LOST) or not exc.sqlstate or exc.sqlstate.startswith("08"):
            if committing and committing[0]:
                raise OutcomeUnknown(f"connection lost during COMMIT: {_first_line(exc)}") from exc
            raise TransientError(_first_line(exc)) from exc
        raise TransientError(_first_line(exc)) from exc
    except psycopg.InternalError as exc:
        if not _protocol_lost(exc):
            raise
        # The server session under a pooler died mid-pipeline: the pooler
        # answered for it, and what reached the server is not known.
        if committing and committing[0]:
            raise OutcomeUnknown(f"connection lost during COMMIT: {_first_line(exc)}") from exc
        raise TransientError(_first_line(exc)) from exc


def _protocol_lost(exc: psycopg.InternalError) -> bool:
    """psycopg's own protocol confusion (no SQLSTATE): more results than
    statements, as when a pooler's server session dies inside a pipeline."""
    return not exc.sqlstate and str(exc).startswith("received ")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return redact(text.splitlines()[0] if text else type(exc).__name__)


def statement_timeout_setting(seconds: float | None) -> str:
    """A ``statement_timeout`` value for a bound in seconds: whole milliseconds,
    at least 1 (0 would mean none), and '0' when there is no bound."""
    if seconds is None:
        return "0"
    return str(max(1, int(seconds * 1000)))


# -- jsonb values ---------------------------------------------------------------------


_JSONB_CACHE_BYTES = 256
"""The longest jsonb text :class:`JsonbValues` keeps the value of."""
_JSONB_CACHE_ENTRIES = 1024
"""How many it keeps; the lot is dropped when full (the ones in use come back)."""
_MISSING: Any = object()
_SCALARS = frozenset({str, int, float, bool, type(None)})
_decode = json.JSONDecoder().raw_decode


def _flat(value: Any) -> bool:
    """Whether a fresh shallow copy of ``value`` is as good as a fresh decode: a
    scalar, or an object or array of scalars (the types json decodes to)."""
    kind = type(value)
    if kind is dict:
        value = value.values()
    elif kind is not list:
        return kind in _SCALARS
    return _SCALARS.issuperset(map(type, value))


class JsonbValues(JsonbLoader):
    """psycopg's jsonb loader, with the values of short texts kept for the next row.

    A claim's rows repeat the same few jsonb texts (every job's backoff
    policy, ``{}`` payloads), and decoding them was 7 us of each claimed
    job. A short text seen before is answered from a cache, with a fresh
    copy each time (only flat values are kept: a scalar, or an object or
    array of scalars, so a shallow copy is a value of its own: a handler
    that changes its payload changes no other job's). Others are decoded
    as psycopg does, without its encoding detection (jsonb's text is UTF-8
    here, as psycopg's loader assumes too). A ``json.loads`` replaced
    through ``psycopg.types.json.set_json_loads`` is used as it is, with no
    cache.
    """

    _cache: dict[bytes, Any] = {}
    """Shared by every connection and cursor (psycopg makes a loader per result):
    a dict's single get, set and clear are atomic, and a race only misses."""

    def __init__(self, oid: int, context: Any = None) -> None:
        super().__init__(oid, context)
        self._custom = self.loads is not json.loads

    def load(self, data: Any) -> Any:
        if not isinstance(data, bytes):
            data = bytes(data)
        if self._custom:
            return self.loads(data)
        short = len(data) <= _JSONB_CACHE_BYTES
        if short:
            kept = JsonbValues._cache.get(data, _MISSING)
            if kept is not _MISSING:
                return kept.copy() if isinstance(kept, dict | list) else kept
        text = data.decode()
        try:
            value, end = _decode(text)
        except ValueError:
            value, end = json.loads(text), len(text)  # leading space: never in jsonb's text
        if end != len(text):
            value = json.loads(text)  # the same error json.loads gives, or the value
        if short and _flat(value):
            cache = JsonbValues._cache
            if len(cache) >= _JSONB_CACHE_ENTRIES:
                cache.clear()
            cache[data] = value.copy() if isinstance(value, dict | list) else value
        return value


def use_jsonb_values(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """Load ``conn``'s jsonb columns with :class:`JsonbValues` (jobrun's pools)."""
    conn.adapters.register_loader("jsonb", JsonbValues)


# -- array parameters ---------------------------------------------------------------


class BinaryArray(list[Any]):
    """A list parameter psycopg sends in binary: for the uuid[] and text[] columns
    of a batch statement (CompleteJobs' ids, tokens, scopes and keys).

    A plain list goes in text, each element formatted, checked for quoting
    and escaped in Python: 8 us per completed job for CompleteJobs' four
    arrays, where the binary form (a uuid's 16 bytes, a str's UTF-8) takes
    1.3. Only for lists whose elements all have one type with a binary
    form matching the statement's cast (uuid, text); anything else stays a
    plain list. The dumper is registered for this class alone, so no other
    list of the process changes format.
    """


psycopg.adapters.register_dumper(BinaryArray, ListBinaryDumper)


# -- JSON parameters ----------------------------------------------------------------


def _identity(text: str) -> str:
    return text


def raw_json(text: str) -> Jsonb:
    """A jsonb parameter from JSON text already made (sent as is, not serialised again)."""
    return Jsonb(text, dumps=_identity)


_backoff_json: dict[Backoff, Jsonb] = {}


def backoff_json(policy: Backoff) -> Jsonb:
    """The stored form of a policy, serialised once per distinct policy."""
    cached = _backoff_json.get(policy)
    if cached is None:
        cached = raw_json(json.dumps(policy.to_json(), separators=(",", ":")))
        if len(_backoff_json) < 1024:
            _backoff_json[policy] = cached
    return cached


def run_at(job: NewJob, db_now: dt.datetime) -> dt.datetime:
    if job.run_at is not None:
        return job.run_at
    if job.delay is not None:
        return db_now + job.delay
    return db_now


def carrier_json(carrier: propagation.Carrier | None) -> Jsonb | None:
    """The enqueue's trace carrier as stored: serialised once, shared by its jobs."""
    return None if carrier is None else raw_json(json.dumps(carrier, separators=(",", ":")))


def trace_json(job: NewJob, shared: Jsonb | None) -> Jsonb | None:
    """The creation context stored with ``job``: its own if it brings one, else the enqueue's."""
    return shared if job.trace_context is None else Jsonb(job.trace_context)


def copy_row(job: NewJob, db_now: dt.datetime, shared: Jsonb | None) -> q.CopyJobsParams:
    return q.CopyJobsParams(
        id=job.id,
        queue=job.queue,
        type=job.type,
        payload=raw_json(job.payload_json),
        priority=job.priority,
        max_attempts=job.max_attempts,
        backoff=backoff_json(job.backoff),
        run_at=run_at(job, db_now),
        trace_context=trace_json(job, shared),
        concurrency_key=job.concurrency_key,
    )
