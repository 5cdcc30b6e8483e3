from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import psycopg

from jobrun.postgres import migrate as m

MIGRATIONS = Path(__file__).resolve().parents[2] / "db" / "migrations"


def _tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn) as c:
        return {
            r[0]
            for r in c.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            ).fetchall()
        }


def test_migrate_applies_every_migration_to_an_empty_database(empty_dsn: str) -> None:
    applied = m.migrate(empty_dsn)
    forward = sorted(
        p.name.removesuffix(".sql")
        for p in MIGRATIONS.glob("*.sql")
        if not p.name.endswith(".rollback.sql")
    )
    assert applied == forward
    assert {"jobs", "job_events", "processed_effects", "schedules"} <= _tables(empty_dsn)
    assert m.pending(empty_dsn) == []


def test_migrate_twice_applies_nothing_the_second_time(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    assert m.migrate(empty_dsn) == []


def test_five_concurrent_migrators_apply_each_migration_once(empty_dsn: str) -> None:
    results: list[list[str]] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(5)

    def run() -> None:
        try:
            barrier.wait()
            results.append(m.migrate(empty_dsn))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    applied = [ids for ids in results if ids]
    assert len(applied) == 1
    assert sum(len(ids) for ids in results) == len(applied[0])
    with psycopg.connect(empty_dsn) as c:
        (count,) = c.execute("SELECT count(*) FROM _yoyo_migration").fetchone()  # type: ignore[misc]
    assert count == len(applied[0])


def test_migrate_leaves_no_yoyo_lock_table(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    assert "yoyo_lock" not in _tables(empty_dsn)


def test_rollback_then_replay_gives_the_same_schema(empty_dsn: str) -> None:
    m.migrate(empty_dsn)
    before = _schema_fingerprint(empty_dsn)
    m.rollback_all(empty_dsn)
    assert not ({"jobs", "job_events", "processed_effects", "schedules"} & _tables(empty_dsn))
    m.migrate(empty_dsn)
    assert _schema_fingerprint(empty_dsn) == before


def _schema_fingerprint(dsn: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as c:
        cols = c.execute(
            "SELECT table_name, column_name, data_type, is_nullable, column_default "
            "FROM information_schema.columns WHERE table_schema = 'public' "
            "AND table_name NOT LIKE '\\_yoyo%' ORDER BY 1, 2"
        ).fetchall()
        idx = c.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
            "AND tablename NOT LIKE '\\_yoyo%' ORDER BY 1"
        ).fetchall()
    return [*cols, *idx]


def test_a_migrator_killed_while_holding_the_lock_blocks_nobody(empty_dsn: str) -> None:
    script = (
        "import sys, time\n"
        "from jobrun.postgres.migrate import _Backend\n"
        "b = _Backend(sys.argv[1])\n"
        "with b.lock():\n"
        "    print('locked', flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script, empty_dsn], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert m.migrate(empty_dsn)  # the session lock died with the process
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
