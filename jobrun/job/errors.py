"""The jobrun error tree.

Every error jobrun raises on purpose derives from :class:`JobrunError`, and
carries its context as attributes rather than only in the message::

    JobrunError
    ├── ValidationError        bad input, raised before anything is written
    ├── NotFound               no job (or schedule) with that id
    ├── AlreadyExists          a schedule with that id exists already
    ├── InvalidState           the operation does not apply to the job's current state
    ├── IdempotencyConflict    the key is taken by a job with a different body
    ├── LeaseLost              the caller no longer holds the job's lease (the fence)
    ├── CommitRefused          a commit callable ended the transaction it was given
    ├── LeaderLost             the leader's term ended before a leader action could commit:
    │                          nothing of it was done (the action was fenced by the term)
    ├── SchemaMismatch         the database's jobrun schema is missing, older or newer than
    │                          this code: run ``jobrun migrate`` (or upgrade jobrun)
    ├── WaitTimeout            the job had not finished when a wait for it ran out (also a
    │                          ``TimeoutError``)
    ├── SignalTimeout          a durable signal wait's timeout passed before the signal came
    │                          (``ctx.wait_for_signal``, :mod:`jobrun.job.signals`; also a
    │                          ``TimeoutError``)
    └── DatabaseError          the database could not do it
        ├── TransientError     connection lost, server shutting down, read-only, pool timeout:
        │   │                  retry later, nothing was decided
        │   └── ConnectionUnavailable
        │                      no pooled connection within the call's bound (the database
        │                      away, or every connection in use); the wait was the pause
        ├── OutcomeUnknown     the connection died during COMMIT: the change may or may not
        │                      have landed; retry with the same idempotency key
        ├── PoolerError        a transaction pooler (PgBouncer) moved the session's prepared
        │                      statements away: set JOBRUN_POOLER=transaction; nothing committed
        └── InheritedPool      a pool the caller built was inherited through fork(): open
                               one after the fork; retrying in this process never helps

``ValidationError`` is also a ``ValueError`` so that callers who treat bad
arguments generically still catch it. What a handler raises to steer its job
(``PermanentFailure``, ``Snooze``: :mod:`jobrun.worker.registry`) is no error
of jobrun's and stands outside the tree, as does ``Parked``
(:mod:`jobrun.job.signals`, a BaseException a durable wait leaves its
handler by). tests/unit/test_error_tree.py compares this drawing with the
classes, so a class moved or added without its line fails there.
"""

from __future__ import annotations

import uuid


class JobrunError(Exception):
    """Base class of every error jobrun raises on purpose."""


