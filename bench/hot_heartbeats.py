"""Measures HOT updates of heartbeats under two choices of the expired-lease index.

The figures are quoted in db/migrations/0001.initial.sql. Run: .venv/bin/python bench/hot_heartbeats.py
"""
import time, psycopg
from jobrun.postgres.embedded import throwaway_cluster
from jobrun.postgres.migrate import migrate
with throwaway_cluster({"fsync":"off"}) as c:
    for variant in ["lease_expires_at", "id"]:
        c.ensure_database(f"v_{variant}")
        dsn = c.dsn(f"v_{variant}")
        migrate(dsn)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP INDEX jobs_leased_idx")
            conn.execute(f"CREATE INDEX jobs_leased_idx ON jobs ({variant}) WHERE state = 'leased'")
            conn.execute("""INSERT INTO jobs (id, queue, type, payload, backoff, state, finished_at)
              SELECT gen_random_uuid(), 'default', 't', '{}', '{}', 'succeeded', now() FROM generate_series(1, 98000)""")
            conn.execute("""INSERT INTO jobs (id, queue, type, payload, backoff, state, lease_owner, lease_token, lease_expires_at, attempts)
              SELECT gen_random_uuid(), 'default', 't', '{}', '{}', 'leased', 'w', gen_random_uuid(), now() + interval '30 s', 1 FROM generate_series(1, 2000)""")
            conn.execute("VACUUM ANALYZE jobs")
            conn.execute("SELECT pg_stat_reset()")
            ids = [r[0] for r in conn.execute("SELECT id FROM jobs WHERE state='leased'")]
            for i in range(10):  # 10 rounds x 2000 = 20,000 heartbeat updates, in batches of 100
                for k in range(0, 2000, 100):
                    conn.execute("UPDATE jobs SET lease_expires_at = now() + interval '30 s', updated_at = now() WHERE id = ANY(%s)", [ids[k:k+100]])
            conn.execute("SELECT pg_stat_force_next_flush()")
            time.sleep(0.5)
            upd, hot = conn.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relname='jobs'").fetchone()
            t=time.perf_counter()
            for _ in range(50):
                conn.execute("SELECT id FROM jobs WHERE state='leased' AND lease_expires_at < now() ORDER BY id LIMIT 100").fetchall()
            scan=(time.perf_counter()-t)/50*1000
            plan = conn.execute("EXPLAIN SELECT id FROM jobs WHERE state='leased' AND lease_expires_at < now() ORDER BY id LIMIT 100").fetchall()
            print(variant, upd, hot, f"{hot/upd:.1%}", f"scan {scan:.2f} ms", plan[0][0][:60], plan[1][0][:70] if len(plan)>1 else "")
