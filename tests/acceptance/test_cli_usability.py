"""The first hour with the ``jobrun`` command: version, help, readable tables, clear errors.

Against a real PostgreSQL; the terminal-width tests run ``python -m jobrun``
as a real process (in a pipe with COLUMNS, and on a real pseudo-terminal).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import fcntl
import importlib.metadata
import json
import os
import pty
import random
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jobrun import cli
from jobrun.client import Client
from jobrun.config import _ENV as SETTINGS_ENV
from jobrun.job.model import Job, NewJob, State
from jobrun.job.validate import MIN_PRIORITY
from jobrun.postgres import embedded

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.acceptance.apps.touch:registry"
TTL = dt.timedelta(seconds=30)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


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
    for var in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL", "COLUMNS"):
        monkeypatch.delenv(var, raising=False)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test tried to start the embedded PostgreSQL")

    monkeypatch.setattr(embedded, "ensure_embedded", refuse)
    monkeypatch.setattr("jobrun.postgres.connect.ensure_embedded", refuse)


@pytest.fixture
def jobrun(dsn: str, capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``jobrun(*args)``: the command in this process, against the test's database."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = cli.main([*args, "--database-url", dsn])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client.connect(dsn) as c:
        yield c


def _env(dsn: str | None, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL", "COLUMNS")
    }
    if dsn is not None:
        env["DATABASE_URL"] = dsn
    env.update(extra)
    return env


def run_process(dsn: str | None, *args: str, **env: str) -> Result:
    """``python -m jobrun ARGS`` in a pipe."""
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun", *args],
        env=_env(dsn, **env),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


def run_on_terminal(dsn: str, *args: str, columns: int) -> str:
    """``python -m jobrun ARGS`` with stdout on a pseudo-terminal ``columns`` wide."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobrun", *args],
        env=_env(dsn, TERM="xterm"),
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                try:
                    data = os.read(leader, 65536)
                except OSError:  # EIO: the terminal closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        assert proc.wait(timeout=10) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(leader)
        if proc.stderr:
            proc.stderr.close()
    text = b"".join(chunks).decode()
    return ANSI.sub("", text).replace("\r\n", "\n")


def leased(client: Client, queue: str = "default") -> Job:
    (job,) = client.store.claim("test-worker", [queue], 1, TTL)
    return job


# -- version, python -m jobrun, help ------------------------------------------------------


def test_python_m_jobrun_prints_the_installed_version() -> None:
    result = run_process(None, "--version")
    assert result.code == 0, result.err
    assert result.out == f"jobrun {importlib.metadata.version('jobrun')}\n"


def test_python_m_jobrun_runs_commands(dsn: str) -> None:
    enqueued = run_process(dsn, "enqueue", "t.a", "--json")
    assert enqueued.code == 0, enqueued.err
    listed = run_process(dsn, "list", "--json")
    assert [j["id"] for j in json.loads(listed.out)] == [enqueued.json()["id"]]


