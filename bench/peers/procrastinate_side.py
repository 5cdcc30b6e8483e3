"""procrastinate's side of the comparison (runs in ``.venv-peers``).

The worker is procrastinate's own command on the app below (its default
connector, ``PsycopgConnector``; async tasks, which it runs on its event
loop without a thread each)::

    procrastinate --app bench.peers.procrastinate_side.app worker --queues peers --concurrency N

Its defaults: ``--concurrency 1``, LISTEN/NOTIFY on, polling every 5 s,
jobs kept after they finish (``--delete-jobs`` unset).

The producer commands use the synchronous API of its quick start, as a
jobrun user's code does: ``with app.open(): task.defer(i=...)`` for one job
and ``task.batch_defer(*[{"i": ...}, ...])`` for many (its batch API, one
statement).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import procrastinate

from bench.peers import common


class Peers:
    """The app and its two tasks (a no-op, and the pickup probe)."""

    def __init__(self, dsn: str) -> None:
        self.app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

        @self.app.task(name="noop", queue=common.QUEUE)
        async def noop(i: int) -> None:
            return None

        @self.app.task(name="pickup", queue=common.QUEUE)
        async def pickup(i: int) -> None:
            common.note_start(i)

        self.noop = noop
        self.pickup = pickup


# What ``procrastinate --app bench.peers.procrastinate_side.app`` loads (its URL from the
# environment). Not made when this module runs as the producer command: each command makes
# its own App, and procrastinate warns about an App in the __main__ module.
if __name__ != "__main__":
    app = Peers(os.environ.get(common.DSN_ENV, "")).app


def versions(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **common.versions("procrastinate", "psycopg", "psycopg-pool"),
        "api": "sync defer (PsycopgConnector), async worker",
    }


def enqueue_one(args: argparse.Namespace) -> dict[str, Any]:
    p = Peers(args.dsn)
    warmup = p.noop.configure(queue=common.WARMUP_QUEUE)
    with p.app.open():
        for i in range(common.WARMUP_CALLS):
            warmup.defer(i=i)
        started = time.perf_counter()
        for i in range(args.jobs):
            p.noop.defer(i=i)
        seconds = time.perf_counter() - started
    return {"jobs": args.jobs, "seconds": seconds, "call": "task.defer(i=...)"}


def enqueue_many(args: argparse.Namespace) -> dict[str, Any]:
    p = Peers(args.dsn)
    with p.app.open():
        p.app.check_connection()  # the pool's connection is up before the clock starts
        started = time.perf_counter()
        ids = p.noop.batch_defer(*[common.payload(i) for i in range(args.jobs)])
        seconds = time.perf_counter() - started
    return {
        "jobs": args.jobs,
        "inserted": len(ids),
        "seconds": seconds,
        "call": "task.batch_defer(*[{'i': i} for i in range(n)])",
    }


def seed(args: argparse.Namespace) -> dict[str, Any]:
    p = Peers(args.dsn)
    task = p.noop if args.kind == "noop" else p.pickup
    with p.app.open():
        ids = task.batch_defer(*[common.payload(i) for i in range(args.jobs)])
    return {"jobs": args.jobs, "inserted": len(ids)}


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    run = common.Pickup(args)
    p = Peers(args.dsn)
    warmup = p.noop.configure(queue=common.WARMUP_QUEUE)
    with p.app.open():
        for i in range(common.WARMUP_CALLS):
            warmup.defer(i=i)
        p.pickup.defer(i=common.PICKUP_WARM_KEY)
        run.wait_warm()
        for i in range(run.jobs):
            pause = run.pause(i)
            if pause > 0:
                time.sleep(pause)
            before = time.time()
            p.pickup.defer(i=i)
            run.record(i, before, time.time())
    return run.result()


COMMANDS: dict[str, common.Command] = {
    "versions": versions,
    "enqueue_one": enqueue_one,
    "enqueue_many": enqueue_many,
    "seed": seed,
    "pickup": pickup,
}

if __name__ == "__main__":
    common.run(COMMANDS, prog="python -m bench.peers.procrastinate_side")
