"""Many hosts against one PostgreSQL: a no-op drain as worker hosts are added (issue 16).

For each way in (directly, and through PgBouncer in transaction mode with
``JOBRUN_DIRECT_URL`` for LISTEN) and each number of hosts (1, 2, 4:
``JOBRUN_SCALE_HOSTS``), ``JOBRUN_SCALE_JOBS`` no-op jobs (``bench.noop``)
are enqueued on a paused queue, one ``jobrun worker`` process per host is
started inside that host's network namespace (``--concurrency
JOBRUN_SCALE_CONCURRENCY``, ``JOB_EVENTS=all``, default settings
otherwise), and once every one has its listener up the queue is resumed.

Measured, per drain: the rate (jobs / time from the first claim to the last
finish, by the database clock), the CPU seconds per job of the database's
processes, of PgBouncer and of the workers (from /proc), transactions and
WAL bytes per job, and the connections by host address. The ceiling
(bench/measure.py's raw 8-connection loop) is measured in the same run,
before and after the drains. The model of docs/capacity.md
(:func:`bench.capacity.predict`) predicts each rate from the one-host drain
of the same way; predicted and measured are printed side by side and
written as JSON (``JOBRUN_SCALE_OUT``).

Asserted: every job done exactly once (succeeded, one attempt, one claim
event, one finish event), none lost, every worker exits cleanly, every
host connects from its own address. Never asserted: any speed (tests never
assert speed; the figures are for the reader and docs/capacity.md).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
import pytest

from bench import capacity
from bench.server import BENCH_TABLES, Database
from jobrun import NewJob
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from tests.scale.conftest import HOSTS
from tests.support.database import TestServer
from tests.support.netns import NetNamespace
from tests.support.pgbouncer import PgBouncer

ROOT = Path(__file__).resolve().parents[2]
JOBS = int(os.environ.get("JOBRUN_SCALE_JOBS", "3000"))
CONCURRENCY = int(os.environ.get("JOBRUN_SCALE_CONCURRENCY", "16"))
CEILING_TX = int(os.environ.get("JOBRUN_SCALE_CEILING_TX", str(max(2000, JOBS))))
QUEUE = "scale"
WAYS = ("direct", "pgbouncer")

pytestmark = pytest.mark.timeout(int(os.environ.get("JOBRUN_SCALE_TIMEOUT", "1800")))


def _at(dsn: str, host: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["host"] = host
    return psycopg.conninfo.make_conninfo("", **params)


@contextlib.contextmanager
def _workers(
    hosts: list[NetNamespace], urls: list[dict[str, str]], logs: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """One ``jobrun worker`` per host, inside its namespace; SIGTERM and reaped at the end."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for n, (host, env) in enumerate(zip(hosts, urls, strict=True)):
            command = [
                *("ip", "netns", "exec", host.name),
                *(sys.executable, "-m", "jobrun.cli", "worker", "--app", "bench.app:registry"),
                *("--queues", QUEUE, "--concurrency", str(CONCURRENCY), "--no-scheduler"),
                *("--log-level", "warning"),
            ]
            environ = {**os.environ, "JOBRUN_JOB_EVENTS": "all", "PYTHONPATH": str(ROOT), **env}
            with open(logs / f"worker-{n}.log", "ab") as log:
                procs.append(
                    subprocess.Popen(
                        command, stdout=log, stderr=subprocess.STDOUT, env=environ, cwd=ROOT
                    )
                )
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


def _sessions(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """(application_name, client address) of every other client session in the database."""
    rows = conn.execute(
        "SELECT application_name, host(client_addr) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " AND backend_type = 'client backend'"
    ).fetchall()
    return [(str(r[0]), str(r[1])) for r in rows]


def _wait(condition: Any, timeout: float, what: Any) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what()}")
        time.sleep(0.1)