def _parsers(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def _arguments() -> Iterator[tuple[str, argparse.Action]]:
    for path, parser in _parsers(cli.build_parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
                name = action.option_strings[-1] if action.option_strings else action.dest
                yield " ".join(("jobrun", *path, name)), action


def test_every_argument_of_every_command_has_help_text() -> None:
    arguments = list(_arguments())
    assert len(arguments) > 100  # every subcommand was walked
    missing = [where for where, a in arguments if not a.help or a.help == argparse.SUPPRESS]
    assert missing == []


def test_every_setting_flag_shows_its_default_and_its_environment_variable() -> None:
    var_of = {field: var for var, (field, _parse) in SETTINGS_ENV.items()}
    named: set[str] = set()
    for where, action in _arguments():
        field = action.dest.removeprefix("no_")
        if field not in var_of or not action.option_strings:
            continue
        assert f"; env {var_of[field]})" in str(action.help), where
        assert "(default: " in str(action.help), where
        named.add(var_of[field])
    assert named == set(SETTINGS_ENV)  # every variable of jobrun.config has its flag


def test_options_with_a_default_show_it() -> None:
    for where, action in _arguments():
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
            assert f"(default: {action.default})" in str(action.help), where


def test_worker_help_shows_durations_with_their_defaults_and_variables(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # argparse wraps help at the terminal width
    assert cli.main(["worker", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for flag, text in (
        ("--lease-ttl", "(default: 30s; env JOBRUN_LEASE_TTL)"),
        ("--heartbeat-interval", "(default: 5s; env JOBRUN_HEARTBEAT_INTERVAL)"),
        ("--poll-interval", "(default: 1s; env JOBRUN_POLL_INTERVAL)"),
        ("--shutdown-grace", "(default: 30s; env JOBRUN_SHUTDOWN_GRACE)"),
        ("--retention", "(default: 7d; env JOBRUN_RETENTION)"),
        ("--concurrency", "(default: 10; env JOBRUN_CONCURRENCY)"),
        ("--claim-ahead", "(default: 0; env JOBRUN_CLAIM_AHEAD)"),
    ):
        entry = out.split(f" {flag} ", 1)[1].split(" --", 1)[0]  # the flag's own help
        assert entry.endswith(text), entry


# -- jobrun list ---------------------------------------------------------------------------


def _assorted_jobs(client: Client) -> list[Job]:
    """Jobs in every state, with names and an error as long as real ones."""
    dead = client.enqueue("email.send", queue="emails", max_attempts=1, priority=MIN_PRIORITY)
    failed = client.store.fail(leased(client, "emails"), "SMTP 550: mailbox unavailable " * 9, None)
    assert failed.id == dead.id
    running = client.enqueue("report.build", queue="reports")
    leased(client, "reports")
    stopping = client.enqueue("report.build", queue="reports")
    leased(client, "reports")
    client.cancel(stopping.id)
    cancelled = client.enqueue("thumbnail.make", queue="images")
    client.cancel(cancelled.id)
    later = client.enqueue("invoice.send", queue="billing", delay=dt.timedelta(hours=2))
    return [client.get(j.id) for j in (dead, running, stopping, cancelled, later)]


def _assert_one_readable_line_per_job(out: str, jobs: list[Job], width: int) -> None:
    lines = out.rstrip("\n").split("\n")
    too_long = [line for line in lines if len(line) > width]
    assert too_long == [], out
    assert len(lines) == 1 + len(jobs) + 1, out  # header, one line per job, the count
    for job in jobs:
        (line,) = [line for line in lines if str(job.id).startswith(line.split()[0])]
        state = "cancelling" if job.cancel_requested else str(job.state)
        for text in (job.queue, job.type, state, f"{job.attempts}/{job.max_attempts}"):
            assert re.search(rf"(^|\s){re.escape(text)}(\s|$)", line), (text, line)


@pytest.mark.parametrize("width", [80, 120])
def test_list_keeps_one_readable_line_per_job_at_the_width_of_columns(
    dsn: str, client: Client, width: int
) -> None:
    jobs = _assorted_jobs(client)
    result = run_process(dsn, "list", COLUMNS=str(width))
    assert result.code == 0, result.err
    _assert_one_readable_line_per_job(result.out, jobs, width)
    if width == 120:
        assert "run_at" in result.out.splitlines()[0]
        assert "SMTP 550" in result.out


def test_list_keeps_one_readable_line_per_job_on_an_80_column_terminal(
    dsn: str, client: Client
) -> None:
    jobs = _assorted_jobs(client)
    _assert_one_readable_line_per_job(run_on_terminal(dsn, "list", columns=80), jobs, 80)


def test_list_cuts_long_queue_and_type_names_to_stay_on_one_line(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = client.enqueue("a.rather.long.job.type.name", queue="a-rather-long-queue-name")
    monkeypatch.setenv("COLUMNS", "80")
    result = jobrun("list")
    (line,) = [line for line in result.out.splitlines()[1:-1]]  # a short id at 80 columns
    assert str(job.id).startswith(line.split()[0])
    assert len(line) <= 80
    assert "…" in line
    assert re.search(r"\squeued\s+0/25$", line), line


def test_list_shows_the_newest_jobs_first(jobrun: Callable[..., Result], client: Client) -> None:
    ids = [str(client.enqueue("t.a").id) for _ in range(3)]
    assert [j["id"] for j in jobrun("list", "--json").json()] == ids[::-1]
    out = jobrun("list").out
    rows = [line.split()[0] for line in out.splitlines()[1:-1]]
    assert rows == ids[::-1]
    assert out.splitlines()[-1] == "3 jobs, newest first"


def test_list_pages_back_in_time_with_before(jobrun: Callable[..., Result], client: Client) -> None:
    ids = [str(client.enqueue("t.a").id) for _ in range(5)]
    first = jobrun("list", "--limit", "2")
    assert first.out.splitlines()[-1] == f"2 jobs, newest first; older: --before {ids[3]}"
    page1 = jobrun("list", "--limit", "2", "--json").json()
    page2 = jobrun("list", "--limit", "2", "--before", ids[3], "--json").json()
    page3 = jobrun("list", "--limit", "2", "--before", ids[1], "--json").json()
    assert [j["id"] for j in page1 + page2 + page3] == ids[::-1]
    assert jobrun("list", "--limit", "2", "--before", ids[1]).out.splitlines()[-1] == (
        "1 job, newest first"
    )


def test_list_with_a_malformed_before_is_a_validation_error(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun("list", "--before", "yesterday")
    assert result.code == cli.EXIT_VALIDATION
    assert "--before" in result.err


def test_list_before_with_oldest_or_after_is_a_usage_error_naming_each_order(
    jobrun: Callable[..., Result], client: Client
) -> None:
    job_id = str(client.enqueue("t.a").id)
    for extra in (("--oldest",), ("--after", job_id)):
        result = jobrun("list", "--before", job_id, *extra)
        assert result.code == cli.EXIT_USAGE
        assert "--before pages newest first, --after and --oldest oldest first" in result.err


def _v7(ms: int, rng: random.Random) -> uuid.UUID:
    """A version-7 UUID at the Unix time ``ms`` (milliseconds)."""
    rand = rng.getrandbits(74)
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) << 64) | (0b10 << 62) | (rand & (2**62 - 1))
    return uuid.UUID(int=value)


def test_newest_jobs_are_the_highest_ids_however_their_times_are_spread(client: Client) -> None:
    rng = random.Random(11)
    now = time.time_ns() // 1_000_000
    year = 365 * 86_400_000
    times = (
        [now - 20 * year + i for i in range(5)]  # long ago
        + [now - year] * 300  # a burst within one millisecond
        + [now - rng.randrange(3_600_000) for _ in range(60)]  # the last hour
        + [now + 86_400_000 * d for d in (1, 2)]  # a fast clock
    )
    ids = [_v7(ms, rng) for ms in times] + [uuid.uuid4() for _ in range(4)]
    states = [State.QUEUED] * len(ids)
    client.enqueue_batch(NewJob(type="t.a", id=job_id) for job_id in ids)
    for job_id in rng.sample(ids, 40):
        client.cancel(job_id)
        states[ids.index(job_id)] = State.CANCELLED
    highest = sorted(ids, reverse=True)
    for count in (1, 7, 50, 120, 400):
        for before in (None, highest[3], highest[70], highest[300], highest[-2]):
            below = [i for i in highest if before is None or i < before]
            got = cli.newest_jobs(client, {}, count, before)
            assert [j.id for j in got] == below[:count], (count, before)
        cancelled = [i for i in highest if states[ids.index(i)] == State.CANCELLED]
        got = cli.newest_jobs(client, {"state": State.CANCELLED}, count)
        assert [j.id for j in got] == cancelled[:count]


# -- jobrun events -------------------------------------------------------------------------


def test_events_prints_one_readable_line_per_event(
    jobrun: Callable[..., Result], client: Client
) -> None:
    job = client.enqueue("t.fail", max_attempts=2, priority=MIN_PRIORITY)
    client.store.fail(leased(client), "boom\nsecond line", None)
    client.store.fail(leased(client), "boom again", None)
    result = jobrun("events", str(job.id))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    kinds = [line.split()[1] for line in lines]
    assert kinds == ["enqueued", "claimed", "retrying", "claimed", "dead"]
    for line in lines:
        dt.datetime.fromisoformat(line.split()[0])
        assert "{" not in line
        assert '"' not in line
    assert "attempt" not in lines[0]
    assert re.search(r"retrying\s+attempt 1\s+via=fail error: boom second line$", lines[2])
    assert re.search(r"dead\s+attempt 2\s+via=fail error: boom again$", lines[4])
    events = jobrun("events", str(job.id), "--json").json()  # the machine form is unchanged
    assert events[-1]["detail"] == {"via": "fail", "error": "boom again", "permanent": False}


def test_events_fit_the_terminal_width(
    jobrun: Callable[..., Result], client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = client.enqueue("t.fail", max_attempts=1, priority=MIN_PRIORITY)
    client.store.fail(leased(client), "x" * 500, None)
    monkeypatch.setenv("COLUMNS", "80")
    lines = jobrun("events", str(job.id)).out.splitlines()
    assert len(lines) == 3
    assert all(len(line) <= 80 for line in lines)
    assert lines[-1].endswith("x…")


# -- jobrun schedules add -----------------------------------------------------------------


def test_schedules_add_existing_id_says_how_to_replace_it(
    jobrun: Callable[..., Result],
) -> None:
    assert jobrun("schedules", "add", "nightly", "0 3 * * *", "t.a").code == 0
    result = jobrun("schedules", "add", "nightly", "0 4 * * *", "t.a")
    assert result.code == cli.EXIT_CONFLICT
    assert result.err.startswith("jobrun: schedule 'nightly' already exists")
    assert "--replace" in result.err
    assert "jobrun schedules remove nightly" in result.err


def test_schedules_add_warns_when_no_handler_of_the_app_knows_the_type(
    jobrun: Callable[..., Result], client: Client
) -> None:
    result = jobrun("schedules", "add", "s1", "@hourly", "email.send", "--app", APP)
    assert result.code == 0, result.err
    assert result.err.startswith("jobrun: warning: ")
    assert "'email.send'" in result.err
    assert "touch" in result.err  # what the registry does handle
    assert client.get_schedule("s1").type == "email.send"  # created all the same


def test_schedules_add_says_nothing_when_the_app_handles_the_type_or_no_app_is_given(
    jobrun: Callable[..., Result],
) -> None:
    handled = jobrun("schedules", "add", "s1", "@hourly", "touch", "--app", APP)
    assert (handled.code, handled.err) == (0, "")
    unknown = jobrun("schedules", "add", "s2", "@hourly", "email.send")
    assert (unknown.code, unknown.err) == (0, "")


def test_schedules_add_with_an_app_that_is_not_a_registry_is_a_validation_error(
    jobrun: Callable[..., Result], client: Client
) -> None:
    result = jobrun("schedules", "add", "s1", "@hourly", "touch", "--app", "tests.nope:registry")
    assert result.code == cli.EXIT_VALIDATION
    assert "--app" in result.err
    assert client.list_schedules() == []


def test_schedules_add_accepts_an_alias_and_lists_it_as_written(
    jobrun: Callable[..., Result], client: Client
) -> None:
    result = jobrun("schedules", "add", "daily", "@daily", "t.a", "--tz", "Europe/Paris", "--json")
    assert result.code == 0, result.err
    next_run = dt.datetime.fromisoformat(result.json()["next_run_at"])
    local = next_run.astimezone(zoneinfo.ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (0, 0)
    assert client.get_schedule("daily").cron == "@daily"


def test_schedules_add_with_a_field_out_of_range_names_the_range(
    jobrun: Callable[..., Result],
) -> None:
    result = jobrun("schedules", "add", "s1", "61 * * * *", "t.a")
    assert result.code == cli.EXIT_VALIDATION
    assert "minute must be 0-59, got 61" in result.err
