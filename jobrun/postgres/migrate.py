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

A schema of its own
-------------------
Everything lands in one PostgreSQL schema (``jobrun`` unless ``schema=`` says
otherwise, see :mod:`jobrun.postgres.schema`), yoyo's bookkeeping tables
included: the migrating session's ``search_path`` is that schema alone, and
the migration files name it explicitly. A database migrated by jobrun 0.1
(tables, type and bookkeeping rows in ``public``) is adopted on the first
migrate: in one transaction, under the migration lock, jobrun's objects move
into the schema with ``ALTER ... SET SCHEMA`` (rows, indexes, constraints,
grants and sequences travel with them; nothing is copied) and jobrun's rows
of ``public._yoyo_migration`` move to the schema's own bookkeeping, leaving
an application's own yoyo rows where they were.

yoyo probes every new connection for transactional DDL by reading a table it
never created, which leaves an ERROR line in the server log on every
migrate; PostgreSQL has transactional DDL, so the probe is skipped.
"""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from yoyo import read_migrations
from yoyo.backends.core.postgresql import PostgresqlPsycopgBackend
from yoyo.connections import DatabaseURI

from jobrun.job.errors import ValidationError
from jobrun.postgres import dsn
from jobrun.postgres.pool import conninfo_with, ping, pooler_mode
from jobrun.postgres.schema import DEFAULT_SCHEMA, SCHEMA_VERSION, in_schema, schema_name

log = logging.getLogger(__name__)

# The advisory lock key, two-int form: (jobrun namespace, purpose). The two-int
# form cannot collide with an application's single-bigint advisory locks.
LOCK_NAMESPACE = 0x6A6F62  # "job"
LOCK_MIGRATE = 1

MIGRATION_TABLE = "_yoyo_migration"

# jobrun 0.1's objects in public, moved into the schema by adopt_legacy_layout.
_LEGACY_TABLES = ("jobs", "job_events", "processed_effects", "schedules", "queue_pauses")
_LEGACY_TYPES = ("job_state",)


@contextlib.contextmanager
def migrations_dir(schema: str = DEFAULT_SCHEMA) -> Iterator[Path]:
    """The directory holding the migration files for ``schema``, wherever jobrun is
    installed from (a temporary copy naming ``schema`` when it is not the default)."""
    with _source_dir() as source:
        if schema == DEFAULT_SCHEMA:
            yield source
            return
        with tempfile.TemporaryDirectory(prefix="jobrun-migrations-") as tmp:
            for path in sorted(source.glob("*.sql")):
                text = path.read_text(encoding="utf-8")
                (Path(tmp) / path.name).write_text(in_schema(text, schema), encoding="utf-8")
            yield Path(tmp)


@contextlib.contextmanager
def _source_dir() -> Iterator[Path]:
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

    def __init__(self, conninfo: str, schema: str = DEFAULT_SCHEMA) -> None:
        self._conninfo = conninfo
        self._schema = schema
        self._lock_depth = 0
        # yoyo reads the database name off its URI object (list_tables); the
        # password stays out of it.
        dbname = dsn.parse(conninfo).get("dbname")
        uri = DatabaseURI("postgresql+psycopg", None, None, None, None, dbname, {})
        super().__init__(uri, MIGRATION_TABLE)

    def connect(self, dburi: Any) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            conninfo_with(self._conninfo, application_name="jobrun-migrate"), autocommit=True
        )
        try:
            # The schema first, then only it on the search_path: yoyo's
            # bookkeeping tables (unqualified in yoyo) land in it.
            name = sql.Identifier(self._schema)
            # Concurrent migrators may both find the schema missing: the loser
            # of that race is told it exists, which is all it wanted.
            with contextlib.suppress(
                psycopg.errors.UniqueViolation, psycopg.errors.DuplicateSchema
            ):
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(name))
            conn.execute(sql.SQL("SET search_path = {}").format(name))
        except BaseException:
            conn.close()
            raise
        return conn

    def copy(self) -> _Backend:
        return _Backend(self._conninfo, self._schema)

    def _check_transactional_ddl(self) -> bool:
        """PostgreSQL has transactional DDL; yoyo's probe logs an ERROR (see above)."""
        return True

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


