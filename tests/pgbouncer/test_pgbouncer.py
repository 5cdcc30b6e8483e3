"""jobrun through a real PgBouncer: detection, errors, a worker, the scheduler, the oracle.

``dsn`` is the test database through the transaction-mode PgBouncer,
``direct_dsn`` the same database directly (see conftest.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import jobrun
import jobrun.aio
from jobrun.job.errors import OutcomeUnknown, PoolerError, ValidationError
from jobrun.job.model import NewJob, ScheduleSpec, State
from jobrun.postgres.async_store import AsyncStore, open_async_pool
from jobrun.postgres.leader import LeaseLocker
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.migrate import migrate
from jobrun.postgres.notify import Notifier, NullDispatcher
from jobrun.postgres.pool import open_pool, pooler_of
from jobrun.postgres.store import Store
from tests.faults.harness import Workers, wait_until
from tests.faults.oracle import EFFECTS_DDL, Oracle
from tests.support.database import TestServer
from tests.support.pgbouncer import PgBouncer

ORACLE_SECONDS = float(os.environ.get("JOBRUN_PGBOUNCER_ORACLE_SECONDS", "6"))
ORACLE_JOBS = int(os.environ.get("JOBRUN_PGBOUNCER_ORACLE_JOBS", "1000"))
"""The oracle run's size: small in ``make test``, ``make test-pgbouncer-full`` runs 10,000."""


@pytest.fixture
def pooled_pool(dsn: str) -> Iterator[ConnectionPool[Any]]:
    pool = open_pool(dsn, concurrency=4)
    try:
        yield pool
    finally:
        pool.close()


# -- the setting and its detection --------------------------------------------------


def test_a_pooler_is_detected_and_its_connections_prepare_nothing(
    dsn: str, direct_dsn: str, pooled_pool: ConnectionPool[Any]
) -> None:
    assert pooler_of(pooled_pool) == "transaction"
    assert pooled_pool.kwargs["prepare_threshold"] is None
    with pooled_pool.connection() as c:
        for _ in range(10):
            c.execute("SELECT 1 + %s", [1])
        assert c.execute("SELECT count(*) FROM pg_prepared_statements").fetchone() == (0,)
    direct = open_pool(direct_dsn, concurrency=1)
    try:
        assert pooler_of(direct) == "none"
        assert "prepare_threshold" not in direct.kwargs
    finally:
        direct.close()


def test_the_asyncio_client_through_pgbouncer_detects_it_and_enqueues_and_reads_back(
    dsn: str,
) -> None:
    """AsyncStore's pool takes the same setting: no prepared statements, no
    session SET, and its timestamps still come back in UTC."""

    async def scenario() -> tuple[str, Any, Any]:
        pool = await open_async_pool(dsn, concurrency=2)
        try:
            store = AsyncStore(pool)
            jobs = [await store.enqueue(NewJob(type="t", payload={"n": n})) for n in range(8)]
            got = [await store.get(job.id) for job in jobs]
            async with pool.connection() as c:
                cur = await c.execute("SELECT count(*) FROM pg_prepared_statements")
                prepared = await cur.fetchone()
            assert [g.payload for g in got] == [{"n": n} for n in range(8)]
            return str(getattr(pool, "jobrun_pooler", None)), prepared, got[0].created_at
        finally:
            await pool.close()

    mode, prepared, created = asyncio.run(scenario())
    assert mode == "transaction"
    assert prepared == (0,)
    assert created.utcoffset() == dt.timedelta(0)


def test_a_session_pooler_is_detected_too_and_can_be_named(
    pgbouncer_session: PgBouncer, direct_dsn: str
) -> None:
    through = pgbouncer_session.dsn(direct_dsn)
    auto = open_pool(through, concurrency=1)
    named = open_pool(through, concurrency=1, pooler="session")
    try:
        assert pooler_of(auto) == "transaction"  # cannot tell: the safe guess
        assert pooler_of(named) == "session"
        assert "prepare_threshold" not in named.kwargs
    finally:
        auto.close()
        named.close()


def test_a_bad_pooler_setting_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="JOBRUN_POOLER"):
        jobrun.Settings.from_env({"JOBRUN_POOLER": "bouncy"})
    with pytest.raises(ValidationError, match="JOBRUN_DIRECT_URL"):
        jobrun.Settings(direct_url="mysql://x@y/z")
    with pytest.raises(ValidationError, match="pooler"):
        open_pool("host=127.0.0.1", pooler="sometimes")


# -- errors from the pooler -----------------------------------------------------------