def _drain(
    way: str,
    hosts: list[NetNamespace],
    *,
    conn: psycopg.Connection[Any],
    store: Store,
    server: TestServer,
    admin_dsn: str,
    bouncer: PgBouncer,
    logs: Path,
) -> dict[str, Any]:
    """One drain of JOBS no-op jobs by one worker per host; asserts exactly once."""
    assert server.cluster is not None
    t0 = time.monotonic()
    conn.execute(
        "TRUNCATE jobrun.jobs, jobrun.job_events, jobrun.processed_effects, jobrun.queue_pauses"
    )
    conn.execute("CHECKPOINT")
    store.pause_queue(QUEUE)
    store.enqueue_batch(NewJob(type="bench.noop", queue=QUEUE) for _ in range(JOBS))
    conn.execute("VACUUM ANALYZE jobrun.jobs, jobrun.job_events")
    if way == "direct":
        urls = [{"DATABASE_URL": _at(admin_dsn, h.host)} for h in hosts]
    else:
        urls = [
            {
                "DATABASE_URL": bouncer.dsn(admin_dsn, host=h.host),
                "JOBRUN_DIRECT_URL": _at(admin_dsn, h.host),
                "JOBRUN_POOLER": "transaction",
            }
            for h in hosts
        ]
    for log in logs.glob("worker-*.log"):
        log.unlink()
    with _workers(hosts, urls, logs) as procs:

        def outputs() -> str:
            return "\n".join(p.read_text(errors="replace")[-2000:] for p in logs.glob("*.log"))

        def ready() -> bool:
            assert all(p.poll() is None for p in procs), outputs()
            return sum(1 for a, _ in _sessions(conn) if a == "jobrun-listener") >= len(hosts)

        _wait(ready, 60, lambda: f"the workers' listeners\n{outputs()}")
        before = capacity.Counters.read(conn)
        assert bouncer.pid is not None
        workers0 = sum(capacity.process_cpu(p.pid) for p in procs)
        server0 = capacity.server_cpu(server.cluster.datadir)
        bouncer0 = capacity.process_cpu(bouncer.pid)
        busy0 = capacity.machine_busy()
        wall0 = time.monotonic()
        store.resume_queue(QUEUE)

        def drained() -> bool:
            assert all(p.poll() is None for p in procs), outputs()
            row = conn.execute(
                "SELECT count(*) FROM jobrun.jobs WHERE state IN ('queued', 'leased')"
            ).fetchone()
            return row == (0,)

        _wait(drained, max(120.0, JOBS / 20), lambda: f"the drain\n{outputs()}")
        wall = time.monotonic() - wall0
        busy = capacity.machine_busy() - busy0
        workers_cpu = sum(capacity.process_cpu(p.pid) for p in procs) - workers0
        server_cpu = capacity.server_cpu(server.cluster.datadir) - server0
        bouncer_cpu = capacity.process_cpu(bouncer.pid) - bouncer0
        sessions = _sessions(conn)
    assert [p.returncode for p in procs] == [0] * len(procs), outputs()
    assert "Traceback" not in outputs(), outputs()
    if way == "pgbouncer":
        bouncer.admin("RECONNECT")  # its server sessions end, and flush their statistics
    _wait(
        lambda: not any(a.startswith("jobrun-") for a, _ in _sessions(conn)),
        30,
        lambda: _sessions(conn),
    )
    after = capacity.Counters.read(conn)

    # -- exactly once, nothing lost ---------------------------------------------------------
    total, succeeded, once = conn.execute(
        "SELECT count(*), count(*) FILTER (WHERE state = 'succeeded'),"
        " count(*) FILTER (WHERE attempts = 1) FROM jobrun.jobs WHERE queue = %s",
        [QUEUE],
    ).fetchone() or (0, 0, 0)
    assert (total, succeeded, once) == (JOBS, JOBS, JOBS)
    wrong = conn.execute(
        "SELECT count(*) FROM (SELECT j.id,"
        "  count(*) FILTER (WHERE e.kind = 'claimed') AS claims,"
        "  count(*) FILTER (WHERE e.kind = 'succeeded') AS finishes"
        "  FROM jobrun.jobs j LEFT JOIN jobrun.job_events e ON e.job_id = j.id"
        "  GROUP BY j.id) per_job WHERE claims <> 1 OR finishes <> 1"
    ).fetchone()
    assert wrong == (0,), "a job claimed or finished other than once"

    # -- each host from its own address -----------------------------------------------------
    peers = {h.peer for h in hosts}
    listeners = {addr for app, addr in sessions if app == "jobrun-listener"}
    assert listeners == peers, sessions
    pooled = [addr for app, addr in sessions if app == "jobrun-worker"]
    if way == "direct":
        assert set(pooled) == peers, sessions
    else:
        assert set(pooled) == {"127.0.0.1"}, sessions  # PgBouncer's server connections

    row = conn.execute(
        "SELECT extract(epoch FROM (SELECT max(finished_at) FROM jobrun.jobs WHERE queue = %s)"
        " - (SELECT min(at) FROM jobrun.job_events WHERE kind = 'claimed'))::float8",
        [QUEUE],
    ).fetchone()
    assert row is not None
    seconds = float(row[0])
    # How long a job was leased, from its claim to its finish (R); the jobs
    # leased at once on average are rate x R (Little's law).
    held = conn.execute(
        "SELECT avg(extract(epoch FROM j.finished_at - e.at))::float8 FROM jobrun.jobs j"
        " JOIN jobrun.job_events e ON e.job_id = j.id AND e.kind = 'claimed'"
        " WHERE j.queue = %s",
        [QUEUE],
    ).fetchone()
    assert held is not None
    per_job = after.per_job(before, JOBS)
    print(f"{way} x {len(hosts)}: {JOBS / seconds:,.0f} jobs/s, {time.monotonic() - t0:.1f} s")
    return {
        "way": way,
        "hosts": len(hosts),
        "jobs": JOBS,
        "concurrency": CONCURRENCY,
        "rate": JOBS / seconds,
        "wall_seconds": wall,
        "leased_ms": float(held[0]) * 1000,
        "leased_mean": JOBS / seconds * float(held[0]),
        "worker_cpu_us": workers_cpu / JOBS * 1e6,
        "database_cpu_us": server_cpu / JOBS * 1e6,
        "pooler_cpu_us": (bouncer_cpu / JOBS * 1e6) if way == "pgbouncer" else 0.0,
        "cpu_cores_used": (workers_cpu + server_cpu + bouncer_cpu) / wall,
        "machine_busy_cores": busy / wall,
        "other_cores": max(0.0, busy - workers_cpu - server_cpu - bouncer_cpu) / wall,
        "database_cores": server_cpu / wall,
        "transactions_per_job": per_job["transactions"],
        "wal_bytes_per_job": per_job["wal_bytes"],
        "server_connections": len(
            [a for a, _ in sessions if a in ("jobrun-worker", "jobrun-listener")]
        ),
    }


