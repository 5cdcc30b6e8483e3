"""The console of a real ``jobrun worker`` process tells each job's story.

One worker process runs a job of every outcome (tests/acceptance/apps/outcomes.py):
success, a failure then a success, dead after its attempts, a permanent
failure, a cancel, a result, ``Done(result, commit)``, and jobs of a type it
has no handler for. Its stderr is read as a user (text) or a log shipper
(``--log-format json``) would read it.
"""

from __future__ import annotations

import json
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobrun.job.model import Backoff, EventKind, Job, NewJob, State
from jobrun.postgres import dsn as dsn_tools
from jobrun.postgres.store import Store
from jobrun.worker.logs import version
from tests.acceptance.conftest import WorkerProcess
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.apps.outcomes:registry"
TYPES = ["boom", "done", "flaky", "ok", "perm", "result", "wait_cancel"]
QUICK = Backoff(kind="constant", base=0.0, jitter=0.0)
STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"


@pytest.fixture
def secret_dsn(conn: psycopg.Connection[Any], dsn: str) -> Iterator[tuple[str, str]]:
    """The test database through a role with a password: (dsn, password)."""
    role = f"console_{secrets.token_hex(4)}"
    password = f"pw-{secrets.token_hex(8)}"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    try:
        yield psycopg.conninfo.make_conninfo(dsn, user=role, password=password), password
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def enqueue_every_outcome(store: Store) -> dict[str, Job]:
    def job(type: str, **fields: Any) -> Job:
        return store.enqueue(NewJob(type=type, backoff=QUICK, **fields))

    return {
        "ok": job("ok"),
        "flaky": job("flaky", max_attempts=3),
        "boom": job("boom", max_attempts=2),
        "perm": job("perm"),
        "result": job("result"),
        "done": job("done", queue="other"),
        "wait_cancel": job("wait_cancel"),
        "unknown": job("no.such.type"),
        "unknown2": job("no.such.type"),
    }


