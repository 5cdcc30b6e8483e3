"""/healthz and /readyz of a real worker (issue 12): what they answer, and when they change.

Everything runs against the real PostgreSQL, over real HTTP. Database
outages are real too: the worker connects as a role of its own, whose
connections are killed (``pg_terminate_backend``) over and over while the
role may not log in again, so that no claim nor heartbeat can succeed until
the test lets it back in.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobrun.config import Settings
from jobrun.job.model import NewJob, State
from jobrun.observe.health import Health
from jobrun.observe.http import ObserveServer
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.runtime import Runtime
from jobrun.scheduler.service import SchedulerConfig, SchedulerService
from jobrun.worker import Registry, Worker, WorkerConfig
from jobrun.worker.context import JobContext
from tests.support.waiting import wait_for

FAST: dict[str, Any] = {
    "lease_ttl": dt.timedelta(seconds=3),
    "heartbeat_interval": dt.timedelta(milliseconds=200),
    "poll_interval": dt.timedelta(milliseconds=200),
    "shutdown_grace": dt.timedelta(seconds=5),
}
STALE_AFTER = dt.timedelta(seconds=1.5)


@dataclasses.dataclass
class Answer:
    status: int
    body: str
    content_type: str


def get(url: str) -> Answer:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return Answer(reply.status, reply.read().decode(), reply.headers["Content-Type"])
    except urllib.error.HTTPError as exc:
        with exc:
            return Answer(exc.code, exc.read().decode(), exc.headers["Content-Type"])


def local(server: ObserveServer) -> str:
    return f"http://127.0.0.1:{server.port}"


def runtime_url(runtime: Runtime) -> str:
    assert runtime.observe is not None
    (server,) = runtime.observe.servers
    return local(server)


def settings(url: str, **fields: Any) -> Settings:
    return Settings(
        database_url=url,
        health_port=0,
        observe_host="127.0.0.1",
        call_timeout=dt.timedelta(seconds=1),
        **{**FAST, **fields},
    )


# -- a role of the worker's own, and outages of it -------------------------------------


@dataclasses.dataclass
class Role:
    name: str
    dsn: str
    admin_dsn: str
    conn: psycopg.Connection[Any]

    @contextlib.contextmanager
    def refused(self) -> Iterator[None]:
        """Until the block ends: the role may not log in, its connections killed over and over."""
        self.conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(self.name)))
        stop = threading.Event()
        killed: list[int] = []

        def kill() -> None:
            with psycopg.connect(self.admin_dsn, autocommit=True) as c:
                while not stop.is_set():
                    # Materialised first: pg_terminate_backend must only see the role's pids.
                    rows = c.execute(
                        "WITH victims AS MATERIALIZED ("
                        "  SELECT pid FROM pg_stat_activity WHERE usename = %s)"
                        " SELECT pid FROM victims WHERE pg_terminate_backend(pid)",
                        [self.name],
                    ).fetchall()
                    killed.extend(r[0] for r in rows)
                    stop.wait(0.05)

        killer = threading.Thread(target=kill, name="test-killer", daemon=True)
        killer.start()
        try:
            wait_for(lambda: killed)  # the worker's connections are being killed
            yield
        finally:
            stop.set()
            killer.join(30)
            self.conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(self.name)))


@pytest.fixture
def role(conn: psycopg.Connection[Any], dsn: str, admin_dsn: str) -> Iterator[Role]:
    name = f"health_{secrets.token_hex(4)}"
    password = f"pw-{secrets.token_hex(8)}"
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(password)
        )
    )
    try:
        yield Role(
            name, psycopg.conninfo.make_conninfo(dsn, user=name, password=password), admin_dsn, conn
        )
    finally:
        conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [name]
        )
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.fixture
def held() -> Iterator[threading.Event]:
    """Set to let the ``hold`` handler return."""
    release = threading.Event()
    yield release
    release.set()


@pytest.fixture
def holding_registry(held: threading.Event) -> Registry:
    registry = Registry()

    @registry.handler("hold")
    def hold(ctx: JobContext, job: Any) -> None:
        while not (held.is_set() or ctx.cancelled.is_set()):
            held.wait(0.05)

    return registry


# -- a healthy worker ------------------------------------------------------------------


def test_a_healthy_worker_answers_ok_on_healthz_and_readyz(dsn: str) -> None:
    with Runtime(settings(dsn), Registry()) as runtime:
        url = runtime_url(runtime)
        live = wait_for(lambda: (a := get(f"{url}/healthz")).status == 200 and a)
        assert live.body == "ok\n"
        assert live.content_type.startswith("text/plain")
        ready = get(f"{url}/readyz")
        assert (ready.status, ready.body) == (200, "ok\n")
        # No metrics port: no /metrics, and nothing else either.
        assert get(f"{url}/metrics").status == 404
        assert get(f"{url}/").status == 404
        assert get(f"{url}/healthz/x").status == 404
        assert get(f"{url}/healthz?verbose=1").status == 200


def test_a_busy_worker_that_only_heartbeats_stays_healthy(
    dsn: str, store: Store, holding_registry: Registry, held: threading.Event
) -> None:
    # One thread, busy: it claims nothing more, and only its heartbeats show it is alive.
    bound = dt.timedelta(seconds=2)
    with Runtime(
        settings(dsn, concurrency=1, health_stale_after=bound), holding_registry, scheduler=False
    ) as runtime:
        url = runtime_url(runtime)
        job = store.enqueue(NewJob(type="hold"))
        wait_for(lambda: store.get(job.id).state is State.LEASED)
        assert runtime.worker is not None
        wait_for(lambda: runtime.worker is not None and runtime.worker.threads_busy == 1)
        until = time.monotonic() + 3 * bound.total_seconds()
        while time.monotonic() < until:
            answer = get(f"{url}/healthz")
            assert answer.status == 200, answer.body
            time.sleep(0.1)
        assert store.get(job.id).state is State.LEASED  # still running: it never claimed again
        held.set()


# -- readiness -------------------------------------------------------------------------


def test_readyz_is_503_naming_the_schema_on_an_unmigrated_database(empty_dsn: str) -> None:
    pool = open_pool(empty_dsn, concurrency=1, application_name="jobrun-test")
    server = ObserveServer(Health(Store(pool)), host="127.0.0.1", port=0)
    server.start()
    try:
        ready = get(f"{local(server)}/readyz")
        assert ready.status == 503
        assert ready.body.count("\n") == 1
        assert "schema" in ready.body and "jobrun migrate" in ready.body
        # Liveness asks no database: the process is up.
        assert get(f"{local(server)}/healthz").status == 200
    finally:
        server.stop()
        pool.close()


def test_readyz_follows_the_schema_version_at_every_probe(dsn: str, conn: Any) -> None:
    with Runtime(settings(dsn), Registry(), scheduler=False) as runtime:
        url = runtime_url(runtime)
        assert get(f"{url}/readyz").status == 200
        conn.execute("UPDATE jobrun.schema_version SET version = version + 1")
        try:
            ready = get(f"{url}/readyz")
            assert ready.status == 503
            assert "schema" in ready.body and "upgrade jobrun" in ready.body
        finally:
            conn.execute("UPDATE jobrun.schema_version SET version = version - 1")
        assert get(f"{url}/readyz").status == 200


def test_readyz_is_503_while_the_database_refuses_the_worker(role: Role) -> None:
    with Runtime(settings(role.dsn), Registry(), scheduler=False) as runtime:
        url = runtime_url(runtime)
        wait_for(lambda: get(f"{url}/readyz").status == 200)
        with role.refused():
            ready = wait_for(lambda: (a := get(f"{url}/readyz")).status == 503 and a)
            assert ready.body.startswith("database: "), ready.body
        wait_for(lambda: get(f"{url}/readyz").status == 200)


def test_readiness_fails_and_liveness_holds_while_the_runtime_drains(
    dsn: str, store: Store, holding_registry: Registry, held: threading.Event
) -> None:
    runtime = Runtime(settings(dsn), holding_registry, scheduler=False)
    runtime.start()
    url = runtime_url(runtime)
    job = store.enqueue(NewJob(type="hold"))
    wait_for(lambda: runtime.worker is not None and runtime.worker.threads_busy == 1)
    stopping = threading.Thread(target=runtime.stop, kwargs={"timeout": 60})
    stopping.start()
    try:
        ready = wait_for(lambda: (a := get(f"{url}/readyz")).status == 503 and a)
        assert ready.body == "stopping\n"
        assert get(f"{url}/healthz").status == 200
    finally:
        held.set()
        stopping.join(60)
    assert store.get(job.id).state is State.SUCCEEDED
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{url}/healthz", timeout=5)


# -- liveness --------------------------------------------------------------------------


def test_healthz_is_503_while_claims_cannot_succeed_and_200_once_they_can(role: Role) -> None:
    # An idle worker: claims (every poll interval) are what shows it is alive.
    with Runtime(
        settings(role.dsn, health_stale_after=STALE_AFTER), Registry(), scheduler=False
    ) as runtime:
        url = runtime_url(runtime)
        wait_for(lambda: get(f"{url}/healthz").status == 200)
        with role.refused():
            live = wait_for(lambda: (a := get(f"{url}/healthz")).status == 503 and a)
            assert live.body.startswith("no successful claim or heartbeat for "), live.body
            assert "(bound 1.5 s)" in live.body
            assert live.body.count("\n") == 1
            # The process itself is fine: it answers, and its threads live.
            assert runtime.worker is not None and runtime.worker.dead_threads == []
        wait_for(lambda: get(f"{url}/healthz").status == 200)


def test_healthz_is_503_while_a_busy_workers_heartbeats_cannot_succeed(
    role: Role, store: Store, holding_registry: Registry, held: threading.Event
) -> None:
    # One thread, busy: heartbeats alone show it is alive.
    with Runtime(
        settings(role.dsn, concurrency=1, health_stale_after=STALE_AFTER),
        holding_registry,
        scheduler=False,
    ) as runtime:
        url = runtime_url(runtime)
        store.enqueue(NewJob(type="hold"))
        wait_for(lambda: runtime.worker is not None and runtime.worker.threads_busy == 1)
        assert runtime.observe is not None and runtime.observe.health is not None
        health = runtime.observe.health
        wait_for(lambda: health.seconds_since("heartbeat") is not None)
        wait_for(lambda: get(f"{url}/healthz").status == 200)
        with role.refused():
            live = wait_for(lambda: (a := get(f"{url}/healthz")).status == 503 and a)
            assert "last heartbeat " in live.body, live.body
            assert "last heartbeat never" not in live.body  # it did heartbeat, until the outage
        wait_for(lambda: get(f"{url}/healthz").status == 200)
        held.set()


class ClaimerKiller(Store):
    """A real Store whose claim, once told to, raises what the claim loop does not catch."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.die = threading.Event()

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        if self.die.is_set():
            raise SystemExit("a library called sys.exit() on the claimer's thread")
        return super().claim(*args, **kwargs)

    def exchange(self, *args: Any, **kwargs: Any) -> Any:
        """The pipelined claimer's round trip (complete, start and claim in one)."""
        if self.die.is_set():
            raise SystemExit("a library called sys.exit() on the claimer's thread")
        return super().exchange(*args, **kwargs)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_healthz_is_503_naming_a_worker_thread_that_died(pool: Any) -> None:
    store = ClaimerKiller(pool)
    health = Health(store)
    worker = Worker(store, Registry(), WorkerConfig(**FAST), hooks=[health])
    worker.start()
    health.watch_worker(worker)
    server = ObserveServer(health, host="127.0.0.1", port=0)
    server.start()
    try:
        wait_for(lambda: get(f"{local(server)}/healthz").status == 200)
        store.die.set()
        live = wait_for(lambda: (a := get(f"{local(server)}/healthz")).status == 503 and a)
        assert live.body.startswith("worker threads died: jobrun-claimer"), live.body
        assert worker.dead_threads == ["jobrun-claimer"]
        assert get(f"{local(server)}/readyz").status == 200  # the database is fine
    finally:
        server.stop()
        worker.stop(timeout=5)


