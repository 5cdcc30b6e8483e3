"""Django's connection as ``conn=``: the job joins the current ``atomic()`` block.

``client.enqueue(..., conn=django.db.connection)`` (or ``connections[alias]``)
writes the job on Django's own psycopg 3 connection. Inside
``transaction.atomic()`` it is part of the block's transaction: the job
exists exactly when the outermost block commits, and a nested block (a
savepoint) that rolls back takes its jobs with it. No
``transaction.on_commit`` is needed: there is nothing to do after the commit,
the job already is in it. Outside ``atomic()`` Django is in autocommit mode,
and the job commits at once, like any statement there.

A transaction Django has marked for rollback (an error caught inside
``atomic()``) refuses the enqueue with Django's own TransactionManagementError,
as it refuses any query.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import psycopg

from jobrun.job.errors import ValidationError

__all__ = ["connection_for_enqueue", "psycopg_connection"]


def psycopg_connection(connection: Any) -> psycopg.Connection[Any]:
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
def connection_for_enqueue(connection: Any) -> Iterator[psycopg.Connection[Any]]:
    """The psycopg connection under ``connection``, in its ``atomic()`` block's
    transaction (the store joins one that has not reached the server yet: a
    connection not in autocommit mode is its caller's transaction)."""
    raw = psycopg_connection(connection)
    if not connection.get_autocommit():
        connection.validate_no_broken_transaction()
    yield raw
