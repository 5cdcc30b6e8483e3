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
from psycopg.pq import TransactionStatus

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
    """The psycopg connection under ``connection``, inside its transaction on the server.

    In a transaction that has not reached the server yet (the first thing in
    an ``atomic()`` block), a savepoint is begun and released through
    Django's ``transaction.savepoint()`` first, which opens it there:
    otherwise jobrun's store would commit the job on its own.
    """
    from django.db import transaction  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415 - no stubs; Django is imported already (this is its connection)

    raw = psycopg_connection(connection)
    if not connection.get_autocommit():
        connection.validate_no_broken_transaction()
        if raw.info.transaction_status == TransactionStatus.IDLE:
            transaction.savepoint_commit(
                transaction.savepoint(using=connection.alias), using=connection.alias
            )
    yield raw
