"""The measurements of issue 6. Each returns Figures (one value per run).

Methods (see also bench/README.md):

ceiling        N transactions over T threads, one connection each (autocommit
               off), each transaction ``UPDATE bench_ceiling_jobs ... WHERE
               id = $1`` + ``INSERT INTO bench_ceiling_log`` + COMMIT, no
               jobrun code; wall clock from a barrier release to the last join.
enqueue_one    ``Store.enqueue(NewJob(...))`` N times on one thread (the NewJob
               is built in the loop); wall clock.
enqueue_batch  ``Store.enqueue_batch`` in a child process (bench/child.py):
               a list of N jobs, and a generator of M jobs; wall clock around
               the call; the child's ru_maxrss.
drain          N no-op jobs enqueued on a paused queue, then ``jobrun worker``
               process(es) started and ready (their LISTEN connection is up),
               then the queue resumed. Rate = N / (last ``jobs.finished_at`` -
               first ``claimed`` event), both by the database clock.
               Peak RSS = VmHWM of each worker process, read before SIGTERM.
drain_tx       the same with handlers returning a commit callable (one INSERT),
               i.e. one Complete transaction per job.
dashboard      the dashboard's pages (overview, jobs, jobs of a state, a jobs page half
               way down) through its ASGI app on the growth table: 20 requests
               per page and run after 3 warm-up ones; p50 and p95 server time.
handlers       the no-op drain at the highest concurrency, alternating a plain
               ``def`` handler and an ``async def`` one (bench/handlers.py).
observed       the no-op drain at the highest concurrency, alternating a worker
               with no observability, one with ``--metrics-port 0`` and one
               with ``--tracing otel`` (SDK, batch processor, null exporter);
               cost = 1 - rate with / rate without, per run.
limits         the no-op drain at the highest concurrency, alternating no limit, a
               concurrency limit of 50, one of 1,000, a per-key limit of 1 over 1,000
               keys and a rate limit of 1,000,000/s (issue 14); ratio = limited /
               unlimited, per run.
limits_claim   ``Store.claim`` of 32 jobs (the previous 32 still leased) at 100,000
               queued jobs, without limits and under each kind; p50, p99, ratios.
worker_rss     a longer no-op drain (100,000 jobs by default) for the RSS target.
pickup         an idle ``jobrun worker``; jobs enqueued one by one at a fixed
               rate; latency = the handler's ``time.time()`` at start minus
               the enqueuer's ``time.time()`` right after ``enqueue`` returned
               (so after COMMIT). Same host, same clock.
sustained      a producer at 80 % of the peak drain rate and a worker, for 10
               minutes; completions per minute, last / first, the tables'
               size and dead tuples (bench/sustained.py).
growth         ``Store.claim`` of B jobs, timed one call at a time, on a table
               holding only the jobs the samples claim ("empty") and on one
               with F finished + Q queued rows ("large"); plus EXPLAIN of the
               claim statement (custom and generic plans) on the large table.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from rich.console import Console

from bench import cpu
from bench import workflows as bench_workflows
from bench.plan import explain_claim
from bench.server import ROOT, Database
from bench.stats import (
    Figure,
    at_least,
    at_most,
    below,
    not_below,
    percentile,
    ratio_at_least,
)
from jobrun import NewJob
from jobrun.job.model import DEFAULT_BACKOFF
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store


@dataclasses.dataclass
class Sizes:
    """Every size the benchmark uses; ``--size NAME=VALUE`` overrides one."""

    enqueue_one_jobs: int = 3_000
    batch_jobs: int = 100_000
    stream_jobs: int = 1_000_000
    drain_jobs: int = 50_000
    """No-op drains (at concurrency > 1)."""
    drain_tx_jobs: int = 50_000
    """Transactional drains."""
    drain_c1_jobs: int = 10_000
    """Cap for drains at concurrency 1 (one claim per job)."""
    drain_concurrency: str = "1,8,32"
    procs: int = 2
    procs_concurrency: int = 16
    rss_drain_jobs: int = 100_000
    rss_drain_concurrency: int = 32
    pickup_rate: float = 20.0
    pickup_seconds: float = 10.0
    pickup_concurrency: int = 10
    ceiling_threads: int = 8
    ceiling_tx: int = 20_000
    growth_finished: int = 1_000_000
    growth_queued: int = 100_000
    growth_samples: int = 300
    claim_batch: int = 10
    limits_queued: int = 100_000
    """Queued jobs under the claims of ``limits_claim`` (topped up before each block)."""
    limits_samples: int = 500
    limits_claim_batch: int = 32
    sustained_seconds: float = 600.0
    """The producer-consumer run's length (bench/sustained.py)."""
    sustained_interval: float = 0.0
    """Its sampling interval; 0: a minute, or a sixth of a run shorter than 6 minutes."""
    sustained_load: float = 0.8
    """The producer's rate as a fraction of the peak drain rate measured just before."""
    sustained_peak_jobs: int = 50_000
    sustained_concurrency: int = 0
    """The worker's threads for the peak and the run; 0: the highest of drain_concurrency."""
    wf_concurrency: int = 32
    """The worker's threads for the workflow figures (bench/workflows.py)."""
    wf_plain_jobs: int = 32_000
    """The baseline drain: as many jobs as the chains have nodes (32 x 1,000), so that
    both drains last about as long and share the server's background work alike."""
    wf_fanout: int = 10_000
    wf_chains: int = 32
    """Chains side by side (each ``wf_chain_length`` jobs, one after the other): one per
    worker thread, so that a chain's link latency, not idle threads, is what is measured."""
    wf_chain_length: int = 1_000
    wf_fanins: int = 200
    wf_fanin_rate: float = 20.0

    @property
    def concurrencies(self) -> list[int]:
        return [int(c) for c in self.drain_concurrency.split(",") if c.strip()]

    def set(self, assignment: str) -> None:
        name, _, value = assignment.partition("=")
        name = name.strip().replace("-", "_")
        fields = {f.name: f for f in dataclasses.fields(self)}
        if name not in fields or not value:
            raise ValueError(
                f"--size {assignment!r}: expected NAME=VALUE, NAME one of {sorted(fields)}"
            )
        current = getattr(self, name)
        setattr(self, name, type(current)(value.strip()))


