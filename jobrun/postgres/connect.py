"""How the layers above reach PostgreSQL without importing psycopg themselves.

The client, the asyncio client and the runtime name connections and pools
in their signatures and take a caller's connection for a transactional
enqueue; only this package imports psycopg, so the names they need are
here:

- the psycopg types they name (``Connection``, ``AsyncConnection``,
  ``ConnectionPool``) and the errors the command maps to an exit code
  (``OperationalError``, ``PoolTimeout``);
- :func:`caller_connection`: the psycopg ``Connection`` under what a caller
  passes as ``conn=`` (a psycopg connection, a SQLAlchemy Session,
  Connection or scoped_session, a Django connection), lent inside that
  object's transaction with psycopg's standard loaders pinned (Django loads
  ``jsonb`` as text; jobrun reads its own rows back on the lent
  connection). An ORM is recognised by where its classes come from, so no
  ORM is ever imported to ask; ``jobrun.contrib`` re-exports these names;
- :func:`database_url_or_embedded`: the configured URL, else the embedded
  PostgreSQL, said out loud (for ``Client.connect()`` and the command only:
  a Runtime refuses to guess).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import AsyncConnection, Connection, OperationalError
from psycopg.pq import Format
from psycopg_pool import ConnectionPool, PoolTimeout

from jobrun.job.errors import ValidationError
from jobrun.postgres.embedded import EMBEDDED_DATABASE, ensure_embedded

__all__ = [
    "AsyncConnection",
    "Connection",
    "ConnectionPool",
    "OperationalError",
    "PoolTimeout",
    "caller_connection",
    "conninfo",
    "database_url_or_embedded",
    "django_connection",
    "django_connection_for_enqueue",
    "sqlalchemy_connection",
    "sqlalchemy_connection_for_enqueue",
    "standard_loaders",
]

log = logging.getLogger("jobrun")

_PINNED_TYPES = ("json", "jsonb", "timestamptz")
"""The types whose loaders jobrun's rows need to be psycopg's own."""


def database_url_or_embedded(url: str | None, *, say: Callable[[str], None] | None = None) -> str:
    """``url``, or the embedded PostgreSQL's (started or reused), announced in one line.

    The line goes to ``say`` (the command writes it on stderr), by default a
    WARNING of the ``jobrun`` logger.
    """
    if url:
        return url
    cluster, started = ensure_embedded()
    embedded = cluster.url(EMBEDDED_DATABASE)
    what = "started" if started else "reusing"
    line = (
        f"no DATABASE_URL; {what} the embedded PostgreSQL at {embedded} (data in {cluster.datadir})"
    )
    if say is None:
        log.warning("%s", line)
    else:
        say(line)
    return embedded


def conninfo(**params: Any) -> str:
    """A libpq connection string from keyword parameters (quoted as libpq reads them)."""
    return psycopg.conninfo.make_conninfo("", **params)


# -- the caller's connection -------------------------------------------------------------


def _from(obj: object, package: str) -> bool:
    """Whether ``obj``'s class (or a base of it) is defined in ``package``.

    Duck typing by origin: the package is already imported when one of its
    objects exists, so asking costs no import.
    """
    return any(
        getattr(cls, "__module__", "").partition(".")[0] == package for cls in type(obj).__mro__
    )


@contextlib.contextmanager
def caller_connection(conn: object) -> Iterator[Connection[Any]]:
    """The psycopg Connection under ``conn``, lent inside ``conn``'s transaction.

    A psycopg Connection is passed through as it is. Anything else is a
    ValidationError naming what is accepted, raised before anything is written.
    """
    if isinstance(conn, psycopg.Connection):
        yield conn
        return
    if _from(conn, "sqlalchemy"):
        with sqlalchemy_connection_for_enqueue(conn) as raw, standard_loaders(raw):
            yield raw
        return
    if _from(conn, "django"):
        with django_connection_for_enqueue(conn) as raw, standard_loaders(raw):
            yield raw
        return
    raise ValidationError(
        "conn",
        "must be a psycopg.Connection, a SQLAlchemy Session or Connection (psycopg 3 "
        f"dialect), or a Django connection (psycopg 3 backend), not {type(conn).__name__}",
    )


@contextlib.contextmanager
def standard_loaders(conn: Connection[Any]) -> Iterator[Connection[Any]]:
    """``conn`` with psycopg's standard loaders for json, jsonb and timestamptz, then its own.

    For a connection configured by someone else (Django loads jsonb as
    text): jobrun's store reads its rows back with the connection's loaders.
    """
    saved: list[tuple[int, type[Any]]] = []
    for name in _PINNED_TYPES:
        info = psycopg.adapters.types.get(name)
        if info is None:  # pragma: no cover - psycopg knows these built-in types
            continue
        for fmt in (Format.TEXT, Format.BINARY):
            standard = psycopg.adapters.get_loader(info.oid, fmt)
            current = conn.adapters.get_loader(info.oid, fmt)
            if standard is not None and current is not standard:
                if current is not None:
                    saved.append((info.oid, current))
                conn.adapters.register_loader(info.oid, standard)
    try:
        yield conn
    finally:
        for oid, loader in reversed(saved):
            conn.adapters.register_loader(oid, loader)


def _sqlalchemy_connection(obj: object) -> Any:
    """The SQLAlchemy Connection whose transaction ``obj`` stands for."""
    # SQLAlchemy is imported already: ``obj`` is one of its objects.
    from sqlalchemy.engine import Connection as SAConnection  # noqa: PLC0415
    from sqlalchemy.orm import Session, scoped_session  # noqa: PLC0415

    if isinstance(obj, scoped_session):
        obj = obj()
    if isinstance(obj, Session):
        return obj.connection()  # begins the session's transaction when needed
    if isinstance(obj, SAConnection):
        return obj
    raise ValidationError(
        "conn",
        f"a SQLAlchemy Session, scoped_session or Connection is needed, not {type(obj).__name__}",
    )


def sqlalchemy_connection(obj: object) -> Connection[Any]:
    """The psycopg 3 connection under a SQLAlchemy Session or Connection (the DBAPI one).

    ValidationError when the engine's driver is not psycopg 3 (make the URL
    ``postgresql+psycopg://``).
    """
    driver = _sqlalchemy_connection(obj).connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        raise ValidationError(
            "conn",
            "jobrun needs SQLAlchemy's psycopg 3 dialect (a postgresql+psycopg:// URL); "
            f"this engine's driver connection is a {type(driver).__module__}."
            f"{type(driver).__name__}",
        )
    return driver


@contextlib.contextmanager
def sqlalchemy_connection_for_enqueue(obj: object) -> Iterator[Connection[Any]]:
    """The psycopg connection under ``obj``, inside ``obj``'s transaction on the server.

    A Connection not yet in a transaction is begun, as SQLAlchemy 2.x does at
    any first use (commit it with ``connection.commit()``). A transaction
    that has not reached the server yet is joined by the store itself (a
    connection not in autocommit mode is its caller's transaction).
    """
    sa_conn = _sqlalchemy_connection(obj)
    if not sa_conn.in_transaction():
        sa_conn.begin()
    yield sqlalchemy_connection(sa_conn)


def django_connection(connection: Any) -> Connection[Any]:
    """The psycopg 3 connection under a Django connection (connected if it was not).

    ValidationError for another database vendor or for psycopg2.
    """
    vendor = getattr(connection, "vendor", None)
    if vendor != "postgresql":
        raise ValidationError(
            "conn", f"jobrun needs Django's PostgreSQL backend, not the {vendor!r} one"
        )
    connection.ensure_connection()
    raw = connection.connection
    if not isinstance(raw, psycopg.Connection):
        raise ValidationError(
            "conn",
            "jobrun needs Django's PostgreSQL backend on psycopg 3 (pip install 'psycopg'); "
            f"this connection is a {type(raw).__module__}.{type(raw).__name__}",
        )
    return raw


@contextlib.contextmanager
def django_connection_for_enqueue(connection: Any) -> Iterator[Connection[Any]]:
    """The psycopg connection under ``connection``, in its ``atomic()`` block's
    transaction (the store joins one that has not reached the server yet: a
    connection not in autocommit mode is its caller's transaction)."""
    raw = django_connection(connection)
    if not connection.get_autocommit():
        connection.validate_no_broken_transaction()
    yield raw
