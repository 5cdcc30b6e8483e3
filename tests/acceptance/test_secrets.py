"""Secrets never printed (issue 10), against the real test server.

A canary password goes into every DSN form a user may paste (libpq URLs and
key=value strings, SQLAlchemy's ``postgresql+psycopg://`` and kin, a raw
password with blanks, ``@``, ``%`` and quotes, other schemes). Every way in
(the library, the ``jobrun`` command, a worker process and its handlers) is
made to fail: nothing listening, a wrong password, a string that does not
parse. Everything said is scanned for the canary: stdout, stderr, log
records, exception strings, reprs and tracebacks (chained causes included),
``jobs.last_error`` and ``job_events`` rows, the worker's log.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from jobrun import cli
from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import TransientError, ValidationError
from jobrun.job.model import Backoff, State
from jobrun.postgres import embedded
from jobrun.postgres.embedded import free_port
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.migrate import migrate
from jobrun.postgres.notify import Notifier
from jobrun.postgres.pool import open_pool, ping
from jobrun.runtime import Runtime
from jobrun.worker import Registry

ROOT = Path(__file__).resolve().parents[2]
CORE = f"canary{secrets.token_hex(8)}"
"""The distinctive part of every planted password: no quoting or encoding changes it."""
PASSWORD = f"{CORE} p@ss%w'\\x"
"""A password with a blank, an '@', a lone '%', a quote and a backslash."""
QUICK = Backoff(kind="constant", base=0.0, jitter=0.0)


def _kv_quote(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def dsn_forms(user: str, password: str, host: str, port: int | str, dbname: str) -> dict[str, str]:
    """The same connection in every form jobrun accepts (and one it refuses)."""
    enc = urllib.parse.quote(password, safe="")
    where = f"{host}:{port}/{dbname}"
    return {
        "url": f"postgresql://{user}:{enc}@{where}",
        "postgres-scheme": f"postgres://{user}:{enc}@{where}",
        "sqlalchemy-psycopg": f"postgresql+psycopg://{user}:{enc}@{where}",
        "sqlalchemy-psycopg2": f"postgresql+psycopg2://{user}:{enc}@{where}",
        "sqlalchemy-asyncpg": f"postgresql+asyncpg://{user}:{enc}@{where}?ssl=disable",
        "raw-url": f"postgresql://{user}:{password}@{where}",
        "query-password": f"postgresql://{user}@{where}?password={enc}&sslmode=disable",
        "keywords": (
            f"host={host} port={port} dbname={dbname} user={user} password={_kv_quote(password)}"
        ),
        "keywords-spaced": (
            f"host = {host} user={user} password = {_kv_quote(password)}"
            f" port={port} dbname={dbname}"
        ),
        "mysql": f"mysql://{user}:{enc}@{where}",
    }


FORM_NAMES = list(dsn_forms("u", "p", "h", 1, "d"))
CONNECTABLE = [name for name in FORM_NAMES if name != "mysql"]

GARBAGE = {
    "unclosed-ipv6": f"postgresql+psycopg://app:{urllib.parse.quote(PASSWORD)}@[::1/app",
    "bogus-parameter": f"postgresql://app:{PASSWORD}@127.0.0.1/app?bogus_option=1",
    "bad-escape-in-query": f"postgresql://app@127.0.0.1/app?password={CORE}%zz",
    "unterminated-quote": f"host=127.0.0.1 user=app password='{CORE} x",
    "stray-equals": f"host=127.0.0.1 password={CORE} =broken",
    "not-a-dsn": f"{CORE} hunter2",
    "unknown-driver": f"postgresql+nodriver://app:{CORE}@127.0.0.1/app",
    "other-scheme": f"mysql+pymysql://app:{CORE}@127.0.0.1:3306/app",
}


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ambient configuration, and never the real embedded PostgreSQL."""
    for var in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL", "WORKER_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a test tried to start the embedded PostgreSQL")

    monkeypatch.setattr(embedded, "ensure_embedded", refuse)
    monkeypatch.setattr("jobrun.postgres.connect.ensure_embedded", refuse)


@pytest.fixture
def server(admin_dsn: str) -> dict[str, str]:
    params = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    return {
        "host": str(params.get("host") or "localhost"),
        "port": str(params.get("port") or "5432"),
        "dbname": str(params["dbname"]),
    }


@pytest.fixture
def canary_role(conn: psycopg.Connection[Any], admin_dsn: str) -> Iterator[str]:
    """A LOGIN role whose password is PASSWORD (a superuser: migrate and workers need no grants)."""
    role = f"canary_{secrets.token_hex(4)}"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(PASSWORD)
        )
    )
    try:
        probe = psycopg.conninfo.make_conninfo(
            admin_dsn, user=role, password="certainly-wrong", connect_timeout=5
        )
        try:
            psycopg.connect(probe).close()
        except psycopg.OperationalError:
            pass
        else:
            pytest.skip("the test server does not check passwords over TCP")
        yield role
    finally:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [role]
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- scanning everything said ------------------------------------------------------------------