QUICK = Sizes(
    enqueue_one_jobs=100,
    batch_jobs=2_000,
    stream_jobs=20_000,
    drain_jobs=1_000,
    drain_tx_jobs=1_000,
    drain_c1_jobs=500,
    procs_concurrency=8,
    rss_drain_jobs=2_000,
    pickup_seconds=2.0,
    ceiling_tx=800,
    growth_finished=20_000,
    growth_queued=2_000,
    growth_samples=30,
    limits_queued=2_000,
    limits_samples=30,
    sustained_seconds=30.0,
    sustained_peak_jobs=1_000,
    wf_plain_jobs=500,
    wf_fanout=500,
    wf_chain_length=20,
    wf_fanins=20,
)


@dataclasses.dataclass
class Context:
    db: Database
    sizes: Sizes
    runs: int
    console: Console
    workdir: Path
    store: Store
    failures: list[str] = dataclasses.field(default_factory=list)
    """Parts of a measurement that failed while the rest still produced figures."""

    def say(self, text: str) -> None:
        self.console.print(f"  [dim]{text}[/dim]", highlight=False)

    def failed(self, figure: str, run: int, exc: Exception) -> None:
        """Run ``run`` (from 0) of ``figure`` failed: noted for the summary, and said."""
        self.failures.append(f"{figure} run {run + 1}: {exc}")
        self.console.print(f"[red]{figure} run {run + 1} failed:[/red] {exc}")


# -- worker processes -----------------------------------------------------------


class Workers:
    """``jobrun worker --app bench.app:registry`` processes on one queue."""

    def __init__(
        self,
        ctx: Context,
        queue: str,
        concurrency: int,
        procs: int,
        extra_args: tuple[str, ...] = (),
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.ctx = ctx
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        env = {
            **os.environ,
            "DATABASE_URL": ctx.db.dsn,
            "JOBRUN_JOB_EVENTS": "all",
            "PYTHONPATH": str(ROOT),
            **(extra_env or {}),
        }
        for n in range(procs):
            log = ctx.workdir / f"worker-{time.monotonic_ns()}-{n}.log"
            with open(log, "wb") as handle:
                self.procs.append(
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "jobrun.cli",
                            "worker",
                            "--app",
                            "bench.app:registry",
                            "--queues",
                            queue,
                            "--concurrency",
                            str(concurrency),
                            "--no-scheduler",
                            "--log-level",
                            "warning",
                            *extra_args,
                        ],
                        stdout=handle,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=ROOT,
                    )
                )
            self.logs.append(log)

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"worker {proc.pid} exited with {proc.returncode}:\n{tail}")

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until every process has its LISTEN connection (its pool is open by then)."""
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive()
            if _connections(self.ctx.db, "jobrun-listener") >= len(self.procs):
                return
            if time.monotonic() > deadline:
                raise RuntimeError("the worker processes did not get ready in time")
            time.sleep(0.05)

    def peak_rss_mb(self) -> float:
        """The largest VmHWM (peak resident set) among the processes, in MB."""
        peak = 0.0
        for proc in self.procs:
            for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024)
        return peak

    def cpu_seconds(self) -> float:
        """User + system CPU time of the processes so far (all their threads)."""
        return sum(cpu.process_cpu_seconds(proc.pid) for proc in self.procs)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        # Their backends go away a moment after the processes.
        deadline = time.monotonic() + 10
        while _connections(self.ctx.db, None) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)


@contextlib.contextmanager
def workers(
    ctx: Context,
    queue: str,
    concurrency: int,
    procs: int = 1,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
) -> Iterator[Workers]:
    w = Workers(ctx, queue, concurrency, procs, extra_args, extra_env)
    try:
        yield w
    finally:
        w.stop()


def _connections(db: Database, application_name: str | None) -> int:
    """Worker connections (listener, or every jobrun-worker/listener one) to the bench db."""
    names = [application_name] if application_name else ["jobrun-listener", "jobrun-worker"]
    rows = db.execute(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND application_name = ANY(%s)",
        [names],
    )
    return int(rows[0][0])


DRAIN_POLL = """
SELECT EXISTS (SELECT 1 FROM jobrun.jobs WHERE state = 'queued' AND queue = %s)
    OR EXISTS (SELECT 1 FROM jobrun.jobs WHERE state = 'leased'),
       (SELECT max(finished_at) FROM jobrun.jobs)
"""


def _wait_drained(ctx: Context, w: Workers, queue: str, timeout: float) -> None:
    """Until no job of ``queue`` is queued or leased; fails on a stall or a dead worker.

    The poll must cost the server next to nothing (it runs during the
    measurement): one connection, index probes through the partial claim and
    lease indexes and the finished_at index, three times a second.
    """
    last, last_change = None, time.monotonic()
    deadline = time.monotonic() + timeout
    with psycopg.connect(ctx.db.dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(DRAIN_POLL, [queue]).fetchone()
            assert row is not None
            pending, finished = row
            if not pending:
                return
            now = time.monotonic()
            if finished != last:
                last, last_change = finished, now
            if now - last_change > 60 or now > deadline:
                raise RuntimeError(
                    "the drain stalled: no job finished for 60 s\n" + _stall_report(ctx, w)
                )
            w.check_alive()
            time.sleep(0.3)


def _stall_report(ctx: Context, w: Workers) -> str:
    """What the database sessions and the workers were doing when a drain stalled."""
    lines = [
        "jobs by state: "
        + ", ".join(
            f"{state} {n}"
            for state, n in ctx.db.execute(
                "SELECT state, count(*) FROM jobrun.jobs GROUP BY 1 ORDER BY 1"
            )
        )
    ]
    for row in ctx.db.execute(
        "SELECT pid, application_name, state, wait_event_type, wait_event,"
        " now() - xact_start, left(regexp_replace(query, '\\s+', ' ', 'g'), 120)"
        " FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        " ORDER BY xact_start NULLS LAST"
    ):
        lines.append(" | ".join(str(v) for v in row))
    for log in w.logs:
        tail = log.read_text(errors="replace")[-1500:]
        if tail.strip():
            lines.append(f"--- {log.name}\n{tail}")
    return "\n".join(lines)


# -- the measurements -----------------------------------------------------------


CEILING_UPDATE = (
    "UPDATE bench_ceiling_jobs SET state = 'succeeded', attempts = attempts + 1,"
    " updated_at = now() WHERE id = %s"
)
CEILING_INSERT = "INSERT INTO bench_ceiling_log (job_id) VALUES (%s)"


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _ceiling_loop(db: Database, transactions: int, threads: int) -> tuple[float, float | None]:
    """Seconds for ``threads`` connections to run ``transactions`` minimal job transactions,
    and the server's CPU seconds meanwhile (read before the backends exit)."""
    conns = [psycopg.connect(db.dsn) for _ in range(threads)]  # autocommit off
    barrier = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def work(k: int, conn: psycopg.Connection[Any]) -> None:
        try:
            barrier.wait()
            for i in range(k + 1, transactions + 1, threads):
                conn.execute(CEILING_UPDATE, [i])
                conn.execute(CEILING_INSERT, [i])
                conn.commit()
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=work, args=(k, c), daemon=True) for k, c in enumerate(conns)]
    try:
        for t in workers:
            t.start()
        server0 = db.server_cpu_seconds()
        barrier.wait()
        started = time.perf_counter()
        for t in workers:
            t.join()
        seconds = time.perf_counter() - started
        server1 = db.server_cpu_seconds()
    finally:
        for c in conns:
            c.close()
    if errors:
        raise errors[0]
    server = server1 - server0 if server0 is not None and server1 is not None else None
    return seconds, server