def _costs(drain: dict[str, Any]) -> capacity.Costs:
    return capacity.Costs(
        worker=drain["worker_cpu_us"] / 1e6,
        database=drain["database_cpu_us"] / 1e6,
        pooler=drain["pooler_cpu_us"] / 1e6,
    )


def _table(
    ceiling: dict[str, float], drains: list[dict[str, Any]], latency: capacity.Latency
) -> str:
    lines = [
        f"ceiling (8 connections, raw): {ceiling['tx_per_s']:,.0f} tx/s on"
        f" {ceiling['server_cores']:.2f} server cores",
        f"one worker alone, a batch of {CONCURRENCY}: claim {1000 * latency.claim:.1f} ms,"
        f" complete {1000 * latency.complete:.1f} ms, window {1000 * latency.window:.0f} ms",
        f"{'way':<10}{'hosts':>6}{'jobs/s':>8}{'predicted':>10}{'error':>7}"
        f"{'from 1':>8}{'error':>7}{'x ceil':>7}{'db cores':>9}{'db us':>7}{'pgb us':>7}"
        f"{'wk us':>7}{'free':>6}{'R ms':>6}{'R min':>6}{'L':>5}{'conns':>6}{'tx/job':>7}"
        f"{'WAL B':>7}",
    ]
    for d in drains:
        lines.append(
            f"{d['way']:<10}{d['hosts']:>6}{d['rate']:>8,.0f}{d['predicted']:>10,.0f}"
            f"{d['error']:>+7.0%}{d['predicted_from_one_host']:>8,.0f}"
            f"{d['error_from_one_host']:>+7.0%}{d['rate'] / ceiling['tx_per_s']:>7.2f}"
            f"{d['database_cores']:>9.2f}{d['database_cpu_us']:>7.0f}{d['pooler_cpu_us']:>7.0f}"
            f"{d['worker_cpu_us']:>7.0f}{d['free_cores']:>6.2f}{d['leased_ms']:>6.1f}"
            f"{d['lease_time_model_ms']:>6.1f}"
            f"{d['leased_mean']:>5.0f}"
            f"{d['server_connections']:>6}"
            f"{d['transactions_per_job']:>7.3f}{d['wal_bytes_per_job']:>7.0f}"
        )
    lines.append(
        "predicted = min(hosts x 1 core / wk, free cores / (wk + db + pgb), hosts x 2c / R min),"
        " R min = window + c x wk + (claim + complete) / 2, with the per-job CPU of that drain;"
        " 'from 1': of the 1-host drain. R: claim to finish as measured, L = rate x R"
    )
    return "\n".join(lines)


