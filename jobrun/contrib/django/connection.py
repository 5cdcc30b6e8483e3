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

from jobrun.postgres.connect import django_connection as psycopg_connection
from jobrun.postgres.connect import django_connection_for_enqueue as connection_for_enqueue

__all__ = ["connection_for_enqueue", "psycopg_connection"]
