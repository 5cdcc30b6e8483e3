"""Integrations with the stacks Python applications already run: SQLAlchemy, Django.

Each lives in a module of its own behind an extra (``pip install
'jobrun[sqlalchemy]'``, ``'jobrun[django]'``) and is imported only when used:
``import jobrun`` imports neither SQLAlchemy nor Django, and nor does this
module.

:func:`caller_connection` is what lets ``client.enqueue(..., conn=X)`` take
an ORM's session or connection as well as a psycopg one: it finds the
psycopg 3 ``Connection`` under ``X`` and lends it for the duration of the
enqueue, so that the job is written in the ORM's own database transaction
and exists exactly when that transaction commits.

=================================  ==========================================
``conn=``                          the transaction the job joins
=================================  ==========================================
``psycopg.Connection``             its own (unchanged: see ``Store.enqueue``)
SQLAlchemy ``Session``             the session's (``session.connection()``)
SQLAlchemy ``Connection``          the connection's (begun if it was not)
SQLAlchemy ``scoped_session``      the current session's
Django ``connection`` /            the current ``atomic()`` block's, or
``connections[alias]``             autocommit (the job commits at once)
=================================  ==========================================

A job enqueued first in a transaction that has not reached the server yet
(``transaction.atomic()`` and a SQLAlchemy session "begin" without sending
anything: psycopg sends BEGIN with the first statement) joins that
transaction: the store treats a connection not in autocommit mode as already
in its caller's transaction (:meth:`jobrun.postgres.store.Store._in_caller_tx`).

One subtlety remains: Django configures its psycopg connections to load ``jsonb`` as
text (its JSONField decodes it itself) and, without ``USE_TZ``, timestamps
without a time zone. jobrun reads its own rows back on the lent connection,
so for the duration of the call the resolver pins psycopg's standard loaders
for the types jobrun reads (json, jsonb, timestamptz) on that connection and
puts the ORM's back afterwards. Nothing else on the connection changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.pq import Format

from jobrun.job.errors import ValidationError

__all__ = ["caller_connection", "standard_loaders"]

_PINNED_TYPES = ("json", "jsonb", "timestamptz")
"""The types whose loaders jobrun's rows need to be psycopg's own."""


def _from(obj: object, package: str) -> bool:
    """Whether ``obj``'s class (or a base of it) is defined in ``package``.

    Duck typing by origin: the package is already imported when one of its
    objects exists, so asking costs no import.
    """
    return any(
        getattr(cls, "__module__", "").partition(".")[0] == package for cls in type(obj).__mro__
    )


@contextlib.contextmanager
def caller_connection(conn: object) -> Iterator[psycopg.Connection[Any]]:
    """The psycopg Connection under ``conn``, lent inside ``conn``'s transaction.

    See the module docstring for what ``conn`` may be. A psycopg Connection
    is passed through as it is. Anything else is a ValidationError naming
    what is accepted, raised before anything is written.
    """
    if isinstance(conn, psycopg.Connection):
        yield conn
        return
    if _from(conn, "sqlalchemy"):
        from jobrun.contrib.sqlalchemy import connection_for_enqueue  # noqa: PLC0415

        with connection_for_enqueue(conn) as raw, standard_loaders(raw):
            yield raw
        return
    if _from(conn, "django"):
        from jobrun.contrib.django.connection import connection_for_enqueue as django_conn  # noqa: PLC0415

        with django_conn(conn) as raw, standard_loaders(raw):
            yield raw
        return
    raise ValidationError(
        "conn",
        "must be a psycopg.Connection, a SQLAlchemy Session or Connection (psycopg 3 "
        f"dialect), or a Django connection (psycopg 3 backend), not {type(conn).__name__}",
    )


@contextlib.contextmanager
def standard_loaders(conn: psycopg.Connection[Any]) -> Iterator[psycopg.Connection[Any]]:
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
