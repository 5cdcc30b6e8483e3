"""Least privilege, secrets, hostile identifiers and size limits (the Security part of issue 7).

The whole suite also runs as a DML-only runtime role in CI
(``JOBRUN_TEST_RUNTIME_ROLE=1``, see tests/support/database.py); the first
test here checks such a role end to end inside the fault suite itself.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import secrets
import signal
import subprocess
import sys
import traceback
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import psycopg.conninfo
import pytest
from psycopg import sql

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import Job, NewJob, ScheduleSpec, State
from jobrun.postgres.embedded import free_port
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.migrate import migrate
from jobrun.postgres.notify import Notifier
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import MAX_HEARTBEAT_IDS, Store
from jobrun.runtime import Runtime
from tests.faults.harness import QUICK_RETRY, ROOT, TTL, Workers, scalar, states, terminate_role
from tests.faults.harness import wait_until as wait
from tests.faults.oracle import Oracle
from tests.support.tables import JOBRUN_TABLES

ROLE = "jobrun_fault_rt"


def test_the_runtime_roles_grants_cover_every_table_jobrun_has(
    conn: psycopg.Connection[Any],
) -> None:
    """A migration that adds a table must add it here too, or the role tests
    below would pass without it and a real least-privilege role would fail."""
    rows = conn.execute(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = 'jobrun' AND table_name NOT LIKE '\\_yoyo%'"
    ).fetchall()
    assert {r[0] for r in rows} == set(JOBRUN_TABLES)


def _with(dsn: str, **params: Any) -> str:
    values = psycopg.conninfo.conninfo_to_dict(dsn)
    values.update(params)
    return psycopg.conninfo.make_conninfo("", **values)


@pytest.fixture
def runtime_role(conn: psycopg.Connection[Any], admin_dsn: str) -> Iterator[tuple[str, str]]:
    """A LOGIN role with DML on jobrun's tables only, no CREATE anywhere; (dsn, password)."""
    password = f"canary-{secrets.token_hex(8)}"
    role = sql.Identifier(ROLE)
    exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [ROLE]).fetchone()
    verb = sql.SQL("ALTER" if exists else "CREATE")
    conn.execute(
        sql.SQL("{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD {}").format(
            verb, role, sql.Literal(password)
        )
    )
    conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    conn.execute(sql.SQL("GRANT USAGE ON SCHEMA jobrun TO {}").format(role))
    for table in (*(("jobrun", t) for t in JOBRUN_TABLES), ("public", "effects")):
        conn.execute(
            sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON {} TO {}").format(
                sql.Identifier(*table), role
            )
        )
    for schema in ("jobrun", "public"):
        conn.execute(
            sql.SQL("GRANT USAGE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(
                sql.Identifier(schema), role
            )
        )
    try:
        yield _with(admin_dsn, user=ROLE, password=password), password
    finally:
        for schema in ("jobrun", "public"):
            name = sql.Identifier(schema)
            conn.execute(
                sql.SQL("REVOKE ALL ON ALL TABLES IN SCHEMA {} FROM {}").format(name, role)
            )
            conn.execute(
                sql.SQL("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {} FROM {}").format(name, role)
            )
            conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(name, role))


# -- least privilege ---------------------------------------------------------------------------


def test_jobrun_runs_end_to_end_as_a_role_without_ddl_rights(
    runtime_role: tuple[str, str],
    conn: psycopg.Connection[Any],
    workers: Workers,
    oracle: Oracle,
) -> None:
    url, _ = runtime_role
    with psycopg.connect(url) as probe, pytest.raises(psycopg.errors.InsufficientPrivilege):
        probe.execute("CREATE TABLE nope (x int)")
    with Client.connect(url) as client:
        client.upsert_schedule(ScheduleSpec(id="tick", cron="* * * * * *", type="tx.tick"))
        jobs = [client.enqueue("tx.work", {"sleep": 0.1}, backoff=QUICK_RETRY) for _ in range(5)]
        oracle.enqueued(jobs)
        workers.start(url=url, scheduler=True, concurrency=2)
        wait(
            lambda: all(client.get(j.id).state is State.SUCCEEDED for j in jobs),
            60,
            workers.outputs,
        )
        wait(lambda: scalar(conn, "SELECT count(*) FROM effects") >= 8, 30, "cron runs too")
        assert client.depth() is not None
    with pytest.raises(Exception):  # noqa: B017 - whatever the migrator's error is
        migrate(url)  # the migrator's job, not the runtime role's


