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

# The resolver lives beside the psycopg code it serves (only jobrun.postgres
# imports psycopg, and the core Client calls it); its public home stays here.
from jobrun.postgres.connect import caller_connection, standard_loaders

__all__ = ["caller_connection", "standard_loaders"]