def run_every_outcome(
    store: Store, start_worker: Callable[..., WorkerProcess], url: str, *flags: str
) -> tuple[dict[str, Job], str]:
    """Run one job of each outcome in a worker process; its whole output once it stopped."""
    jobs = enqueue_every_outcome(store)
    worker = start_worker(
        "--app",
        APP,
        "--no-scheduler",
        "--queues",
        "default,other=2",
        "--concurrency",
        "4",
        "--log-level",
        "debug",
        "--log-success",
        "info",
        *flags,
        env={"DATABASE_URL": url},
    )

    def state(name: str) -> State:
        return store.get(jobs[name].id).state

    wait_for(lambda: "waiting to be cancelled" in worker.output(), timeout=60)
    store.cancel(jobs["wait_cancel"].id)
    finished = {
        "ok": State.SUCCEEDED,
        "flaky": State.SUCCEEDED,
        "result": State.SUCCEEDED,
        "done": State.SUCCEEDED,
        "boom": State.DEAD,
        "perm": State.DEAD,
        "wait_cancel": State.CANCELLED,
    }
    wait_for(lambda: all(state(name) is want for name, want in finished.items()), timeout=60)
    wait_for(
        lambda: all(
            store.events(jobs[n].id)[-1].kind is EventKind.RELEASED for n in ("unknown", "unknown2")
        ),
        timeout=60,
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(60) == 0, worker.output()
    return jobs, worker.output()


def assert_unknown_jobs_kept_their_attempts(store: Store, jobs: dict[str, Job]) -> None:
    for name in ("unknown", "unknown2"):
        stored = store.get(jobs[name].id)
        assert stored.state is State.QUEUED
        assert stored.attempts == 0
        assert EventKind.RELEASED in [e.kind for e in store.events(stored.id)]


def lines_of(output: str, job: Job) -> list[str]:
    return [line for line in output.splitlines() if f"job {job.id} " in line]


def test_the_text_console_shows_the_banner_and_one_line_per_outcome_with_the_job(
    store: Store,
    conn: Any,
    tables: None,
    secret_dsn: tuple[str, str],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    url, password = secret_dsn
    jobs, out = run_every_outcome(store, start_worker, url)
    assert password not in out
    lines = out.splitlines()

    # The banner: version, database (no password), queues and limits, concurrency, types.
    start = next(i for i, line in enumerate(lines) if line.endswith(" starting"))
    assert re.fullmatch(
        rf"{STAMP} INFO jobrun.worker: jobrun {re.escape(version())} worker \S+ starting",
        lines[start],
    )
    assert lines[start + 1 : start + 5 + len(TYPES)] == [
        f"  database:    {dsn_tools.describe(url)} (schema jobrun)",
        "  queues:      default, other (at most 2 at once)",
        "  concurrency: 4",
        f"  job types ({len(TYPES)}):",
        *[f"    . {name}" for name in TYPES],
    ]

    def only(name: str, pattern: str, level: str = "INFO") -> str:
        job = jobs[name]
        found = [
            line
            for line in lines_of(out, job)
            if re.fullmatch(
                rf"{STAMP} {level} jobrun.worker: job {job.id} {re.escape(job.type)} {pattern}",
                line,
            )
        ]
        assert len(found) == 1, (pattern, lines_of(out, job))
        return found[0]

    ms = r"[\d.]+ (?:ms|s)"
    only("ok", rf"attempt 1/25: succeeded in {ms}")
    only("result", rf"attempt 1/25: succeeded in {ms}, result stored")
    only("done", rf"attempt 1/25: succeeded in {ms}, result stored")
    failed = only(
        "flaky",
        rf"attempt 1/3: failed in {ms}: ValueError: first try fails; "
        r"next attempt \(2 of 3\) at \S+Z \(in [\d.]+ s\)",
    )
    assert lines[lines.index(failed) + 1] == "Traceback (most recent call last):"  # at DEBUG
    only("flaky", rf"attempt 2/3: succeeded in {ms}")
    only("boom", rf"attempt 1/2: failed in {ms}: RuntimeError: always broken; .*")
    only(
        "boom",
        rf"attempt 2/2: dead in {ms} \(no attempts left \(2 of 2\)\): RuntimeError: always broken",
        "WARNING",
    )
    only(
        "perm",
        rf"attempt 1/25: dead in {ms} \(permanent failure\): "
        "PermanentFailure: bad input, no point retrying",
        "WARNING",
    )
    only("wait_cancel", rf"attempt 1/25: cancelled in {ms}: cancel was requested \(it stopped\)")
    # The handler's own line carries its job too.
    job = jobs["wait_cancel"]
    assert [
        line
        for line in lines_of(out, job)
        if re.fullmatch(
            rf"{STAMP} INFO jobrun.job.wait_cancel: job {job.id} wait_cancel "
            "attempt 1/25: waiting to be cancelled",
            line,
        )
    ]

    # The unknown type: one WARNING naming the known types; the other release is DEBUG.
    warned = [line for line in lines if " WARNING " in line and "'no.such.type'" in line]
    assert len(warned) == 1, warned
    assert f"(it knows: {', '.join(TYPES)})" in warned[0]
    assert "attempt not counted" in warned[0]
    debug = [line for line in lines if " DEBUG " in line and "released again" in line]
    assert len(debug) == 1
    assert_unknown_jobs_kept_their_attempts(store, jobs)


def test_the_json_console_is_one_object_per_line_with_the_job_fields(
    store: Store,
    conn: Any,
    tables: None,
    secret_dsn: tuple[str, str],
    start_worker: Callable[..., WorkerProcess],
) -> None:
    url, password = secret_dsn
    jobs, out = run_every_outcome(store, start_worker, url, "--log-format", "json")
    assert password not in out
    records = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= r.keys() for r in records)

    (banner,) = [r for r in records if "job_types" in r]
    assert banner["version"] == version()
    assert banner["database"] == f"{dsn_tools.describe(url)} (schema jobrun)"
    assert banner["queues"] == {"default": None, "other": 2}
    assert banner["concurrency"] == 4
    assert banner["job_types"] == TYPES

    def outcomes(name: str) -> list[dict[str, Any]]:
        job = jobs[name]
        found = [r for r in records if r.get("job_id") == str(job.id) and "outcome" in r]
        for r in found:
            assert r["job_type"] == job.type and r["queue"] == job.queue
            assert r["max_attempts"] == job.max_attempts
            assert r["logger"] == "jobrun.worker"
        return found

    def brief(r: dict[str, Any]) -> tuple[str, str, int]:
        return (r["level"], r["outcome"], r["attempt"])

    assert [brief(r) for r in outcomes("ok")] == [("INFO", "succeeded", 1)]
    assert outcomes("ok")[0]["duration_ms"] >= 0
    assert [brief(r) for r in outcomes("result")] == [("INFO", "succeeded", 1)]
    assert [brief(r) for r in outcomes("flaky")] == [
        ("INFO", "failed", 1),
        ("INFO", "succeeded", 2),
    ]
    failed = outcomes("flaky")[0]
    assert failed["error"] == "ValueError: first try fails"
    assert failed["next_run_at"].endswith("Z")
    assert "Traceback (most recent call last)" in failed["traceback"]
    assert "first try fails" in failed["traceback"]
    assert [brief(r) for r in outcomes("boom")] == [("INFO", "failed", 1), ("WARNING", "dead", 2)]
    assert [brief(r) for r in outcomes("perm")] == [("WARNING", "dead", 1)]
    assert outcomes("perm")[0]["error"] == "PermanentFailure: bad input, no point retrying"
    assert [brief(r) for r in outcomes("wait_cancel")] == [("INFO", "cancelled", 1)]
    released = outcomes("unknown") + outcomes("unknown2")
    assert sorted(brief(r)[:2] for r in released) == [
        ("DEBUG", "released"),
        ("WARNING", "released"),
    ]
    assert all(r["attempt"] == 1 and r["next_run_at"].endswith("Z") for r in released)
    assert_unknown_jobs_kept_their_attempts(store, jobs)


def test_jobrun_get_shows_a_stored_result(
    store: Store, dsn: str, tables: None, start_worker: Callable[..., WorkerProcess]
) -> None:
    job = store.enqueue(NewJob(type="result"))
    worker = start_worker("--app", APP, "--no-scheduler")
    wait_for(lambda: store.get(job.id).state is State.SUCCEEDED, timeout=60)
    worker.signal(signal.SIGTERM)
    worker.wait(30)
    assert store.get(job.id).result == {"sent": 3}

    def get(*flags: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "jobrun.cli", "--database-url", dsn, "get", str(job.id), *flags],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    table = {
        key: value.strip() for key, _, value in (line.partition(" ") for line in get().splitlines())
    }
    assert table["result"] == '{"sent":3}'
    assert json.loads(get("--json"))["result"] == {"sent": 3}


def test_a_bad_log_format_in_the_environment_is_a_one_line_validation_error(
    dsn: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", "--database-url", dsn, "worker", "--app", APP],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
        env={"JOBRUN_LOG_FORMAT": "xml", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 7, done.stderr
    assert done.stderr.strip() == "jobrun: JOBRUN_LOG_FORMAT: 'xml': expected one of text, json"