# -- secrets ----------------------------------------------------------------------------------


def _everything_said(caplog: pytest.LogCaptureFixture, *errors: BaseException) -> str:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    said = [formatter.format(r) for r in caplog.records]
    for exc in errors:
        said.append(repr(exc))
        said.append("".join(traceback.format_exception(exc)))
    return "\n".join(said)


def _failures(dsn: str) -> list[BaseException]:
    """Every jobrun entry point that connects, made to fail; the errors they raised."""
    errors: list[BaseException] = []
    attempts: list[Any] = [
        lambda: open_pool(dsn, concurrency=1, timeout=2.0),
        lambda: Client.connect(dsn),
        lambda: Runtime(Settings(database_url=dsn), None, database_url=dsn, worker=False),
        lambda: migrate(dsn),
    ]
    for attempt in attempts:
        try:
            result = attempt()
        except Exception as exc:
            errors.append(exc)
        else:
            closer = getattr(result, "close", None)
            if closer is not None:
                closer()
            raise AssertionError(f"connecting with a bad DSN worked: {attempt}")
    locker = AdvisoryLocker(dsn, probe_timeout=2.0)
    assert not locker.try_acquire()
    errors.append(RuntimeError(str(locker.last_error)))
    locker.close()
    notifier = Notifier(dsn, probe_timeout=2.0, backoff_initial=0.05)
    notifier.start()
    try:
        wait(lambda: notifier.stats.faults >= 2, 30, "the listener reports its faults")
        errors.append(RuntimeError(str(notifier.last_error)))
    finally:
        notifier.stop()
    return errors


@pytest.mark.parametrize("form", ["url", "keywords"])
def test_no_password_leaks_from_a_failed_connection(
    form: str, caplog: pytest.LogCaptureFixture
) -> None:
    canary = f"canary-{secrets.token_hex(8)}"
    port = free_port()  # nothing listens there
    dsn = (
        f"postgresql://app:{canary}@127.0.0.1:{port}/app?connect_timeout=2"
        if form == "url"
        else f"host=127.0.0.1 port={port} dbname=app user=app password={canary} connect_timeout=2"
    )
    caplog.set_level(logging.DEBUG)
    errors = _failures(dsn)
    text = _everything_said(caplog, *errors)
    assert canary not in text


def test_no_password_leaks_from_a_failed_authentication(
    runtime_role: tuple[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = runtime_role
    canary = f"canary-{secrets.token_hex(8)}"
    wrong = _with(url, password=canary, connect_timeout="2")
    caplog.set_level(logging.DEBUG)
    errors = _failures(wrong)
    text = _everything_said(caplog, *errors)
    assert "password authentication failed" in text  # it is the auth that failed
    assert canary not in text
    cli = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", "--database-url", wrong, "get", str(uuid.uuid4())],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert cli.returncode == 6, cli.stderr
    assert canary not in cli.stdout + cli.stderr


def test_no_password_reaches_logs_or_job_events_from_a_running_worker(
    runtime_role: tuple[str, str],
    conn: psycopg.Connection[Any],
    workers: Workers,
    oracle: Oracle,
) -> None:
    url, password = runtime_role  # the role's real password is a canary too
    store_pool = open_pool(url, concurrency=1, application_name="jobrun-test")
    store = Store(store_pool)
    try:
        failing = store.enqueue(
            NewJob(
                type="tx.work",
                payload={"fail_attempts": [1, 2], "leak_dsn": True},
                max_attempts=2,
                backoff=QUICK_RETRY,
            )
        )
        fine = [store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY)) for _ in range(3)]
        oracle.enqueued([failing, *fine])
        worker = workers.start(url=url, scheduler=True, concurrency=2)
        wait(lambda: states(conn).get("succeeded") == 3, 30, worker.output)
        wait(lambda: store.get(failing.id).state is State.DEAD, 30, worker.output)
        # Connection faults while it runs: reconnects get logged.
        for role in ("jobrun-worker", "jobrun-listener", "jobrun-leader", "jobrun-reaper"):
            terminate_role(conn, role)
        again = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
        oracle.enqueued([again])
        wait(lambda: store.get(again.id).state is State.SUCCEEDED, 30, worker.output)
        worker.signal(signal.SIGTERM)
        worker.wait(30)
        rows = conn.execute(
            "SELECT coalesce(last_error, '') FROM jobrun.jobs UNION ALL"
            " SELECT coalesce(detail::text, '') FROM jobrun.job_events"
        ).fetchall()
        stored = "\n".join(r[0] for r in rows)
        assert "fails on purpose" in stored
        assert password not in stored, "a job_events row or last_error holds the DSN's password"
        assert password not in worker.output(), "the worker's log holds the DSN's password"
    finally:
        store_pool.close()


