"""``jobrun demo``: a realistic run on a real PostgreSQL, with a summary.

It migrates, registers four handlers (a fast one, a flaky one that retries
and sometimes dies, a transactional one writing to a demo table through its
commit callable, and a cron tick every second), enqueues a batch (20,000 jobs
by default) in one COPY, runs a worker with a live progress bar until the
batch is drained, measures pickup latency with a trickle of single jobs,
and ends with a summary: throughput, latency, counts by state, retries, dead
jobs, and a check that every transactional effect was written exactly once.

It never touches the user's tables: each run creates a throwaway database
(``jobrun_demo_<hex>``) on the server it is given, migrates and runs there,
and drops it on the way out, when interrupted too (see
:mod:`jobrun.postgres.demo`; a later run sweeps the leftovers of a killed
one). So the demo's jobs never show up in the user's ``jobrun depth``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import random
import signal
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from jobrun.client import make_store
from jobrun.config import Settings
from jobrun.job.model import Backoff, Job, NewJob, ScheduleSpec, State
from jobrun.postgres import demo as demo_sql
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.migrate import migrate
from jobrun.postgres.notify import Notifier
from jobrun.postgres.pool import open_pool
from jobrun.scheduler.service import SchedulerConfig, SchedulerService
from jobrun.worker.context import JobContext
from jobrun.worker.registry import Registry
from jobrun.worker.worker import Worker

FLAKY_FAILURE_RATE = 0.25
FLAKY_BACKOFF = Backoff(kind="constant", base=0.2, jitter=0.5)
LATENCY_PROBES = 200
LATENCY_RATE = 50.0  # probes per second
STOP_TIMEOUT = 5.0  # seconds for the worker and the scheduler to stop


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs in the batch (20000)")
    parser.add_argument("--concurrency", type=int, default=16, help="worker threads (16)")
    parser.add_argument("--seed", type=int, default=None, help="random seed of the flaky handler")
    parser.add_argument(
        "--probes",
        type=int,
        default=LATENCY_PROBES,
        help=f"single jobs trickled in to measure pickup latency ({LATENCY_PROBES}; 0: none)",
    )


class _Demo:
    def __init__(self, run: str, seed: int | None) -> None:
        self.run = run
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.probe_started: dict[uuid.UUID, float] = {}
        self.ticks = 0

    def registry(self) -> Registry:
        registry = Registry(default_timeout=dt.timedelta(seconds=30))

        @registry.handler("demo.fast")
        def fast(ctx: JobContext, job: Job) -> None:
            if job.payload.get("probe"):
                self.probe_started[job.id] = time.monotonic()

        @registry.handler("demo.flaky")
        def flaky(ctx: JobContext, job: Job) -> None:
            with self.rng_lock:
                fails = self.rng.random() < FLAKY_FAILURE_RATE
            if fails:
                raise ConnectionError("the flaky upstream said no")

        @registry.handler("demo.ledger")
        def ledger(ctx: JobContext, job: Job) -> Callable[[Any], None]:
            return lambda conn: demo_sql.write_effect(conn, job.id, self.run)

        @registry.handler("demo.tick")
        def tick(ctx: JobContext, job: Job) -> None:
            self.ticks += 1

        return registry


def _batch(n: int, queue: str) -> Iterator[NewJob]:
    for i in range(n):
        kind = i % 10
        if kind < 6:
            yield NewJob(type="demo.fast", queue=queue, payload={"i": i})
        elif kind < 8:
            yield NewJob(
                type="demo.flaky",
                queue=queue,
                payload={"i": i},
                max_attempts=4,
                backoff=FLAKY_BACKOFF,
            )
        else:
            yield NewJob(type="demo.ledger", queue=queue, payload={"i": i})


def run(args: argparse.Namespace, database_url: str) -> int:
    console = Console(stderr=False)
    if args.jobs < 1 or args.concurrency < 1 or args.probes < 0:
        console.print("--jobs and --concurrency must be positive, --probes not negative")
        return 2
    try:
        with _sigterm_interrupts(), demo_sql.demo_database(database_url) as database:
            for name in database.swept:
                console.print(f"dropped {name}, left behind by an earlier demo", soft_wrap=True)
            console.print(
                f"in a throwaway database, {database.name}, dropped at the end "
                "(your own jobs and tables are not touched)",
                soft_wrap=True,
            )
            return _run(console, args, database.conninfo)
    except demo_sql.DemoDatabaseError as exc:
        sys.stderr.write(f"jobrun: {exc}\n")  # one line, as every error of the command
        return 1


@contextlib.contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops the demo like Ctrl-C does: through the cleanup that drops its database."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run(console: Console, args: argparse.Namespace, database_url: str) -> int:
    run_id = uuid.uuid4().hex[:8]
    queue = f"demo-{run_id}"
    demo = _Demo(run_id, args.seed)
    settings = Settings.from_env(
        database_url=database_url,
        concurrency=args.concurrency,
        queues={queue: None},
        lease_ttl=dt.timedelta(seconds=15),
        heartbeat_interval=dt.timedelta(seconds=3),
        commit_timeout=dt.timedelta(seconds=15),  # at most the lease (see jobrun.config)
        poll_interval=dt.timedelta(milliseconds=500),
    )
    migrate(database_url, schema=settings.schema)
    pool = open_pool(database_url, concurrency=args.concurrency, application_name="jobrun-worker")
    scheduler_pool = open_pool(
        database_url, concurrency=1, min_size=1, max_size=3, application_name="jobrun-reaper"
    )
    notifier = Notifier(database_url)
    worker: Worker | None = None
    scheduler: SchedulerService | None = None
    try:
        store = make_store(pool, settings)
        demo_sql.create_table(pool)
        store.upsert_schedule(
            ScheduleSpec(id=f"demo-{run_id}", cron="* * * * * *", type="demo.tick", queue=queue)
        )
        started = time.monotonic()
        store.enqueue_batch(_batch(args.jobs, queue))
        enqueue_s = time.monotonic() - started
        console.print(
            f"run {run_id}: enqueued {args.jobs:,} jobs in one COPY in "
            f"{enqueue_s:.2f} s ({args.jobs / enqueue_s:,.0f} jobs/s)"
        )

        notifier.start()
        scheduler = SchedulerService(
            make_store(scheduler_pool, settings),
            AdvisoryLocker(database_url),
            SchedulerConfig(finished_retention=None, events_retention=None),
        )
        worker = Worker(store, demo.registry(), settings.worker_config(), dispatcher=notifier)
        scheduler.start()
        drain_started = time.monotonic()
        worker.start()
        drain_s = _progress(console, store, queue, args.jobs, drain_started)
        latencies = _latency(store, queue, demo, args.probes)
        worker.stop()
        scheduler.stop()
        worker = scheduler = None
        counts = store.state_counts(queue)
        check = demo_sql.check_effects(pool, run_id, queue, "demo.ledger")
    finally:
        # Interrupted (Ctrl-C) or failed: stop at once, the database goes anyway.
        if worker is not None:
            worker.stop(timeout=STOP_TIMEOUT)
        if scheduler is not None:
            scheduler.stop(timeout=STOP_TIMEOUT)
        notifier.stop()
        scheduler_pool.close()
        pool.close()
    _summary(
        console,
        args,
        drain_s=drain_s,
        latencies=latencies,
        counts=counts,
        check=check,
        ticks=demo.ticks,
    )
    return 0 if check.exactly_once else 1


def _progress(console: Console, store: Any, queue: str, total: int, started: float) -> float:
    with Progress(
        TextColumn("[bold]draining"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        task = progress.add_task("drain", total=total, rate="")
        while True:
            depth = {d.queue: d for d in store.depth()}.get(queue)
            left = 0 if depth is None else depth.ready + depth.scheduled + depth.leased
            done = max(total - left, 0)
            elapsed = time.monotonic() - started
            progress.update(task, completed=done, rate=f"{done / max(elapsed, 1e-9):,.0f} jobs/s")
            if left == 0:
                return elapsed
            time.sleep(0.2)


def _latency(store: Any, queue: str, demo: _Demo, probes: int) -> list[float]:
    """Enqueue-commit to handler-start, for single jobs trickled into an idle worker."""
    enqueued: dict[uuid.UUID, float] = {}
    for _ in range(probes):
        job = store.enqueue(NewJob(type="demo.fast", queue=queue, payload={"probe": True}))
        enqueued[job.id] = time.monotonic()
        time.sleep(1 / LATENCY_RATE)
    deadline = time.monotonic() + 30
    while len(demo.probe_started) < len(enqueued) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(
        (demo.probe_started[i] - t) * 1000 for i, t in enqueued.items() if i in demo.probe_started
    )


def _summary(
    console: Console,
    args: argparse.Namespace,
    *,
    drain_s: float,
    latencies: list[float],
    counts: dict[State, Any],
    check: demo_sql.EffectCheck,
    ticks: int,
) -> None:
    table = Table(title="jobrun demo", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("jobs in the batch", f"{args.jobs:,}")
    table.add_row("worker threads", str(args.concurrency))
    table.add_row("drain time", f"{drain_s:.2f} s")
    table.add_row("throughput", f"{args.jobs / drain_s:,.0f} jobs/s")
    if latencies:
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        table.add_row("pickup latency p50", f"{statistics.median(latencies):.1f} ms")
        table.add_row("pickup latency p99", f"{p99:.1f} ms")
    for state in State:
        c = counts.get(state)
        table.add_row(f"jobs {state.value}", f"{c.jobs if c else 0:,}")
    attempts = sum(c.attempts for c in counts.values())
    jobs = sum(c.jobs for c in counts.values())
    table.add_row("retries (attempts beyond the first)", f"{attempts - jobs:,}")
    table.add_row("dead jobs", f"{counts[State.DEAD].jobs if State.DEAD in counts else 0:,}")
    table.add_row("cron ticks run", str(ticks))
    verdict = "yes" if check.exactly_once else "NO"
    table.add_row(
        "transactional effects exactly once",
        f"{verdict} ({check.effect_rows:,} rows for {check.succeeded_ledger_jobs:,} jobs)",
    )
    console.print(table)