def ceiling(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    values: list[float] = []
    client: list[float] = []
    server: list[float] = []
    for run in range(ctx.runs):
        ctx.db.reset()
        ctx.db.execute(
            "INSERT INTO bench_ceiling_jobs (id, state)"
            " SELECT g, 'leased' FROM generate_series(1, %s) g",
            [s.ceiling_tx],
        )
        ctx.db.execute("VACUUM ANALYZE bench_ceiling_jobs")
        client0 = _own_cpu_seconds()
        seconds, server_cpu = _ceiling_loop(ctx.db, s.ceiling_tx, s.ceiling_threads)
        client.append((_own_cpu_seconds() - client0) / seconds)
        if server_cpu is not None:
            server.append(server_cpu / seconds)
        done = ctx.db.execute("SELECT count(*) FROM bench_ceiling_log")[0][0]
        assert done == s.ceiling_tx, f"{done} of {s.ceiling_tx} ceiling transactions"
        values.append(s.ceiling_tx / seconds)
        ctx.say(
            f"ceiling run {run + 1}: {values[-1]:,.0f} tx/s, client CPU {client[-1]:.2f} cores"
            f" (server {server[-1] if server else 0:.2f})"
        )
    return [
        Figure(
            "ceiling",
            "tx/s",
            values,
            {
                "threads": s.ceiling_threads,
                "transactions": s.ceiling_tx,
                "statements": [CEILING_UPDATE, CEILING_INSERT, "COMMIT"],
                "client_cpu_cores": round(statistics.median(client), 2),
                "server_cpu_cores": round(statistics.median(server), 2) if server else None,
            },
            throughput=True,
        )
    ]


def enqueue_one(ctx: Context) -> list[Figure]:
    n = ctx.sizes.enqueue_one_jobs
    values = []
    for run in range(ctx.runs):
        ctx.db.reset()
        for _ in range(20):  # warm: pooled connection, prepared statements
            ctx.store.enqueue(NewJob(type="bench.noop", queue="warmup"))
        started = time.perf_counter()
        for i in range(n):
            ctx.store.enqueue(NewJob(type="bench.noop", queue="one", payload={"i": i}))
        values.append(n / (time.perf_counter() - started))
        ctx.say(f"enqueue_one run {run + 1}: {values[-1]:,.0f} jobs/s")
    return [
        Figure(
            "enqueue_one",
            "jobs/s",
            values,
            {"jobs": n, "threads": 1, "job_events": "all"},
            target=at_least(1_700, "jobs/s"),
            throughput=True,
        )
    ]


def _child_batch(ctx: Context, jobs: int, mode: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.child", ctx.db.dsn, str(jobs), mode],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench.child {mode} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["inserted"] == jobs, result
    return result


def enqueue_batch(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    figures = []
    for mode, jobs, label in (
        ("list", s.batch_jobs, "enqueue_batch"),
        ("stream", s.stream_jobs, "enqueue_batch.stream"),
    ):
        rates, rss = [], []
        for run in range(ctx.runs):
            ctx.db.reset()
            got = _child_batch(ctx, jobs, mode)
            rates.append(jobs / got["seconds"])
            rss.append(got["peak_rss_mb"])
            ctx.say(f"{label} run {run + 1}: {rates[-1]:,.0f} jobs/s, peak RSS {rss[-1]:.0f} MB")
        params = {"jobs": jobs, "input": mode, "job_events": "all", "payload": '{"i": n}'}
        figures.append(
            Figure(
                label,
                "jobs/s",
                rates,
                params,
                target=at_least(80_000, "jobs/s") if mode == "list" else None,
                throughput=True,
            )
        )
        figures.append(
            Figure(
                f"{label}.rss",
                "MB",
                rss,
                {**params, "what": "peak RSS of the enqueuing process (ru_maxrss)"},
                target=below(200, "MB") if mode == "stream" else None,
            )
        )
    return figures


@dataclasses.dataclass
class DrainRun:
    rate: float
    """jobs/s from the first claim to the last completion (database clock)."""
    peak_rss_mb: float
    worker_cpu: float
    """CPU cores the worker processes used (CPU seconds / wall seconds) while draining."""
    server_cpu: float | None
    """CPU cores the embedded PostgreSQL used meanwhile (None on DATABASE_URL)."""
    claims: int
    """Claim statements that claimed something (distinct claim timestamps)."""
    completions: int
    """Transactions that completed jobs (distinct finished_at)."""
    statements: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """The top statements by server time (with ``--statements``)."""
    leased_peak: int = 0
    """The most jobs leased at once (from each job's claim to its finished_at)."""
    leased_mean: float = 0.0
    """Jobs leased on average over the drain (lease time of all jobs / its duration)."""


LEASES_HELD = """
SELECT (SELECT max(n) FROM (
            SELECT sum(d) OVER (ORDER BY t, d) AS n FROM (
                SELECT e.at AS t, 1 AS d FROM jobrun.job_events e WHERE e.kind = 'claimed'
                UNION ALL
                SELECT j.finished_at, -1 FROM jobrun.jobs j
                WHERE j.queue = %(queue)s AND j.finished_at IS NOT NULL) AS edges) AS w),
       (SELECT sum(extract(epoch FROM j.finished_at - e.at)) FROM jobrun.jobs j
        JOIN jobrun.job_events e ON e.job_id = j.id AND e.kind = 'claimed'
        WHERE j.queue = %(queue)s)
"""
"""The leases a drain held: the most at once (an end before a start at a tie) and
their total time, each lease from its claim to its job's finished_at."""


def _drain_once(
    ctx: Context,
    job_type: str,
    jobs: int,
    concurrency: int,
    procs: int,
    extra_args: tuple[str, ...] = (),
    extra_env: dict[str, str] | None = None,
    *,
    keys: int | None = None,
    limits: dict[str, Any] | None = None,
) -> DrainRun:
    """One drain; with ``keys``, job i has concurrency key ``k{i % keys}``; with
    ``limits``, ``Store.set_queue_limits(queue, **limits)`` before the workers start."""
    ctx.db.reset()
    queue = "drain"
    ctx.store.pause_queue(queue)
    ctx.store.enqueue_batch(
        NewJob(type=job_type, queue=queue, concurrency_key=None if keys is None else f"k{i % keys}")
        for i in range(jobs)
    )
    if limits:
        ctx.store.set_queue_limits(queue, **limits)
    ctx.db.execute("VACUUM ANALYZE jobrun.jobs, jobrun.job_events")
    with workers(ctx, queue, concurrency, procs, extra_args, extra_env) as w:
        w.wait_ready()
        ctx.db.reset_statements()
        cpu0, server0, wall0 = w.cpu_seconds(), ctx.db.server_cpu_seconds(), time.monotonic()
        ctx.store.resume_queue(queue)
        _wait_drained(ctx, w, queue, timeout=max(600.0, jobs / 50))
        server1, wall = ctx.db.server_cpu_seconds(), time.monotonic() - wall0
        worker_cpu = (w.cpu_seconds() - cpu0) / wall
        server_cpu = cpu.cores(server0, server1, wall)
        rss = w.peak_rss_mb()
        statements = ctx.db.top_statements()
    first, last, done, claims, completions = ctx.db.execute(
        "SELECT (SELECT min(at) FROM jobrun.job_events WHERE kind = 'claimed'),"
        " (SELECT max(finished_at) FROM jobrun.jobs WHERE queue = %s),"
        " (SELECT count(*) FROM jobrun.jobs WHERE queue = %s AND state = 'succeeded'),"
        " (SELECT count(DISTINCT at) FROM jobrun.job_events WHERE kind = 'claimed'),"
        " (SELECT count(DISTINCT finished_at) FROM jobrun.jobs WHERE queue = %s)",
        [queue, queue, queue],
    )[0]
    if done != jobs:
        raise RuntimeError(f"{done} of {jobs} jobs succeeded")
    if job_type == "bench.tx":
        effects = ctx.db.execute("SELECT count(*) FROM bench_sink")[0][0]
        if effects != jobs:
            raise RuntimeError(f"{effects} commit-callable rows for {jobs} jobs")
    seconds = (last - first).total_seconds()
    peak, lease_seconds = ctx.db.execute(LEASES_HELD, {"queue": queue})[0]
    return DrainRun(
        jobs / seconds,
        rss,
        worker_cpu,
        server_cpu,
        int(claims),
        int(completions),
        statements,
        leased_peak=int(peak or 0),
        leased_mean=float(lease_seconds or 0) / seconds,
    )


def alternated(
    ctx: Context,
    figure: str,
    variants: Mapping[str, Callable[[], DrainRun]],
    detail: Callable[[DrainRun], str] = lambda got: "",
) -> dict[str, list[DrainRun]] | None:
    """``ctx.runs`` rounds of one drain per variant, in turn within each round,
    so that drift of the machine hits every variant alike; the drains of each
    (None when one failed: noted, and the measurement yields no figure)."""
    drains: dict[str, list[DrainRun]] = {name: [] for name in variants}
    for run in range(ctx.runs):
        for name, drain_once in variants.items():
            try:
                got = drain_once()
            except RuntimeError as exc:
                ctx.failed(f"{figure}.{name}", run, exc)
                return None
            drains[name].append(got)
            ctx.say(
                f"{figure}.{name} run {run + 1}: {got.rate:,.0f} jobs/s, "
                f"{cpu.text(got.worker_cpu, got.server_cpu)}{detail(got)}"
            )
    return drains


def _cores(runs: list[DrainRun]) -> dict[str, float | None]:
    """The worker's and the server's CPU during the drains (cores, medians of the runs)."""
    server = [r.server_cpu for r in runs if r.server_cpu is not None]
    return {
        "worker_cpu_cores": round(statistics.median(r.worker_cpu for r in runs), 2),
        "server_cpu_cores": round(statistics.median(server), 2) if server else None,
    }


def _diagnostics(runs: list[DrainRun], jobs: int) -> dict[str, Any]:
    claims = statistics.median(r.claims for r in runs)
    completions = statistics.median(r.completions for r in runs)
    extra = {"statements": runs[-1].statements} if runs[-1].statements else {}
    return {
        **extra,
        **_cores(runs),
        "claims": claims,
        "jobs_per_claim": round(jobs / claims, 2),
        "completion_transactions": completions,
        "jobs_per_completion": round(jobs / completions, 2),
        "leased_peak": statistics.median(r.leased_peak for r in runs),
        "leased_mean": round(statistics.median(r.leased_mean for r in runs), 1),
    }


def _drain(ctx: Context, kind: str) -> list[Figure]:
    s = ctx.sizes
    job_type = {"noop": "bench.noop", "tx": "bench.tx"}[kind]
    configs = [(f"c{c}", c, 1) for c in s.concurrencies]
    if s.procs > 1:
        configs.append((f"p{s.procs}x{s.procs_concurrency}", s.procs_concurrency, s.procs))
    figures: list[Figure] = []
    single: list[tuple[Figure, list[DrainRun]]] = []
    for label, concurrency, procs in configs:
        jobs = s.drain_jobs if kind == "noop" else s.drain_tx_jobs
        if concurrency == 1 and procs == 1:
            jobs = min(jobs, s.drain_c1_jobs)
        runs = []
        for run in range(ctx.runs):
            try:
                got = _drain_once(ctx, job_type, jobs, concurrency, procs)
            except RuntimeError as exc:
                ctx.failed(f"drain.{kind}.{label}", run, exc)
                break
            runs.append(got)
            ctx.say(
                f"drain.{kind}.{label} run {run + 1}: {got.rate:,.0f} jobs/s, "
                f"RSS {got.peak_rss_mb:.0f} MB, {cpu.text(got.worker_cpu, got.server_cpu)}, "
                f"{jobs / got.claims:.1f} jobs/claim, {jobs / got.completions:.1f} jobs/completion"
            )
        if len(runs) < ctx.runs:
            continue  # a failed configuration yields no figure
        rates = [r.rate for r in runs]
        rss = [r.peak_rss_mb for r in runs]
        params = {
            "jobs": jobs,
            "processes": procs,
            "concurrency": concurrency,
            "handler": job_type,
            "job_events": "all",
            **_diagnostics(runs, jobs),
        }
        rate_figure = Figure(f"drain.{kind}.{label}", "jobs/s", rates, params, throughput=True)
        figures.append(rate_figure)
        figures.append(
            Figure(
                f"drain.{kind}.{label}.rss",
                "MB",
                rss,
                {**params, "what": "peak RSS (VmHWM) of a worker process"},
            )
        )
        if procs == 1:
            single.append((rate_figure, runs))
    if single:
        best, best_runs = max(single, key=lambda pair: pair[0].median)
        target = at_least(6_000, "jobs/s", ratio=1.5) if kind == "noop" else ratio_at_least(0.6)
        figures.append(
            Figure(
                f"drain.{kind}.best",
                "jobs/s",
                list(best.values),
                {**best.parameters, "best_of": [f.name for f, _ in single]},
                target=target,
                throughput=True,
            )
        )
        figures.append(
            Figure(
                f"drain.{kind}.best.cores",
                "cores",
                [r.worker_cpu + (r.server_cpu or 0.0) for r in best_runs],
                {
                    "drain": best.name,
                    **_cores(best_runs),
                    "cpu_count": os.cpu_count(),
                    "what": "worker + server CPU seconds per wall second during the best drain"
                    + (
                        ""
                        if all(r.server_cpu is not None for r in best_runs)
                        else " (the server's unknown: a DATABASE_URL server, worker only)"
                    ),
                },
            )
        )
    return figures


def drain(ctx: Context) -> list[Figure]:
    return _drain(ctx, "noop")


def drain_tx(ctx: Context) -> list[Figure]:
    return _drain(ctx, "tx")


OBSERVED: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "off": ((), {}),
    "metrics": (("--metrics-port", "0"), {}),
    "otel": (("--tracing", "otel"), {"BENCH_OTEL_SDK": "1"}),
}
"""The worker's observability for ``observed``: none, Prometheus metrics (served on
an ephemeral port, never scraped: the cost of recording), OpenTelemetry spans
through the SDK (a batch processor, spans dropped by a null exporter)."""


def observed(ctx: Context) -> list[Figure]:
    """The no-op drain at the best concurrency with metrics and tracing on, against off.

    The variants alternate within each run (off, metrics, otel, off, ...) so
    that drift of the machine hits them alike; the cost is per run, each
    variant against that run's ``off`` drain, and its median is the figure.
    """
    s = ctx.sizes
    concurrency = max(s.concurrencies)
    variants = {
        name: functools.partial(
            _drain_once, ctx, "bench.noop", s.drain_jobs, concurrency, 1, args, env
        )
        for name, (args, env) in OBSERVED.items()
    }
    drains = alternated(ctx, "drain.observed", variants)
    if drains is None:
        return []
    rates = {name: [r.rate for r in runs] for name, runs in drains.items()}
    cpu_per_job = {  # cores / (jobs/s)
        name: [1e6 * r.worker_cpu / r.rate for r in runs] for name, runs in drains.items()
    }
    params = {"jobs": s.drain_jobs, "concurrency": concurrency, "handler": "bench.noop"}
    figures = [
        Figure(
            f"drain.observed.{name}",
            "jobs/s",
            rates[name],
            {**params, "worker_flags": " ".join(args) or "(none)", **_cores(drains[name])},
            throughput=True,
        )
        for name, (args, _) in OBSERVED.items()
    ]
    figures += [
        Figure(
            f"drain.observed.{name}.cpu_per_job",
            "us",
            cpu_per_job[name],
            {**params, "what": "worker CPU time per job (steadier than the rate on a shared host)"},
        )
        for name in OBSERVED
    ]
    for name, limit in (("metrics", 5.0), ("otel", None)):
        costs = [100.0 * (1 - on / off) for on, off in zip(rates[name], rates["off"], strict=True)]
        figures.append(
            Figure(
                f"drain.observed.{name}.cost",
                "%",
                costs,
                {**params, "what": f"1 - drain with {name} / drain without, per run"},
                target=at_most(limit, "%") if limit is not None else None,
            )
        )
    return figures


LIMIT_KEYS = 1_000
"""Concurrency keys of the per-key drain and claims: job i has key ``k{i % 1000}``."""
DRAIN_LIMITS: dict[str, dict[str, Any]] = {
    "off": {},
    "concurrency": {"concurrency": 50},
    "concurrency_1000": {"concurrency": 1000},
    "per_key": {"per_key": 1},
    "rate": {"rate": "1000000/s"},
}
"""The queue limits of ``limits`` (issue 14): a global limit of 50 (the issue's), one
job at a time per key over 1,000 keys, a rate far above what the machine reaches,
and a global limit of 1,000 that nothing reaches. 50 is more than the 32 threads
but not more than the leases a worker holds: a lease lasts until the job's success
commits, and the unlimited drain holds about 85 on average (``leased_mean``), so 50
binds; 1,000 shows what the limited claim costs when no limit binds."""
CLAIM_LIMITS: dict[str, dict[str, Any]] = {
    "none": {},
    "concurrency": {"concurrency": 64},
    "per_key": {"per_key": 1},
    "rate": {"rate": "1000000/s"},
}
"""The limits of ``limits_claim``: 64 is the 32 jobs held plus the 32 claimed, so
the global limit counts leases without ever binding."""


def limits(ctx: Context) -> list[Figure]:
    """The no-op drain at the highest concurrency, unlimited and under each kind of limit.

    The four drains alternate within each run (off, concurrency, per_key, rate,
    off, ...), the same job count and concurrency as the plain drain; the
    ratio is per run, each limited drain against that run's unlimited one.
    """
    s = ctx.sizes
    concurrency = max(s.concurrencies)
    variants = {
        name: functools.partial(
            _drain_once,
            ctx,
            "bench.noop",
            s.drain_jobs,
            concurrency,
            1,
            keys=LIMIT_KEYS if name == "per_key" else None,
            limits=limit,
        )
        for name, limit in DRAIN_LIMITS.items()
    }
    runs = alternated(
        ctx,
        "drain.limits",
        variants,
        lambda got: (
            f", {s.drain_jobs / got.claims:.1f} jobs/claim, "
            f"leased {got.leased_mean:.0f} on average, {got.leased_peak} at most"
        ),
    )
    if runs is None:
        return []
    params = {"jobs": s.drain_jobs, "processes": 1, "concurrency": concurrency}
    figures = []
    for name, limit in DRAIN_LIMITS.items():
        figures.append(
            Figure(
                f"drain.limits.{name}",
                "jobs/s",
                [r.rate for r in runs[name]],
                {
                    **params,
                    "handler": "bench.noop",
                    "limits": limit or None,
                    "concurrency_keys": LIMIT_KEYS if name == "per_key" else None,
                    **_diagnostics(runs[name], s.drain_jobs),
                },
                throughput=True,
            )
        )
    for name, limit in DRAIN_LIMITS.items():
        if not limit:
            continue
        pairs = zip(runs[name], runs["off"], strict=True)
        figures.append(
            Figure(
                f"drain.limits.{name}.ratio",
                "x",
                [on.rate / off.rate for on, off in pairs],
                {**params, "limits": limit, "what": f"drain with {name} / drain without, per run"},
                # The three; the limit of 1,000 is the diagnosis of the first.
                target=None if name == "concurrency_1000" else not_below(0.85, "x"),
            )
        )
    return figures


SEED_LIMITED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, run_at, concurrency_key)
SELECT gen_random_uuid(), 'limited', 'bench.noop', '{}', %(backoff)s,
       now() - interval '1 hour' + (%(offset)s + g) * interval '1 ms',
       'k' || ((%(offset)s + g) %% %(keys)s)
FROM generate_series(1, %(n)s) g
"""


def _held_claims(ctx: Context, queue: str, samples: int, batch: int) -> list[float]:
    """Claim round trips (ms) with the previous claim's jobs still leased, as in a
    worker whose threads are all busy; each batch is completed (untimed) after
    the next claim."""
    owner = f"bench-limits-{uuid.uuid4().hex[:8]}"
    ttl = dt.timedelta(minutes=5)
    held: list[Any] = []
    out = []
    for i in range(CLAIM_WARMUP + samples):
        started = time.perf_counter()
        got = ctx.store.claim(owner, [queue], batch, ttl)
        took = (time.perf_counter() - started) * 1000
        if len(got) != batch:
            raise RuntimeError(f"claim returned {len(got)} jobs, expected {batch}")
        if held:
            ctx.store.complete_many(held)
        held = got
        if i >= CLAIM_WARMUP:
            out.append(took)
    ctx.store.complete_many(held)
    return out


def limits_claim(ctx: Context) -> list[Figure]:
    """``Store.claim`` of 32 jobs at Q queued jobs, without limits and under each kind.

    One table (every job with a concurrency key, ignored without a per-key
    limit); before each block of samples the queue is topped up to Q queued
    jobs, its limits are set (or cleared) and the table is vacuumed; the
    variants alternate within each run and the ratios are per run.
    """
    s = ctx.sizes
    queue = "limited"
    batch = s.limits_claim_batch
    backoff = Jsonb(DEFAULT_BACKOFF.to_json())
    ctx.db.reset()
    ctx.say(f"limits_claim: seeding {s.limits_queued:,} queued rows over {LIMIT_KEYS:,} keys")
    seeded = 0

    def top_up() -> None:
        nonlocal seeded
        queued = ctx.db.execute(
            "SELECT count(*) FROM jobrun.jobs WHERE queue = %s AND state = 'queued'", [queue]
        )[0][0]
        n = s.limits_queued - int(queued)
        if n > 0:
            ctx.db.execute(
                SEED_LIMITED, {"backoff": backoff, "offset": seeded, "keys": LIMIT_KEYS, "n": n}
            )
            seeded += n
        ctx.db.execute("VACUUM ANALYZE jobrun.jobs")

    p50s: dict[str, list[float]] = {name: [] for name in CLAIM_LIMITS}
    p99s: dict[str, list[float]] = {name: [] for name in CLAIM_LIMITS}
    for run in range(ctx.runs):
        for name, limit in CLAIM_LIMITS.items():
            top_up()
            if limit:
                ctx.store.set_queue_limits(queue, **limit)
            else:
                ctx.store.clear_queue_limits(queue)
            lat = _held_claims(ctx, queue, s.limits_samples, batch)
            p50s[name].append(percentile(lat, 50))
            p99s[name].append(percentile(lat, 99))
            ctx.say(
                f"limits.claim.{name} run {run + 1}: claim of {batch} "
                f"p50 {p50s[name][-1]:.2f} ms, p99 {p99s[name][-1]:.2f} ms"
            )
    ctx.store.clear_queue_limits(queue)
    params = {
        "claim_batch": batch,
        "held_leases": batch,
        "samples_per_run": s.limits_samples,
        "queued_rows": s.limits_queued,
        "concurrency_keys": LIMIT_KEYS,
    }
    figures = []
    for name, limit in CLAIM_LIMITS.items():
        for stat, values in (("p50", p50s[name]), ("p99", p99s[name])):
            figures.append(
                Figure(
                    f"limits.claim.{name}.{stat}", "ms", values, {**params, "limits": limit or None}
                )
            )
    for name, limit in CLAIM_LIMITS.items():
        if not limit:
            continue
        for stat, by_name in (("p50", p50s), ("p99", p99s)):
            pairs = zip(by_name[name], by_name["none"], strict=True)
            figures.append(
                Figure(
                    f"limits.claim.{name}.ratio_{stat}",
                    "x",
                    [on / off for on, off in pairs],
                    {
                        **params,
                        "limits": limit,
                        "what": f"claim {stat} with {name} / claim {stat} without, per run",
                    },
                    target=at_most(2, "x"),
                )
            )
    return figures


def worker_rss(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    runs = []
    for run in range(ctx.runs):
        got = _drain_once(ctx, "bench.noop", s.rss_drain_jobs, s.rss_drain_concurrency, 1)
        runs.append(got)
        ctx.say(
            f"worker_rss run {run + 1}: {got.rate:,.0f} jobs/s, "
            f"worker peak RSS {got.peak_rss_mb:.0f} MB, {cpu.text(got.worker_cpu, got.server_cpu)}"
        )
    rates = [r.rate for r in runs]
    rss = [r.peak_rss_mb for r in runs]
    params = {
        "jobs": s.rss_drain_jobs,
        "processes": 1,
        "concurrency": s.rss_drain_concurrency,
        "handler": "bench.noop",
        **_diagnostics(runs, s.rss_drain_jobs),
    }
    return [
        Figure("worker_rss.drain", "jobs/s", rates, params, throughput=True),
        Figure(
            "worker_rss",
            "MB",
            rss,
            {**params, "what": "peak RSS (VmHWM) of the worker process through the drain"},
            target=below(150, "MB"),
        ),
    ]


def pickup(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    n = max(int(s.pickup_rate * s.pickup_seconds), 1)
    p50s, p95s, p99s = [], [], []
    queue = "pickup"
    for run in range(ctx.runs):
        ctx.db.reset()
        for _ in range(20):  # warm the enqueuer's connection (no worker listens to "warmup")
            ctx.store.enqueue(NewJob(type="bench.noop", queue="warmup"))
        with workers(ctx, queue, s.pickup_concurrency, 1) as w:
            w.wait_ready()
            time.sleep(1.0)  # idle: the claimer found nothing and waits for a wake-up
            enqueued: dict[uuid.UUID, float] = {}
            start = time.perf_counter()
            for i in range(n):
                pause = start + i / s.pickup_rate - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
                job = ctx.store.enqueue(NewJob(type="bench.pickup", queue=queue))
                enqueued[job.id] = time.time()
            deadline = time.monotonic() + 30
            while ctx.db.execute("SELECT count(*) FROM bench_pickup")[0][0] < n:
                w.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("pickup jobs did not all run within 30 s")
                time.sleep(0.05)
        rows = ctx.db.execute("SELECT job_id, started FROM bench_pickup")
        latencies = [(started - enqueued[job_id]) * 1000 for job_id, started in rows]
        p50s.append(percentile(latencies, 50))
        p95s.append(percentile(latencies, 95))
        p99s.append(percentile(latencies, 99))
        ctx.say(
            f"pickup run {run + 1}: p50 {p50s[-1]:.2f} ms, p95 {p95s[-1]:.2f} ms, "
            f"p99 {p99s[-1]:.2f} ms ({len(latencies)} jobs)"
        )
    params = {
        "rate_per_s": s.pickup_rate,
        "seconds": s.pickup_seconds,
        "jobs": n,
        "worker_concurrency": s.pickup_concurrency,
        "from": "time.time() after Store.enqueue returned (committed)",
        "to": "time.time() at handler start, in the worker process",
    }
    return [
        Figure("pickup.p50", "ms", p50s, params, target=at_most(3, "ms")),
        Figure("pickup.p95", "ms", p95s, params),
        Figure("pickup.p99", "ms", p99s, params, target=at_most(10, "ms")),
    ]


SEED_FINISHED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, run_at,
                  created_at, updated_at, finished_at)
SELECT gen_random_uuid(), 'growth', 'bench.noop', '{}', %s, 'succeeded', 1,
       now() - interval '2 days', now() - interval '2 days', now() - interval '1 day',
       now() - interval '1 day' + g * interval '1 ms'
FROM generate_series(1, %s) g
"""
SEED_QUEUED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, run_at)
SELECT gen_random_uuid(), 'growth', 'bench.noop', '{}', %s,
       now() - interval '1 hour' + g * interval '1 ms'
