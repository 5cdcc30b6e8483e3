"""The sustained run (issue 27): a producer and a worker for minutes, at 80 % of the peak.

A drain measures a peak: the jobs are queued first, on a table that holds
nothing else. A system in use enqueues and completes at once while its
tables fill with finished jobs, their events and the dead row versions of
every claim and completion, and autovacuum runs meanwhile. This run:

1. measures the peak: a no-op drain of ``sustained_peak_jobs`` jobs by the
   worker setting that then consumes (``sustained_concurrency`` threads, one
   process; the highest of ``drain_concurrency`` by default, the best
   single-process drain so far);
2. empties the tables, starts that worker (``JOBRUN_JOB_EVENTS=all``, finished
   jobs kept: the defaults) on an idle queue, and starts the producer
   (:mod:`bench.producer`, a process of its own) at ``sustained_load`` (0.8)
   of the peak rate for ``sustained_seconds``;
3. samples every ``sustained_interval`` seconds (from the start to the end):
   the size of ``jobs`` and ``job_events`` (``pg_total_relation_size``: heap,
   indexes, TOAST), their dead and live tuples and autovacuum runs
   (``pg_stat_user_tables``), the backlog, and the worker's and the server's
   CPU;
4. counts afterwards, on the database clock, the jobs enqueued
   (``created_at``) and completed (``finished_at``) in each interval from the
   first enqueue.

The figure with the target is the last interval's completion rate over the
first's (>= 0.90): a worker that keeps up completes what is enqueued in
every interval, one that slows as its tables grow falls behind and its
completions fall with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

from bench import cpu
from bench.measure import Context, Workers, _drain_once, workers
from bench.server import ROOT
from bench.stats import Figure, not_below

QUEUE = "sustained"
TABLES = ("jobs", "job_events")

TABLE_STATS = """
SELECT relname, pg_total_relation_size(relid), n_live_tup, n_dead_tup,
       autovacuum_count, autoanalyze_count
FROM pg_stat_user_tables WHERE schemaname = 'jobrun' AND relname = ANY(%s)
"""

DONE_SINCE = """
SELECT clock_timestamp(),
       (SELECT count(*) FROM jobrun.jobs WHERE queue = %(queue)s AND finished_at > %(since)s),
       (SELECT count(*) FROM jobrun.jobs WHERE queue = %(queue)s AND state = 'queued')
"""

PER_INTERVAL = """
WITH t0 AS (SELECT min(created_at) AS t0 FROM jobrun.jobs WHERE queue = %(queue)s)
SELECT 'created', floor(extract(epoch FROM created_at - t0) / %(interval)s)::int, count(*)
FROM jobrun.jobs, t0 WHERE queue = %(queue)s GROUP BY 2
UNION ALL
SELECT 'finished', floor(extract(epoch FROM finished_at - t0) / %(interval)s)::int, count(*)
FROM jobrun.jobs, t0 WHERE queue = %(queue)s AND finished_at IS NOT NULL GROUP BY 2
"""
"""Jobs enqueued and completed in each interval from the first enqueue (database clock)."""


def interval_of(seconds: float, interval: float) -> float:
    """The sampling interval: ``interval`` if set, else a minute, or a sixth of a
    shorter run (so that a 60-second run still has a first and a last interval)."""
    if interval > 0:
        return interval
    return min(60.0, max(seconds / 6, 1.0))


@dataclasses.dataclass
class Sample:
    """The tables and the processes at one moment of the run."""

    at: float
    """Seconds since the producer started (monotonic clock)."""
    tables: dict[str, dict[str, int]]
    backlog: int
    done_per_s: float | None
    """Completions since the previous sample per second (None for the first)."""
    worker_cores: float | None
    server_cores: float | None
    producer_cores: float | None
    """The producer's CPU: it shares the machine with the worker and the server."""

    def record(self) -> dict[str, Any]:
        return {
            "at_s": round(self.at, 1),
            "backlog": self.backlog,
            "done_per_s": None if self.done_per_s is None else round(self.done_per_s, 1),
            "worker_cores": None if self.worker_cores is None else round(self.worker_cores, 2),
            "server_cores": None if self.server_cores is None else round(self.server_cores, 2),
            "producer_cores": None
            if self.producer_cores is None
            else round(self.producer_cores, 2),
            "worker_us_per_job": round(1e6 * self.worker_cores / self.done_per_s)
            if self.worker_cores is not None and self.done_per_s
            else None,
            **{
                f"{name}.{key}": value
                for name, stats in self.tables.items()
                for key, value in stats.items()
            },
        }

    def text(self) -> str:
        parts = [f"{self.at:4.0f} s:"]
        if self.done_per_s is not None:
            parts.append(f"{self.done_per_s:,.0f} jobs/s done,")
        parts.append(f"backlog {self.backlog:,};")
        for name, t in self.tables.items():
            parts.append(
                f"{name} {t['bytes'] / 1e6:,.0f} MB, {t['dead']:,} dead,"
                f" {t['autovacuum']} autovacuum;"
            )
        if self.worker_cores is not None:
            parts.append(cpu.text(self.worker_cores, self.server_cores))
        if self.producer_cores is not None:
            parts.append(f"(producer {self.producer_cores:.2f})")
        return " ".join(parts)


