"""``jobrun demo`` runs in a throwaway database and never touches the user's.

One embedded cluster (a private ``JOBRUN_EMBEDDED_DIR``) for the module: the
user's database is its ``jobrun`` database, where each test enqueues a job of
its own before a demo runs, and checks it afterwards.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.acceptance.embedded_home import EmbeddedHome, embedded_home

pytestmark = pytest.mark.slow

SMALL = ("--jobs", "200", "--probes", "5", "--concurrency", "4")
BIG = ("--jobs", "50000", "--concurrency", "2")
DEMO_DB = re.compile(r"jobrun_demo_[0-9a-f]+")


@pytest.fixture(scope="module")
def home() -> Iterator[EmbeddedHome]:
    with embedded_home() as h:
        h.start()
        assert h.jobrun("migrate").code == 0
        yield h


@pytest.fixture
def url(home: EmbeddedHome) -> str:
    return home.start()


def demo_databases(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE 'jobrun\\_demo\\_%' ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


def user_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_schema || '.' || table_name FROM information_schema.tables"
            " WHERE table_schema NOT IN ('pg_catalog', 'information_schema') ORDER BY 1"
        ).fetchall()
    return [name for (name,) in rows]


def snapshot(home: EmbeddedHome, url: str, job_id: str) -> dict[str, Any]:
    """The user's side of the cluster: their job, the depth, their tables, every job."""
    job = home.jobrun("get", job_id, "--json")
    depth = home.jobrun("depth", "--json")
    assert job.code == 0, job
    assert depth.code == 0, depth
    with psycopg.connect(url) as conn:
        jobs = conn.execute("SELECT id, queue, state FROM jobrun.jobs ORDER BY id").fetchall()
    return {"job": job.json(), "depth": depth.json(), "tables": user_tables(url), "jobs": jobs}


def my_job(home: EmbeddedHome) -> str:
    result = home.jobrun("enqueue", "mine.report", '{"for": "me"}', "--queue", "mine", "--json")
    assert result.code == 0, result
    job_id: str = result.json()["id"]
    return job_id


def started_demo(home: EmbeddedHome, url: str) -> tuple[subprocess.Popen[str], str]:
    """A long demo, once its batch is enqueued; with the name of its database."""
    proc = home.popen("demo", *BIG)
    assert proc.stdout is not None
    try:
        name = None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            found = DEMO_DB.search(line)
            if found and name is None:
                name = found.group()
            if "enqueued" in line:
                break
        assert name is not None, "".join(seen)
        assert name in demo_databases(url)
    except BaseException:
        proc.kill()
        proc.communicate(timeout=60)
        raise
    return proc, name


def test_demo_leaves_the_users_database_as_it_was(home: EmbeddedHome, url: str) -> None:
    job_id = my_job(home)
    before = snapshot(home, url, job_id)

    result = home.jobrun("demo", *SMALL)
    assert result.code == 0, result
    assert "exactly once" in result.out

    after = snapshot(home, url, job_id)
    assert after == before
    assert not any(d["queue"].startswith("demo") for d in after["depth"])
    assert demo_databases(url) == []


def test_an_interrupted_demo_drops_its_database(home: EmbeddedHome, url: str) -> None:
    job_id = my_job(home)
    before = snapshot(home, url, job_id)
    proc, name = started_demo(home, url)
    time.sleep(1)  # draining
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert name not in demo_databases(url)
    assert snapshot(home, url, job_id) == before


def test_a_terminated_demo_drops_its_database(home: EmbeddedHome, url: str) -> None:
    proc, name = started_demo(home, url)
    proc.terminate()
    proc.communicate(timeout=60)
    assert name not in demo_databases(url)


def test_a_killed_demos_database_is_dropped_by_the_next_demo(home: EmbeddedHome, url: str) -> None:
    job_id = my_job(home)
    proc, killed = started_demo(home, url)
    proc.kill()
    proc.communicate(timeout=60)
    assert killed in demo_databases(url)  # nobody could clean up
    before = snapshot(home, url, job_id)

    deadline = time.monotonic() + 10  # the killed demo's server sessions end
    while time.monotonic() < deadline:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [killed]
            ).fetchone()
        if row == (0,):
            break
        time.sleep(0.1)
    result = home.jobrun("demo", *SMALL)
    assert result.code == 0, result
    assert f"dropped {killed}" in result.out
    assert demo_databases(url) == []
    assert snapshot(home, url, job_id) == before


def test_the_next_demo_never_drops_a_running_demos_database(home: EmbeddedHome, url: str) -> None:
    running, name = started_demo(home, url)
    try:
        result = home.jobrun("demo", *SMALL)
        assert result.code == 0, result
        assert name in demo_databases(url)
        assert running.poll() is None
    finally:
        running.send_signal(signal.SIGINT)
        running.communicate(timeout=60)
    assert demo_databases(url) == []


def test_a_demo_that_cannot_create_its_database_says_so_and_touches_nothing(
    admin_dsn: str,
) -> None:
    """On a server of the user's (DATABASE_URL), as a role with every right on the
    user's tables but no CREATEDB: the demo refuses instead of using those tables."""
    role, password = f"no_createdb_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    ident = sql.Identifier(role)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN NOCREATEDB PASSWORD {}").format(
                ident, sql.Literal(password)
            )
        )
        for grant in (
            "GRANT ALL ON SCHEMA public TO {}",
            "GRANT ALL ON ALL TABLES IN SCHEMA public TO {}",
            "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {}",
        ):
            conn.execute(sql.SQL(grant).format(ident))
    before = user_tables(admin_dsn)
    try:
        url = psycopg.conninfo.make_conninfo(admin_dsn, user=role, password=password)
        with embedded_home() as nowhere:  # never started: the URL is given
            result = nowhere.jobrun("demo", *SMALL, "--database-url", url)
        assert result.code == 1, result
        (line,) = [x for x in result.err.splitlines() if "CREATEDB" in x]
        assert line.startswith("jobrun: the demo runs in a throwaway database"), line
        assert "its role needs CREATEDB" in line
        assert password not in result.err + result.out
        assert user_tables(admin_dsn) == before
        with psycopg.connect(admin_dsn) as conn:
            assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (0,)
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))
