"""SQLAlchemy 2.x (psycopg 3 dialect, ``postgresql+psycopg://``): both halves of "exactly once".

Transactional enqueue: pass a ``Session`` (or a ``Connection``) as ``conn``
and the job is written in its database transaction, so it exists exactly
when the session commits::

    with Session(engine) as session:
        session.add(Order(id=7, cents=1999))
        client.enqueue("invoice.record", {"order": 7}, conn=session)
        session.commit()            # the order and its job, or neither

A savepoint (``session.begin_nested()``) rolled back takes the jobs enqueued
inside it with it. :func:`jobrun.contrib.caller_connection` explains the
one subtlety (a transaction that has not reached the server yet).

Commit callables that write through the ORM: :func:`session_for` lends a
``Session`` on the connection a commit callable is given (Complete's, inside
its transaction)::

    def commit(conn: psycopg.Connection) -> None:
        with session_for(conn) as session:
            session.add(Ledger(order_id=7, cents=1999))   # flushed on exit

How the lent session stays sound: Complete owns the transaction, and the
effect row, the callable's writes and the job's success must commit together
or not at all. The session therefore runs on a private engine whose dialect
never commits, rolls back or closes the connection it is lent (a commit or a
rollback of the outer transaction raises :class:`~jobrun.CommitRefused`), and
it joins that transaction in ``join_transaction_mode="create_savepoint"``: a
``session.commit()`` inside the block releases a savepoint, a
``session.rollback()`` rolls back to it, and nothing the session does can end
Complete's transaction. On leaving the block the session is committed in
that sense (flushed, its savepoint released); an exception rolls its
savepoint back and propagates, which fails the attempt and rolls everything
back. The private engine adds nothing to the connection (no notice handler,
no hstore adapter) and shares it with nobody.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from sqlalchemy import create_engine
from sqlalchemy.dialects import registry as dialect_registry
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from jobrun.job.errors import CommitRefused, ValidationError
from jobrun.postgres.connect import sqlalchemy_connection, sqlalchemy_connection_for_enqueue

__all__ = ["connection_for_enqueue", "psycopg_connection", "session_for"]


# -- transactional enqueue: the resolver is jobrun.postgres.connect's ------------------

psycopg_connection = sqlalchemy_connection
connection_for_enqueue = sqlalchemy_connection_for_enqueue


# -- commit callables: a session on Complete's connection -----------------------------

_lent: ContextVar[psycopg.Connection[Any] | None] = ContextVar(
    "jobrun_lent_connection", default=None
)
_ending: ContextVar[bool] = ContextVar("jobrun_lent_connection_ending", default=False)
"""True while the lent engine connects or lets go: its dialect's rollback is then a no-op."""


class _LentConnectionDialect(PGDialect_psycopg):
    """SQLAlchemy's psycopg dialect on a connection it was lent, not given.

    It never commits, rolls back or closes the connection: Complete (or
    whoever lent it) does. ``do_begin`` is already a no-op in SQLAlchemy
    (psycopg begins implicitly), and savepoints are plain statements.
    """

    supports_statement_cache = True  # compiles as its parent does

    def on_connect(self) -> None:
        return None  # no notice handler added to a connection that is not ours

    def do_commit(self, dbapi_connection: Any) -> None:
        raise CommitRefused(
            "a session_for() session cannot commit the transaction it was lent; "
            "it commits with the job (session.commit() inside the block only "
            "releases the session's savepoint)"
        )

    def do_rollback(self, dbapi_connection: Any) -> None:
        if _ending.get():
            return  # letting go of the connection, never rolling it back
        raise CommitRefused(
            "a session_for() session cannot roll back the transaction it was lent; "
            "raise from the commit callable to fail the attempt instead"
        )

    def do_close(self, dbapi_connection: Any) -> None:
        return None

    def do_terminate(self, dbapi_connection: Any) -> None:
        return None


_DIALECT_NAME = "jobrun_lent"
dialect_registry.register(f"postgresql.{_DIALECT_NAME}", __name__, "_LentConnectionDialect")

_engine_lock = threading.Lock()
_engine: Engine | None = None


def _lent_connection() -> psycopg.Connection[Any]:
    conn = _lent.get()
    if conn is None:  # pragma: no cover - only session_for connects this engine
        raise RuntimeError("the lent-connection engine connects only inside session_for()")
    return conn


def _lent_engine() -> Engine:
    """The process's engine over lent connections (its dialect is set up once, on the first)."""
    global _engine  # noqa: PLW0603 - one engine per process, made on first use
    with _engine_lock:
        if _engine is None:
            _engine = create_engine(
                f"postgresql+{_DIALECT_NAME}://",
                creator=_lent_connection,
                poolclass=NullPool,  # every checkout is the connection lent now
                pool_reset_on_return=None,
                use_native_hstore=False,  # registering it would change the lent connection
            )
        return _engine


@contextlib.contextmanager
def session_for(conn: psycopg.Connection[Any], **session_options: Any) -> Iterator[Session]:
    """A SQLAlchemy Session on ``conn``'s open transaction, for a commit callable.

    ``conn`` must be inside a transaction (a commit callable's connection
    is). On a normal exit the session is flushed and its savepoint released:
    its writes are part of that transaction and commit with it. An exception
    rolls the session's savepoint back and propagates. The session cannot
    end the transaction (see the module docstring); ``session_options`` go
    to ``Session()`` (``info=``, ``autoflush=``, ...).
    """
    if not isinstance(conn, psycopg.Connection):
        raise ValidationError("conn", f"must be a psycopg.Connection, not {type(conn).__name__}")
    if conn.info.transaction_status != TransactionStatus.INTRANS:
        raise ValidationError(
            "conn",
            "session_for() joins an open transaction (a commit callable's connection); "
            f"this connection's is {conn.info.transaction_status.name}",
        )
    if "join_transaction_mode" in session_options or "bind" in session_options:
        raise ValidationError("session_options", "bind and join_transaction_mode are session_for's")
    lent = _lent.set(conn)
    try:
        ending = _ending.set(True)  # the dialect's first connect ends with a rollback
        try:
            sa_conn = _lent_engine().connect()
        finally:
            _ending.reset(ending)
        try:
            sa_conn.begin()  # SQLAlchemy's bookkeeping only: nothing is sent
            session = Session(
                bind=sa_conn, join_transaction_mode="create_savepoint", **session_options
            )
            try:
                yield session
                session.commit()  # flush and RELEASE SAVEPOINT: never the lent transaction
            finally:
                session.close()
        finally:
            ending = _ending.set(True)
            try:
                sa_conn.close()
            finally:
                _ending.reset(ending)
    finally:
        _lent.reset(lent)
