"""An upgrade from the previous release: its database, jobs in every state, run by this code.

``previous_release/`` freezes what the last release shipped: ``RELEASE`` names
it, ``migrations/`` is a byte-for-byte copy of its ``db/migrations`` and
``seed.sql`` leaves jobs in every state, as a deployment of that release has
them when its workers are stopped for the upgrade. CONTRIBUTING.md
("Releasing") says how the copy is refreshed at each release.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
from yoyo import read_migrations

import jobrun
from jobrun._version import __version__
from jobrun.job.model import Backoff, NewJob
from jobrun.postgres import migrate as m
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.migration.test_migrate import _schema_fingerprint
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
MIGRATIONS = ROOT / "db" / "migrations"
PREVIOUS = Path(__file__).resolve().parent / "previous_release"
NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


def _job(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


RUNNABLE = [_job(n) for n in (1, 3, 4, 8, 9, 10, 11, 12)]
WAITING = [_job(2), _job(13)]  # scheduled an hour ahead; on a paused queue
FINISHED = [_job(5), _job(6), _job(7)]  # succeeded, dead, cancelled


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.strip().split("."))


def _build_previous_release(dsn: str) -> None:
    """Migrate as the previous release's ``jobrun migrate`` did, then seed its jobs."""
    backend = m._Backend(dsn)
    try:
        with backend.lock():
            backend.init_database()
            migrations = read_migrations(str(PREVIOUS / "migrations"))
            backend.apply_migrations(backend.to_apply(migrations))
    finally:
        backend.connection.close()
    with psycopg.connect(dsn) as c:
        c.execute((PREVIOUS / "seed.sql").read_text())  # type: ignore[call-overload]


def _rows(dsn: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(dsn) as c:
        rows = c.execute(
            "SELECT id::text, state::text, attempts, run_at, result, last_error, finished_at,"
            " updated_at FROM jobrun.jobs"
        ).fetchall()
    return {r[0]: r[1:] for r in rows}


def test_a_released_migration_is_never_edited_nor_removed() -> None:
    # yoyo knows a migration by its id: an edit to a released file would never
    # reach the databases that applied it, and they would differ from new ones.
    frozen = sorted(PREVIOUS.joinpath("migrations").glob("*.sql"))
    assert frozen, "previous_release/migrations is empty"
    for path in frozen:
        current = MIGRATIONS / path.name
        assert current.is_file(), f"released migration {path.name} was removed"
        assert current.read_bytes() == path.read_bytes(), f"released {path.name} was edited"
    assert _version((PREVIOUS / "RELEASE").read_text()) <= _version(__version__)


def test_the_frozen_release_is_the_changelogs_latest() -> None:
    # Releasing adds a dated changelog entry; this fails until the release's
    # migrations are frozen here too (CONTRIBUTING.md, "Releasing", step 7).
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - ", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert released, "CHANGELOG.md names no release"
    assert (PREVIOUS / "RELEASE").read_text().strip() == released[0]


def test_the_previous_release_upgrades_and_a_current_worker_runs_every_runnable_job(
    empty_dsn: str, pg_server: Any
) -> None:
    _build_previous_release(empty_dsn)
    before = _rows(empty_dsn)
    assert len(before) == 13

    frozen = {p.name.removesuffix(".sql") for p in (PREVIOUS / "migrations").glob("*.sql")}
    expected = sorted(
        p.name.removesuffix(".sql")
        for p in MIGRATIONS.glob("*.sql")
        if not p.name.endswith(".rollback.sql") and p.name.removesuffix(".sql") not in frozen
    )
    assert m.migrate(empty_dsn) == expected
    fresh = pg_server.create_database(template=None)
    try:
        m.migrate(pg_server.dsn(fresh))
        assert _schema_fingerprint(empty_dsn) == _schema_fingerprint(pg_server.dsn(fresh))
    finally:
        pg_server.drop_database(fresh)

    registry = jobrun.Registry()
    running: dict[str, int] = {}
    overlaps: list[str] = []
    guard = threading.Lock()

    @registry.handler("up.run")
    def run(ctx: jobrun.JobContext, job: jobrun.Job) -> dict[str, Any]:
        return {"ran": job.payload["n"], "attempt": ctx.attempt}

    @registry.handler("up.limited")
    def limited(ctx: jobrun.JobContext, job: jobrun.Job) -> None:
        key = str(job.concurrency_key)
        with guard:
            running[key] = running.get(key, 0) + 1
            if running[key] > 1:
                overlaps.append(key)
        time.sleep(0.2)
        with guard:
            running[key] -= 1

    @registry.handler("up.cron")
    def cron(ctx: jobrun.JobContext, job: jobrun.Job) -> str:
        return "fired"

    settings = jobrun.Settings(
        database_url=empty_dsn,
        queues={"default": None, "limited": None, "paused": None},
        concurrency=4,
        lease_ttl=dt.timedelta(seconds=3),
        heartbeat_interval=dt.timedelta(milliseconds=500),
        poll_interval=dt.timedelta(milliseconds=200),
        shutdown_grace=dt.timedelta(seconds=5),
        commit_timeout=dt.timedelta(seconds=3),
    )

    def done() -> bool:
        rows = _rows(empty_dsn)
        fired = [r for r in rows.values() if r[3] == "fired"]
        return bool(fired) and all(rows[i][0] == "succeeded" for i in RUNNABLE)

    with jobrun.Runtime(settings, registry):  # checks the schema version first
        wait_for(done, timeout=30)
    after = _rows(empty_dsn)

    for job_id in RUNNABLE:
        state, attempts, *_ = after[job_id]
        assert state == "succeeded", job_id
        if before[job_id][0] != "queued" or before[job_id][1]:
            assert attempts == 2, job_id  # the 0.1.0 attempt counted, one more here
    assert after[_job(1)][3] == {"ran": 1, "attempt": 1}
    assert after[_job(3)][3] == {"ran": 3, "attempt": 2}  # reaped, then run again
    assert after[_job(4)][3] == {"ran": 4, "attempt": 2}
    assert overlaps == []  # the 0.1.0 per-key limit still holds
    for job_id in WAITING + FINISHED:
        assert after[job_id] == before[job_id], job_id  # untouched, to the timestamp
    new = set(after) - set(before)
    assert len(new) == 1 and after[new.pop()][:1] == ("succeeded",)  # the cron job

    with psycopg.connect(empty_dsn) as c:
        kinds = [
            r[0]
            for r in c.execute(
                "SELECT kind FROM jobrun.job_events WHERE job_id = %s ORDER BY id", [_job(3)]
            )
        ]
        assert kinds[:2] == ["enqueued", "claimed"] and "reaped" in kinds
        assert kinds[-1] == "succeeded"
        assert c.execute(
            "SELECT job_id::text FROM jobrun.processed_effects WHERE key = %s", [_job(5)]
        ).fetchone() == (_job(5),)

    # An idempotency key taken under 0.1.0 is still taken: the replay returns its job.
    pool = open_pool(empty_dsn, concurrency=1)
    try:
        replay = Store(pool).enqueue(
            NewJob(
                type="up.run",
                payload={"n": 8},
                idempotency_key="order-8",
                max_attempts=3,
                backoff=NO_WAIT,
            )
        )
    finally:
        pool.close()
    assert str(replay.id) == _job(8)
