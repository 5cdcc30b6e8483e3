"""Shared fixtures: a real PostgreSQL for the session, a fresh database per test."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.postgres.events import EventMode
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.support.database import TestServer, runtime_role_mode, test_server

_HEAVY = (Path(__file__).resolve().parent / "faults", Path(__file__).resolve().parent / "scale")


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Leave tests/faults and tests/scale out unless asked for by path
    (``make test-faults``, ``make test-scale``).

    The fault-injection suite kills processes and restarts servers for
    several minutes, and the scale test runs worker hosts and drains;
    plain ``make test`` stays fast without them.
    """
    heavy = collection_path.resolve()
    if heavy not in _HEAVY:
        return None
    root = config.invocation_params.dir
    for arg in config.args:
        target = (root / arg.split("::")[0]).resolve()
        if target == heavy or heavy in target.parents:
            return None
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``JOBRUN_TEST_RUNTIME_ROLE=1``, run only the tests that talk as the application.

    The runtime-role run exists to prove jobrun works without DDL rights; a
    test that never connects as that role (no database at all, or only the
    superuser's ``conn``/``admin_dsn``) runs exactly as in the full run and
    proves nothing new, so it is deselected (and counted as such).
    """
    if not runtime_role_mode():
        return
    keep, dropped = [], []
    for item in items:
        (keep if _connects_as_the_application(item) else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


def _connects_as_the_application(item: pytest.Item) -> bool:
    """Whether the test may hold the runtime role's DSN: a rule, not a list.

    It does when ``dsn`` (the application's DSN, and with it ``pool``,
    ``store``...) is among its fixtures, or when the test itself or one of
    the suite's other fixtures (those of tests/ but this file) asks for
    ``pg_server`` (it may call ``app_dsn``) or for ``request`` (it may look
    ``dsn`` up by name, ``request.getfixturevalue``). The fixtures of this
    file that take ``pg_server`` hand out the superuser's DSN only; pytest's
    and plugins' own fixtures never reach ``pg_server``.
    """
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a test function: keep it rather than guess
        return True
    reaching = {"pg_server", "request"}
    if "dsn" in info.names_closure or reaching & set(info.argnames):
        return True
    suite = __name__.rpartition(".")[0] + "."
    return any(
        reaching & set(fixturedef.argnames)
        and fixturedef.func.__module__.startswith(suite)
        and fixturedef.func.__module__ != __name__
        for fixturedefs in info.name2fixturedefs.values()
        for fixturedef in fixturedefs
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TestServer]:
    with test_server() as server:
        server.create_template()
        yield server


@pytest.fixture
def database(pg_server: TestServer) -> Iterator[str]:
    """The name of a freshly migrated database of this test's own."""
    name = pg_server.create_database()
    try:
        yield name
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def dsn(pg_server: TestServer, database: str) -> str:
    """A connection string to this test's database, for jobrun.

    The superuser's, or with JOBRUN_TEST_RUNTIME_ROLE=1 the DML-only runtime
    role's (see tests/support/database.py).
    """
    return pg_server.app_dsn(database)


@pytest.fixture
def admin_dsn(pg_server: TestServer, database: str) -> str:
    """The superuser's (migrator's) connection string to this test's database."""
    return pg_server.dsn(database)


@pytest.fixture
def empty_dsn(pg_server: TestServer) -> Iterator[str]:
    """A connection string to an empty database (no migrations applied)."""
    name = pg_server.create_database(template=None)
    try:
        yield pg_server.dsn(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def pool(dsn: str) -> Iterator[Any]:
    p = open_pool(dsn, concurrency=8)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def store(pool: Any) -> Store:
    return Store(pool)


@pytest.fixture
def terminal_store(pool: Any) -> Store:
    return Store(pool, event_mode=EventMode.TERMINAL)


@pytest.fixture
def make_store(pool: Any) -> Callable[..., Store]:
    def make(**options: Any) -> Store:
        return Store(pool, **options)

    return make


@pytest.fixture
def conn(admin_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit superuser connection to the test's database, for setup and assertions."""
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        yield c


# -- every generated query is executed by some test --------------------------
#
# sqlc's static check cannot tell that an ON CONFLICT target misses its partial
# index, or that a cast is wrong at run time: only running the statement does.
# Every method of the generated query layer (the Queries class of each query
# module, which jobrun.postgres.sqlc.Queries inherits) is wrapped to record its
# calls; a run of the whole suite fails if one was never called.

_called: set[str] = set()
_generated: set[str] = set()


def _record(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _called.add(name)
        return fn(*args, **kwargs)

    return wrapper


def _query_classes() -> list[type]:
    """The Queries class of every generated query module."""
    try:
        package = importlib.import_module("jobrun.postgres.sqlc")
    except ModuleNotFoundError:
        return []
    return [
        cls
        for cls in package.Queries.__mro__[1:]
        if cls.__name__ == "Queries" and cls.__module__.startswith(package.__name__ + ".")
    ]


def pytest_configure(config: pytest.Config) -> None:
    for cls in _query_classes():
        module_name = cls.__module__.rsplit(".", 1)[-1]
        for name, fn in list(vars(cls).items()):
            if inspect.isfunction(fn) and not name.startswith("_"):
                qualified = f"{module_name}.{name}"
                _generated.add(qualified)
                setattr(cls, name, _record(qualified, fn))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """With pytest-xdist, gather the queries each worker's tests called."""
    _called.update(getattr(node, "workeroutput", {}).get("jobrun_called_queries", ()))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # an xdist worker: the controller does the check
        workeroutput["jobrun_called_queries"] = sorted(_called)
        return
    whole_suite = not session.config.args or session.config.args == ["tests"]
    selective = session.config.getoption("keyword") or session.config.getoption("markexpr")
    if exitstatus != 0 or not whole_suite or selective:
        return
    never = sorted(_generated - _called)
    if never:
        session.config.get_terminal_writer().line(
            f"generated queries never executed by any test: {', '.join(never)}", red=True
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