def _exception_texts(exc: BaseException) -> list[str]:
    """str, repr and traceback of ``exc`` and of every exception chained to it, suppressed too."""
    said: list[str] = ["".join(traceback.format_exception(exc))]
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        said += [str(current), repr(current), repr(current.args)]
        todo += [current.__cause__, current.__context__]
    return said


def _everything(caplog: pytest.LogCaptureFixture, *texts: str, errors: Any = ()) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    said = [formatter.format(r) for r in caplog.records]
    for exc in errors:
        said += _exception_texts(exc)
    return "\n".join([*said, *texts])


def _library_failures(url: str) -> list[BaseException]:
    """Every library entry point that takes a DSN, made to fail on ``url``; what they raised."""
    errors: list[BaseException] = []
    attempts: list[Callable[[], Any]] = [
        lambda: ping(url),
        lambda: open_pool(url, concurrency=1, timeout=2.0),
        lambda: Client.connect(url),
        lambda: migrate(url),
        lambda: Runtime(Settings(database_url=url), None, database_url=url, worker=False),
    ]
    for attempt in attempts:
        try:
            result = attempt()
        except Exception as exc:
            errors.append(exc)
        else:
            getattr(result, "close", lambda: None)()
            raise AssertionError(f"connecting with a bad DSN worked: {attempt}")
    try:
        locker = AdvisoryLocker(url, probe_timeout=2.0)
    except ValidationError as exc:
        errors.append(exc)
    else:
        assert not locker.try_acquire()
        errors.append(RuntimeError(f"{locker.last_error}"))
        locker.close()
    try:
        notifier = Notifier(url, probe_timeout=2.0, backoff_initial=0.05)
    except ValidationError as exc:
        errors.append(exc)
    else:
        notifier.start()
        try:
            deadline = time.monotonic() + 30
            while notifier.stats.faults < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert notifier.stats.faults >= 2, "the listener reports its faults"
            errors.append(RuntimeError(f"{notifier.last_error}"))
        finally:
            notifier.stop()
    return errors


