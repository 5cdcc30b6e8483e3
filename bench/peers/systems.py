"""The three systems as the orchestrator sees them: how each is installed, run and read.

Every system is driven through its own tooling and public API only: its
schema comes from its own installer, its worker is its own command, and the
drain's figures come from the timestamps it records itself, all of them
``now()`` of the transaction that claimed or finished a job (the database
clock):

==============  ==========================  ===============================
system          first claim                 last completion
==============  ==========================  ===============================
jobrun          ``job_events`` 'claimed'    ``jobs.finished_at``
PgQueuer        ``pgqueuer_log`` 'picked'   ``pgqueuer_log`` 'successful'
procrastinate   ``procrastinate_events``    ``procrastinate_events``
                'started'                   'succeeded'
==============  ==========================  ===============================
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from bench.peers import common

ROOT = Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One way of running a system's worker: its flags and environment, and how many processes."""

    label: str
    """How the table names it: ``8 threads``, ``batch 10``..."""
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    procs: int = 1


@dataclasses.dataclass(frozen=True)
class System:
    name: str
    title: str
    python: Path
    side: str
    """The module of its producer commands (bench.peers.common's command line)."""
    script: str
    """The console script of its worker (run through bench.peers.launch)."""
    app_module: str
    """The module its worker loads the handlers from (imported before the start signal)."""
    worker_args: tuple[str, ...]
    """The worker command's arguments before a setting's own."""
    install: Callable[[System, str], None]
    """Create its schema in the (template) database at the URL, with its own tooling."""
    best: tuple[Setting, ...]
    """The single-process settings tried for "drain, 1 process, best setting"."""
    two_by_eight: Setting
    one: Setting
    """One job at a time in one process."""
    pickup: Setting
    """Its defaults, for the idle worker of the pickup latency."""
    remaining_sql: str
    """True while some job of the drain is still queued or running (cheap: polled)."""
    stats_sql: str
    """(first claim, last completion, jobs succeeded) of the drain, by the database clock."""
    queued_sql: str
    """The jobs an enqueue measurement left in the database (its check)."""
    defaults: str
    """What its worker's defaults are, for the table's notes."""

    def env(self, url: str) -> dict[str, str]:
        """Its processes' environment: the URL, and jobrun's default event mode spelled out."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PG", "JOBRUN_"))}
        env.pop("DATABASE_URL", None)
        env.update(
            {
                common.DSN_ENV: url,
                "PYTHONPATH": str(ROOT),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        if self.name == "jobrun":
            env.update({"DATABASE_URL": url, "JOBRUN_JOB_EVENTS": "all"})
        return env


def _run(cmd: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def _install_jobrun(system: System, url: str) -> None:
    from jobrun.postgres.migrate import migrate  # noqa: PLC0415 - the orchestrator's venv only

    migrate(url)


def _install_pgqueuer(system: System, url: str) -> None:
    _run(
        [str(system.python), "-m", "pgqueuer", "--pg-dsn", url, "install"],
        system.env(url),
        "pgq install",
    )


def _install_procrastinate(system: System, url: str) -> None:
    _run(
        [
            str(system.python),
            "-m",
            "procrastinate",
            "--app",
            PROCRASTINATE_APP,
            "schema",
            "--apply",
        ],
        system.env(url),
        "procrastinate schema --apply",
    )


PROCRASTINATE_APP = "bench.peers.procrastinate_side.app"


def jobrun(python: Path, best: tuple[int, ...]) -> System:
    def threads(n: int) -> Setting:
        extra = tuple(os.environ.get("BENCH_JOBRUN_ARGS", "").split())
        label = f"{n} thread{'s' if n > 1 else ''}" + "".join(f" {a}" for a in extra)
        return Setting(label, ("--concurrency", str(n), *extra))

    return System(
        name="jobrun",
        title="jobrun",
        python=python,
        side="bench.peers.jobrun_side",
        script="jobrun",
        app_module="bench.peers.jobrun_side",
        worker_args=(
            "worker",
            "--app",
            "bench.peers.jobrun_side:registry",
            "--queues",
            common.QUEUE,
            "--log-level",
            "warning",
        ),
        install=_install_jobrun,
        best=tuple(threads(n) for n in best),
        two_by_eight=dataclasses.replace(threads(8), label="2 x 8 threads", procs=2),
        one=threads(1),
        pickup=Setting("defaults (10 threads)"),
        remaining_sql=(
            "SELECT EXISTS (SELECT 1 FROM jobrun.jobs WHERE state = 'queued' AND queue = 'peers')"
            " OR EXISTS (SELECT 1 FROM jobrun.jobs WHERE state = 'leased')"
        ),
        stats_sql=(
            "SELECT (SELECT min(at) FROM jobrun.job_events WHERE kind = 'claimed'),"
            " (SELECT max(finished_at) FROM jobrun.jobs WHERE queue = 'peers'),"
            " (SELECT count(*) FROM jobrun.jobs WHERE queue = 'peers' AND state = 'succeeded')"
        ),
        queued_sql="SELECT count(*) FROM jobrun.jobs WHERE queue = 'peers'",
        defaults="10 threads, JOBRUN_JOB_EVENTS=all, LISTEN/NOTIFY, scheduler candidate",
    )


def pgqueuer(python: Path, best: tuple[int, ...]) -> System:
    def batch(n: int) -> Setting:
        return Setting(f"batch {n}", ("--batch-size", str(n)))

    return System(
        name="pgqueuer",
        title="PgQueuer",
        python=python,
        side="bench.peers.pgqueuer_side",
        script="pgq",
        app_module="bench.peers.pgqueuer_side",
        worker_args=("run", "bench.peers.pgqueuer_side:create_pgqueuer", "--log-level", "WARNING"),
        install=_install_pgqueuer,
        best=tuple(batch(n) for n in best),
        two_by_eight=Setting(
            "2 x (max 8 tasks, batch 4)",
            ("--max-concurrent-tasks", "8", "--batch-size", "4"),
            procs=2,
        ),
        one=Setting("concurrency_limit=1", env={common.C1_ENV: "1"}),
        pickup=Setting("defaults (batch 10)"),
        remaining_sql="SELECT EXISTS (SELECT 1 FROM pgqueuer)",
        stats_sql=(
            "SELECT (SELECT min(created) FROM pgqueuer_log WHERE status = 'picked'),"
            " (SELECT max(created) FROM pgqueuer_log WHERE status = 'successful'),"
            " (SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'"
            " AND entrypoint = 'noop')"
        ),
        queued_sql="SELECT count(*) FROM pgqueuer WHERE entrypoint = 'noop'",
        defaults="batch 10, no cap on concurrent tasks, LISTEN/NOTIFY",
    )


def procrastinate(python: Path, best: tuple[int, ...]) -> System:
    def concurrency(n: int) -> Setting:
        return Setting(f"concurrency {n}", ("--concurrency", str(n)))

    return System(
        name="procrastinate",
        title="procrastinate",
        python=python,
        side="bench.peers.procrastinate_side",
        script="procrastinate",
        app_module="bench.peers.procrastinate_side",
        worker_args=("--app", PROCRASTINATE_APP, "worker", "--queues", common.QUEUE),
        install=_install_procrastinate,
        best=tuple(concurrency(n) for n in best),
        two_by_eight=dataclasses.replace(concurrency(8), label="2 x concurrency 8", procs=2),
        one=concurrency(1),
        pickup=Setting("defaults (concurrency 1)"),
        remaining_sql=(
            "SELECT EXISTS (SELECT 1 FROM procrastinate_jobs WHERE status IN ('todo', 'doing'))"
        ),
        stats_sql=(
            "SELECT (SELECT min(at) FROM procrastinate_events WHERE type = 'started'),"
            " (SELECT max(at) FROM procrastinate_events WHERE type = 'succeeded'),"
            " (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
            " AND queue_name = 'peers')"
        ),
        queued_sql="SELECT count(*) FROM procrastinate_jobs WHERE queue_name = 'peers'",
        defaults="concurrency 1, LISTEN/NOTIFY + 5 s polling, finished jobs kept",
    )