FROM generate_series(1, %s) g
"""
CLAIM_WARMUP = 10


def _claim_samples(ctx: Context, samples: int, batch: int) -> list[float]:
    owner = f"bench-growth-{uuid.uuid4().hex[:8]}"
    ttl = dt.timedelta(minutes=5)
    for _ in range(CLAIM_WARMUP):
        ctx.store.claim(owner, ["growth"], batch, ttl)
    out = []
    for _ in range(samples):
        started = time.perf_counter()
        got = ctx.store.claim(owner, ["growth"], batch, ttl)
        out.append((time.perf_counter() - started) * 1000)
        if len(got) != batch:
            raise RuntimeError(f"claim returned {len(got)} jobs, expected {batch}")
    return out


def _seed(ctx: Context, finished: int, queued: int) -> None:
    backoff = Jsonb(DEFAULT_BACKOFF.to_json())
    if finished:
        ctx.db.execute(SEED_FINISHED, [backoff, finished])
    ctx.db.execute(SEED_QUEUED, [backoff, queued])
    ctx.db.execute("VACUUM ANALYZE jobrun.jobs")


DASHBOARD_PAGES = ("overview", "jobs", "jobs_queued", "jobs_deep")
DASHBOARD_SAMPLES = 20


def dashboard(ctx: Context) -> list[Figure]:
    """Server time of the dashboard's pages on the growth table (F finished + Q queued).

    Through the ASGI app in this process (starlette's TestClient: routing,
    the Store's reads and rendering, no network), so the figure is the
    server's time. ``jobs_deep`` is a jobs page half way down the table.
    """
    from starlette.testclient import TestClient  # noqa: PLC0415 - the web extra

    from jobrun.web import create_app  # noqa: PLC0415

    s = ctx.sizes
    ctx.db.reset()
    ctx.say(f"dashboard: seeding {s.growth_finished:,} finished + {s.growth_queued:,} queued rows")
    _seed(ctx, s.growth_finished, s.growth_queued)
    total = s.growth_finished + s.growth_queued
    middle = ctx.db.execute(
        "SELECT id FROM jobrun.jobs ORDER BY id OFFSET %s LIMIT 1", [total // 2]
    )[0][0]
    paths = {
        "overview": "/",
        "jobs": "/jobs",
        "jobs_queued": "/jobs?state=queued",
        "jobs_deep": f"/jobs?before={middle}",
    }
    p50s: dict[str, list[float]] = {name: [] for name in DASHBOARD_PAGES}
    p95s: dict[str, list[float]] = {name: [] for name in DASHBOARD_PAGES}
    with TestClient(create_app(ctx.store), base_url="http://127.0.0.1") as http:
        for run in range(ctx.runs):
            for name in DASHBOARD_PAGES:
                for _ in range(3):  # warm-up: prepared statements, template cache
                    http.get(paths[name]).raise_for_status()
                samples = []
                for _ in range(DASHBOARD_SAMPLES):
                    began = time.perf_counter()
                    http.get(paths[name]).raise_for_status()
                    samples.append((time.perf_counter() - began) * 1000)
                p50s[name].append(percentile(samples, 50))
                p95s[name].append(percentile(samples, 95))
                ctx.say(
                    f"dashboard.{name} run {run + 1}: p50 {p50s[name][-1]:.1f} ms, "
                    f"p95 {p95s[name][-1]:.1f} ms"
                )
    params = {
        "finished": s.growth_finished,
        "queued": s.growth_queued,
        "requests": DASHBOARD_SAMPLES,
    }
    figures = []
    for name in DASHBOARD_PAGES:
        figures.append(
            Figure(
                f"dashboard.{name}.p50",
                "ms",
                p50s[name],
                {**params, "path": paths[name].split("?")[0]},
                target=below(300, "ms") if name in ("overview", "jobs") else None,
            )
        )
        figures.append(
            Figure(f"dashboard.{name}.p95", "ms", p95s[name], {**params, "path": paths[name]})
        )
    return figures


def growth(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    per_run = (CLAIM_WARMUP + s.growth_samples) * s.claim_batch
    results: dict[str, tuple[list[float], list[float]]] = {}
    plans: list[dict[str, Any]] = []
    seq_scans: list[float] = []
    uses_index: list[bool] = []
    for case, finished, queued in (
        ("empty", 0, per_run * ctx.runs),
        ("large", s.growth_finished, max(s.growth_queued, per_run * ctx.runs)),
    ):
        ctx.db.reset()
        ctx.say(f"growth: seeding {finished:,} finished + {queued:,} queued rows")
        _seed(ctx, finished, queued)
        p50s, p95s = [], []
        for run in range(ctx.runs):
            if case == "large":
                with psycopg.connect(ctx.db.dsn, autocommit=True) as conn:
                    custom = explain_claim(conn, ["growth"], s.claim_batch)
                    generic = explain_claim(conn, ["growth"], s.claim_batch, generic=True)
                seq_scans.append(custom.seq_scans_on_jobs + generic.seq_scans_on_jobs)
                uses_index.append(custom.uses_claim_index and generic.uses_claim_index)
                if run == 0:
                    plans = [{"mode": p.mode, "scans": p.summary()} for p in (custom, generic)]
            lat = _claim_samples(ctx, s.growth_samples, s.claim_batch)
            p50s.append(percentile(lat, 50))
            p95s.append(percentile(lat, 95))
            ctx.say(
                f"growth.{case} run {run + 1}: claim of {s.claim_batch} "
                f"p50 {p50s[-1]:.2f} ms, p95 {p95s[-1]:.2f} ms"
            )
        results[case] = (p50s, p95s)
    base = {"claim_batch": s.claim_batch, "samples_per_run": s.growth_samples}
    sizes = {
        "empty": {"finished_rows": 0, "queued_rows": per_run * ctx.runs},
        "large": {
            "finished_rows": s.growth_finished,
            "queued_rows": max(s.growth_queued, per_run * ctx.runs),
        },
    }
    figures = []
    for case in ("empty", "large"):
        p50s, p95s = results[case]
        params = {**base, **sizes[case]}
        figures.append(Figure(f"growth.claim.{case}.p50", "ms", p50s, params))
        figures.append(Figure(f"growth.claim.{case}.p95", "ms", p95s, params))
    ratio_params = {**base, "large": sizes["large"], "empty": sizes["empty"]}
    for stat, idx in (("p50", 0), ("p95", 1)):
        pairs = zip(results["large"][idx], results["empty"][idx], strict=True)
        figures.append(
            Figure(
                f"growth.claim.ratio_{stat}",
                "x",
                [large / empty for large, empty in pairs],
                {**ratio_params, "what": f"large-table claim {stat} / empty-table claim {stat}"},
                target=at_most(2, "x") if stat == "p50" else None,
            )
        )
    figures.append(
        Figure(
            "growth.claim_plan.seq_scans",
            "nodes",
            seq_scans,
            {
                **sizes["large"],
                "what": "Seq Scan nodes on jobs in EXPLAIN (FORMAT JSON) of CLAIM_JOBS, "
                "custom + generic plan",
                "uses_jobs_claim_idx": all(uses_index),
                "plans": plans,
            },
            target=at_most(0, "nodes"),
        )
    )
    return figures


def sustained(ctx: Context) -> list[Figure]:
    """The producer-consumer run (bench/sustained.py, which builds on this module)."""
    from bench import sustained as run  # noqa: PLC0415 - it imports this module

    return run.sustained(ctx)


def _handlers(ctx: Context) -> list[Figure]:
    from bench import handlers as run  # noqa: PLC0415 - it imports this module

    return run.handlers(ctx)


def _workflows(ctx: Context) -> list[Figure]:
    # Looked up at call time: bench.workflows imports this module.
    return bench_workflows.workflows(ctx)


MEASUREMENTS: dict[str, Callable[[Context], list[Figure]]] = {
    "ceiling": ceiling,
    "enqueue_one": enqueue_one,
    "enqueue_batch": enqueue_batch,
    "drain": drain,
    "drain_tx": drain_tx,
    "handlers": _handlers,
    "worker_rss": worker_rss,
    "observed": observed,
    "limits": limits,
    "limits_claim": limits_claim,
    "pickup": pickup,
    "growth": growth,
    "dashboard": dashboard,
    "sustained": sustained,
    "workflows": _workflows,
}


def open_store(dsn: str) -> Store:
    pool = open_pool(dsn, concurrency=2, min_size=1, application_name="bench")
    return Store(pool)
