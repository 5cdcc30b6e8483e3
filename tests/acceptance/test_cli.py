"""The ``jobrun`` command, end to end against a real PostgreSQL.

A few tests run the command as a real process (``python -m jobrun.cli``);
the rest call ``main([...])`` in this process and read stdout/stderr with
capsys, which is much faster and covers the same code.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import types
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun import cli
from jobrun.client import Client
from jobrun.job.model import Job, State
from jobrun.job.validate import MIN_PRIORITY
from jobrun.postgres import embedded
from tests.acceptance.apps import touch as touch_app

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.apps.touch:registry"
TTL = dt.timedelta(seconds=30)
UNKNOWN_ID = "0190a0a0-0000-7000-8000-000000000000"


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient configuration, and never the real embedded PostgreSQL."""
    for var in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL", "WORKER_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv("COLUMNS", raising=False)  # tables in a pipe are as wide as COLUMNS

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test tried to start the embedded PostgreSQL")

    monkeypatch.setattr(embedded, "ensure_embedded", refuse)
    monkeypatch.setattr("jobrun.postgres.connect.ensure_embedded", refuse)
    # In-process worker/scheduler commands must not reconfigure the test's root logger.
    monkeypatch.setattr("jobrun.cli.processes._configure_logging", lambda *args, **kwargs: None)


@pytest.fixture
def jobrun(dsn: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``jobrun(*args)``: run the command in-process against the test's database."""

    def run(*args: str, database_url: str | None = dsn) -> Result:
        capsys.readouterr()
        argv = [*args] if database_url is None else [*args, "--database-url", database_url]
        code = cli.main(argv)
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client.connect(dsn) as c:
        yield c


def _env(dsn: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL")
    }
    env["DATABASE_URL"] = dsn
    return env


def run_process(dsn: str, *args: str, timeout: float = 60) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", *args],
        env=_env(dsn),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.code == code, result
    assert result.err.endswith("\n")
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("jobrun: ")
    assert "Traceback" not in result.err
    for fragment in fragments:
        assert fragment in lines[0]
    assert result.out == ""


def assert_utc_timestamp(value: str) -> None:
    parsed = dt.datetime.fromisoformat(value)
    assert parsed.utcoffset() == dt.timedelta(0)


def leased(client: Client, queue: str = "default") -> Job:
    (job,) = client.store.claim("test-worker", [queue], 1, TTL)
    return job


def dead(
    client: Client, type: str = "t.fail", queue: str = "default", error: str = "boom\nsecond line"
) -> Job:
    """A dead job (enqueued first in line, claimed and failed with its one attempt)."""
    job = client.enqueue(type, queue=queue, max_attempts=1, priority=MIN_PRIORITY)
    claimed = leased(client, queue)
    assert claimed.id == job.id
    return client.store.fail(claimed, error, None)


def wait_for(predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


# -- real processes -----------------------------------------------------------------------


def test_migrate_applies_every_migration_to_an_empty_database_then_is_up_to_date(
    empty_dsn: str,
) -> None:
    first = run_process(empty_dsn, "migrate")
    assert first.code == 0, first.err
    assert "applied 0001.initial" in first.out
    assert "applied 0002.queue_pauses" in first.out

    again = run_process(empty_dsn, "migrate", "--json")
    assert again.code == 0, again.err
    assert json.loads(again.out) == {"applied": []}
    assert run_process(empty_dsn, "migrate").out == "up to date\n"


def test_enqueue_prints_the_id_that_get_then_shows(dsn: str) -> None:
    enqueued = run_process(dsn, "enqueue", "email.send", '{"to": "a@example.com"}')
    assert enqueued.code == 0, enqueued.err
    job_id = enqueued.out.strip()
    uuid.UUID(job_id)

    shown = run_process(dsn, "get", job_id, "--json")
    assert shown.code == 0, shown.err
    job = json.loads(shown.out)
    assert job["id"] == job_id
    assert job["type"] == "email.send"
    assert job["payload"] == {"to": "a@example.com"}
    assert job["state"] == "queued"

    human = run_process(dsn, "get", job_id)
    assert job_id in human.out
    assert "email.send" in human.out
    assert "\x1b[" not in human.out  # no colour codes when stdout is not a terminal


def test_process_reports_not_found_as_one_line_and_exit_code_3(dsn: str) -> None:
    result = run_process(dsn, "get", UNKNOWN_ID)
    assert_one_line_error(result, cli.EXIT_NOT_FOUND, UNKNOWN_ID, "not found")


def test_process_reports_an_unreachable_database_without_the_password(dsn: str) -> None:
    url = f"postgresql://app:pr0c3ss-s3cret@127.0.0.1:{embedded.free_port()}/app"
    result = run_process(url, "list")
    assert_one_line_error(result, cli.EXIT_UNAVAILABLE, "cannot connect")
    assert "pr0c3ss-s3cret" not in result.err


def test_worker_runs_an_enqueued_job_and_exits_zero_on_sigterm(
    dsn: str, client: Client, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    job = client.enqueue("touch", {"path": str(marker)})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "jobrun.cli",
            "worker",
            "--app",
            APP,
            "--concurrency",
            "2",
            "--poll-interval",
            "200ms",
            "--shutdown-grace",
            "5s",
        ],
        env=_env(dsn),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: client.get(job.id).state == State.SUCCEEDED, what="the job to succeed")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert marker.read_text() == str(job.id)
    assert "  database:" in err  # the start banner, on stderr at INFO
    assert "Traceback" not in err


def test_scheduler_enqueues_due_occurrences_and_exits_zero_on_sigterm(
    dsn: str, client: Client, jobrun: Callable[..., Result]
) -> None:
    assert jobrun("schedules", "add", "every-second", "* * * * * *", "tick").code == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobrun.cli", "scheduler", "--app", "tests.acceptance.apps.touch"],
        env=_env(dsn),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: bool(client.list(type="tick")), what="a scheduled job")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "Traceback" not in err


