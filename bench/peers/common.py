"""What every system's side of the comparison shares: names, the command line, the pickup log.

Standard library only: this module is imported both by jobrun's ``.venv``
and by ``.venv-peers`` (where jobrun is not installed).

Each ``bench.peers.<system>_side`` module is run as
``python -m bench.peers.<system>_side COMMAND --dsn URL ...`` by the
orchestrator and prints exactly one ``RESULT {json}`` line on stdout. The
commands:

versions        the installed versions of the system and its driver
enqueue_one     ``--jobs`` enqueues of one job each, in a loop on one
                connection, after ``WARMUP_CALLS`` warm-up calls to a queue no
                worker works; ``seconds`` is the loop's wall clock
enqueue_many    one batch enqueue of ``--jobs`` jobs, the job objects built
                inside the timed region (as a user's code builds them);
                jobrun's ``--form payloads`` is its lighter form, one type and
                a list of payloads (``Client.enqueue_many``, where it exists)
seed            the same batch enqueue, untimed: the jobs a drain then runs
pickup          with a worker already idle: jobs enqueued one by one at
                ``--rate`` per second; for each, ``time.time()`` just before
                the enqueue call and just after it returned (committed); the
                worker's handler notes ``time.time()`` as it starts in the
                pickup log (:func:`note_start`); the latencies come back in
                milliseconds

Why a log file for the handler's start time rather than a row: it is the
same for the three systems, costs the handler one ``write(2)`` (after the
time is taken), and takes nothing from the worker's database connections.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

DSN_ENV = "BENCH_PEERS_DSN"
"""The database URL, for the modules a system's own command imports (the worker apps)."""
PICKUP_LOG_ENV = "BENCH_PEERS_PICKUP_LOG"
"""The file a worker's pickup handler appends ``"<key> <time.time()>"`` lines to."""
C1_ENV = "BENCH_PEERS_CONCURRENCY_LIMIT"
"""PgQueuer only: the entrypoints' ``concurrency_limit`` (its way of serialising dispatch)."""

QUEUE = "peers"
"""The queue the workers work (jobrun, procrastinate); PgQueuer selects by entrypoint."""
WARMUP_QUEUE = "warmup"
"""Where warm-up enqueues go: no worker works it (PgQueuer: an unregistered entrypoint)."""
WARMUP_CALLS = 20
PICKUP_WARM_KEY = -1
"""The first pickup job: run before the timed ones, so the worker is up and then idle."""
PICKUP_IDLE_SECONDS = 1.0
"""How long the worker sits idle (nothing queued) before the timed pickups start."""
PICKUP_TIMEOUT = 60.0
RESULT_PREFIX = "RESULT "


def payload(i: int) -> dict[str, int]:
    """The job's payload, the same for every system: a small JSON object."""
    return {"i": i}


# -- the pickup log ------------------------------------------------------------------

_log_fd: int | None = None


def note_start(key: int) -> None:
    """Note that the handler of pickup job ``key`` started now (the first thing it does)."""
    global _log_fd  # noqa: PLW0603 - one descriptor per worker process, opened on first use
    started = time.time()
    if _log_fd is None:
        _log_fd = os.open(os.environ[PICKUP_LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(_log_fd, f"{key} {started!r}\n".encode())


def read_starts(path: Path) -> dict[int, float]:
    """The pickup log: job key -> handler start (``time.time()``); the last line may be partial."""
    starts: dict[int, float] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return starts
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            try:
                starts[int(parts[0])] = float(parts[1])
            except ValueError:
                continue
    return starts


def wait_for_starts(path: Path, keys: Sequence[int], timeout: float) -> dict[int, float]:
    """Until every key in ``keys`` is in the pickup log; raises after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        starts = read_starts(path)
        missing = [k for k in keys if k not in starts]
        if not missing:
            return starts
        if time.monotonic() > deadline:
            raise SystemExit(
                f"pickup: {len(missing)} of {len(keys)} jobs never started within {timeout:.0f} s"
            )
        time.sleep(0.02)


class Pickup:
    """One pickup measurement's schedule and samples (the producer's half).

    Job ``i`` is due at ``start + i / rate`` (a fixed schedule, so a slow
    call does not push the later ones back); :meth:`result` waits until the
    worker noted every job's start.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.jobs: int = args.jobs
        self.rate: float = args.rate
        self.log = Path(args.log)
        self.before: dict[int, float] = {}
        self.after: dict[int, float] = {}
        self.started = 0.0

    def wait_warm(self) -> None:
        """After the warm pickup job was enqueued: until it ran, then idle for a second."""
        wait_for_starts(self.log, [PICKUP_WARM_KEY], PICKUP_TIMEOUT)
        time.sleep(PICKUP_IDLE_SECONDS)
        self.started = time.perf_counter()

    def pause(self, i: int) -> float:
        """Seconds to wait before enqueueing job ``i`` (<= 0: it is due)."""
        return self.started + i / self.rate - time.perf_counter()

    def record(self, i: int, before: float, after: float) -> None:
        self.before[i] = before
        self.after[i] = after

    def result(self) -> dict[str, Any]:
        keys = list(range(self.jobs))
        starts = wait_for_starts(self.log, keys, PICKUP_TIMEOUT)
        return {
            "jobs": self.jobs,
            "rate": self.rate,
            "from_call_ms": [(starts[k] - self.before[k]) * 1000 for k in keys],
            "from_commit_ms": [(starts[k] - self.after[k]) * 1000 for k in keys],
            "call_ms": [(self.after[k] - self.before[k]) * 1000 for k in keys],
        }


# -- the command line ------------------------------------------------------------------

Command = Callable[[argparse.Namespace], dict[str, Any]]


def parse(argv: Sequence[str], prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("command", choices=("versions", "enqueue_one", "enqueue_many", "seed", "pickup"))
    p.add_argument("--dsn", default=os.environ.get(DSN_ENV, ""), help="the database URL")
    p.add_argument("--jobs", type=int, default=0)
    p.add_argument("--kind", default="noop", choices=("noop", "pickup"), help="seed: which job")
    p.add_argument(
        "--form",
        default="list",
        choices=("list", "payloads"),
        help="enqueue_many: jobrun's batch form (a list of NewJob, or one type and payloads)",
    )
    p.add_argument("--rate", type=float, default=20.0, help="pickup: jobs per second")
    p.add_argument("--log", default="", help="pickup: the pickup log the worker writes")
    return p.parse_args(argv)


def run(commands: dict[str, Command], argv: Sequence[str] | None = None, prog: str = "") -> None:
    """Parse the command line, run the command, print its ``RESULT`` line."""
    args = parse(sys.argv[1:] if argv is None else argv, prog)
    result = commands[args.command](args)
    print(RESULT_PREFIX + json.dumps(result), flush=True)


def parse_result(stdout: str) -> dict[str, Any]:
    """The ``RESULT`` line of a side's output (the orchestrator's half)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(RESULT_PREFIX):
            value: dict[str, Any] = json.loads(line[len(RESULT_PREFIX) :])
            return value
    raise ValueError("no RESULT line in the output")


def versions(*names: str) -> dict[str, Any]:
    """The installed versions of the distributions ``names``, and the interpreter's."""
    from importlib import metadata  # noqa: PLC0415 - only this command needs it

    out: dict[str, Any] = {"python": sys.version.split()[0]}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