class NowKiller(Store):
    """A real Store whose clock, once told to, raises what the scheduler's loop does not catch."""

    def __init__(self, pool: Any) -> None:
        super().__init__(pool)
        self.die = threading.Event()

    def now(self) -> Any:
        if self.die.is_set():
            raise SystemExit("a library called sys.exit() on the scheduler's thread")
        return super().now()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_scheduler_only_process_is_live_while_its_loop_thread_lives(pool: Any, dsn: str) -> None:
    store = NowKiller(pool)
    scheduler = SchedulerService(
        store, AdvisoryLocker(dsn), SchedulerConfig(tick_interval=dt.timedelta(milliseconds=50))
    )
    health = Health(store)
    health.watch_scheduler(scheduler)
    server = ObserveServer(health, host="127.0.0.1", port=0)
    server.start()
    scheduler.start()
    try:
        wait_for(lambda: scheduler.is_leader)
        assert get(f"{local(server)}/healthz").status == 200
        store.die.set()
        live = wait_for(lambda: (a := get(f"{local(server)}/healthz")).status == 503 and a)
        assert live.body == "scheduler thread died: jobrun-scheduler\n"
    finally:
        server.stop()
        scheduler.stop()


# -- the server ------------------------------------------------------------------------


def test_probe_requests_are_logged_at_debug_only(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    server = ObserveServer(Health(), host="127.0.0.1", port=0)
    server.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="jobrun.observe.http"):
            assert get(f"{local(server)}/healthz").status == 200
            assert get(f"{local(server)}/nope").status == 404
            wait_for(lambda: len([r for r in caplog.records if "GET /nope" in r.getMessage()]))
    finally:
        server.stop()
    lines = [r for r in caplog.records if r.name == "jobrun.observe.http"]
    assert any("GET /healthz" in r.getMessage() for r in lines)
    assert all(r.levelno == logging.DEBUG for r in lines)
    assert "GET /" not in capfd.readouterr().err  # nothing written past the logging system
