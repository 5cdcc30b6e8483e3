"""Schema migrations: yoyo SQL files, applied only when asked.

``db/migrations/`` is the one source of the schema. A wheel carries a copy
(``jobrun/_migrations``, put there by the build); a source or editable
checkout reads ``db/migrations/`` directly.

Concurrent migrators (twenty pods starting at once) are serialised by a
*session* advisory lock held on the migrating connection around the whole
apply, instead of yoyo's lock table: a row in a lock table survives a
``kill -9`` of the migrator and then blocks every later deploy until someone
runs ``yoyo break-lock``, while a session lock dies with its connection.
The second migrator waits for the lock, then finds nothing left to apply.

Workers never migrate: nothing at run time needs DDL rights, so the runtime
role can be a plain DML role while a migrator role owns the schema.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from yoyo import read_migrations
from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
from yoyo.connections import DatabaseURI

from jobrun.postgres import dsn
from jobrun.postgres.pool import conninfo_with

log = logging.getLogger(__name__)

# The advisory lock key, two-int form: (jobrun namespace, purpose). The two-int
# form cannot collide with an application's single-bigint advisory locks.
LOCK_NAMESPACE = 0x6A6F62  # "job"
LOCK_MIGRATE = 1

MIGRATION_TABLE = "_yoyo_migration"


@contextlib.contextmanager
def migrations_dir() -> Iterator[Path]:
    """The directory holding the migration files, wherever jobrun is installed from."""
    packaged = importlib.resources.files("jobrun") / "_migrations"
    if packaged.is_dir():
        with importlib.resources.as_file(packaged) as path:
            yield Path(path)
        return
    source = Path(__file__).resolve().parents[2] / "db" / "migrations"
    if not source.is_dir():
        raise FileNotFoundError(f"jobrun migrations not found (looked in the package and {source})")
    yield source


class _Backend(PostgresqlPsycopgBackend):  # type: ignore[misc]
    """yoyo's psycopg backend on our connection string, locked by a session advisory lock."""

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock_depth = 0
        # yoyo reads the database name off its URI object (list_tables); the
        # password stays out of it.
        dbname = dsn.parse(conninfo).get("dbname")
        uri = DatabaseURI("postgresql+psycopg", None, None, None, None, dbname, {})
        super().__init__(uri, MIGRATION_TABLE)

    def connect(self, dburi: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(
            conninfo_with(self._conninfo, application_name="jobrun-migrate"), autocommit=True
        )

    def copy(self) -> _Backend:
        return _Backend(self._conninfo)

    def apply_one(self, migration: Any, force: bool = False, mark: bool = True) -> None:
        """Apply a migration and record it in ONE transaction.

        yoyo applies on a second connection and marks it applied afterwards; a
        crash in between leaves the schema changed but unrecorded, and the
        next migrate fails on "already exists". Here both commit together.
        """
        self.ensure_internal_schema_updated()
        with self.transaction():
            migration.process_steps(self, "apply", force=force)
            self.log_migration(migration, "apply")
            if mark:
                self.mark_one(migration, log=False)

    def rollback_one(self, migration: Any, force: bool = False) -> None:
        self.ensure_internal_schema_updated()
        with self.transaction():
            migration.process_steps(self, "rollback", force=force)
            self.log_migration(migration, "rollback")
            self.unmark_one(migration, log=False)

    def create_lock_table(self) -> None:
        """No lock table: see the module docstring."""

    @contextlib.contextmanager
    def lock(self, timeout: int = 10) -> Iterator[None]:
        # Re-entrant: yoyo takes the lock itself around its internal schema
        # upgrade while we already hold it around the apply.
        if self._lock_depth == 0:
            self.connection.execute(
                "SELECT pg_advisory_lock(%s, %s)", [LOCK_NAMESPACE, LOCK_MIGRATE]
            )
        self._lock_depth += 1
        try:
            yield
        finally:
            self._lock_depth -= 1
            if self._lock_depth == 0 and not self.connection.closed:
                self.connection.execute(
                    "SELECT pg_advisory_unlock(%s, %s)", [LOCK_NAMESPACE, LOCK_MIGRATE]
                )


def _open(conninfo: str) -> _Backend:
    """The backend, connected; errors without the password (ValidationError if unparseable)."""
    conninfo = dsn.normalize(conninfo)
    try:
        return _Backend(conninfo)
    except psycopg.OperationalError as exc:
        reason = dsn.redact_for(conninfo, " ".join(str(exc).split()) or type(exc).__name__)
    # Raised outside the except block: the driver's error is not chained to it.
    raise psycopg.OperationalError(f"cannot connect to migrate {dsn.describe(conninfo)}: {reason}")


def migrate(conninfo: str) -> list[str]:
    """Apply every pending migration; return the ids applied (empty when up to date).

    Idempotent and safe to run from many processes at once.
    """
    backend = _open(conninfo)
    try:
        backend.init_database()
        with migrations_dir() as path:
            migrations = read_migrations(str(path))
            with backend.lock():
                pending = backend.to_apply(migrations)
                ids = [m.id for m in pending]
                if ids:
                    log.info("applying migrations %s", ", ".join(ids))
                    backend.apply_migrations(pending)
        return ids
    finally:
        backend.connection.close()


def rollback_all(conninfo: str) -> list[str]:
    """Roll back every applied migration (tests and ``jobrun migrate --rollback`` only)."""
    backend = _open(conninfo)
    try:
        backend.init_database()
        with migrations_dir() as path:
            migrations = read_migrations(str(path))
            with backend.lock():
                applied = backend.to_rollback(migrations)
                ids = [m.id for m in applied]
                backend.rollback_migrations(applied)
        return ids
    finally:
        backend.connection.close()


def pending(conninfo: str) -> list[str]:
    """The ids of the migrations not yet applied."""
    backend = _open(conninfo)
    try:
        with migrations_dir() as path:
            return [m.id for m in backend.to_apply(read_migrations(str(path)))]
    finally:
        backend.connection.close()