def _open(conninfo: str, schema: str) -> _Backend:
    """The backend, connected; errors without the password (ValidationError if unparseable)."""
    conninfo = dsn.normalize(conninfo)
    schema_name(schema)
    try:
        return _Backend(conninfo, schema)
    except psycopg.OperationalError as exc:
        reason = dsn.redact_for(conninfo, " ".join(str(exc).split()) or type(exc).__name__)
    # Raised outside the except block: the driver's error is not chained to it.
    raise psycopg.OperationalError(f"cannot connect to migrate {dsn.describe(conninfo)}: {reason}")


def migrate(conninfo: str, *, schema: str = DEFAULT_SCHEMA, pooler: str = "auto") -> list[str]:
    """Apply every pending migration; return the ids applied (empty when up to date).

    Idempotent and safe to run from many processes at once. A database laid
    out by jobrun 0.1 (in ``public``) is adopted first (see the module docstring).

    Migrating needs a session of its own (the migration lock is a session
    lock, yoyo sets a ``search_path``): ``conninfo`` through a transaction
    pooler is refused with a ValidationError naming ``JOBRUN_DIRECT_URL``
    before anything is written. ``pooler`` is :mod:`jobrun.postgres.pool`'s
    setting: ``auto`` detects a pooler and refuses it, ``session`` and
    ``none`` trust the caller.
    """
    mode = pooler_mode(pooler, "pooler")
    # Asked on a connection of its own, before the backend's creates the schema.
    if mode == "transaction" or (
        mode == "auto" and ping(conninfo, application_name="jobrun-migrate")
    ):
        raise ValidationError(
            "JOBRUN_DIRECT_URL",
            f"{dsn.describe(conninfo)} goes through a connection pooler: migrations need "
            "a session of their own (a session lock, a search_path), which a transaction "
            "pooler does not keep. Migrate through a direct connection to PostgreSQL "
            "(JOBRUN_DIRECT_URL / --direct-url), or say JOBRUN_POOLER=session if the "
            "pooler keeps sessions",
        )
    backend = _open(conninfo, schema)
    try:
        with migrations_dir(schema) as path:
            migrations = read_migrations(str(path))
            with backend.lock():
                adopted = adopt_legacy_layout(backend, [m.id for m in migrations])
                backend.init_database()
                if adopted:
                    backend.ensure_internal_schema_updated()
                    _adopt_bookkeeping(backend, adopted)
                pending = backend.to_apply(migrations)
                ids = [m.id for m in pending]
                if ids:
                    log.info("applying migrations %s", ", ".join(ids))
                    backend.apply_migrations(pending)
        return ids
    finally:
        backend.connection.close()


def adopt_legacy_layout(backend: _Backend, known: list[str]) -> list[str]:
    """Move jobrun 0.1's objects from ``public`` into the schema; the migration ids
    they were migrated to (empty when there was nothing to adopt).

    Only when the schema holds no jobs table yet and ``public`` holds jobrun's
    (its ``jobs`` with a ``lease_token`` column, and its migration rows in
    ``public._yoyo_migration``): an application's own ``public.jobs`` is never
    touched.
    """
    conn: psycopg.Connection[Any] = backend.connection
    schema = backend._schema
    row = conn.execute(
        "SELECT to_regclass(%s) IS NULL,"
        " to_regclass('public._yoyo_migration') IS NOT NULL,"
        " EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = 'public'"
        "         AND table_name = 'jobs' AND column_name = 'lease_token')",
        [f"{schema}.jobs"],
    ).fetchone()
    assert row is not None
    schema_empty, public_bookkeeping, public_jobs = row
    if not (schema_empty and public_bookkeeping and public_jobs):
        return []
    applied = [
        r[0]
        for r in conn.execute(
            "SELECT migration_id FROM public._yoyo_migration WHERE migration_id = ANY(%s)",
            [known],
        ).fetchall()
    ]
    if not applied:
        return []
    log.info("moving jobrun's tables from public into schema %s (migrated by jobrun 0.1)", schema)
    with conn.transaction():
        for type_name in _LEGACY_TYPES:
            conn.execute(
                sql.SQL("ALTER TYPE {} SET SCHEMA {}").format(
                    sql.Identifier("public", type_name), sql.Identifier(schema)
                )
            )
        for table in _LEGACY_TABLES:
            conn.execute(
                sql.SQL("ALTER TABLE IF EXISTS {} SET SCHEMA {}").format(
                    sql.Identifier("public", table), sql.Identifier(schema)
                )
            )
    return applied