def test_worker_hosts_added_one_primary_drains_every_job_exactly_once_directly_and_via_pgbouncer(
    hosts: list[NetNamespace],
    bouncer: PgBouncer,
    pg_server: TestServer,
    admin_dsn: str,
    tmp_path: Path,
) -> None:
    assert pg_server.cluster is not None
    started = time.monotonic()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(BENCH_TABLES)
        bench_db = Database(admin_dsn, "embedded", pg_server.cluster)
        ceilings = [capacity.ceiling(bench_db, CEILING_TX)]
        pool = open_pool(admin_dsn, concurrency=1, application_name="scale-test")
        try:
            store = Store(pool)
            # One worker's round trips for a batch, alone: the model's latency bound.
            latency = capacity.probe_latency(store, f"{QUEUE}-probe", CONCURRENCY)
            drains = [
                _drain(
                    way,
                    hosts[:n],
                    conn=conn,
                    store=store,
                    server=pg_server,
                    admin_dsn=admin_dsn,
                    bouncer=bouncer,
                    logs=tmp_path,
                )
                for way in WAYS
                for n in HOSTS
            ]
        finally:
            pool.close()
        ceilings.append(capacity.ceiling(bench_db, CEILING_TX))
    ceiling = {k: statistics.mean(c[k] for c in ceilings) for k in ceilings[0]}
    for way in WAYS:
        mine = [d for d in drains if d["way"] == way]
        first = min(mine, key=lambda d: d["hosts"])
        for d in mine:
            free = (os.cpu_count() or 1) - d["other_cores"]
            d["free_cores"] = free
            d["lease_time_model_ms"] = 1000 * capacity.lease_time(latency, _costs(d), CONCURRENCY)
            d["predicted"] = capacity.predict(
                d["hosts"], _costs(d), free, latency=latency, concurrency=CONCURRENCY
            )
            d["error"] = d["rate"] / d["predicted"] - 1
            d["predicted_from_one_host"] = capacity.predict(
                d["hosts"], _costs(first), free, latency=latency, concurrency=CONCURRENCY
            )
            d["error_from_one_host"] = d["rate"] / d["predicted_from_one_host"] - 1
    report = {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(),
        "cores": os.cpu_count(),
        "jobs": JOBS,
        "concurrency": CONCURRENCY,
        "ceiling": ceiling,
        "ceilings": ceilings,
        "latency_ms": {
            "claim": 1000 * latency.claim,
            "complete": 1000 * latency.complete,
            "window": 1000 * latency.window,
        },
        "drains": drains,
        "seconds": time.monotonic() - started,
    }
    out = Path(os.environ.get("JOBRUN_SCALE_OUT") or tmp_path / "scale.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    text = _table(ceiling, drains, latency)
    out.with_suffix(".txt").write_text(text + "\n")
    print(f"\n{text}\nscale figures: {out} ({report['seconds']:.0f} s)")
