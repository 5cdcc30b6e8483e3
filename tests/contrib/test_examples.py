"""The examples in examples/ run as a reader would run them, against real PostgreSQL.

Each in its own directory, as real processes: the worker started in the
background (and stopped with SIGTERM, which must end it cleanly), the
application's commands in the foreground, their output checked.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.conftest import FAST_ENV
from tests.contrib.conftest import job_types

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent


def environment(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBRUN_"))}
    env.update(FAST_ENV)
    env["DATABASE_URL"] = dsn
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.pop("PYTHONPATH", None)  # jobrun as installed, like a reader's project
    return env


@pytest.fixture
def background(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[tuple[subprocess.Popen[str], Path]] = []

    def start(args: list[str], *, cwd: Path, env: dict[str, str]) -> subprocess.Popen[str]:
        log = tmp_path / f"background-{len(procs)}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen(
                args, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env
            )
        procs.append((proc, log))
        return proc

    yield start
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print(f"--- {proc.args}\n{log.read_text(errors='replace')}")


def run(args: list[str], *, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        args, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0


@pytest.mark.slow
def _create_example_tables(admin_dsn: str) -> None:
    """The example's own tables, made by the owner of the database: a runtime
    role (JOBRUN_TEST_RUNTIME_ROLE) may not create tables, and the example's
    create_all then finds them there."""
    import importlib.util  # noqa: PLC0415 - the example is a script, not a package

    import sqlalchemy  # noqa: PLC0415 - an optional extra

    spec = importlib.util.spec_from_file_location("sqlalchemy_app", EXAMPLES / "sqlalchemy_app.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # SQLAlchemy resolves the annotations through it
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    engine = sqlalchemy.create_engine(
        "postgresql+psycopg://", creator=lambda: psycopg.connect(admin_dsn)
    )
    try:
        module.Base.metadata.create_all(engine)
    finally:
        engine.dispose()


def test_the_sqlalchemy_example_commits_an_order_with_its_job_and_records_it_once(
    dsn: str,
    admin_dsn: str,
    conn: psycopg.Connection[Any],
    background: Callable[..., subprocess.Popen[str]],
) -> None:
    _create_example_tables(admin_dsn)
    env = environment(dsn)
    worker = background(
        [str(VENV_BIN / "jobrun"), "worker", "--app", "sqlalchemy_app:registry"],
        cwd=EXAMPLES,
        env=env,
    )
    app = [sys.executable, "sqlalchemy_app.py"]
    out = run(app, cwd=EXAMPLES, env=env)
    assert out.splitlines() == [
        "order 7: succeeded {'invoiced': 7}",
        "orders: [7]",
        "ledger: [(7, 1999)]",
    ]
    conn.execute("DELETE FROM example_orders")  # the same order again: an idempotent replay
    out = run(app, cwd=EXAMPLES, env=env)
    assert out.splitlines()[2] == "ledger: [(7, 1999)]"
    stop(worker)
    assert job_types(conn) == ["invoice.record"]


@pytest.mark.slow
def test_the_django_example_places_orders_and_its_worker_invoices_them(
    dsn: str,
    admin_dsn: str,
    conn: psycopg.Connection[Any],
    background: Callable[..., subprocess.Popen[str]],
) -> None:
    project = EXAMPLES / "django_project"
    env = environment(dsn)
    manage = [sys.executable, "manage.py"]
    run([*manage, "migrate", "-v", "0"], cwd=project, env=environment(admin_dsn))
    worker = background([*manage, "jobrun_worker"], cwd=project, env=env)
    out = run([*manage, "place_order", "7", "1999", "--wait"], cwd=project, env=env)
    assert out.strip() == "order 7: SUCCESSFUL {'cents': 1999, 'invoice': 1}"  # jsonb's key order
    out = run([*manage, "place_order", "8", "500", "--decline"], cwd=project, env=env)
    assert out.strip() == "order 8 declined: no order, no task"
    stop(worker)
    assert conn.execute("SELECT number FROM orders_order").fetchall() == [(7,)]
    assert conn.execute("SELECT cents FROM orders_invoice").fetchall() == [(1999,)]
    assert job_types(conn) == ["django.task"]