class ValidationError(JobrunError, ValueError):
    """Bad input: nothing was written, no event, no notification."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(JobrunError):
    """No job or schedule with that id exists (any more)."""

    def __init__(self, what: str, ident: object) -> None:
        super().__init__(f"{what} {ident} not found")
        self.what = what
        self.ident = ident


class AlreadyExists(JobrunError):
    """Creating something whose id is taken (``create_schedule``; upsert replaces instead)."""

    def __init__(self, what: str, ident: object) -> None:
        super().__init__(f"{what} {ident!r} already exists")
        self.what = what
        self.ident = ident


class InvalidState(JobrunError):
    """The operation does not apply to the job in its current state (retry of a leased job)."""

    def __init__(self, job_id: uuid.UUID, state: str, operation: str, *, what: str = "job") -> None:
        super().__init__(f"cannot {operation} {what} {job_id}: it is {state}")
        self.job_id = job_id
        self.state = state
        self.operation = operation


class IdempotencyConflict(JobrunError):
    """The (queue, idempotency key) pair is held by a job with a different body."""

    def __init__(self, queue: str, key: str, existing_id: uuid.UUID | None = None) -> None:
        super().__init__(
            f"idempotency key {key!r} in queue {queue!r} is already used by "
            f"job {existing_id} with a different body"
            if existing_id
            else f"idempotency key {key!r} in queue {queue!r} is already used with a different body"
        )
        self.queue = queue
        self.key = key
        self.existing_id = existing_id


class LeaseLost(JobrunError):
    """The caller's lease (owner + token) no longer holds: another owner or the reaper has the job.

    Nothing was changed; on the transactional path the commit callable's writes
    were rolled back with everything else.
    """

    def __init__(self, job_id: uuid.UUID) -> None:
        super().__init__(f"lease of job {job_id} was lost")
        self.job_id = job_id


class CommitRefused(JobrunError):
    """A commit callable committed or rolled back the connection it was lent.

    The callable must only run statements: Complete owns the transaction, so
    that the effect row, the callable's writes and the job's new state land
    together or not at all.
    """


class DatabaseError(JobrunError):
    """The database could not complete the operation."""


class TransientError(DatabaseError):
    """A connection fault (lost connection, shutdown, read-only server, pool timeout).

    Nothing was decided; the same call may succeed later.
    """


class ConnectionUnavailable(TransientError):
    """No pooled connection could be had within the call's bound.

    The message says why: the database unavailable (for how long, how many
    failed attempts, the last reason), or every connection of the pool in
    use. The call waited its whole bound for one, so a loop that retries
    needs no pause of its own before the next try.
    """


class OutcomeUnknown(DatabaseError):
    """The connection was lost while COMMIT was in flight.

    The transaction may or may not have committed. Retrying is safe: enqueue is
    deduplicated by its idempotency key and the effect ledger never runs a
    commit callable twice.
    """


class PoolerError(DatabaseError):
    """A transaction pooler between jobrun and PostgreSQL broke a session feature.

    Raised for the errors PgBouncer in transaction mode (and its kin) causes
    when a connection uses server-side prepared statements: the statement
    was prepared on one server session and the next transaction ran on
    another (``InvalidSqlStatementName``, ``DuplicatePreparedStatement``, a
    ``bind message supplies ... parameters`` protocol error). The server
    rejected the statement, so nothing of it committed; retrying on the same
    connections fails the same way. The fix is the setting: ``pooler`` names
    it (``JOBRUN_POOLER``), ``sqlstate`` is the server's code.
    """

    def __init__(self, detail: str, *, sqlstate: str | None = None) -> None:
        super().__init__(
            f"{detail}: the connection goes through a transaction pooler (PgBouncer in "
            "transaction pooling mode?), which runs each transaction on another server session, "
            "so psycopg's prepared statements go missing. Nothing was committed. Set "
            "JOBRUN_POOLER=transaction (Settings(pooler='transaction'), --pooler transaction, "
            "open_pool(..., pooler='transaction')), or connect with prepare_threshold=None"
        )
        self.detail = detail
        self.sqlstate = sqlstate
        self.pooler = "JOBRUN_POOLER"


class LeaderLost(JobrunError):
    """The leader's term is over (its lease expired or was taken over): the action was refused.

    Leader actions are fenced by the term they were started in: the
    transaction checks and share-locks the term's lease row first, so an
    action of an old term can never commit beside the next term's.
    ``term`` is the term that ended.
    """

    def __init__(self, name: str, term: int) -> None:
        super().__init__(f"leadership {name!r}: term {term} is over; the action was not done")
        self.name = name
        self.term = term


class InheritedPool(DatabaseError):
    """The Store's pool was opened in another process and inherited through ``fork()``.

    Its connections are the parent's server sessions: using them from the
    child would mix both processes' queries and answers, so nothing was
    sent. Pools from ``open_pool`` (and ``Client.connect``) reopen
    themselves in a child; a ``psycopg_pool.ConnectionPool`` built by the
    caller cannot be, so it must be created after the fork (gunicorn's
    ``post_fork`` hook, uwsgi's ``postfork``, a ``multiprocessing``
    initializer) or be one of ``open_pool``'s. Not a TransientError: a retry
    in the same process fails the same way.
    """

    def __init__(self, owner_pid: int | None, pid: int) -> None:
        parent = f"process {owner_pid}" if owner_pid is not None else "another process"
        super().__init__(
            f"this connection pool was opened in {parent} and inherited by process {pid} "
            "through fork(); its connections belong to the parent and were not used. "
            "Create the pool after the fork (e.g. in gunicorn's post_fork hook or a "
            "multiprocessing initializer), or use jobrun.postgres.pool.open_pool / "
            "jobrun.Client.connect, whose pools reopen themselves in a child"
        )
        self.owner_pid = owner_pid
        self.pid = pid


class SchemaMismatch(JobrunError):
    """The jobrun schema in the database is missing or at another version than this code's.

    ``found`` is the database's version (None: no jobrun schema at all),
    ``needed`` this code's. Raised once at start by every entry point, so a
    worker started before ``jobrun migrate`` says so in one line instead of
    failing every query.
    """

    def __init__(self, schema: str, found: int | None, needed: int) -> None:
        if found is None:
            message = f"the jobrun schema {schema!r} is missing: run 'jobrun migrate'"
        elif found < needed:
            message = (
                f"the jobrun schema {schema!r} is at version {found}, this jobrun needs "
                f"{needed}: run 'jobrun migrate'"
            )
        else:
            message = (
                f"the jobrun schema {schema!r} is at version {found}, newer than this "
                f"jobrun knows ({needed}): upgrade jobrun"
            )
        super().__init__(message)
        self.schema = schema
        self.found = found
        self.needed = needed


class WaitTimeout(JobrunError, TimeoutError):
    """The job had not finished when the wait ran out; ``job`` is how it stood last."""

    def __init__(self, job: object, timeout: float) -> None:
        job_id = getattr(job, "id", job)
        state = getattr(job, "state", "?")
        super().__init__(f"job {job_id} had not finished after {timeout:g} s (it is {state})")
        self.job = job
        self.timeout = timeout