class Sampler:
    """Reads the tables' statistics and the CPU counters; each reading a Sample."""

    def __init__(self, ctx: Context, w: Workers) -> None:
        self.ctx = ctx
        self.w = w
        self.started = time.monotonic()
        self.since: Any = ctx.db.execute("SELECT clock_timestamp()")[0][0]
        self.counters = (w.cpu_seconds(), ctx.db.server_cpu_seconds(), self.started)
        self.producer: int | None = None
        self.producer_cpu: float | None = None

    def watch(self, pid: int) -> None:
        """Read the producer's CPU too, from now on."""
        self.producer = pid
        self.producer_cpu = self._producer_cpu()

    def _producer_cpu(self) -> float | None:
        try:
            return None if self.producer is None else cpu.process_cpu_seconds(self.producer)
        except (OSError, IndexError, ValueError):
            return None  # it has exited

    def sample(self, first: bool = False) -> Sample:
        db = self.ctx.db
        tables = {
            name: {
                "bytes": int(size),
                "live": int(live),
                "dead": int(dead),
                "autovacuum": int(autovacuum),
                "autoanalyze": int(autoanalyze),
            }
            for name, size, live, dead, autovacuum, autoanalyze in db.execute(
                TABLE_STATS, [list(TABLES)]
            )
        }
        now_db, done, backlog = db.execute(DONE_SINCE, {"queue": QUEUE, "since": self.since})[0]
        now = time.monotonic()
        worker, server = self.w.cpu_seconds(), db.server_cpu_seconds()
        producer0, producer = self.producer_cpu, self._producer_cpu()
        worker0, server0, wall0 = self.counters
        wall = now - wall0
        got = Sample(
            at=now - self.started,
            tables={name: tables[name] for name in TABLES if name in tables},
            backlog=int(backlog),
            done_per_s=None if first else done / (now_db - self.since).total_seconds(),
            worker_cores=None if first else cpu.cores(worker0, worker, wall),
            server_cores=None if first else cpu.cores(server0, server, wall),
            producer_cores=cpu.cores(producer0, producer, wall),
        )
        self.since, self.counters, self.producer_cpu = now_db, (worker, server, now), producer
        return got


def _per_interval(ctx: Context, interval: float, count: int) -> tuple[list[int], list[int]]:
    """Jobs enqueued and completed in each of the ``count`` intervals from the first enqueue."""
    created, finished = [0] * count, [0] * count
    for kind, k, n in ctx.db.execute(PER_INTERVAL, {"queue": QUEUE, "interval": interval}):
        if k is not None and 0 <= k < count:
            (created if kind == "created" else finished)[k] = int(n)
    return created, finished