# -- hostile identifiers ---------------------------------------------------------------------

INJECTIONS = [
    "default'; DROP TABLE jobrun.jobs; --",
    'jobs"; DROP TABLE jobrun.jobs; --',
    "a b",
    "x;y",
    "Default",
    "$$",
    "",
    "q" * 64,
    "é",
]


def _intact(conn: psycopg.Connection[Any]) -> tuple[Any, ...]:
    tables = conn.execute(
        "SELECT count(*) FROM pg_tables WHERE schemaname = 'jobrun' AND tablename = ANY(%s)",
        [list(JOBRUN_TABLES)],
    ).fetchone()
    rows = conn.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs), (SELECT count(*) FROM jobrun.job_events),"
        " (SELECT count(*) FROM jobrun.schedules)"
    ).fetchone()
    return (tables, rows)


@pytest.mark.parametrize("bad", INJECTIONS)
def test_an_injection_in_a_queue_name_is_rejected_before_any_sql(
    bad: str, conn: psycopg.Connection[Any], dsn: str
) -> None:
    before = _intact(conn)
    store = Store(NoSQL())  # type: ignore[arg-type]
    for attempt in (
        lambda: NewJob(type="tx.work", queue=bad),
        lambda: store.claim("owner", [bad], 1, TTL),
        lambda: store.list(queue=bad),
        lambda: store.pause_queue(bad),
        lambda: store.resume_queue(bad),
        lambda: store.state_counts(bad),
        lambda: ScheduleSpec(id="ok", cron="* * * * *", type="tx.tick", queue=bad),
        lambda: Settings(database_url=dsn, queues=[bad]),
    ):
        with pytest.raises(ValidationError):
            attempt()
    assert _intact(conn) == before


@pytest.mark.parametrize("bad", INJECTIONS)
def test_an_injection_in_a_notify_channel_is_rejected(
    bad: str, conn: psycopg.Connection[Any], dsn: str
) -> None:
    before = _intact(conn)
    for attempt in (
        lambda: Notifier(dsn, channel=bad),
        lambda: Store(NoSQL(), notify_channel=bad),  # type: ignore[arg-type]
        lambda: Settings(database_url=dsn, notify_channel=bad),
        lambda: Settings.from_env({"DATABASE_URL": dsn, "JOBRUN_NOTIFY_CHANNEL": bad or "''"}),
    ):
        with pytest.raises(ValidationError):
            attempt()
    assert _intact(conn) == before


SCHEDULE_INJECTIONS = [
    "nightly'; DROP TABLE jobrun.schedules; --",
    'x"; DROP TABLE jobrun.jobs; --',
    "a b",
    "x;y",
    "$$",
    "",
    "é",
    "a:b",  # would make sched:<id>:<occurrence> ambiguous
    "sched:x:2026-01-01T00:00:00Z",
    "x" * 101,
]


@pytest.mark.parametrize("bad", SCHEDULE_INJECTIONS)
def test_an_injection_in_a_schedule_id_is_rejected(
    bad: str, conn: psycopg.Connection[Any], store: Store
) -> None:
    before = _intact(conn)
    with pytest.raises(ValidationError):
        ScheduleSpec(id=bad, cron="* * * * *", type="tx.tick")
    # Reads and deletes only ever bind it as a parameter: nothing matches, nothing runs.
    for attempt in (
        lambda: store.get_schedule(bad),
        lambda: store.delete_schedule(bad),
        lambda: store.pause_schedule(bad),
    ):
        with pytest.raises(JobrunError):
            attempt()
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "jobrun.cli",
            "--database-url",
            store_dsn(store),
            "schedules",
            "add",
            bad,
            "* * * * *",
            "tx.tick",
        ],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert cli.returncode in (2, 7), cli.stderr
    assert _intact(conn) == before


def store_dsn(store: Store) -> str:
    return str(store.pool.conninfo)


# -- size limits, before any SQL ----------------------------------------------------------------