def _cli_runs(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> list[tuple[list[str], int, str]]:
    """``jobrun depth`` and ``migrate``, by flag and by DATABASE_URL: (argv, code, output)."""
    runs = []
    for argv, env in (
        (["depth", "--database-url", url], None),
        (["--database-url", url, "migrate"], None),
        (["depth", "--json"], url),
        (["migrate"], url),
    ):
        if env is None:
            monkeypatch.delenv("DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("DATABASE_URL", env)
        capsys.readouterr()
        code = cli.main(argv)
        captured = capsys.readouterr()
        runs.append((argv, code, captured.out + captured.err))
    monkeypatch.delenv("DATABASE_URL", raising=False)
    return runs


def _one_line_errors(runs: list[tuple[list[str], int, str]], code: int) -> None:
    for argv, got, output in runs:
        assert got == code, (argv, output)
        assert output.startswith("jobrun: ") and output.count("\n") == 1, (argv, output)


# -- the three failures, every form, every way in -----------------------------------------------


@pytest.mark.parametrize("form", FORM_NAMES)
def test_no_password_is_said_when_nothing_listens(
    form: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url = dsn_forms("app", PASSWORD, "127.0.0.1", free_port(), "app")[form]
    caplog.set_level(logging.DEBUG)
    errors = _library_failures(url)
    runs = _cli_runs(url, capsys, monkeypatch)
    said = _everything(caplog, *(r[2] for r in runs), errors=errors)
    assert CORE not in said
    if form == "mysql":
        assert all(isinstance(e, ValidationError) for e in errors[:5])
        _one_line_errors(runs, cli.EXIT_VALIDATION)
    else:
        assert all(isinstance(e, TransientError | psycopg.OperationalError) for e in errors[:5])
        assert "cannot connect to PostgreSQL at app@127.0.0.1" in said
        _one_line_errors(runs, cli.EXIT_UNAVAILABLE)


@pytest.mark.parametrize("form", CONNECTABLE)
def test_no_password_is_said_when_the_password_is_wrong(
    form: str,
    canary_role: str,
    server: dict[str, str],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    wrong = f"{CORE} wr@ng%w'\\x"  # the canary is in the wrong password this time
    url = dsn_forms(canary_role, wrong, **server)[form]
    caplog.set_level(logging.DEBUG)
    errors = _library_failures(url)
    runs = _cli_runs(url, capsys, monkeypatch)
    said = _everything(caplog, *(r[2] for r in runs), errors=errors)
    assert "password authentication failed" in said  # it is the authentication that failed
    assert CORE not in said
    _one_line_errors(runs, cli.EXIT_UNAVAILABLE)
    if form in ("sqlalchemy-psycopg", "keywords"):  # the real command, as a process, too
        env = {**os.environ, "PYTHONPATH": str(ROOT), "DATABASE_URL": url}
        for argv in (["depth"], ["migrate"], ["--database-url", url, "list"]):
            proc = subprocess.run(
                [sys.executable, "-m", "jobrun.cli", *argv],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode == cli.EXIT_UNAVAILABLE, proc.stderr
            assert "password authentication failed" in proc.stderr
            assert CORE not in proc.stdout + proc.stderr


@pytest.mark.parametrize("garbage", list(GARBAGE.values()), ids=list(GARBAGE))
def test_no_password_is_said_when_the_dsn_does_not_parse(
    garbage: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)
    errors = _library_failures(garbage)
    runs = _cli_runs(garbage, capsys, monkeypatch)
    said = _everything(caplog, *(r[2] for r in runs), errors=errors)
    assert CORE not in said
    assert all(isinstance(e, ValidationError) for e in errors)
    _one_line_errors(runs, cli.EXIT_VALIDATION)
    assert all("DATABASE_URL" in r[2] for r in runs)


# -- a working DSN: accepted in every form, and never shown ---------------------------------------


@pytest.mark.parametrize("form", CONNECTABLE)
def test_every_dsn_form_connects_and_no_object_holding_it_shows_the_password(
    form: str, canary_role: str, server: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url = dsn_forms(canary_role, PASSWORD, **server)[form]
    caplog.set_level(logging.DEBUG)
    assert migrate(url) == []  # the template is migrated already
    settings = Settings.from_env({"DATABASE_URL": url})
    shown: list[Any] = [settings]
    with Client.connect(url, pool_size=1) as client:
        assert client.depth() == []
        with client.store.pool.connection() as c:
            assert c.execute("SELECT current_user").fetchone() == (canary_role,)
            shown.append(c)
        shown += [client, client.store, client.store.pool]
    runtime = Runtime(settings, None, database_url=url, worker=False)
    try:
        shown += [runtime, runtime.scheduler]
    finally:
        runtime.close()
    notifier = Notifier(url)
    locker = AdvisoryLocker(url)
    try:
        assert locker.try_acquire()
        shown += [notifier, locker]
    finally:
        locker.close()
    said = _everything(caplog, *(repr(o) for o in shown), *(str(o) for o in shown))
    assert "database_url=" in said
    assert CORE not in said


def test_a_runtime_workers_start_banner_names_the_database_without_the_password(
    canary_role: str, server: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url = dsn_forms(canary_role, PASSWORD, **server)["url"]
    caplog.set_level(logging.INFO, logger="jobrun")
    with Runtime(Settings(database_url=url), Registry(), scheduler=False) as runtime:
        assert runtime.worker is not None
    (banner,) = [
        r for r in caplog.records if r.name == "jobrun.worker" and "starting" in r.getMessage()
    ]
    where = f"{canary_role}@{server['host']}:{server['port']}/{server['dbname']} (schema jobrun)"
    assert banner.database == where  # type: ignore[attr-defined]
    assert f"  database:    {where}" in banner.getMessage().splitlines()
    assert CORE not in _everything(caplog)


def test_a_worker_never_logs_or_stores_the_password_its_handlers_quote(
    canary_role: str,
    server: dict[str, str],
    conn: psycopg.Connection[Any],
    admin_dsn: str,
    tmp_path: Path,
) -> None:
    forms = dsn_forms(canary_role, PASSWORD, **server)
    quoted = list(forms.values())
    with Client.connect(admin_dsn, pool_size=1) as client:
        jobs = [
            client.enqueue(kind, {"form": i}, max_attempts=2, backoff=QUICK)
            for i in range(len(quoted))
            for kind in ("leak.raise", "leak.permanent")
        ]
        jobs.append(client.enqueue("leak.params", {}, max_attempts=1))
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        # The worker runs on the raw form (blank, '@', '%', quote, backslash unencoded).
        "DATABASE_URL": forms["raw-url"],
        "JOBRUN_TEST_LEAKY_DSNS": json.dumps(quoted),
        "JOBRUN_POLL_INTERVAL": "200ms",
        "JOBRUN_HEARTBEAT_INTERVAL": "500ms",
        "JOBRUN_LEASE_TTL": "5s",
    }
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jobrun.cli",
                "worker",
                "--app",
                "tests.acceptance.apps.leaky:registry",
                "--concurrency",
                "4",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )
    try:
        deadline = time.monotonic() + 60
        ids = [j.id for j in jobs]
        while time.monotonic() < deadline:
            (dead,) = conn.execute(
                "SELECT count(*) FROM jobrun.jobs WHERE id = ANY(%s) AND state = 'dead'", [ids]
            ).fetchone()
            if dead == len(jobs) or proc.poll() is not None:
                break
            time.sleep(0.2)
        states = conn.execute("SELECT state, count(*) FROM jobrun.jobs GROUP BY state").fetchall()
        assert dict(states) == {State.DEAD.value: len(jobs)}, log.read_text()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    rows = conn.execute(
        "SELECT coalesce(last_error, '') FROM jobrun.jobs UNION ALL"
        " SELECT coalesce(detail::text, '') FROM jobrun.job_events"
    ).fetchall()
    stored = "\n".join(r[0] for r in rows)
    output = log.read_text()
    assert "cannot reach" in stored and "gave up on" in stored and "bad settings" in stored
    assert "Traceback" in stored  # the retried failures keep their traceback
    assert "connecting to" in output and "failed" in output
    assert CORE not in stored, "jobs.last_error or a job_events row holds the password"
    assert CORE not in output, "the worker's log holds the password"
