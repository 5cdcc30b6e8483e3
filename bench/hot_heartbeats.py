"""HOT updates of heartbeats under two choices of the expired-lease index.

The figures are quoted in db/migrations/0001.initial.sql.
Run: .venv/bin/python bench/hot_heartbeats.py
"""

from __future__ import annotations

import time

import psycopg
from psycopg import sql

from jobrun.postgres.embedded import throwaway_cluster
from jobrun.postgres.migrate import migrate

FINISHED_ROWS = 98_000
LEASED_ROWS = 2_000
ROUNDS = 10  # 10 x 2,000 = 20,000 heartbeat updates, 100 ids per statement

SEED_FINISHED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, finished_at)
SELECT gen_random_uuid(), 'default', 't', '{}', '{}', 'succeeded', now()
FROM generate_series(1, %s)
"""
SEED_LEASED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, lease_owner, lease_token,
                  lease_expires_at, attempts)
SELECT gen_random_uuid(), 'default', 't', '{}', '{}', 'leased', 'w', gen_random_uuid(),
       now() + interval '30 s', 1
FROM generate_series(1, %s)
"""
HEARTBEAT = """
UPDATE jobrun.jobs SET lease_expires_at = now() + interval '30 s', updated_at = now()
WHERE id = ANY(%s)
"""
REAPER_SCAN = """
SELECT id FROM jobrun.jobs WHERE state = 'leased' AND lease_expires_at < now() ORDER BY id LIMIT 100
"""


def measure(dsn: str, column: str) -> tuple[int, int, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP INDEX jobs_leased_idx")
        conn.execute(
            sql.SQL("CREATE INDEX jobs_leased_idx ON jobs ({}) WHERE state = 'leased'").format(
                sql.Identifier(column)
            )
        )
        conn.execute(SEED_FINISHED, [FINISHED_ROWS])
        conn.execute(SEED_LEASED, [LEASED_ROWS])
        conn.execute("VACUUM ANALYZE jobrun.jobs")
        conn.execute("SELECT pg_stat_reset()")
        ids = [r[0] for r in conn.execute("SELECT id FROM jobrun.jobs WHERE state = 'leased'")]
        for _ in range(ROUNDS):
            for k in range(0, len(ids), 100):
                conn.execute(HEARTBEAT, [ids[k : k + 100]])
        conn.execute("SELECT pg_stat_force_next_flush()")
        time.sleep(0.5)
        row = conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'jobs'"
        ).fetchone()
        assert row is not None
        started = time.perf_counter()
        for _ in range(50):
            conn.execute(REAPER_SCAN).fetchall()
        scan_ms = (time.perf_counter() - started) / 50 * 1000
        return int(row[0]), int(row[1]), scan_ms


def main() -> None:
    with throwaway_cluster({"fsync": "off"}) as cluster:
        for column in ("lease_expires_at", "id"):
            name = f"v_{column}"
            cluster.ensure_database(name)
            migrate(cluster.dsn(name))
            updates, hot, scan_ms = measure(cluster.dsn(name), column)
            print(
                f"index on ({column}) WHERE state = 'leased': {hot} of {updates} updates HOT "
                f"({hot / updates:.1%}); reaper scan {scan_ms:.2f} ms"
            )


if __name__ == "__main__":
    main()
