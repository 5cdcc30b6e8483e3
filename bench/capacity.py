"""The per-job costs behind docs/capacity.md, and the model that predicts the scale test.

``python -m bench.capacity`` (from the repository root) starts a throwaway
PostgreSQL like ``make bench`` (or uses ``DATABASE_URL``), with
``pg_stat_statements`` preloaded, and measures, around a no-op drain of
``--jobs`` jobs by one ``jobrun worker`` process (``--concurrency``,
``JOBRUN_JOB_EVENTS=all``, default settings otherwise):

- statements per job: ``pg_stat_statements`` calls in the database, BEGIN
  and COMMIT included (an upper bound on client round trips: jobrun does not
  pipeline across statements), and transactions per job
  (``pg_stat_database.xact_commit``);
- WAL bytes per job (``pg_current_wal_lsn()`` before and after) and WAL
  records and full-page images (``pg_stat_wal``);
- tuples written per job, by table (``pg_stat_user_tables``: inserted,
  updated, of those HOT, deleted), and index entries: every insert and every
  non-HOT update adds one entry to each index whose predicate the new row
  version matches; the figure counts every index (an upper bound) and the
  indexes' growth in bytes is measured beside it;
- CPU seconds per job of the database server (its processes' time from
  /proc) and of the worker process;
- connections per worker process, by ``application_name``, while it runs;
- the ceiling: bench/measure.py's raw 8-connection loop (``UPDATE`` +
  ``INSERT`` + ``COMMIT``), with the server's CPU during it.

The figures are printed and written as JSON to ``--out`` (bench/results/).
:func:`predict` is the throughput model; tests/scale calls it with the costs
it measures in its own run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from rich.console import Console

from bench import cpu, measure, server
from jobrun import NewJob
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store

RESULTS = Path(__file__).resolve().parent / "results"

CORES = os.cpu_count() or 1


# -- the model ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Costs:
    """CPU seconds per job, measured on one drain."""

    worker: float
    """Worker processes (all their threads)."""
    database: float
    """PostgreSQL's processes."""
    pooler: float = 0.0
    """PgBouncer (0 when the workers connect directly)."""

    @property
    def total(self) -> float:
        return self.worker + self.database + self.pooler


@dataclasses.dataclass(frozen=True, kw_only=True)
class Latency:
    """A worker's round trips for one batch, measured alone (see :func:`probe_latency`)."""

    claim: float
    """Seconds for ``Store.claim`` of a batch (a worker's concurrency) of jobs."""
    complete: float
    """Seconds for ``Store.complete_many`` of such a batch."""
    window: float = 0.005
    """The completer's batching window (``complete_flush_interval``, 5 ms by default)."""


def lease_time(latency: Latency, costs: Costs, concurrency: int) -> float:
    """The shortest life of a lease in a worker of ``concurrency`` threads (seconds).

    A lease begins when its claim commits and ends when its completion
    commits. Between the two: the rest of the claim's round trip (its reply,
    read and made into jobs), the worker's CPU for the batch (serialised on
    its GIL: ``c * w``), the completer's batching window, and the completion's
    round trip up to its commit (the request and the statement). Half of
    each round trip stands for the part on the lease's side of its commit:
    ``R = window + c * w + (claim + complete) / 2``.
    """
    round_trips = (latency.claim + latency.complete) / 2
    return latency.window + concurrency * costs.worker + round_trips


def predict(
    hosts: int,
    costs: Costs,
    cores: float,
    host_cores: float = 1.0,
    *,
    latency: Latency | None = None,
    concurrency: int | None = None,
) -> float:
    """The no-op drain rate (jobs/s) of ``hosts`` worker hosts: docs/capacity.md, "The model".

    ``X(n) = min(n * H / w, F / (w + d + b), n * 2c / R)``, three bounds:

    - the worker's CPU: handlers, claim loop and completer share one GIL, so
      a host (one worker process) uses at most ``H`` (one core) at ``w`` CPU
      seconds per job;
    - the machine's CPU: the CPU all of it needs per job (worker ``w``,
      database ``d``, pooler ``b``) must fit in the ``F`` cores there are
      (on the test machine every process shares them: ``F`` is what other
      work left free; in a deployment the database's term is
      ``db_cores / d`` on its own);
    - the worker's latency (with ``latency`` and ``concurrency``): a worker
      holds at most two batches of ``c`` leases in a drain (one running or
      waiting for the completer, the next claimed for the threads the first
      freed), each living at least :func:`lease_time` ``R``; by Little's
      law a host finishes at most ``2c / R`` jobs a second.
    """
    if hosts < 1 or costs.worker <= 0 or costs.total <= 0 or cores <= 0:
        raise ValueError("hosts, the costs and the cores must be positive")
    bound = min(hosts * host_cores / costs.worker, cores / costs.total)
    if latency is not None:
        if concurrency is None or concurrency < 1:
            raise ValueError("the latency bound needs the workers' concurrency")
        bound = min(bound, hosts * 2 * concurrency / lease_time(latency, costs, concurrency))
    return bound