# -- usage --------------------------------------------------------------------------------


def test_help_exits_zero(jobrun: Callable[..., Result]) -> None:
    result = jobrun("--help", database_url=None)
    assert result.code == 0
    assert "enqueue" in result.out


def test_unknown_command_is_a_one_line_usage_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("frobnicate", database_url=None), cli.EXIT_USAGE, "frobnicate")


def test_missing_command_is_a_usage_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun(), cli.EXIT_USAGE, "command")


def test_unknown_option_is_a_usage_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("depth", "--bogus"), cli.EXIT_USAGE, "--bogus")


def test_global_options_work_before_and_after_the_subcommand(
    dsn: str, jobrun: Callable[..., Result]
) -> None:
    before = jobrun("--database-url", dsn, "enqueue", "t.a", database_url=None)
    assert before.code == 0, before.err
    after = jobrun("get", before.out.strip(), "--json")  # the fixture appends --database-url
    assert after.code == 0, after.err
    nested = jobrun("--database-url", dsn, "queues", "list", "--json", database_url=None)
    assert nested.code == 0, nested.err
    assert nested.json() == [{"queue": "default", "paused": False, "leased": 0, "limits": None}]


def test_database_url_comes_from_the_environment(
    dsn: str, jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    result = jobrun("depth", "--json", database_url=None)
    assert result.code == 0, result.err
    assert result.json() == []


# -- enqueue ------------------------------------------------------------------------------


def test_enqueue_json_prints_the_job_with_every_option_applied(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun(
        "enqueue",
        "report.build",
        '{"n": 1}',
        "--queue",
        "reports",
        "--priority",
        "-5",
        "--max-attempts",
        "3",
        "--delay",
        "1h",
        "--key",
        "report-1",
        "--json",
    )
    assert result.code == 0, result.err
    job = result.json()
    assert job["queue"] == "reports"
    assert job["priority"] == -5
    assert job["max_attempts"] == 3
    assert job["idempotency_key"] == "report-1"
    assert job["payload"] == {"n": 1}
    uuid.UUID(job["id"])
    for key in ("run_at", "created_at", "updated_at"):
        assert_utc_timestamp(job[key])
    created = dt.datetime.fromisoformat(job["created_at"])
    delay = dt.datetime.fromisoformat(job["run_at"]) - created
    assert dt.timedelta(minutes=59) < delay <= dt.timedelta(hours=1, seconds=1)
    assert job["finished_at"] is None
    assert job["backoff"]["kind"] == "exponential"


def test_enqueue_delay_accepts_plain_seconds(jobrun: Callable[..., Result]) -> None:
    job = jobrun("enqueue", "t.a", "--delay", "90", "--json").json()
    delay = dt.datetime.fromisoformat(job["run_at"]) - dt.datetime.fromisoformat(job["created_at"])
    assert dt.timedelta(seconds=89) < delay <= dt.timedelta(seconds=91)


def test_enqueue_without_payload_stores_an_empty_object(jobrun: Callable[..., Result]) -> None:
    assert jobrun("enqueue", "t.a", "--json").json()["payload"] == {}


def test_enqueue_with_invalid_json_payload_is_a_validation_error(
    jobrun: Callable[..., Result], client: Client
) -> None:
    result = jobrun("enqueue", "t.a", "{not json")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "payload", "JSON")
    assert client.list() == []


def test_enqueue_with_invalid_delay_is_a_validation_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(
        jobrun("enqueue", "t.a", "--delay", "soon"), cli.EXIT_VALIDATION, "--delay"
    )


def test_enqueue_with_invalid_queue_name_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun("enqueue", "t.a", "--queue", "bad queue name!")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "queue")


def test_enqueue_replaying_an_idempotency_key_returns_the_stored_job(
    jobrun: Callable[..., Result],
) -> None:
    first = jobrun("enqueue", "t.a", '{"x": 1}', "--key", "k1")
    again = jobrun("enqueue", "t.a", '{"x": 1}', "--key", "k1")
    assert first.code == again.code == 0
    assert first.out == again.out


