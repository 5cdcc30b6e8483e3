"""Fixtures of the fault-injection suite: the oracle after every test, processes, proxy.

The suite runs with ``make test-faults`` (``pytest tests/faults``); plain
``make test`` leaves it out (see ``pytest_ignore_collect`` in tests/conftest.py).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.faults.harness import InProcess, Workers
from tests.faults.oracle import EFFECTS_DDL, Oracle
from tests.support.proxy import TcpProxy


@pytest.fixture
def side_log(tmp_path: Path) -> Path:
    """The directory the handlers' side log goes to (in this process too)."""
    path = tmp_path / "side-log"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def oracle(admin_dsn: str, side_log: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Oracle]:
    """Checked after EVERY scenario, on the test's database and any other it watched."""
    monkeypatch.setenv("JOBRUN_FAULTS_LOG", str(side_log))
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(EFFECTS_DDL)
    o = Oracle(admin_dsn, side_log)
    yield o
    o.verify_all()


@pytest.fixture
def workers(dsn: str, tmp_path: Path, side_log: Path) -> Iterator[Workers]:
    w = Workers(dsn, tmp_path, side_log)
    try:
        yield w
    finally:
        w.kill_all()


@pytest.fixture
def proxy(dsn: str) -> Iterator[TcpProxy]:
    p = TcpProxy(dsn)
    try:
        yield p
    finally:
        p.close()


@pytest.fixture
def in_process(dsn: str) -> Iterator[Callable[..., InProcess]]:
    made: list[InProcess] = []

    def make(url: str | None = None, **settings: Any) -> InProcess:
        runtime = InProcess(url or dsn, **settings)
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:
        runtime.stop()


@pytest.fixture
def store(dsn: str) -> Iterator[Store]:
    """A Store on a pool of its own (jobrun-test), for enqueueing and inspecting."""
    pool = open_pool(dsn, concurrency=4, application_name="jobrun-test")
    try:
        yield Store(pool)
    finally:
        pool.close()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Real processes, kills and restarts: generous per-test bound (pytest-timeout).
    for item in items:
        if "faults" in Path(str(item.fspath)).parts and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(int(os.environ.get("JOBRUN_FAULT_TIMEOUT", "240"))))
