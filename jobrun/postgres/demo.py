"""The SQL of ``jobrun demo``: its throwaway database, effects table and exactly-once check.

The demo never runs in the user's database: :func:`demo_database` creates
``jobrun_demo_<hex>`` on the same server, and drops it when the demo ends,
by error or Ctrl-C included. A demo killed with ``-9`` leaves its database
behind; the next demo drops every ``jobrun_demo_*`` database nobody is
connected to. Creation and that sweep are serialised by an advisory lock,
and a live demo keeps a connection to its database from the moment it
creates it, so a sweep never drops a database that is still in use.

The demo's transactional handler writes one row per job into
``jobrun_demo_effects`` through its commit callable; the summary checks that
every succeeded job of the run has exactly one row and no other job has any.
The table is the demo's own (created on first use, outside the migrations).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg import errors, sql
from psycopg_pool import ConnectionPool

from jobrun.postgres import dsn
from jobrun.postgres.migrate import LOCK_NAMESPACE
from jobrun.postgres.pool import conninfo_with

DATABASE_PREFIX = "jobrun_demo_"
"""Every demo database is named with this prefix (and only demo databases are)."""

LOCK_DEMO = 3
"""The advisory lock purpose that serialises creating and sweeping demo databases."""


class DemoDatabaseError(RuntimeError):
    """The demo's throwaway database could not be created."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DemoDatabase:
    name: str
    conninfo: str
    """The connection string of the demo database (the caller's, with its dbname)."""
    swept: tuple[str, ...]
    """Leftovers of killed demos dropped before this one was created."""


_LEFTOVERS = """
SELECT datname FROM pg_database d
 WHERE starts_with(datname, %s)
   AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)
 ORDER BY datname
"""


def _drop(admin: psycopg.Connection[Any], name: str, *, force: bool) -> None:
    statement = "DROP DATABASE IF EXISTS {} WITH (FORCE)" if force else "DROP DATABASE IF EXISTS {}"
    admin.execute(sql.SQL(statement).format(sql.Identifier(name)))


def _sweep(admin: psycopg.Connection[Any]) -> tuple[str, ...]:
    """Drop the demo databases nobody is connected to (the leftovers of killed demos)."""
    swept = []
    for (name,) in admin.execute(_LEFTOVERS, [DATABASE_PREFIX]).fetchall():
        try:
            _drop(admin, name, force=False)  # never FORCE: one that is in use stays
        except errors.ObjectInUse:
            continue
        swept.append(name)
    return tuple(swept)


@contextlib.contextmanager
def demo_database(conninfo: str) -> Iterator[DemoDatabase]:
    """A new, empty database on the server of ``conninfo``, dropped on the way out.

    Needs a role that may create databases (CREATEDB); a :class:`DemoDatabaseError`
    says so otherwise.
    """
    name = DATABASE_PREFIX + uuid.uuid4().hex[:12]
    target = conninfo_with(conninfo, dbname=name, application_name="jobrun-demo")
    created = False
    holder: psycopg.Connection[Any] | None = None
    try:
        with psycopg.connect(conninfo, autocommit=True) as admin:
            admin.execute("SELECT pg_advisory_lock(%s, %s)", [LOCK_NAMESPACE, LOCK_DEMO])
            swept = _sweep(admin)
            try:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except errors.InsufficientPrivilege:
                raise DemoDatabaseError(
                    f"the demo runs in a throwaway database and cannot create one on "
                    f"{dsn.describe(conninfo)}: its role needs CREATEDB (or run the demo "
                    f"without DATABASE_URL, on the embedded PostgreSQL)"
                ) from None
            created = True
            holder = psycopg.connect(target, autocommit=True)  # in use from now on
        yield DemoDatabase(name=name, conninfo=target, swept=swept)
    finally:
        if holder is not None:
            holder.close()
        if created:
            with psycopg.connect(conninfo, autocommit=True) as admin:
                _drop(admin, name, force=True)


CREATE = """
CREATE TABLE IF NOT EXISTS jobrun_demo_effects (
    job_id     uuid        PRIMARY KEY,
    run        text        NOT NULL,
    written_at timestamptz NOT NULL DEFAULT now()
)
"""


def create_table(pool: ConnectionPool[Any]) -> None:
    with pool.connection() as conn:
        conn.execute(CREATE)


def write_effect(conn: psycopg.Connection[Any], job_id: uuid.UUID, run: str) -> None:
    """The commit callable's statement: inside Complete's transaction."""
    conn.execute("INSERT INTO jobrun_demo_effects (job_id, run) VALUES (%s, %s)", [job_id, run])


@dataclasses.dataclass(frozen=True)
class EffectCheck:
    succeeded_ledger_jobs: int
    effect_rows: int
    jobs_with_one_row: int
    rows_without_success: int

    @property
    def exactly_once(self) -> bool:
        return (
            self.effect_rows == self.succeeded_ledger_jobs == self.jobs_with_one_row
            and self.rows_without_success == 0
        )


def check_effects(pool: ConnectionPool[Any], run: str, queue: str, job_type: str) -> EffectCheck:
    with pool.connection() as conn:
        row = conn.execute(
            """
            SELECT
              (SELECT count(*) FROM jobrun.jobs WHERE queue = %(q)s AND type = %(t)s
                 AND state = 'succeeded'),
              (SELECT count(*) FROM jobrun_demo_effects WHERE run = %(r)s),
              (SELECT count(*) FROM jobrun.jobs j WHERE j.queue = %(q)s AND j.type = %(t)s
                 AND j.state = 'succeeded'
                 AND (SELECT count(*) FROM jobrun_demo_effects e WHERE e.job_id = j.id) = 1),
              (SELECT count(*) FROM jobrun_demo_effects e WHERE e.run = %(r)s AND NOT EXISTS (
                 SELECT 1 FROM jobrun.jobs j WHERE j.id = e.job_id AND j.state = 'succeeded'))
            """,
            {"q": queue, "t": job_type, "r": run},
        ).fetchone()
    assert row is not None
    return EffectCheck(*row)
