"""The first hour as a user (issue 11): connecting, one Settings, embedding a worker,
the schema setting, and failing fast on a missing or old schema.

Real PostgreSQL and real processes throughout: the ``jobrun`` command runs as
``python -m jobrun.cli`` where the exit code, stderr and timing matter, and
in-process (``cli.main``) where only its output does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun import cli
from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import SchemaMismatch, ValidationError
from jobrun.job.model import Job, NewJob, State
from jobrun.postgres import embedded
from jobrun.postgres.migrate import migrate
from jobrun.postgres.pool import open_pool
from jobrun.postgres.schema import SCHEMA_VERSION
from jobrun.postgres.store import Store
from jobrun.runtime import Runtime
from jobrun.testing import run_jobs
from jobrun.worker import JobContext, Registry
from tests.acceptance.embedded_home import EmbeddedHome, embedded_home
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
TOUCH_APP = "tests.acceptance.apps.touch:registry"
AMBIENT = (
    "DATABASE_URL",
    "JOB_EVENTS",
    "JOBRUN_JOB_EVENTS",
    "JOBRUN_NOTIFY_CHANNEL",
    "JOBRUN_SCHEMA",
    "WORKER_CONCURRENCY",
    "JOBRUN_CONCURRENCY",
    "JOBRUN_CLAIM_AHEAD",
    "JOBRUN_QUEUES",
    "COLUMNS",
)
FAST = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=500),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}
QUICKLY = 20.0
"""Seconds within which a process on an unmigrated database has exited (it used to run forever)."""


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str
    seconds: float = 0.0


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient configuration, and never the real user's embedded PostgreSQL in-process."""
    for var in AMBIENT:
        monkeypatch.delenv(var, raising=False)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test tried to start the embedded PostgreSQL")

    monkeypatch.setattr(embedded, "ensure_embedded", refuse)
    monkeypatch.setattr("jobrun.postgres.connect.ensure_embedded", refuse)
    monkeypatch.setattr("jobrun.cli.processes._configure_logging", lambda *args, **kwargs: None)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in AMBIENT}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def run_process(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    """``python -m jobrun.cli ARGS``, to its end (or ``timeout``)."""
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", *args],
        env=env or _env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


@pytest.fixture
def jobrun_cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """``jobrun_cli(*args)``: the command in this process."""

    def run(*args: str) -> Result:
        capsys.readouterr()
        code = cli.main(list(args))
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def assert_schema_line(result: Result, *fragments: str) -> None:
    """Exit code 8 and one line on stderr naming the problem and the fix; no traceback."""
    assert result.code == cli.EXIT_SCHEMA == 8, result
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("jobrun: "), result.err
    assert "Traceback" not in result.err + result.out
    for fragment in fragments:
        assert fragment in lines[0], result.err


def touch_registry() -> Registry:
    registry = Registry()

    @registry.handler("touch")
    def touch(ctx: JobContext, job: Job) -> None:
        Path(job.payload["path"]).write_text(str(job.id))

    return registry


# -- connecting: DATABASE_URL, else the embedded database --------------------------------


def test_client_connect_without_an_argument_uses_database_url(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", dsn)
    with Client.connect() as client:
        job = client.enqueue("hello")
        assert client.get(job.id).state is State.QUEUED
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT type FROM jobrun.jobs WHERE id = %s", [job.id]).fetchone()
    assert row == ("hello",)
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nowhere")
    with Client.connect(dsn) as client:  # an explicit URL wins
        assert client.get(job.id).type == "hello"


@pytest.fixture
def home() -> Iterator[EmbeddedHome]:
    with embedded_home() as h:
        yield h


CONNECT_WITH_NOTHING = """
import jobrun
with jobrun.Client.connect() as client:
    job = client.enqueue("hello", queue="first-hour")
    print(job.id)
"""


@pytest.mark.slow
def test_client_connect_with_neither_uses_the_embedded_database_and_says_so(
    home: EmbeddedHome,
) -> None:
    assert home.jobrun("migrate").code == 0  # the embedded cluster, migrated by the CLI
    proc = subprocess.run(
        [sys.executable, "-c", CONNECT_WITH_NOTHING],
        env=home.env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stderr.splitlines()
    assert len(said) == 1, proc.stderr  # Python prints a library WARNING when nothing is set up
    assert "no DATABASE_URL" in said[0]
    assert "embedded PostgreSQL" in said[0]
    assert str(home.path / "data") in said[0]
    listed = home.jobrun("list", "--queue", "first-hour", "--json")
    assert [j["id"] for j in json.loads(listed.out)] == [proc.stdout.strip()]


def test_the_embedded_fallback_of_the_library_is_a_logging_warning(
    dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Cluster:
        datadir = Path("/somewhere/data")

        def url(self, dbname: str) -> str:
            return dsn

    monkeypatch.setattr("jobrun.postgres.connect.ensure_embedded", lambda: (Cluster(), True))
    with caplog.at_level(logging.WARNING, logger="jobrun"), Client.connect() as client:
        assert client.depth() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert warnings[0].name == "jobrun"
    assert "no DATABASE_URL" in warnings[0].getMessage()
    assert "started the embedded PostgreSQL" in warnings[0].getMessage()


# -- run_jobs -----------------------------------------------------------------------------


def test_run_jobs_runs_every_queue_unless_told_otherwise(store: Store) -> None:
    registry = Registry()
    ran: list[str] = []

    @registry.handler("note")
    def note(ctx: JobContext, job: Job) -> None:
        ran.append(job.queue)

    @registry.handler("fan_out")
    def fan_out(ctx: JobContext, job: Job) -> None:
        ran.append(job.queue)
        Client(store).enqueue("note", queue="follow-ups")  # a queue that was empty at first

    client = Client(store)
    client.enqueue("note", queue="emails")
    client.enqueue("note")
    client.enqueue("fan_out", queue="reports")
    later = client.enqueue("note", queue="later", delay=dt.timedelta(hours=1))

    report = run_jobs(client, registry)
    assert report.ran == 4
    assert report.succeeded == 4
    assert sorted(ran) == ["default", "emails", "follow-ups", "reports"]
    assert client.get(later.id).state is State.QUEUED  # not runnable yet: left alone

    emails = client.enqueue("note", queue="emails")
    default = client.enqueue("note")
    assert run_jobs(client, registry, queues=["emails"]).ran == 1  # told otherwise
    assert client.get(emails.id).state is State.SUCCEEDED
    assert client.get(default.id).state is State.QUEUED


def test_run_jobs_stops_at_max_jobs_across_queues(store: Store) -> None:
    registry = Registry()
    registry.register("note", lambda ctx, job: None)
    client = Client(store)
    for queue in ("a", "b", "c"):
        client.enqueue("note", queue=queue)
    assert run_jobs(client, registry, max_jobs=2).ran == 2
    assert run_jobs(client, registry).ran == 1


# -- one name for the batch call ------------------------------------------------------------


def test_the_batch_call_is_enqueue_batch_on_the_client_as_on_the_store(store: Store) -> None:
    client = Client(store)
    result = client.enqueue_batch(NewJob(type="t", queue="batch") for _ in range(3))
    assert result.inserted == 3
    # enqueue_many is the columnar form (a type and its payloads): NewJobs given
    # to it are told where they go, before anything is written.
    with pytest.raises(ValidationError, match="enqueue_batch"):
        client.enqueue_many([NewJob(type="t")], [{}])  # type: ignore[arg-type]
    assert client.enqueue_many("t", [{}, {}]).inserted == 2


# -- one Settings for the client and the worker ---------------------------------------------


def test_settings_read_jobrun_schema_and_name_it_when_invalid() -> None:
    assert Settings.from_env({}).schema == "jobrun"
    assert Settings.from_env({"JOBRUN_SCHEMA": "acme_jobs"}).schema == "acme_jobs"
    for bad in ("Acme", "acme-jobs", "pg_jobs", "public", "x" * 64):
        with pytest.raises(ValidationError) as caught:
            Settings.from_env({"JOBRUN_SCHEMA": bad})
        assert caught.value.field == "JOBRUN_SCHEMA"


def test_a_client_built_from_settings_uses_every_store_setting(dsn: str) -> None:
    settings = Settings(
        database_url=dsn,
        job_events="terminal",
        notify_channel="acme_wakeups",
        commit_timeout=dt.timedelta(seconds=7),
        call_timeout=None,
    )
    with Client.connect(settings=settings) as client:
        store = client.store
        assert (store.event_mode.value, store.notify_channel) == ("terminal", "acme_wakeups")
        assert store.commit_timeout == dt.timedelta(seconds=7)
        assert store.call_timeout is None
        assert store.schema == "jobrun"


def test_client_and_worker_from_one_settings_agree_on_the_notify_channel(dsn: str) -> None:
    # Polling every 30 s: a job that runs within a few seconds was announced on
    # the channel the worker listens to.
    settings = Settings(
        database_url=dsn,
        notify_channel="acme_wakeups",
        **{**FAST, "poll_interval": dt.timedelta(seconds=30)},
    )
    done = threading.Event()
    registry = Registry()
    registry.register("wake", lambda ctx, job: done.set())
    with Runtime(settings, registry, scheduler=False) as runtime:
        notifier = runtime.notifier
        assert notifier is not None and notifier.wait_connected(10)
        time.sleep(0.5)  # the worker's first (empty) claim is behind it: it now waits
        with Client.connect(settings=settings) as client:
            enqueued = time.monotonic()
            client.enqueue("wake")
        assert done.wait(10), "the worker was not woken by the client's enqueue"
        assert time.monotonic() - enqueued < 10


# -- embedding a worker -----------------------------------------------------------------------


def test_runtime_without_a_database_url_raises_naming_the_setting() -> None:
    with pytest.raises(ValidationError) as caught:
        Runtime(Settings(), Registry())
    assert caught.value.field == "DATABASE_URL"
    assert "embedded" in str(caught.value)  # it says why it did not fall back


def test_runtime_as_a_context_manager_runs_a_job_and_stops_without_touching_signals(
    dsn: str, tmp_path: Path
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    marker = tmp_path / "ran"
    with Runtime(Settings(database_url=dsn, **FAST), touch_registry()) as runtime:
        assert {s: signal.getsignal(s) for s in before} == before
        with Client.connect(dsn) as client:
            job = client.enqueue("touch", {"path": str(marker)})
            wait_for(lambda: client.get(job.id).state is State.SUCCEEDED)
        worker = runtime.worker
        assert worker is not None
    assert marker.read_text() == str(job.id)
    assert {s: signal.getsignal(s) for s in before} == before
    assert not any(t.is_alive() for t in worker._threads)
    assert runtime.stop() is True  # safe to call twice
    assert runtime.stop(timeout=0) is True
    with pytest.raises(RuntimeError, match="stopped"):
        runtime.start()


def test_runtime_run_without_signals_returns_when_stopped_from_another_thread(
    dsn: str, tmp_path: Path
) -> None:
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    runtime = Runtime(Settings(database_url=dsn, **FAST), touch_registry())
    returned = threading.Event()

    def run() -> None:
        runtime.run(install_signals=False)
        returned.set()

    thread = threading.Thread(target=run, name="embedding-app")
    thread.start()
    marker = tmp_path / "ran"
    with Client.connect(dsn) as client:
        job = client.enqueue("touch", {"path": str(marker)})
        wait_for(lambda: client.get(job.id).state is State.SUCCEEDED)
    assert not returned.is_set()
    assert runtime.stop(timeout=5) is True
    assert returned.wait(10)
    thread.join(10)
    assert {s: signal.getsignal(s) for s in before} == before


def test_runtime_start_and_stop_are_safe_to_call_twice(dsn: str) -> None:
    runtime = Runtime(Settings(database_url=dsn, **FAST), Registry(), scheduler=False)
    runtime.start()
    runtime.start()
    assert runtime.stop(timeout=5) is True
    assert runtime.stop(timeout=5) is True


# -- fail fast on a missing or old schema --------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ("worker", "--app", TOUCH_APP),
        ("scheduler",),
        ("depth",),
        ("enqueue", "hello"),
    ],
    ids=lambda c: c[0],
)
def test_a_command_on_an_unmigrated_database_says_so_in_one_line_and_exits_8(
    empty_dsn: str, command: tuple[str, ...]
) -> None:
    result = run_process(*command, env=_env(DATABASE_URL=empty_dsn), timeout=QUICKLY)
    assert_schema_line(result, "the jobrun schema 'jobrun' is missing", "run 'jobrun migrate'")
    assert result.out == ""


def test_client_connect_on_an_unmigrated_database_raises_schema_mismatch(
    empty_dsn: str, jobrun_cli: Callable[..., Result]
) -> None:
    with pytest.raises(SchemaMismatch) as caught:
        Client.connect(empty_dsn)
    assert caught.value.found is None
    assert "run 'jobrun migrate'" in str(caught.value)
    with Client.connect(empty_dsn, check_schema=False) as client:  # opting out
        assert client.store.schema_version() is None
    migrated = jobrun_cli("migrate", "--database-url", empty_dsn)  # migrate itself never checks
    assert migrated.code == 0, migrated
    with Client.connect(empty_dsn) as client:
        assert client.store.schema_version() == SCHEMA_VERSION


def test_runtime_on_an_unmigrated_database_raises_before_starting(empty_dsn: str) -> None:
    with pytest.raises(SchemaMismatch):
        Runtime(Settings(database_url=empty_dsn), Registry())
    with psycopg.connect(empty_dsn, autocommit=True) as conn:  # and nothing is left connected

        def others() -> int:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()
            return row[0] if row else 0

        wait_for(lambda: others() == 0, timeout=10)


@pytest.mark.parametrize(
    ("offset", "fragments"),
    [
        (-1, (f"is at version {SCHEMA_VERSION - 1}", f"needs {SCHEMA_VERSION}", "jobrun migrate")),
        (+1, (f"is at version {SCHEMA_VERSION + 1}", "newer", "upgrade jobrun")),
    ],
    ids=["older", "newer"],
)
def test_a_schema_at_another_version_is_named_with_the_fix(
    dsn: str,
    conn: psycopg.Connection[Any],
    jobrun_cli: Callable[..., Result],
    offset: int,
    fragments: tuple[str, ...],
) -> None:
    conn.execute("UPDATE jobrun.schema_version SET version = %s", [SCHEMA_VERSION + offset])
    assert_schema_line(jobrun_cli("depth", "--database-url", dsn), *fragments)
    with pytest.raises(SchemaMismatch) as caught:
        Client.connect(dsn)
    assert caught.value.found == SCHEMA_VERSION + offset
    with pytest.raises(SchemaMismatch):
        Runtime(Settings(database_url=dsn), Registry())


def test_a_worker_on_an_old_schema_exits_at_once(dsn: str, conn: psycopg.Connection[Any]) -> None:
    conn.execute("UPDATE jobrun.schema_version SET version = %s", [SCHEMA_VERSION - 1])
    result = run_process("worker", "--app", TOUCH_APP, env=_env(DATABASE_URL=dsn), timeout=QUICKLY)
    assert_schema_line(result, f"is at version {SCHEMA_VERSION - 1}")


def test_the_exit_code_for_the_schema_is_documented(jobrun_cli: Callable[..., Result]) -> None:
    assert "8 schema" in jobrun_cli("--help").out
    assert cli.__doc__ is not None
    assert "8     the jobrun schema" in cli.__doc__


# -- migrate --sql ---------------------------------------------------------------------------


def _psql() -> str:
    bundled = embedded.embedded_bindir() / "psql"
    found = str(bundled) if bundled.exists() else shutil.which("psql")
    if found is None:
        pytest.skip("no psql")
    return found


def test_migrate_sql_prints_ddl_that_psql_applies_and_check_schema_accepts(
    empty_dsn: str, jobrun_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No database is reachable (nor the embedded one: the fixture refuses it).
    monkeypatch.setenv("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nowhere")
    result = jobrun_cli("migrate", "--sql")
    monkeypatch.delenv("DATABASE_URL")
    assert result.code == 0, result
    assert result.err == ""
    assert "CREATE SCHEMA" in result.out and "jobrun.jobs" in result.out
    psql = subprocess.run(
        [_psql(), "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", empty_dsn, "-f", "-"],
        input=result.out,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert psql.returncode == 0, psql.stderr
    pool = open_pool(empty_dsn, concurrency=1, min_size=1)
    try:
        Store(pool).check_schema()
    finally:
        pool.close()
    assert jobrun_cli("depth", "--database-url", empty_dsn).code == 0


def test_migrate_sql_names_the_chosen_schema(jobrun_cli: Callable[..., Result]) -> None:
    result = jobrun_cli("migrate", "--sql", "--schema", "acme_jobs")
    assert result.code == 0, result
    assert '"acme_jobs".jobs' in result.out
    assert "jobrun.jobs" not in result.out
    assert jobrun_cli("migrate", "--sql", "--json").code == cli.EXIT_USAGE  # SQL is not JSON


# -- the schema setting ---------------------------------------------------------------------


def test_jobrun_schema_end_to_end_leaves_schema_jobrun_alone(
    empty_dsn: str, tmp_path: Path
) -> None:
    env = _env(
        DATABASE_URL=empty_dsn,
        JOBRUN_SCHEMA="acme_jobs",
        JOBRUN_POLL_INTERVAL="200ms",
        JOBRUN_LEASE_TTL="3s",
        JOBRUN_HEARTBEAT_INTERVAL="500ms",
    )
    migrated = run_process("migrate", env=env)
    assert migrated.code == 0, migrated
    marker = tmp_path / "ran"
    enqueued = run_process("enqueue", "touch", json.dumps({"path": str(marker)}), env=env)
    assert enqueued.code == 0, enqueued
    job_id = enqueued.out.strip()
    worker = subprocess.Popen(
        [sys.executable, "-m", "jobrun.cli", "worker", "--app", TOUCH_APP],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: marker.exists() or worker.poll() is not None, timeout=60)
        assert marker.exists(), worker.communicate(timeout=10)[0]
        with psycopg.connect(empty_dsn) as conn:
            wait_for(
                lambda: (
                    conn.execute(
                        "SELECT state::text FROM acme_jobs.jobs WHERE id = %s", [job_id]
                    ).fetchone()
                    == ("succeeded",)
                )
            )
            assert conn.execute("SELECT to_regnamespace('jobrun')").fetchone() == (None,)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=60)
    assert worker.returncode == 0, out
    shown = run_process("get", job_id, "--json", env=env)
    assert shown.code == 0, shown
    assert json.loads(shown.out)["state"] == "succeeded"
    # The same database through the default schema: jobrun's is not there.
    default = run_process("depth", env={**env, "JOBRUN_SCHEMA": ""})
    assert_schema_line(default, "the jobrun schema 'jobrun' is missing")


def test_the_schema_flag_overrides_the_environment(
    empty_dsn: str, jobrun_cli: Callable[..., Result], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JOBRUN_SCHEMA", "other_jobs")
    assert jobrun_cli("migrate", "--database-url", empty_dsn, "--schema", "acme_jobs").code == 0
    assert (
        jobrun_cli("enqueue", "t", "--database-url", empty_dsn, "--schema", "acme_jobs").code == 0
    )
    with psycopg.connect(empty_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM acme_jobs.jobs").fetchone() == (1,)
        assert conn.execute("SELECT to_regnamespace('other_jobs')").fetchone() == (None,)


def test_an_invalid_schema_is_a_validation_error_before_connecting(
    jobrun_cli: Callable[..., Result],
) -> None:
    result = jobrun_cli(
        "depth", "--database-url", "postgresql://x@127.0.0.1:1/x", "--schema", "Bad-Name"
    )
    assert result.code == cli.EXIT_VALIDATION, result
    assert "JOBRUN_SCHEMA" in result.err or "--schema" in result.err


def test_client_and_runtime_use_the_schema_of_their_settings(empty_dsn: str) -> None:
    migrate(empty_dsn, schema="acme_jobs")
    settings = Settings(database_url=empty_dsn, schema="acme_jobs", **FAST)
    registry = Registry()
    registry.register("t", lambda ctx, job: None)
    with Client.connect(settings=settings) as client, Runtime(settings, registry) as runtime:
        assert runtime.worker is not None
        assert getattr(runtime.worker.store, "schema", None) == "acme_jobs"
        job = client.enqueue("t")
        wait_for(lambda: client.get(job.id).state is State.SUCCEEDED)


def test_schedulers_of_two_schemas_in_one_database_each_lead_their_own(empty_dsn: str) -> None:
    migrate(empty_dsn, schema="app_one")
    migrate(empty_dsn, schema="app_two")
    runtimes = [
        Runtime(Settings(database_url=empty_dsn, schema=name), None, worker=False)
        for name in ("app_one", "app_two")
    ]
    try:
        for runtime in runtimes:
            runtime.start()
        for runtime in runtimes:
            scheduler = runtime.scheduler
            assert scheduler is not None
            wait_for(lambda s=scheduler: s.is_leader, timeout=15)
    finally:
        for runtime in runtimes:
            runtime.stop(timeout=5)