def probe_latency(store: Store, queue: str, batch: int, rounds: int = 30) -> Latency:
    """Median round trips of one worker's claim and completion of ``batch`` no-op
    jobs, one after the other on an otherwise idle store (``rounds`` of each)."""
    store.enqueue_batch(NewJob(type="bench.noop", queue=queue) for _ in range(batch * rounds))
    claims: list[float] = []
    completes: list[float] = []
    ttl = dt.timedelta(minutes=5)
    for _ in range(rounds):
        began = time.perf_counter()
        jobs = store.claim("capacity-probe", [queue], batch, ttl)
        claims.append(time.perf_counter() - began)
        began = time.perf_counter()
        store.complete_many(jobs)
        completes.append(time.perf_counter() - began)
    return Latency(claim=statistics.median(claims), complete=statistics.median(completes))


# -- the counters -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Counters:
    """The server's cumulative counters at one moment (see :meth:`read`)."""

    lsn: int
    wal_records: int
    wal_fpi: int
    xacts: int
    statements: int | None
    tables: dict[str, tuple[int, int, int, int]]
    """relname -> (inserted, updated, hot updated, deleted)."""
    index_bytes: dict[str, int]
    indexes: dict[str, int]
    """relname -> how many indexes the table has."""

    @classmethod
    def read(cls, conn: psycopg.Connection[Any]) -> Counters:
        """Read them on ``conn`` (autocommit, in the measured database).

        Statistics are flushed by backends when they go idle or exit: read
        after the workers stopped, and after ``pg_stat_force_next_flush()``.
        """
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT pg_current_wal_lsn() - '0/0'::pg_lsn, wal_records, wal_fpi,"
            " (SELECT xact_commit FROM pg_stat_database WHERE datname = current_database())"
            " FROM pg_stat_wal"
        ).fetchone()
        assert row is not None
        statements = None
        with contextlib.suppress(psycopg.Error):
            got = conn.execute(
                "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements"
                " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND query NOT LIKE '%%pg_stat%%' AND query NOT LIKE '%%pg_current_wal%%'"
            ).fetchone()
            statements = int(got[0]) if got else None
        tables = {
            r[0]: (int(r[1]), int(r[2]), int(r[3]), int(r[4]))
            for r in conn.execute(
                "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del"
                " FROM pg_stat_user_tables WHERE schemaname = 'jobrun'"
            ).fetchall()
        }
        index_bytes = {
            r[0]: int(r[1])
            for r in conn.execute(
                "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
                " WHERE schemaname = 'jobrun'"
            ).fetchall()
        }
        indexes = {
            r[0]: int(r[1])
            for r in conn.execute(
                "SELECT relname, count(*) FROM pg_stat_user_indexes"
                " WHERE schemaname = 'jobrun' GROUP BY 1"
            ).fetchall()
        }
        return cls(
            int(row[0]),
            int(row[1]),
            int(row[2]),
            int(row[3]),
            statements,
            tables,
            index_bytes,
            indexes,
        )

    def per_job(self, before: Counters, jobs: int, *, own_xacts: int = 0) -> dict[str, Any]:
        """What was written between ``before`` and this, divided by ``jobs``.

        ``own_xacts``: transactions of the measuring side itself to leave out.
        """
        tables: dict[str, dict[str, float]] = {}
        entries = 0.0
        for name, (ins, upd, hot, dele) in self.tables.items():
            b = before.tables.get(name, (0, 0, 0, 0))
            d = (ins - b[0], upd - b[1], hot - b[2], dele - b[3])
            if any(d):
                tables[name] = {
                    "inserted": d[0] / jobs,
                    "updated": d[1] / jobs,
                    "hot_updated": d[2] / jobs,
                    "deleted": d[3] / jobs,
                }
                entries += (d[0] + d[1] - d[2]) * self.indexes.get(name, 0)
        index_growth = {
            name: size - before.index_bytes.get(name, 0)
            for name, size in self.index_bytes.items()
            if size != before.index_bytes.get(name, 0)
        }
        return {
            "wal_bytes": (self.lsn - before.lsn) / jobs,
            "wal_records": (self.wal_records - before.wal_records) / jobs,
            "wal_fpi": (self.wal_fpi - before.wal_fpi) / jobs,
            "transactions": (self.xacts - before.xacts - own_xacts) / jobs,
            "statements": (
                (self.statements - before.statements) / jobs
                if self.statements is not None and before.statements is not None
                else None
            ),
            "tuples_written": sum(
                t["inserted"] + t["updated"] + t["deleted"] for t in tables.values()
            ),
            "tables": tables,
            "index_entries_at_most": entries / jobs,
            "index_bytes": {name: grew / jobs for name, grew in index_growth.items()},
        }


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads)."""
    return cpu.process_cpu_seconds(pid)


def server_cpu(datadir: Path) -> float:
    """CPU seconds of a local PostgreSQL so far: the postmaster, its live children
    and the children it reaped (bench/cpu.py)."""
    return cpu.tree_cpu_seconds(cpu.postmaster_pid(datadir))


def machine_busy() -> float:
    """CPU seconds the whole machine was busy so far (/proc/stat: not idle, not iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def connections(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Client connections to the current database, by application_name."""
    return {
        str(r[0]): int(r[1])
        for r in conn.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend' GROUP BY 1 ORDER BY 1"
        ).fetchall()
    }


def _wait_gone(conn: psycopg.Connection[Any], application_name: str, timeout: float = 15) -> None:
    """Until no backend of ``application_name`` is left (their statistics are flushed)."""
    deadline = time.monotonic() + timeout
    while connections(conn).get(application_name) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)


def ceiling(db: server.Database, transactions: int, threads: int = 8) -> dict[str, float]:
    """bench/measure.py's ceiling loop on ``db``: tx/s and the server's CPU cores meanwhile."""
    db.execute("TRUNCATE bench_ceiling_jobs, bench_ceiling_log")
    db.execute(
        "INSERT INTO bench_ceiling_jobs (id, state)"
        " SELECT g, 'leased' FROM generate_series(1, %s) g",
        [transactions],
    )
    db.execute("VACUUM ANALYZE bench_ceiling_jobs")
    seconds, server_seconds = measure._ceiling_loop(db, transactions, threads)
    done = db.execute("SELECT count(*) FROM bench_ceiling_log")[0][0]
    assert done == transactions, f"{done} of {transactions} ceiling transactions"
    rate = transactions / seconds
    cores = server_seconds / seconds if server_seconds is not None else float("nan")
    return {"tx_per_s": rate, "server_cores": cores, "tx_per_s_per_server_core": rate / cores}


# -- the measurement --------------------------------------------------------------------------


@contextlib.contextmanager
def _context(url: str | None, workdir: Path) -> Iterator[measure.Context]:
    settings = {"shared_preload_libraries": "pg_stat_statements"} if not url else {}
    with server.database(url, settings) as db:
        db.enable_statements()
        store = Store(open_pool(db.dsn, concurrency=1, application_name="bench-enqueue"))
        try:
            yield measure.Context(db, measure.Sizes(), 1, Console(width=150), workdir, store)
        finally:
            store.pool.close()


def measure_costs(ctx: measure.Context, jobs: int, concurrency: int) -> dict[str, Any]:
    """One no-op drain; every per-job figure of the module docstring."""
    db = ctx.db
    queue = "capacity"
    db.reset()
    ctx.store.pause_queue(queue)
    with psycopg.connect(db.dsn, autocommit=True) as conn:
        # The enqueue: one Store.enqueue per job (an application's usual path).
        db.reset_statements()
        start = Counters.read(conn)
        server0 = db.server_cpu_seconds()
        store = Store(open_pool(db.dsn, concurrency=1, application_name="bench-enqueue"))
        try:
            for _ in range(jobs):
                store.enqueue(NewJob(type="bench.noop", queue=queue))
        finally:
            store.pool.close()
        # A backend's statistics reach the server when it exits (or up to 10 s
        # later), and its CPU time the postmaster's once it is reaped.
        _wait_gone(conn, "bench-enqueue")
        server1 = db.server_cpu_seconds()
        enqueued = Counters.read(conn).per_job(start, jobs, own_xacts=2)
        if server0 is not None and server1 is not None:
            enqueued["database_cpu_per_job_us"] = (server1 - server0) / jobs * 1e6
        db.execute("VACUUM ANALYZE jobrun.jobs, jobrun.job_events")
        with measure.workers(ctx, queue, concurrency) as w:
            w.wait_ready()
            db.reset_statements()
            before = Counters.read(conn)
            cpu0 = w.cpu_seconds()
            server0 = db.server_cpu_seconds()
            wall0 = time.monotonic()
            ctx.store.resume_queue(queue)
            measure._wait_drained(ctx, w, queue, timeout=600)
            wall = time.monotonic() - wall0
            server1 = db.server_cpu_seconds()
            worker_cpu = w.cpu_seconds() - cpu0
            # The worker's own, once its pools have grown to what the drain needed.
            seen = {k: v for k, v in connections(conn).items() if k.startswith("jobrun-")}
        _wait_gone(conn, "jobrun-worker")
        after = Counters.read(conn)
        db.execute("VACUUM jobrun.jobs, jobrun.job_events, jobrun.processed_effects")
        stored = {
            str(r[0]): int(r[1]) / jobs
            for r in conn.execute(
                "SELECT t, pg_total_relation_size(t) FROM unnest(ARRAY['jobrun.jobs',"
                " 'jobrun.job_events', 'jobrun.processed_effects']) AS t"
            ).fetchall()
        }
        first, last, done = conn.execute(
            "SELECT (SELECT min(at) FROM jobrun.job_events WHERE kind = 'claimed'),"
            " (SELECT max(finished_at) FROM jobrun.jobs WHERE queue = %s),"
            " (SELECT count(*) FROM jobrun.jobs WHERE queue = %s AND state = 'succeeded')",
            [queue, queue],
        ).fetchone() or (None, None, 0)
        statements = db.top_statements(limit=20)
    if done != jobs:
        raise RuntimeError(f"{done} of {jobs} jobs succeeded")
    seconds = (last - first).total_seconds()
    database_cpu = (server1 - server0) if server0 is not None and server1 is not None else None
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "rate": jobs / seconds,
        "wall_seconds": wall,
        "worker_cpu_per_job_us": worker_cpu / jobs * 1e6,
        "database_cpu_per_job_us": database_cpu / jobs * 1e6 if database_cpu else None,
        "connections_per_worker_process": seen,
        # The drain poll (3 a second) and the resume are the measuring side's.
        **after.per_job(before, jobs, own_xacts=int(wall * 3) + 4),
        "top_statements": statements,
        "enqueue": enqueued,
        "stored_bytes_per_finished_job": stored,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.capacity", description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--ceiling-tx", type=int, default=20_000)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    console = Console(width=150)
    started = dt.datetime.now(dt.UTC)
    with (
        tempfile.TemporaryDirectory(prefix="jobrun-capacity-") as workdir,
        _context(os.environ.get("DATABASE_URL") or None, Path(workdir)) as ctx,
    ):
        info = ctx.db.info()
        costs = measure_costs(ctx, args.jobs, args.concurrency)
        top = ceiling(ctx.db, args.ceiling_tx)
    result = {
        "timestamp": started.isoformat(),
        "postgres": info,
        "machine": server.machine(),
        "jobrun": server.code(),
        "costs": costs,
        "ceiling": top,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"capacity-{started:%Y%m%dT%H%M%SZ}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    c = costs
    console.print(f"no-op drain of {c['jobs']:,} jobs, 1 worker process x {c['concurrency']}:")
    console.print(f"  rate                     {c['rate']:,.0f} jobs/s")
    for key in ("statements", "transactions", "wal_bytes", "wal_records", "wal_fpi"):
        value = c[key]
        console.print(f"  {key:<24} {value:,.3f} per job" if value is not None else f"  {key}: n/a")
    console.print(f"  tuples written           {c['tuples_written']:.2f} per job")
    for name, t in c["tables"].items():
        console.print(
            f"    {name:<22} ins {t['inserted']:.2f} upd {t['updated']:.2f}"
            f" (HOT {t['hot_updated']:.2f}) del {t['deleted']:.2f}"
        )
    console.print(f"  index entries (at most)  {c['index_entries_at_most']:.2f} per job")
    for name, grew in c["index_bytes"].items():
        console.print(f"    {name:<22} {grew:.1f} bytes per job")
    console.print(f"  worker CPU               {c['worker_cpu_per_job_us']:.0f} us per job")
    if c["database_cpu_per_job_us"] is not None:
        console.print(f"  database CPU             {c['database_cpu_per_job_us']:.0f} us per job")
    console.print(f"  connections per process  {c['connections_per_worker_process']}")
    console.print(
        "  stored per finished job  "
        + ", ".join(f"{t} {b:.0f}" for t, b in c["stored_bytes_per_finished_job"].items())
        + " bytes (indexes included, after VACUUM)"
    )
    e = c["enqueue"]
    console.print(
        f"enqueue, one Store.enqueue per job: {e['statements']} statements,"
        f" {e['transactions']:.2f} transactions, {e['wal_bytes']:.0f} WAL bytes,"
        f" {e['tuples_written']:.2f} tuples, {e['index_entries_at_most']:.2f} index entries"
        f" (at most), {e.get('database_cpu_per_job_us', 0):.0f} us database CPU per job"
    )
    console.print(
        f"ceiling: {top['tx_per_s']:,.0f} tx/s on {top['server_cores']:.2f} server cores"
        f" = {top['tx_per_s_per_server_core']:,.0f} tx/s per server core"
    )
    if c["database_cpu_per_job_us"]:
        console.print(f"jobs/s per database core: {1e6 / c['database_cpu_per_job_us']:,.0f}")
    console.print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
