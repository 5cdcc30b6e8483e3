"""jobrun's side of the comparison (runs in jobrun's ``.venv``).

The worker is the real command at its defaults (``JOBRUN_JOB_EVENTS=all``,
notifications on, standing for scheduler leader)::

    jobrun worker --app bench.peers.jobrun_side:registry --queues peers --concurrency N

The producer commands (see :mod:`bench.peers.common`) go through the public
client, as an application would: ``jobrun.Client.connect(url)`` (its
default pool), ``client.enqueue(type, payload, queue=...)`` for one job and
``client.enqueue_batch([NewJob(...), ...])`` for many: a list, the form a
user's code most often has in hand; and, where this jobrun has it, the
lighter ``client.enqueue_many(type, [payload, ...])``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jobrun
from bench.peers import common
from jobrun import Job, JobContext, NewJob, Registry

NOOP = "peers.noop"
PICKUP = "peers.pickup"

registry = Registry()


@registry.handler(NOOP)
def noop(ctx: JobContext, job: Job) -> None:
    return None


@registry.handler(PICKUP)
def pickup_handler(ctx: JobContext, job: Job) -> None:
    assert isinstance(job.payload, dict)
    common.note_start(int(job.payload["i"]))  # type: ignore[arg-type]


def _client(args: argparse.Namespace) -> jobrun.Client:
    return jobrun.Client.connect(args.dsn)


def versions(args: argparse.Namespace) -> dict[str, Any]:
    return {
        **common.versions("jobrun", "psycopg", "psycopg-pool"),
        "api": "sync (psycopg 3)",
        "enqueue_many": hasattr(jobrun.Client, "enqueue_many"),
    }


def enqueue_one(args: argparse.Namespace) -> dict[str, Any]:
    with _client(args) as client:
        for i in range(common.WARMUP_CALLS):
            client.enqueue(NOOP, common.payload(i), queue=common.WARMUP_QUEUE)
        started = time.perf_counter()
        for i in range(args.jobs):
            client.enqueue(NOOP, common.payload(i), queue=common.QUEUE)
        seconds = time.perf_counter() - started
    return {"jobs": args.jobs, "seconds": seconds, "call": "Client.enqueue(type, payload, queue=)"}


def enqueue_many(args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    with _client(args) as client:
        client.now()  # the pool's connection is up before the clock starts
        started = time.perf_counter()
        if args.form == "payloads":
            # The lighter form (where this jobrun has it): one type, a list of payloads.
            many: Any = getattr(client, "enqueue_many")  # noqa: B009 - absent in older jobruns
            result = many(NOOP, [common.payload(i) for i in range(n)], queue=common.QUEUE)
            call = "Client.enqueue_many(type, [payload for i in range(n)], queue=)"
        else:
            result = client.enqueue_batch(
                [NewJob(type=NOOP, queue=common.QUEUE, payload=common.payload(i)) for i in range(n)]
            )
            call = "Client.enqueue_batch([NewJob(...) for i in range(n)])"
        seconds = time.perf_counter() - started
    return {"jobs": n, "inserted": result.inserted, "seconds": seconds, "call": call}


def seed(args: argparse.Namespace) -> dict[str, Any]:
    kind = NOOP if args.kind == "noop" else PICKUP
    with _client(args) as client:
        result = client.enqueue_batch(
            NewJob(type=kind, queue=common.QUEUE, payload=common.payload(i))
            for i in range(args.jobs)
        )
    return {"jobs": args.jobs, "inserted": result.inserted}


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    run = common.Pickup(args)
    with _client(args) as client:
        for i in range(common.WARMUP_CALLS):
            client.enqueue(NOOP, common.payload(i), queue=common.WARMUP_QUEUE)
        client.enqueue(PICKUP, common.payload(common.PICKUP_WARM_KEY), queue=common.QUEUE)
        run.wait_warm()
        for i in range(run.jobs):
            pause = run.pause(i)
            if pause > 0:
                time.sleep(pause)
            before = time.time()
            client.enqueue(PICKUP, common.payload(i), queue=common.QUEUE)
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
    common.run(COMMANDS, prog="python -m bench.peers.jobrun_side")