def test_enqueue_reusing_a_key_with_a_different_body_is_a_conflict(
    jobrun: Callable[..., Result],
) -> None:
    assert jobrun("enqueue", "t.a", '{"x": 1}', "--key", "k1").code == 0
    result = jobrun("enqueue", "t.a", '{"x": 2}', "--key", "k1")
    assert_one_line_error(result, cli.EXIT_CONFLICT, "k1")


def test_enqueue_honours_the_job_events_flag(jobrun: Callable[..., Result], client: Client) -> None:
    quiet = jobrun("enqueue", "t.a", "--job-events", "terminal").out.strip()
    loud = jobrun("enqueue", "t.a", "--job-events", "all").out.strip()
    assert client.events(quiet) == []
    assert [e.kind for e in client.events(loud)] == ["enqueued"]


def test_invalid_notify_channel_is_a_validation_error(jobrun: Callable[..., Result]) -> None:
    result = jobrun("enqueue", "t.a", "--notify-channel", "no spaces allowed")
    assert_one_line_error(result, cli.EXIT_VALIDATION)


def test_invalid_environment_setting_is_a_validation_error(
    jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBRUN_LEASE_TTL", "forever-ish")
    assert_one_line_error(jobrun("depth"), cli.EXIT_VALIDATION, "JOBRUN_LEASE_TTL")


# -- get, list, events, depth -------------------------------------------------------------


def test_get_shows_one_job_as_key_value_lines(
    jobrun: Callable[..., Result], client: Client
) -> None:
    job = dead(client)
    out = jobrun("get", str(job.id)).out
    lines = {line.split(None, 1)[0]: line for line in out.splitlines() if line.strip()}
    assert str(job.id) in lines["id"]
    assert "dead" in lines["state"]
    assert "1 of 1" in lines["attempts"]
    assert "boom" in lines["last_error"]


def test_get_and_list_tell_a_job_claimed_ahead_from_a_running_one(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pipelined worker leases jobs ahead of its free threads: leased, not started."""
    running = client.enqueue("t.run", queue="ahead")
    waiting = client.enqueue("t.wait", queue="ahead")
    leased(client, "ahead")
    client.store.exchange("test-worker", queues=["ahead"], limit=1, ttl=TTL, start_now=0)

    def fields(job_id: uuid.UUID) -> dict[str, str]:
        out = jobrun("get", str(job_id)).out
        return {k: v for k, _, v in (line.partition(" ") for line in out.splitlines()) if k}

    got = fields(waiting.id)
    assert " ".join(got["state"].split()) == (
        "leased, waiting for a thread (claimed ahead, not started)"
    )
    assert got["started_at"].strip() == ""
    assert got["attempts"].split() == ["0", "of", "25"]
    got = fields(running.id)
    assert got["state"].strip() == "leased"
    assert got["started_at"].strip().endswith("Z")
    monkeypatch.setenv("COLUMNS", "120")
    lines = jobrun("list", "--queue", "ahead").out.splitlines()
    states = {
        job.id: line.split()[3]
        for job in (running, waiting)
        for line in lines
        if str(job.id) in line
    }
    assert states == {running.id: "leased", waiting.id: "claimed"}


def test_get_unknown_job_is_not_found(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("get", UNKNOWN_ID), cli.EXIT_NOT_FOUND, UNKNOWN_ID)


def test_get_malformed_id_is_a_validation_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("get", "not-a-uuid"), cli.EXIT_VALIDATION, "not-a-uuid")


def test_list_json_filters_by_queue_state_and_type(
    jobrun: Callable[..., Result], client: Client
) -> None:
    a = client.enqueue("t.a", queue="q1")
    client.enqueue("t.b", queue="q1")
    client.enqueue("t.a", queue="q2")
    gone = dead(client, type="t.a", queue="q1")

    everything = jobrun("list", "--oldest", "--json").json()
    assert len(everything) == 4
    assert [j["id"] for j in everything] == sorted(j["id"] for j in everything)  # oldest first

    result = jobrun("list", "--queue", "q1", "--state", "queued", "--type", "t.a", "--json")
    assert [j["id"] for j in result.json()] == [str(a.id)]
    assert [j["id"] for j in jobrun("list", "--state", "dead", "--json").json()] == [str(gone.id)]


def test_list_pages_with_limit_and_after(jobrun: Callable[..., Result], client: Client) -> None:
    ids = [str(client.enqueue("t.a").id) for _ in range(5)]
    page1 = jobrun("list", "--oldest", "--limit", "2", "--json").json()
    page2 = jobrun("list", "--limit", "2", "--after", page1[-1]["id"], "--json").json()
    page3 = jobrun("list", "--limit", "2", "--after", page2[-1]["id"], "--json").json()
    assert [j["id"] for j in page1 + page2 + page3] == ids


def test_list_table_shows_jobs_and_truncated_errors(
    jobrun: Callable[..., Result], client: Client
) -> None:
    client.enqueue("t.a")
    failed = dead(client, type="t.long", error="x" * 500)
    result = jobrun("list")
    assert result.code == 0
    assert "\x1b[" not in result.out
    header = result.out.splitlines()[0].split()
    assert header == ["id", "queue", "type", "state", "attempts", "run_at", "last_error"]
    row = next(line for line in result.out.splitlines() if str(failed.id) in line)
    assert "dead" in row
    assert "1/1" in row
    assert "x" * 50 in row
    assert "x" * 100 not in row


def test_list_table_says_when_more_pages_follow(
    jobrun: Callable[..., Result], client: Client
) -> None:
    ids = [client.enqueue("t.a").id for _ in range(3)]
    assert f"--after {ids[1]}" in jobrun("list", "--oldest", "--limit", "2").out


def test_list_empty_says_so(jobrun: Callable[..., Result]) -> None:
    result = jobrun("list")
    assert (result.code, result.out) == (0, "no jobs\n")
    assert jobrun("list", "--json").json() == []


def test_list_with_unknown_state_is_a_validation_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("list", "--state", "sleeping"), cli.EXIT_VALIDATION, "sleeping")


def test_list_with_limit_out_of_range_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    assert_one_line_error(jobrun("list", "--limit", "0"), cli.EXIT_VALIDATION, "limit")


def test_events_json_lists_the_audit_trail(jobrun: Callable[..., Result], client: Client) -> None:
    job = dead(client)
    result = jobrun("events", str(job.id), "--json")
    assert result.code == 0, result.err
    events = result.json()
    assert [e["kind"] for e in events] == ["enqueued", "claimed", "dead"]
    for e in events:
        assert e["job_id"] == str(job.id)
        assert_utc_timestamp(e["at"])
    table = jobrun("events", str(job.id)).out
    assert "claimed" in table
    assert "dead" in table


def test_events_of_unknown_job_is_not_found(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("events", UNKNOWN_ID), cli.EXIT_NOT_FOUND)


def test_depth_counts_per_queue_and_shows_paused_queues(
    jobrun: Callable[..., Result], client: Client
) -> None:
    client.enqueue("t.a", queue="emails")
    client.enqueue("t.a", queue="emails", delay=dt.timedelta(hours=1))
    client.enqueue("t.a", queue="emails")
    leased(client, "emails")
    dead(client, queue="reports")
    client.pause_queue("idle")

    result = jobrun("depth", "--json")
    assert result.code == 0, result.err
    assert result.json() == [
        {"queue": "emails", "ready": 1, "scheduled": 1, "leased": 1, "dead": 0, "paused": False},
        {"queue": "idle", "ready": 0, "scheduled": 0, "leased": 0, "dead": 0, "paused": True},
        {"queue": "reports", "ready": 0, "scheduled": 0, "leased": 0, "dead": 1, "paused": False},
    ]
    table = jobrun("depth").out
    assert table.splitlines()[0].split() == [
        "queue",
        "ready",
        "scheduled",
        "leased",
        "dead",
        "paused",
    ]
    idle = next(line for line in table.splitlines() if "idle" in line)
    assert "paused" in idle


def test_depth_of_an_empty_database(jobrun: Callable[..., Result]) -> None:
    assert jobrun("depth", "--json").json() == []
    assert jobrun("depth").code == 0


# -- cancel, retry ------------------------------------------------------------------------


def test_cancel_a_queued_job(jobrun: Callable[..., Result], client: Client) -> None:
    job = client.enqueue("t.a")
    result = jobrun("cancel", str(job.id))
    assert result.code == 0, result.err
    assert "cancelled" in result.out
    assert client.get(job.id).state == State.CANCELLED


def test_cancel_a_running_job_requests_cancellation(
    jobrun: Callable[..., Result], client: Client
) -> None:
    client.enqueue("t.a")
    job = leased(client)
    result = jobrun("cancel", str(job.id), "--json")
    assert result.code == 0, result.err
    shown = result.json()
    assert shown["state"] == "leased"
    assert shown["cancel_requested"] is True


def test_cancel_a_finished_job_is_invalid_state(
    jobrun: Callable[..., Result], client: Client
) -> None:
    job = dead(client)
    assert_one_line_error(jobrun("cancel", str(job.id)), cli.EXIT_INVALID_STATE, "dead")


def test_cancel_unknown_job_is_not_found(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("cancel", UNKNOWN_ID), cli.EXIT_NOT_FOUND)


def test_bulk_cancel_acts_on_every_matching_job_across_pages(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobrun.cli.actions.BULK_PAGE", 2)
    doomed = [client.enqueue("t.a", queue="q1").id for _ in range(5)]
    spared = [client.enqueue("t.b", queue="q1").id, client.enqueue("t.a", queue="q2").id]

    result = jobrun("cancel", "--state", "queued", "--queue", "q1", "--type", "t.a", "--yes")
    assert result.code == 0, result.err
    assert result.out == "cancelled 5 jobs\n"
    assert {client.get(i).state for i in doomed} == {State.CANCELLED}
    assert {client.get(i).state for i in spared} == {State.QUEUED}


def test_bulk_cancel_of_running_jobs_requests_cancellation(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobrun.cli.actions.BULK_PAGE", 2)
    for _ in range(3):
        client.enqueue("t.a")
    running = client.store.claim("w", ["default"], 3, TTL)
    result = jobrun("cancel", "--state", "leased", "--json", "--yes")
    assert result.code == 0, result.err
    assert result.json() == {"cancelled": 0, "cancel_requested": 3, "skipped": 0}
    assert all(client.get(j.id).cancel_requested for j in running)


def test_bulk_cancel_of_finished_jobs_is_refused(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(
        jobrun("cancel", "--state", "succeeded"), cli.EXIT_INVALID_STATE, "succeeded"
    )


def test_cancel_with_both_an_id_and_state_is_a_usage_error(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun("cancel", UNKNOWN_ID, "--state", "queued")
    assert_one_line_error(result, cli.EXIT_USAGE, "not both")


def test_cancel_with_neither_id_nor_state_is_a_usage_error(
    jobrun: Callable[..., Result],
) -> None:
    assert_one_line_error(jobrun("cancel"), cli.EXIT_USAGE)
    assert_one_line_error(jobrun("retry", "--queue", "q1"), cli.EXIT_USAGE, "--state")


def test_retry_a_dead_job_queues_it_again(jobrun: Callable[..., Result], client: Client) -> None:
    job = dead(client)
    result = jobrun("retry", str(job.id), "--json")
    assert result.code == 0, result.err
    shown = result.json()
    assert shown["state"] == "queued"
    assert shown["attempts"] == 0
    assert jobrun("retry", str(job.id)).out == f"job {job.id} queued to run now\n"


def test_retry_a_leased_job_is_invalid_state(jobrun: Callable[..., Result], client: Client) -> None:
    client.enqueue("t.a")
    job = leased(client)
    assert_one_line_error(jobrun("retry", str(job.id)), cli.EXIT_INVALID_STATE, "leased")


def test_retry_unknown_job_is_not_found(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("retry", UNKNOWN_ID), cli.EXIT_NOT_FOUND)


def test_bulk_retry_of_dead_jobs_requeues_every_match_and_prints_the_count(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobrun.cli.actions.BULK_PAGE", 2)
    dead_ones = [dead(client, type="t.a").id for _ in range(3)]
    other = dead(client, type="t.b").id
    result = jobrun("retry", "--state", "dead", "--type", "t.a", "--yes")
    assert result.code == 0, result.err
    assert result.out == "retried 3 jobs\n"
    assert {client.get(i).state for i in dead_ones} == {State.QUEUED}
    assert client.get(other).state == State.DEAD
    assert jobrun("retry", "--state", "dead", "--json", "-y").json() == {"retried": 1, "skipped": 0}


def test_bulk_retry_of_leased_jobs_is_refused(
    jobrun: Callable[..., Result], client: Client
) -> None:
    client.enqueue("t.a")
    job = leased(client)
    assert_one_line_error(jobrun("retry", "--state", "leased"), cli.EXIT_INVALID_STATE, "leased")
    assert client.get(job.id).state == State.LEASED


# -- queues, purge ------------------------------------------------------------------------


def test_queues_pause_resume_and_list(jobrun: Callable[..., Result], client: Client) -> None:
    client.enqueue("t.a", queue="emails")
    result = jobrun("queues", "pause", "emails")
    assert (result.code, result.out) == (0, "queue emails paused\n")
    assert client.paused_queues() == ["emails"]
    assert jobrun("queues", "pause", "later", "--json").json() == {
        "queue": "later",
        "paused": True,
    }

    listed = jobrun("queues", "list", "--json").json()
    assert listed == [
        {"queue": "emails", "paused": True, "leased": 0, "limits": None},
        {"queue": "later", "paused": True, "leased": 0, "limits": None},
    ]
    table = jobrun("queues", "list").out
    assert "emails" in table
    assert "paused" in table

    assert jobrun("queues", "resume", "emails").out == "queue emails resumed\n"
    assert jobrun("queues", "resume", "emails").out == "queue emails was not paused\n"
    assert jobrun("queues", "resume", "later", "--json").json() == {
        "queue": "later",
        "paused": False,
        "was_paused": True,
    }
    assert jobrun("queues", "list", "--json").json() == [
        {"queue": "emails", "paused": False, "leased": 0, "limits": None}
    ]


def test_queues_without_an_action_is_a_usage_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("queues"), cli.EXIT_USAGE)


def test_queue_pause_with_invalid_name_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    assert_one_line_error(jobrun("queues", "pause", "no such!"), cli.EXIT_VALIDATION)


def test_purge_deletes_jobs_finished_longer_ago_and_prints_the_count(
    jobrun: Callable[..., Result], client: Client, conn: psycopg.Connection[Any]
) -> None:
    old = [client.cancel(client.enqueue("t.a").id).id for _ in range(2)]
    recent = client.cancel(client.enqueue("t.a").id).id
    queued = client.enqueue("t.a").id
    conn.execute(
        "UPDATE jobrun.jobs SET finished_at = now() - interval '10 days' WHERE id = ANY(%s)", [old]
    )
    result = jobrun("purge", "--older-than", "7d", "--yes")
    assert (result.code, result.out) == (0, "purged 2 jobs\n")
    assert {j.id for j in client.list()} == {recent, queued}
    assert jobrun("purge", "--older-than", "7d", "--json").json() == {"purged": 0}


def test_purge_with_invalid_duration_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    assert_one_line_error(jobrun("purge", "--older-than", "ages"), cli.EXIT_VALIDATION)


def test_purge_without_older_than_is_a_usage_error(jobrun: Callable[..., Result]) -> None:
    assert_one_line_error(jobrun("purge"), cli.EXIT_USAGE, "--older-than")


# -- schedules ----------------------------------------------------------------------------


def test_schedules_add_list_pause_resume_remove(
    jobrun: Callable[..., Result], client: Client
) -> None:
    added = jobrun(
        "schedules",
        "add",
        "nightly",
        "0 3 * * *",
        "report.build",
        '{"kind": "daily"}',
        "--tz",
        "Europe/Paris",
        "--queue",
        "reports",
        "--priority",
        "2",
        "--max-attempts",
        "4",
        "--json",
    )
    assert added.code == 0, added.err
    schedule = added.json()
    assert schedule["id"] == "nightly"
    assert schedule["timezone"] == "Europe/Paris"
    assert schedule["payload"] == {"kind": "daily"}
    assert (schedule["queue"], schedule["priority"], schedule["max_attempts"]) == ("reports", 2, 4)
    assert_utc_timestamp(schedule["next_run_at"])
    assert schedule["paused"] is False

    listed = jobrun("schedules", "list", "--json").json()
    assert [s["id"] for s in listed] == ["nightly"]
    table = jobrun("schedules", "list").out
    assert "nightly" in table
    assert "0 3 * * *" in table

    assert jobrun("schedules", "pause", "nightly").out == "schedule nightly paused (paused)\n"
    assert client.get_schedule("nightly").paused
    resumed = jobrun("schedules", "resume", "nightly", "--json").json()
    assert resumed["paused"] is False

    assert jobrun("schedules", "remove", "nightly").out == "schedule nightly removed\n"
    assert jobrun("schedules", "list", "--json").json() == []
    assert jobrun("schedules", "list").out == "no schedules\n"


def test_schedules_add_existing_id_is_a_conflict_unless_replace(
    jobrun: Callable[..., Result], client: Client
) -> None:
    assert jobrun("schedules", "add", "s1", "*/5 * * * *", "t.a").code == 0
    assert_one_line_error(
        jobrun("schedules", "add", "s1", "0 * * * *", "t.b"), cli.EXIT_CONFLICT, "s1"
    )
    replaced = jobrun("schedules", "add", "s1", "0 * * * *", "t.b", "--replace")
    assert replaced.code == 0, replaced.err
    assert "saved" in replaced.out
    stored = client.get_schedule("s1")
    assert (stored.cron, stored.type) == ("0 * * * *", "t.b")


def test_schedules_add_with_bad_cron_or_zone_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    assert_one_line_error(
        jobrun("schedules", "add", "s1", "every day", "t.a"), cli.EXIT_VALIDATION, "cron"
    )
    assert_one_line_error(
        jobrun("schedules", "add", "s1", "0 3 * * *", "t.a", "--tz", "Mars/Olympus"),
        cli.EXIT_VALIDATION,
    )
    assert_one_line_error(
        jobrun("schedules", "add", "s1", "0 3 * * *", "t.a", "[1,"), cli.EXIT_VALIDATION, "JSON"
    )


def test_schedules_acting_on_unknown_id_is_not_found(jobrun: Callable[..., Result]) -> None:
    for action in ("remove", "pause", "resume"):
        assert_one_line_error(jobrun("schedules", action, "nope"), cli.EXIT_NOT_FOUND, "nope")


# -- database errors and secrets ----------------------------------------------------------


def test_unreachable_database_exits_6_for_every_kind_of_command(
    jobrun: Callable[..., Result],
) -> None:
    url = f"postgresql://postgres@127.0.0.1:{embedded.free_port()}/jobrun"
    for args in (("list",), ("enqueue", "t.a"), ("migrate",), ("schedules", "list")):
        assert_one_line_error(jobrun(*args, database_url=url), cli.EXIT_UNAVAILABLE)


def test_password_in_database_url_never_reaches_stderr(jobrun: Callable[..., Result]) -> None:
    secret = "Sup3r-s3cret-pw"
    closed = f"postgresql://app:{secret}@127.0.0.1:{embedded.free_port()}/app"
    for args in (("get", UNKNOWN_ID), ("migrate",), ("depth", "--json")):
        result = jobrun(*args, database_url=closed)
        assert_one_line_error(result, cli.EXIT_UNAVAILABLE)
        assert secret not in result.err
    for unparseable in (
        f"postgresql://app:{secret}@[::1/app",
        f"postgresql://app:{secret}@127.0.0.1/app?bogus_option=1",
    ):
        result = jobrun("depth", database_url=unparseable)
        assert_one_line_error(result, cli.EXIT_VALIDATION, "DATABASE_URL")
        assert secret not in result.err


def test_password_in_a_working_database_url_is_not_echoed_on_errors(
    dsn: str, jobrun: Callable[..., Result]
) -> None:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    secret = "n0t-ech0ed"
    url = (
        f"postgresql://{params['user']}:{secret}@{params['host']}:{params['port']}"
        f"/{params['dbname']}"
    )
    result = jobrun("get", UNKNOWN_ID, database_url=url)
    if result.code == cli.EXIT_NOT_FOUND:  # trust auth on loopback: the password is ignored
        assert secret not in result.err
    else:  # a server that checks passwords refuses this one
        assert result.code == cli.EXIT_UNAVAILABLE
        assert secret not in result.err


# -- worker and scheduler configuration (no process started) ------------------------------


def test_worker_app_must_name_a_registry(jobrun: Callable[..., Result]) -> None:
    result = jobrun("worker", "--app", "tests.acceptance.apps.touch:not_a_registry")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "not a jobrun Registry")
    result = jobrun("worker", "--app", "tests.acceptance.apps.touch:missing")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "no attribute 'missing'")
    result = jobrun("worker", "--app", "tests.acceptance.apps.touch")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "MODULE:REGISTRY")


def test_worker_app_module_that_does_not_exist_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun("worker", "--app", "no_such_module_anywhere:registry")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "no_such_module_anywhere")


def test_worker_app_is_imported_from_the_current_directory(
    jobrun: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_cwd_app.py").write_text("registry = 'just a string'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "cli_cwd_app", raising=False)
    try:
        result = jobrun("worker", "--app", "cli_cwd_app:registry")
    finally:
        sys.modules.pop("cli_cwd_app", None)
    assert_one_line_error(result, cli.EXIT_VALIDATION, "cli_cwd_app:registry is a str")


def test_worker_app_that_fails_to_import_is_reported_in_one_line(
    jobrun: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "cli_broken_app.py").write_text("raise RuntimeError('app is broken')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    monkeypatch.delitem(sys.modules, "cli_broken_app", raising=False)
    result = jobrun("worker", "--app", "cli_broken_app:registry")
    assert_one_line_error(result, cli.EXIT_ERROR, "RuntimeError", "app is broken")


def _broken_app(where: Path) -> tuple[Path, Path]:
    """An app whose import fails two modules deep, in a function of its own."""
    app = where / "cli_failing_app.py"
    helper = where / "cli_failing_settings.py"
    app.write_text("import cli_failing_settings\n\nregistry = None\n")
    helper.write_text(
        "def load():\n    raise KeyError('SECRET_KEY is not set')\n\n\nSETTINGS = load()\n"
    )
    return app, helper


def _run_in(where: Path, dsn: str, *args: str) -> Result:
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", *args],
        env={**_env(dsn), "PYTHONPATH": str(ROOT)},
        cwd=where,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def test_worker_app_that_fails_to_import_shows_its_own_frames_at_debug_level(
    dsn: str, tmp_path: Path
) -> None:
    app, helper = _broken_app(tmp_path)
    result = _run_in(
        tmp_path, dsn, "worker", "--app", "cli_failing_app:registry", "--log-level", "debug"
    )
    assert result.code == cli.EXIT_ERROR, result
    lines = result.err.splitlines()
    assert lines[-1] == (
        "jobrun: importing cli_failing_app failed: KeyError: 'SECRET_KEY is not set'"
    )
    assert lines[0] == "Traceback (most recent call last):"
    frames = [line.strip() for line in lines if line.strip().startswith("File ")]
    assert frames == [
        f'File "{app}", line 1, in <module>',
        f'File "{helper}", line 5, in <module>',
        f'File "{helper}", line 2, in load',
    ]
    assert "raise KeyError('SECRET_KEY is not set')" in result.err  # the source line
    assert lines[-2] == "KeyError: 'SECRET_KEY is not set'"
    assert result.out == ""


def test_worker_app_that_fails_to_import_says_in_one_line_how_to_see_where(
    dsn: str, tmp_path: Path
) -> None:
    _broken_app(tmp_path)
    result = _run_in(tmp_path, dsn, "worker", "--app", "cli_failing_app:registry")
    assert_one_line_error(result, cli.EXIT_ERROR, "KeyError", "SECRET_KEY", "--log-level debug")


@pytest.mark.parametrize(
    ("flag", "value", "field"),
    [
        ("--lease-ttl", "long", "--lease-ttl"),
        ("--concurrency", "0", "concurrency"),
        ("--claim-ahead", "-1", "claim_ahead"),
        ("--queues", "a=zero", "queues"),
        ("--retention", "a week", "--retention"),
        ("--commit-timeout", "-", "--commit-timeout"),
    ],
)
def test_worker_with_invalid_settings_is_a_validation_error(
    jobrun: Callable[..., Result], flag: str, value: str, field: str
) -> None:
    result = jobrun("worker", "--app", APP, flag, value)
    assert_one_line_error(result, cli.EXIT_VALIDATION, field)


def test_worker_settings_come_from_flags_over_the_environment(
    jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class FakeRuntime:
        worker = None

        def __init__(self, settings: Any, registry: Any, **kwargs: Any) -> None:
            seen.update(settings=settings, registry=registry, **kwargs)

        def run(self) -> None:
            seen["ran"] = True

    monkeypatch.setattr("jobrun.runtime.Runtime", FakeRuntime)
    monkeypatch.setenv("WORKER_CONCURRENCY", "3")
    monkeypatch.setenv("JOBRUN_POLL_INTERVAL", "2s")
    monkeypatch.setenv("JOBRUN_RETENTION", "1d")
    monkeypatch.setenv("JOBRUN_CLAIM_AHEAD", "0")
    result = jobrun(
        "worker",
        "--claim-ahead",
        "auto",
        "--app",
        APP,
        "--queues",
        "emails=4,default",
        "--lease-ttl",
        "45s",
        "--heartbeat-interval",
        "3s",
        "--shutdown-grace",
        "1m",
        "--commit-timeout",
        "off",
        "--retention",
        "off",
        "--events-retention",
        "2d",
        "--no-notifications",
        "--no-scheduler",
        "--log-level",
        "warning",
    )
    assert result.code == 0, result.err
    settings = seen["settings"]
    assert settings.concurrency == 3  # from the environment
    assert settings.poll_interval == dt.timedelta(seconds=2)
    assert dict(settings.queues) == {"emails": 4, "default": None}
    assert settings.lease_ttl == dt.timedelta(seconds=45)
    assert settings.heartbeat_interval == dt.timedelta(seconds=3)
    assert settings.shutdown_grace == dt.timedelta(minutes=1)
    assert settings.commit_timeout is None
    assert settings.retention is None  # the flag's "off" beats the environment
    assert settings.events_retention == dt.timedelta(days=2)
    assert settings.notifications is False
    assert settings.claim_ahead is None  # the flag's "auto" beats the environment's 0
    assert seen["scheduler"] is False
    assert seen["registry"] is touch_app.registry
    assert seen["ran"] is True


def test_scheduler_runs_without_a_worker(
    jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    class FakeRuntime:
        def __init__(self, settings: Any, registry: Any, **kwargs: Any) -> None:
            seen.update(settings=settings, registry=registry, **kwargs)

        def run(self) -> None:
            seen["ran"] = True

    monkeypatch.setattr("jobrun.runtime.Runtime", FakeRuntime)
    result = jobrun("scheduler", "--events-retention", "off")
    assert result.code == 0, result.err
    assert seen["registry"] is None
    assert seen["worker"] is False
    assert seen["settings"].events_retention is None
    assert seen["ran"] is True


def test_scheduler_app_module_must_exist(jobrun: Callable[..., Result]) -> None:
    result = jobrun("scheduler", "--app", "no_such_module_anywhere")
    assert_one_line_error(result, cli.EXIT_VALIDATION, "no_such_module_anywhere")


# -- demo, embedded -----------------------------------------------------------------------


def test_demo_says_so_when_it_is_not_available(
    jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "jobrun.demo", None)  # importing it now fails
    assert_one_line_error(jobrun("demo"), cli.EXIT_ERROR, "demo is not available")


def test_demo_gets_its_own_options_and_the_database_url(
    dsn: str, jobrun: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[Any, str]] = []
    demo = types.ModuleType("jobrun.demo")

    def add_arguments(parser: Any) -> None:
        parser.add_argument("--jobs", type=int, default=10)

    def run(args: Any, database_url: str) -> int:
        calls.append((args, database_url))
        return 0

    demo.add_arguments = add_arguments  # type: ignore[attr-defined]
    demo.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "jobrun.demo", demo)

    assert jobrun("demo", "--jobs", "3").code == 0
    ((args, url),) = calls
    assert args.jobs == 3
    assert url == dsn
    assert_one_line_error(jobrun("demo", "--nope"), cli.EXIT_USAGE, "--nope")
    assert jobrun("demo", "--help").code == 0


def test_embedded_status_when_no_cluster_runs(
    jobrun: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "default_home", lambda: tmp_path)
    result = jobrun("embedded", "status", database_url=None)
    assert result.code == 0, result.err
    assert result.out.startswith("not running")
    status = jobrun("embedded", "status", "--json", database_url=None).json()
    assert status == {
        "running": False,
        "url": None,
        "datadir": str(tmp_path / "data"),
        "initialised": False,
    }


def test_embedded_stop_when_no_cluster_runs_does_nothing(
    jobrun: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedded, "default_home", lambda: tmp_path)
    result = jobrun("embedded", "stop", "--json", database_url=None)
    assert result.code == 0, result.err
    assert result.json()["stopped"] is False


# -- output helpers -----------------------------------------------------------------------


def test_exit_codes_are_distinct() -> None:
    codes = [
        cli.EXIT_OK,
        cli.EXIT_ERROR,
        cli.EXIT_USAGE,
        cli.EXIT_NOT_FOUND,
        cli.EXIT_CONFLICT,
        cli.EXIT_INVALID_STATE,
        cli.EXIT_UNAVAILABLE,
        cli.EXIT_VALIDATION,
    ]
    assert codes == list(range(8))
