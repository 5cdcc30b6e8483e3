"""The pytest plugin (jobrun.pytest_plugin), used by test files of its own as a user would.

Each test writes a small test file and runs pytest on it (pytester, in this
process), pointing the plugin at the suite's server with
``--jobrun-database-url``: the fixtures make real databases there, a real
worker runs on them.
"""

from __future__ import annotations

import importlib.metadata
import os
import textwrap
import tomllib
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support.database import TestServer

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]


def _plugin_args() -> list[str]:
    """``-p jobrun.pytest_plugin`` unless the installed entry point loads it already."""
    installed = any(
        ep.value == "jobrun.pytest_plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "jobrun.pytest_plugin"]


def _run(pytester: pytest.Pytester, server: TestServer, source: str) -> pytest.RunResult:
    pytester.makepyfile(test_app=textwrap.dedent(source))
    return pytester.runpytest(
        *_plugin_args(), f"--jobrun-database-url={server.admin_dsn}", "-p", "no:cacheprovider"
    )


def _leftovers(server: TestServer) -> list[str]:
    with psycopg.connect(server.admin_dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'jobrun_pt_%%'"
        ).fetchall()
    return [name for (name,) in rows]


def test_each_test_gets_a_migrated_database_of_its_own_dropped_afterwards(
    pytester: pytest.Pytester, pg_server: TestServer
) -> None:
    result = _run(
        pytester,
        pg_server,
        """
        import os
        import jobrun

        seen = []

        def test_one(jobrun_database, jobrun_client):
            assert os.environ["DATABASE_URL"] == jobrun_database
            jobrun_client.enqueue("a")
            seen.append(jobrun_database)
            assert len(jobrun_client.list()) == 1

        def test_two(jobrun_database, jobrun_client):
            assert jobrun_database != seen[0]
            assert jobrun_client.list() == []     # nothing of test_one's
            with jobrun.Client.connect() as client:   # DATABASE_URL: this test's
                assert client.list() == []
        """,
    )
    result.assert_outcomes(passed=2)
    assert _leftovers(pg_server) == []


def test_the_worker_fixture_runs_jobs_and_run_jobs_advances_a_snooze(
    pytester: pytest.Pytester, pg_server: TestServer
) -> None:
    result = _run(
        pytester,
        pg_server,
        """
        import datetime as dt
        import pytest
        import jobrun
        from jobrun.testing import advance_jobs, assert_enqueued

        registry = jobrun.Registry()

        @registry.handler("email.send")
        def send(ctx, job):
            return {"sent_to": job.payload["to"]}

        @registry.handler("poll")
        def poll(ctx, job):
            if job.snoozes == 0:
                raise jobrun.Snooze(dt.timedelta(minutes=10))
            return "ready"

        @pytest.fixture
        def jobrun_registry():
            return registry

        def test_a_real_worker_runs_the_job(jobrun_client, jobrun_worker):
            job = jobrun_client.enqueue("email.send", {"to": "a@example.com"})
            done = jobrun_client.wait(job.id, timeout=10)
            assert done.result == {"sent_to": "a@example.com"}

        def test_a_running_worker_takes_a_delayed_job_once_advanced(jobrun_client, jobrun_worker):
            an_hour = dt.timedelta(hours=1)
            job = jobrun_client.enqueue("email.send", {"to": "d@example.com"}, delay=an_hour)
            assert advance_jobs(jobrun_client, dt.timedelta(hours=2)) == 1
            assert jobrun_client.wait(job.id, timeout=10).state == "succeeded"

        def test_run_jobs_runs_a_snoozed_job_with_advance(jobrun_client, jobrun_run_jobs):
            job = jobrun_client.enqueue("poll")
            assert_enqueued(jobrun_client, "poll", count=1)
            report = jobrun_run_jobs(advance=dt.timedelta(minutes=15))
            assert (report.ran, report.advanced) == (2, 1)
            assert jobrun_client.get(job.id).result == "ready"

        def test_assert_enqueued_says_what_was_enqueued(jobrun_client):
            jobrun_client.enqueue("email.send", {"to": "b@example.com"})
            assert_enqueued(jobrun_client, "email.send", payload={"to": "c@example.com"})
        """,
    )
    result.assert_outcomes(passed=3, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*expected at least one job of type 'email.send' with payload"
            " {'to': 'c@example.com'}, found 0",
            "*email.send queue=default state=queued payload={'to': 'b@example.com'}",
        ]
    )
    assert _leftovers(pg_server) == []


def test_a_server_that_refuses_says_so_in_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_app="def test_x(jobrun_database):\n    pass\n")
    result = pytester.runpytest(
        *_plugin_args(),
        "--jobrun-database-url=postgresql://nobody@127.0.0.1:1/none?connect_timeout=2",
        "-p",
        "no:cacheprovider",
    )
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*jobrun: no database for the tests:*127.0.0.1*"])


def test_the_plugin_is_idle_for_tests_that_use_none_of_its_fixtures(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_app="def test_x():\n    pass\n")
    result = pytester.runpytest(
        *_plugin_args(), "--jobrun-database-url=postgresql://nobody@127.0.0.1:1/none"
    )
    result.assert_outcomes(passed=1)


@pytest.mark.slow
def test_without_a_server_the_plugin_starts_a_throwaway_embedded_one(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    pytester.makepyfile(
        test_app="""
        def test_x(jobrun_client):
            job = jobrun_client.enqueue("a")
            assert jobrun_client.get(job.id).state == "queued"
        """
    )
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_role_without_createdb_is_told_so_without_its_password(
    pytester: pytest.Pytester, pg_server: TestServer
) -> None:
    role, password = f"jobrun_nocreatedb_{os.getpid()}", "s3cret-Pw-9"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(password)
            )
        )
    try:
        params = psycopg.conninfo.conninfo_to_dict(pg_server.admin_dsn)
        params.update(user=role, password=password, dbname="postgres")
        pytester.makepyfile(test_app="def test_x(jobrun_database):\n    pass\n")
        result = pytester.runpytest(
            *_plugin_args(),
            f"--jobrun-database-url={psycopg.conninfo.make_conninfo('', **params)}",
            "-p",
            "no:cacheprovider",
        )
    finally:
        with psycopg.connect(pg_server.admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*jobrun: no database for the tests:*needs CREATEDB*"])
    assert password not in result.stdout.str()


def test_the_distribution_registers_the_plugin_with_pytest() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"jobrun": "jobrun.pytest_plugin"}


def test_the_ini_value_names_the_server_when_nothing_else_does(
    pytester: pytest.Pytester, pg_server: TestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    pytester.makeini(f"[pytest]\njobrun_database_url = {pg_server.admin_dsn}\n")
    pytester.makepyfile(
        test_app="def test_x(jobrun_client):\n    assert jobrun_client.list() == []\n"
    )
    result = pytester.runpytest(*_plugin_args(), "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert _leftovers(pg_server) == []