def _adopt_bookkeeping(backend: _Backend, ids: list[str]) -> None:
    """Move jobrun's rows of public._yoyo_migration into the schema's bookkeeping."""
    conn: psycopg.Connection[Any] = backend.connection
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "INSERT INTO {} (migration_hash, migration_id, applied_at_utc)"
                " SELECT migration_hash, migration_id, applied_at_utc FROM public._yoyo_migration"
                " WHERE migration_id = ANY(%s)"
            ).format(sql.Identifier(backend._schema, MIGRATION_TABLE)),
            [ids],
        )
        conn.execute("DELETE FROM public._yoyo_migration WHERE migration_id = ANY(%s)", [ids])
        (left,) = conn.execute("SELECT count(*) FROM public._yoyo_migration").fetchone() or (0,)
        if left == 0:
            # Nobody else's bookkeeping was in there: leave public as it was before jobrun.
            for table in ("_yoyo_migration", "_yoyo_log", "_yoyo_version", "yoyo_lock"):
                conn.execute(
                    sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier("public", table))
                )


def rollback_all(conninfo: str, *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """Roll back every applied migration (tests and ``jobrun migrate --rollback`` only)."""
    backend = _open(conninfo, schema)
    try:
        backend.init_database()
        with migrations_dir(schema) as path:
            migrations = read_migrations(str(path))
            with backend.lock():
                applied = backend.to_rollback(migrations)
                ids = [m.id for m in applied]
                backend.rollback_migrations(applied)
        return ids
    finally:
        backend.connection.close()


def pending(conninfo: str, *, schema: str = DEFAULT_SCHEMA) -> list[str]:
    """The ids of the migrations not yet applied."""
    backend = _open(conninfo, schema)
    try:
        with migrations_dir(schema) as path:
            return [m.id for m in backend.to_apply(read_migrations(str(path)))]
    finally:
        backend.connection.close()


_DEPENDS = re.compile(r"^--\s*depends:.*$", re.MULTILINE)


def migration_sql(schema: str = DEFAULT_SCHEMA) -> str:
    """Every forward migration as one SQL script naming ``schema``.

    For teams that apply DDL through their own tool (Alembic, Django,
    Flyway, a DBA's review): the script creates the schema and everything in
    it, ending with the schema_version row that every jobrun entry point
    checks at start. Without yoyo's bookkeeping, ``jobrun migrate`` would
    try to apply it again later: apply later versions' scripts the same way.
    """
    schema_name(schema)
    parts = [
        f"-- jobrun schema version {SCHEMA_VERSION} in schema {schema}: every forward migration",
        "BEGIN;",
    ]
    with migrations_dir(schema) as path:
        for file in sorted(path.glob("*.sql")):
            if file.name.endswith(".rollback.sql"):
                continue
            body = _DEPENDS.sub("", file.read_text(encoding="utf-8")).strip()
            parts += ["", f"-- {file.name}", body]
    parts += ["", "COMMIT;", ""]
    return "\n".join(parts)