def test_prepared_statements_through_pgbouncer_raise_a_pooler_error_naming_the_setting(
    pg_server: TestServer, direct_dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Two clients, one server session: the second prepares a name the first left there."""
    from tests.pgbouncer.conftest import require_pgbouncer  # noqa: PLC0415

    require_pgbouncer()  # a PgBouncer of its own (one server connection), not the suite's
    bouncer = PgBouncer(pg_server.admin_dsn, pool_size=1, users=_users(pg_server))
    bouncer.start()
    try:
        through = bouncer.dsn(direct_dsn)
        pool = open_pool(through, concurrency=1, pooler="none")  # told wrong on purpose
        store = Store(pool)
        first = psycopg.connect(through, autocommit=True, prepare_threshold=0)
        second = psycopg.connect(through, autocommit=True, prepare_threshold=0)
        try:
            store.enqueue(NewJob(type="t"), conn=first)
            with pytest.raises(PoolerError) as caught:
                store.enqueue(NewJob(type="t"), conn=second)
        finally:
            first.close()
            second.close()
            pool.close()
    finally:
        bouncer.destroy()
    message = str(caught.value)
    assert "PgBouncer" in message and "JOBRUN_POOLER=transaction" in message
    assert caught.value.sqlstate in ("42P05", "26000", "08P01")
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


def test_a_statement_the_server_rejected_is_never_outcome_unknown(
    direct_dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """What PgBouncer does to a prepared statement, done on purpose on one session.

    The session's prepared statements are swapped under psycopg's feet for
    ones of another shape: the next execution's Bind is refused with an ERROR
    (08P01, "bind message supplies ... parameters"), which a lone autocommit
    statement used to report as OutcomeUnknown.
    """
    pool: ConnectionPool[Any] = ConnectionPool(
        direct_dsn,
        kwargs={"autocommit": True, "prepare_threshold": 0},
        min_size=1,
        max_size=1,
        open=True,
    )
    try:
        store = Store(pool)
        store.enqueue(NewJob(type="t"))
        with pool.connection() as c:
            names = [
                r[0] for r in c.execute("SELECT name FROM pg_prepared_statements", prepare=False)
            ]
            assert names
            for name in names:
                c.execute(f'DEALLOCATE "{name}"', prepare=False)
                c.execute(f'PREPARE "{name}" AS SELECT 1', prepare=False)
        with pytest.raises(PoolerError) as caught:
            store.enqueue(NewJob(type="t"))
    finally:
        pool.close()
    assert not isinstance(caught.value, OutcomeUnknown)
    assert "bind message supplies" in str(caught.value) or "prepared statement" in str(caught.value)
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (1,)


def test_migrate_through_a_transaction_pooler_is_refused_naming_the_direct_url(
    pgbouncer: PgBouncer, admin_dsn: str
) -> None:
    """As the migrator (the runtime role may not migrate anyway)."""
    with pytest.raises(ValidationError, match="JOBRUN_DIRECT_URL"):
        migrate(pgbouncer.dsn(admin_dsn))
    assert migrate(admin_dsn) == []  # directly: up to date
    # Refused before anything is written: a schema not there yet stays absent.
    with pytest.raises(ValidationError, match="JOBRUN_DIRECT_URL"):
        migrate(pgbouncer.dsn(admin_dsn), schema="never_made")
    with psycopg.connect(admin_dsn) as c:
        found = c.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'never_made'").fetchone()
    assert found is None


# -- a worker and the scheduler ---------------------------------------------------------


def _users(server: TestServer) -> dict[str, str]:
    from tests.pgbouncer.conftest import _users as users  # noqa: PLC0415

    return users(server)


def _fast(**fields: Any) -> jobrun.Settings:
    return jobrun.Settings(
        poll_interval=dt.timedelta(milliseconds=100),
        heartbeat_interval=dt.timedelta(milliseconds=500),
        lease_ttl=dt.timedelta(seconds=5),
        concurrency=4,
        **fields,
    )


def test_a_worker_and_the_scheduler_run_through_pgbouncer_by_polling_and_the_lease(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    registry = jobrun.Registry()
    done: list[int] = []

    @registry.handler("count")
    def count(ctx: jobrun.JobContext, job: jobrun.Job) -> Any:
        def commit(c: psycopg.Connection[Any]) -> None:
            c.execute("SELECT 1")
            done.append(job.payload.get("i", -1))

        return commit if job.payload.get("i", 1) % 2 else None

    settings = _fast(database_url=dsn)
    with jobrun.Client.connect(settings=settings) as client:
        client.store.create_schedule(ScheduleSpec(id="tick", cron="* * * * * *", type="count"))
        client.store.enqueue_batch(NewJob(type="count", payload={"i": i}) for i in range(300))
        with jobrun.Runtime(settings, registry) as runtime:
            assert isinstance(runtime.notifier, NullDispatcher)
            assert runtime.scheduler is not None
            assert isinstance(runtime.scheduler.locker, LeaseLocker)
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM jobrun.jobs WHERE state = 'succeeded'"
                    ).fetchone()[0]  # type: ignore[index]
                    >= 302
                ),
                60,
                "the jobs and two cron occurrences",
            )
            assert runtime.scheduler.is_leader
            assert runtime.worker is not None and runtime.worker.dead_threads == []
    states = dict(conn.execute("SELECT state, count(*) FROM jobrun.jobs GROUP BY 1").fetchall())
    assert set(states) <= {"succeeded", "queued"}  # an occurrence may be due at the very end
    assert states.get("succeeded", 0) >= 302
    assert conn.execute("SELECT count(*) FROM jobrun.jobs WHERE attempts > 1").fetchone() == (0,)
    (term,) = conn.execute("SELECT term FROM jobrun.leader").fetchone() or (None,)
    assert term == 1


def test_with_a_direct_url_listen_and_the_leader_lock_go_past_the_pooler(
    dsn: str, direct_dsn: str
) -> None:
    registry = jobrun.Registry()
    registry.handler("noop")(lambda ctx, job: None)
    settings = _fast(database_url=dsn, direct_url=direct_dsn)
    with jobrun.Runtime(settings, registry) as runtime:
        assert isinstance(runtime.notifier, Notifier)
        assert runtime.notifier.wait_connected(10)
        assert runtime.scheduler is not None
        assert isinstance(runtime.scheduler.locker, AdvisoryLocker)
        wait_until(
            lambda: runtime.scheduler is not None and runtime.scheduler.is_leader, 20, "lead"
        )
        with jobrun.Client.connect(settings=settings) as client:
            job = client.enqueue("noop", {})
            assert client.store.wait(job.id, timeout=20).state == State.SUCCEEDED


# -- waiting for a job behind the pooler --------------------------------------------------


def _waiters(direct_dsn: str) -> list[str]:
    """The sessions of this database whose last statement LISTENed on the finish
    channel, as PostgreSQL itself sees them: whose are they (application_name)?"""
    with psycopg.connect(direct_dsn, autocommit=True) as c:
        rows = c.execute(
            "SELECT application_name FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        ).fetchall()
    return [str(r[0]) for r in rows]


def _finish_later(direct_dsn: str, job_id: Any, seen: list[list[str]]) -> threading.Thread:
    """After a moment (noting the waiter sessions then), run the job to success."""

    def run() -> None:
        time.sleep(0.6)
        seen.append(_waiters(direct_dsn))
        pool = open_pool(direct_dsn, concurrency=1)
        try:
            store = Store(pool)
            [claimed] = store.claim("finisher", ["default"], 1, dt.timedelta(seconds=30))
            assert claimed.id == job_id
            store.complete(claimed)
        finally:
            pool.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


@pytest.mark.parametrize("direct", [False, True], ids=["polling", "direct-url"])
def test_store_wait_behind_the_pooler_polls_or_listens_on_the_direct_url(
    dsn: str, direct_dsn: str, pooled_pool: ConnectionPool[Any], direct: bool
) -> None:
    store = Store(pooled_pool, direct_url=direct_dsn if direct else None)
    job = store.enqueue(NewJob(type="t"))
    seen: list[list[str]] = []
    finisher = _finish_later(direct_dsn, job.id, seen)
    try:
        assert store.wait(job.id, timeout=20, poll_interval=0.2).state == State.SUCCEEDED
    finally:
        finisher.join()
    # A LISTEN through the pooler would be left on a pooled server session.
    assert seen[0] == (["jobrun-waiter"] if direct else [])


@pytest.mark.parametrize("direct", [False, True], ids=["polling", "direct-url"])
def test_async_store_wait_behind_the_pooler_polls_or_listens_on_the_direct_url(
    dsn: str, direct_dsn: str, direct: bool
) -> None:
    seen: list[list[str]] = []

    async def scenario() -> Any:
        pool = await open_async_pool(dsn, concurrency=2)
        try:
            store = AsyncStore(pool, direct_url=direct_dsn if direct else None)
            job = await store.enqueue(NewJob(type="t"))
            finisher = _finish_later(direct_dsn, job.id, seen)
            try:
                return await store.wait(job.id, timeout=20, poll_interval=0.2)
            finally:
                await asyncio.to_thread(finisher.join)
        finally:
            await pool.close()

    assert asyncio.run(scenario()).state == State.SUCCEEDED
    assert seen[0] == (["jobrun-waiter"] if direct else [])


def test_the_async_client_passes_the_direct_url_to_its_store(dsn: str, direct_dsn: str) -> None:
    async def scenario() -> str | None:
        settings = _fast(database_url=dsn, direct_url=direct_dsn)
        async with await jobrun.aio.AsyncClient.connect(settings=settings) as client:
            return client.store.direct_url

    assert asyncio.run(scenario()) == direct_dsn


# -- the oracle: two worker processes and a cron every second through PgBouncer ----------


def _leader_sampler(admin_dsn: str, stop: threading.Event, seen: set[tuple[int, str]]) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        while not stop.is_set():
            for term, holder in c.execute(
                "SELECT term, holder FROM jobrun.leader WHERE expires_at > now()"
            ):
                seen.add((term, holder))
            stop.wait(0.05)


def test_the_oracle_two_workers_and_a_cron_every_second_through_pgbouncer(
    dsn: str, admin_dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """Every occurrence fired once, every job's effect written once, one leader per term."""
    side_log = tmp_path / "side-log"
    side_log.mkdir()
    conn.execute(EFFECTS_DDL)
    oracle = Oracle(admin_dsn, side_log)
    oracle.watch(admin_dsn, settled=True)
    store_pool = open_pool(dsn, concurrency=1)
    try:
        store = Store(store_pool)
        store.create_schedule(ScheduleSpec(id="every-second", cron="* * * * * *", type="tx.tick"))
        batch = [NewJob(type="tx.work", payload={}) for _ in range(ORACLE_JOBS)]
        oracle.enqueued(batch)
        workers = Workers(dsn, tmp_path, side_log)
        seen: set[tuple[int, str]] = set()
        stop = threading.Event()
        sampler = threading.Thread(target=_leader_sampler, args=(admin_dsn, stop, seen))
        sampler.start()
        try:
            procs = [workers.start(scheduler=True, concurrency=4) for _ in range(2)]
            started = store.now()
            store.enqueue_batch(batch)
            time.sleep(ORACLE_SECONDS)
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM jobrun.jobs"
                        " WHERE type = 'tx.work' AND state <> 'succeeded'"
                    ).fetchone()
                    == (0,)
                ),
                120,
                "every job done",
            )
            ended = store.now()
            for proc in procs:
                proc.signal(signal.SIGTERM)
            for proc in procs:
                assert proc.wait(60) == 0, workers.outputs()
        finally:
            stop.set()
            sampler.join(10)
            workers.kill_all()
        output = workers.outputs()
    finally:
        store_pool.close()
    wait_until(
        lambda: (
            conn.execute(
                "SELECT count(*) FROM jobrun.jobs WHERE type = 'tx.tick' AND state = 'leased'"
            ).fetchone()
            == (0,)
        ),
        30,
        "no occurrence left leased",
    )
    assert "Traceback" not in output, output[-4000:]
    assert "InvalidSqlStatementName" not in output and "OutcomeUnknown" not in output
    ticks = conn.execute(
        "SELECT j.run_at, j.state, (SELECT count(*) FROM effects e"
        "  WHERE e.job_id = j.id) FROM jobrun.jobs j WHERE j.type = 'tx.tick' ORDER BY j.run_at"
    ).fetchall()
    runs = [r[0] for r in ticks]
    in_run = [r for r in ticks if started + dt.timedelta(seconds=1) < r[0] < ended]
    assert len(in_run) >= int((ended - started).total_seconds()) - 3
    # Every occurrence once: one job per second, no second skipped, no effect doubled.
    assert len(runs) == len(set(runs))
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(runs)]
    assert all(g == 1.0 for g in gaps), gaps
    assert all(r[2] == 1 for r in ticks if r[1] == "succeeded"), ticks
    assert all(r[1] in ("succeeded", "queued") for r in ticks)
    oracle.enqueued(r[0] for r in conn.execute("SELECT id FROM jobrun.jobs"))
    oracle.verify()
    # Never two leaders at once, by the term: one holder per term, and no flapping.
    holders: dict[int, set[str]] = {}
    for term, holder in seen:
        holders.setdefault(term, set()).add(holder)
    assert all(len(h) == 1 for h in holders.values()), holders
    elected = re.findall(r"elected leader \(term (\d+)\)", output)
    assert sorted(elected) == sorted(set(elected)), elected  # each term granted once
    (terms,) = conn.execute("SELECT term FROM jobrun.leader").fetchone() or (0,)
    assert terms <= 2, (terms, holders)  # the second only if the leader stopped first
    print(  # the figures of the run, for the report
        f"oracle through PgBouncer: {ORACLE_JOBS} jobs, {len(ticks)} cron occurrences, "
        f"{len(in_run)} in {(ended - started).total_seconds():.1f}s, terms {sorted(holders)}, "
        f"holders per term {[len(h) for h in holders.values()]}"
    )