def _producer(ctx: Context, rate: float, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.producer", ctx.db.dsn, QUEUE, f"{rate:.3f}", str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def sustained(ctx: Context) -> list[Figure]:
    s = ctx.sizes
    concurrency = s.sustained_concurrency or max(s.concurrencies)
    seconds = s.sustained_seconds
    interval = interval_of(seconds, s.sustained_interval)
    count = max(int(seconds // interval), 1)
    peak = _drain_once(ctx, "bench.noop", s.sustained_peak_jobs, concurrency, 1)
    rate = max(s.sustained_load * peak.rate, 1.0)
    ctx.say(
        f"sustained: peak {peak.rate:,.0f} jobs/s at concurrency {concurrency} "
        f"({cpu.text(peak.worker_cpu, peak.server_cpu)}); producing {rate:,.0f} jobs/s "
        f"for {seconds:g} s, sampled every {interval:g} s"
    )
    ctx.db.reset()
    samples: list[Sample] = []
    with workers(ctx, QUEUE, concurrency, 1) as w:
        w.wait_ready()
        sampler = Sampler(ctx, w)
        samples.append(sampler.sample(first=True))
        producer = _producer(ctx, rate, seconds)
        sampler.watch(producer.pid)
        try:
            deadline = sampler.started + seconds + 60
            next_at = sampler.started + interval
            while producer.poll() is None:
                w.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError("the producer did not finish in time")
                if time.monotonic() >= next_at:
                    samples.append(sampler.sample())
                    ctx.say("sustained " + samples[-1].text())
                    next_at += interval
                time.sleep(min(0.5, max(0.0, next_at - time.monotonic())))
        finally:
            if producer.poll() is None:
                producer.kill()
            out, err = producer.communicate()
        if producer.returncode != 0:
            raise RuntimeError(f"bench.producer failed ({producer.returncode}):\n{err[-3000:]}")
        produced = json.loads(out.strip().splitlines()[-1])
        samples.append(sampler.sample())
        ctx.say("sustained end " + samples[-1].text())
    created, finished = _per_interval(ctx, interval, count)
    rates = [n / interval for n in finished]
    first, last = rates[0], rates[-1]
    ratio = last / first if first else 0.0
    start, end = samples[0].tables, samples[-1].tables
    ctx.say("sustained completions per interval (jobs/s): " + ", ".join(f"{r:,.0f}" for r in rates))
    params: dict[str, Any] = {
        "seconds": seconds,
        "interval_s": interval,
        "load": s.sustained_load,
        "peak_jobs_per_s": round(peak.rate, 1),
        "producer_jobs_per_s": round(rate, 1),
        "concurrency": concurrency,
        "processes": 1,
        "handler": "bench.noop",
        "job_events": "all",
        "producer": produced,
        "enqueued_per_interval": created,
        "completed_per_interval": finished,
        "completed_per_s": [round(r, 1) for r in rates],
        "samples": [x.record() for x in samples],
        "autovacuum_runs": {
            name: end[name]["autovacuum"] - start[name]["autovacuum"]
            for name in TABLES
            if name in start and name in end
        },
        "what": "completion rate of the last interval / of the first, the producer at "
        f"{s.sustained_load:g} of the peak drain rate measured just before",
    }
    peak_params: dict[str, Any] = {
        "jobs": s.sustained_peak_jobs,
        "concurrency": concurrency,
        "processes": 1,
        "worker_cpu_cores": round(peak.worker_cpu, 2),
        "server_cpu_cores": None if peak.server_cpu is None else round(peak.server_cpu, 2),
    }
    figures = [
        Figure("sustained.peak", "jobs/s", [peak.rate], peak_params, throughput=True),
        Figure(
            "sustained.first",
            "jobs/s",
            [first],
            {**params, "what": "first interval's rate"},
            throughput=True,
        ),
        Figure(
            "sustained.last",
            "jobs/s",
            [last],
            {**params, "what": "last interval's rate"},
            throughput=True,
        ),
        Figure("sustained.ratio", "x", [ratio], params, target=not_below(0.90, "x")),
    ]
    for name in TABLES:
        if name not in end:
            continue
        what = {"what": f"{name} at the end: pg_total_relation_size, pg_stat_user_tables"}
        figures.append(
            Figure(
                f"sustained.{name}.mb",
                "MB",
                [end[name]["bytes"] / 1e6],
                {**what, "start_mb": start.get(name, {}).get("bytes", 0) / 1e6},
            )
        )
        figures.append(
            Figure(
                f"sustained.{name}.dead_tuples",
                "rows",
                [float(end[name]["dead"])],
                {
                    **what,
                    "live_tuples": end[name]["live"],
                    "autovacuum_runs": params["autovacuum_runs"].get(name),
                },
            )
        )
    return figures
