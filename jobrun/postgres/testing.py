"""What tests need of the database beyond a worker's path (jobrun.testing, the pytest plugin).

Nothing here is called by a worker, a client or the scheduler. Two kinds:

- on a :class:`~jobrun.postgres.store.Store`, the statements of
  ``db/query/testing.sql``: :func:`advance_due` brings jobs due within a
  horizon of the *database's* clock forward to now (``run_jobs(advance=)``),
  and :func:`holding_back` keeps the jobs of other types out of a drain's
  claims (``run_jobs(types=)``) with row locks, writing nothing;
- on a server, the per-test databases of the pytest plugin:
  :class:`TestDatabases` migrates a template once and clones it for each
  test (``CREATE DATABASE ... TEMPLATE``, a file copy: milliseconds, where
  running the migrations costs a second).

They live here because only jobrun.postgres runs SQL.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import os
import secrets
from collections.abc import Callable, Iterator, Sequence

import psycopg
from psycopg import sql

from jobrun.job.errors import ValidationError
from jobrun.postgres import dsn
from jobrun.postgres.convert import translate_errors
from jobrun.postgres.events import EventMode
from jobrun.postgres.migrate import migrate
from jobrun.postgres.plans import MAX_NOTIFY_QUEUE_USAGE
from jobrun.postgres.schema import DEFAULT_SCHEMA
from jobrun.postgres.store import Store


def advance_due(
    store: Store,
    horizon: dt.timedelta,
    *,
    queues: Sequence[str] | None = None,
    types: Sequence[str] | None = None,
) -> int:
    """Make the queued jobs due within ``horizon`` of the database's now due now.

    Only the jobs of ``queues`` and ``types`` (None: all); each gets a
    "retried" event (``{"via": "run_jobs"}``) in the store's event mode, and
    each queue a wake-up. Returns how many jobs moved. One transaction.
    """
    if not isinstance(horizon, dt.timedelta) or horizon < dt.timedelta(0):
        raise ValidationError("advance", "must be a datetime.timedelta of zero or more")
    return store._with_tx(
        lambda c: len(
            store.q.advance_due_jobs(
                c,
                horizon_seconds=horizon.total_seconds(),
                queues=None if queues is None else list(queues),
                types=None if types is None else list(types),
                write_events=store.event_mode is EventMode.ALL,
                channel=store.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
        )
    )


@contextlib.contextmanager
def holding_back(store: Store, types: Sequence[str]) -> Iterator[Callable[[Sequence[str]], int]]:
    """A transaction of its own that keeps the queued jobs of other types from claims.

    Yields ``hold(queues)``: it locks (FOR KEY SHARE) the queued jobs of
    ``queues`` whose type is not in ``types``, those committed since the
    last call included, and returns how many it holds. A claim's FOR UPDATE
    SKIP LOCKED passes them by; the transaction is rolled back at the end,
    so nothing is written. While held, anything that locks such a job FOR
    UPDATE without SKIP LOCKED (an operator's cancel or retry of it) waits
    for the end of the block.
    """
    chosen = list(types)
    with translate_errors(), store.pool.connection() as conn:
        tx = conn.transaction(force_rollback=True)
        with tx:

            def hold(queues: Sequence[str]) -> int:
                with translate_errors():
                    return len(store.q.hold_back_jobs(conn, queues=list(queues), types=chosen))

            yield hold


# -- the pytest plugin's databases ------------------------------------------------


def _with_dbname(conninfo: str, dbname: str) -> str:
    params = dsn.parse(conninfo)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


class TestDatabases:
    """Migrated databases cloned from a template, on a server the caller names.

    ``server_url`` is any connection string to the server (its database is
    only where the ``CREATE DATABASE`` statements run); its role needs
    CREATEDB. The template is made and migrated by :meth:`create_template`,
    once; every :meth:`create` is a clone of it. Names carry the process id
    and a random token, so that concurrent sessions (pytest-xdist, two
    developers) on one server never collide; :meth:`close` drops the template.
    """

    __test__ = False  # not a test class, whatever collects it

    def __init__(self, server_url: str, *, schema: str = DEFAULT_SCHEMA) -> None:
        self.server_url = dsn.normalize(server_url)
        self.schema = schema
        self._prefix = f"jobrun_pt_{os.getpid()}_{secrets.token_hex(3)}"
        self.template = f"{self._prefix}_template"
        self._names = itertools.count(1)
        self._file_copy = False
        self._created = False

    def url(self, name: str) -> str:
        """The connection string of database ``name`` on this server, same role."""
        return _with_dbname(self.server_url, name)

    def _execute(self, statement: sql.Composed) -> None:
        try:
            with psycopg.connect(self.server_url, autocommit=True) as conn:
                conn.execute(statement)
        except psycopg.errors.InsufficientPrivilege as exc:
            raise ValidationError(
                "database_url",
                f"the role of {dsn.describe(self.server_url)} may not create databases"
                " (it needs CREATEDB)",
            ) from exc
        except psycopg.OperationalError as exc:
            message = dsn.redact_for(self.server_url, str(exc).strip().splitlines()[0])
            raise ValidationError(
                "database_url", f"{dsn.describe(self.server_url)}: {message}"
            ) from exc

    def create_template(self) -> None:
        """Create and migrate the template (once per session)."""
        self._execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.template)))
        self._created = True
        migrate(self.url(self.template), schema=self.schema, pooler="none")
        with psycopg.connect(self.server_url, autocommit=True) as conn:
            # FILE_COPY beats WAL_LOG for tiny databases by an order of magnitude.
            self._file_copy = conn.info.server_version >= 150000

    def create(self) -> str:
        """A new database cloned from the template; returns its name."""
        name = f"{self._prefix}_{next(self._names)}"
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(self.template)
        )
        if self._file_copy:
            statement += sql.SQL(" STRATEGY FILE_COPY")
        self._execute(statement)
        return name

    def drop(self, name: str) -> None:
        """Drop database ``name``, its sessions (a worker's, a leaked pool's) ended first."""
        self._execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )

    def close(self) -> None:
        if self._created:
            self.drop(self.template)
            self._created = False