class NoSQL:
    """A pool that fails the test if anything asks it for a connection."""

    max_size = 1
    conninfo = "host=nowhere"

    def connection(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("SQL was attempted before the input was checked")


def _a_claimed_job() -> Job:
    now = dt.datetime.now(dt.UTC)
    return Job(
        id=uuid.uuid4(),
        queue="default",
        type="tx.work",
        payload={},
        priority=0,
        state=State.LEASED,
        attempts=1,
        max_attempts=3,
        backoff=QUICK_RETRY,
        run_at=now,
        lease_owner="owner",
        lease_token=uuid.uuid4(),
        lease_expires_at=now,
        cancel_requested=False,
        idempotency_key=None,
        last_error=None,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )


def test_oversize_payloads_are_rejected_before_any_sql() -> None:
    store = Store(NoSQL())  # type: ignore[arg-type]
    for payload in (
        {"blob": "x" * (1024 * 1024 + 1)},
        {"many": list(range(400_000))},
        {"deep": _nested(100)},
    ):
        with pytest.raises(ValidationError):
            store.enqueue(NewJob(type="tx.work", payload=payload))
    with pytest.raises(ValidationError):
        ScheduleSpec(id="big", cron="* * * * *", type="tx.tick", payload={"b": "x" * 2**21})


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {}
    for _ in range(depth):
        node = {"n": node}
    return node


_NOW = dt.datetime.now(dt.UTC)
_LIMITS: dict[str, Any] = {
    "claim over 1000": lambda s: s.claim("owner", ["default"], 1001, TTL),
    "claim of 0": lambda s: s.claim("owner", ["default"], 0, TTL),
    "heartbeat over 100000 ids": lambda s: s.heartbeat(
        "owner", [(uuid.uuid4(), uuid.uuid4()) for _ in range(MAX_HEARTBEAT_IDS + 1)], _NOW
    ),
    "reap over 100000": lambda s: s.reap_expired(_NOW, 100_001),
    "purge over 100000": lambda s: s.purge(dt.timedelta(days=1), 100_001),
    "prune over 100000": lambda s: s.prune_events(dt.timedelta(days=1), 100_001),
    "list over 10000": lambda s: s.list(limit=10_001),
    "due schedules over 10000": lambda s: s.due_schedules(_NOW, 10_001),
    "empty batch": lambda s: s.enqueue_batch([]),
    "batch with a non-job": lambda s: s.enqueue_batch([NewJob(type="tx.work"), "not a job"]),
    "complete_many over 100000": lambda s: s.complete_many(
        [dataclasses.replace(_a_claimed_job(), id=uuid.uuid4()) for _ in range(100_001)]
    ),
}


@pytest.mark.parametrize("case", list(_LIMITS))
def test_batch_and_id_list_limits_are_enforced_before_any_sql(case: str) -> None:
    store = Store(NoSQL())  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        _LIMITS[case](store)


def test_oversize_error_texts_are_capped_before_they_are_stored(
    store: Store, conn: psycopg.Connection[Any], oracle: Oracle
) -> None:
    job = store.enqueue(NewJob(type="tx.work", max_attempts=1, backoff=QUICK_RETRY))
    oracle.enqueued([job])
    [claimed] = store.claim("owner", ["default"], 1, TTL)
    store.fail(claimed, "E" * (10 * 1024 * 1024) + "\x00tail", None)
    stored = store.get(job.id)
    assert stored.state is State.DEAD
    assert stored.last_error is not None and len(stored.last_error) <= 8192
    longest = scalar(conn, "SELECT max(length(detail::text)) FROM jobrun.job_events")
    assert longest < 2048


def test_a_notification_flood_from_another_role_is_ignored(
    conn: psycopg.Connection[Any], workers: Workers, store: Store, oracle: Oracle
) -> None:
    """Payloads are hints from anyone who can connect: garbage costs nothing and runs nothing."""
    worker = workers.start(concurrency=2)
    wait(
        lambda: scalar(
            conn,
            "SELECT count(*) FROM pg_stat_activity WHERE application_name"
            " = 'jobrun-listener' AND datname = current_database()",
        ),
        30,
        "listener",
    )
    conn.execute(
        "SELECT pg_notify('jobrun_jobs', p) FROM (VALUES ('x''; DROP TABLE jobrun.jobs; --'),"
        " (repeat('a', 7000)), (''), ('Default'), ('{\"queue\": 1}')) AS v(p)"
    )
    job = store.enqueue(NewJob(type="tx.work", backoff=QUICK_RETRY))
    oracle.enqueued([job])
    wait(lambda: store.get(job.id).state is State.SUCCEEDED, 30, worker.output)
    assert worker.alive()
    assert _intact(conn)[0] == (len(JOBRUN_TABLES),)
