"""PgQueuer's side of the comparison (runs in ``.venv-peers``).

The worker is PgQueuer's own command, on the factory below (its README's
consumer: one asyncpg connection, ``PgQueuer(AsyncpgDriver(connection))``,
async entrypoints; yielded from an async context manager, as ``pgq run``
requires)::

    pgq run bench.peers.pgqueuer_side:create_pgqueuer --batch-size B [--max-concurrent-tasks M]

Its defaults: ``--batch-size 10``, no cap on concurrent tasks (an async
handler is a task, so concurrency is whatever the batches bring), and
entrypoints without a ``concurrency_limit``. PgQueuer has no worker
"concurrency 1": ``--max-concurrent-tasks`` must be at least twice the
batch size, so the one-at-a-time drain uses what its documentation offers
for that, ``concurrency_limit=1`` on the entrypoint ("serialises
dispatch"), set here from ``BENCH_PEERS_CONCURRENCY_LIMIT``.

The producer commands use its README's producer: ``Queries(AsyncpgDriver(
await asyncpg.connect(url)))``, ``queries.enqueue(entrypoint, payload_bytes)``
for one job and ``queries.enqueue([entrypoint] * n, [payload, ...], [0] * n)``
for many (PgQueuer's batch form: lists). They run on uvloop, as ``pgq``
runs its own coroutines (PgQueuer depends on uvloop).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from bench.peers import common

NOOP = "noop"
PICKUP = "pickup"
WARMUP = "warmup"
"""An entrypoint no worker registers: its jobs stay queued."""


def _payload(i: int) -> bytes:
    return json.dumps(common.payload(i)).encode()


@contextlib.asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The worker's factory (``pgq run bench.peers.pgqueuer_side:create_pgqueuer``).

    An async context manager: what ``pgq run`` of 1.6 requires (it rejects
    the coroutine of the README's consumer example, which is older).
    """
    connection = await asyncpg.connect(os.environ[common.DSN_ENV])
    pgq = PgQueuer(AsyncpgDriver(connection))
    limit = int(os.environ.get(common.C1_ENV, "0") or 0)

    @pgq.entrypoint(NOOP, concurrency_limit=limit)
    async def noop(job: Job) -> None:
        return None

    @pgq.entrypoint(PICKUP, concurrency_limit=limit)
    async def pickup(job: Job) -> None:
        common.note_start(int(json.loads(job.payload or b"{}")["i"]))

    try:
        yield pgq
    finally:
        await connection.close()


async def _with_queries(args: argparse.Namespace, body: Callable[[Queries], Awaitable[Any]]) -> Any:
    connection = await asyncpg.connect(args.dsn)
    try:
        return await body(Queries(AsyncpgDriver(connection)))
    finally:
        await connection.close()


def _run(args: argparse.Namespace, body: Callable[[Queries], Awaitable[Any]]) -> Any:
    return uvloop.run(_with_queries(args, body))


def versions(args: argparse.Namespace) -> dict[str, Any]:
    return {**common.versions("pgqueuer", "asyncpg", "uvloop"), "api": "async (asyncpg, uvloop)"}


def enqueue_one(args: argparse.Namespace) -> dict[str, Any]:
    async def body(queries: Queries) -> float:
        for i in range(common.WARMUP_CALLS):
            await queries.enqueue(WARMUP, _payload(i))
        started = time.perf_counter()
        for i in range(args.jobs):
            await queries.enqueue(NOOP, _payload(i))
        return time.perf_counter() - started

    seconds = _run(args, body)
    return {"jobs": args.jobs, "seconds": seconds, "call": "Queries.enqueue(entrypoint, bytes)"}


def enqueue_many(args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs

    async def body(queries: Queries) -> tuple[float, int]:
        started = time.perf_counter()
        ids = await queries.enqueue([NOOP] * n, [_payload(i) for i in range(n)], [0] * n)
        return time.perf_counter() - started, len(ids)

    seconds, inserted = _run(args, body)
    return {
        "jobs": n,
        "inserted": inserted,
        "seconds": seconds,
        "call": "Queries.enqueue([entrypoint] * n, [bytes, ...], [0] * n)",
    }


def seed(args: argparse.Namespace) -> dict[str, Any]:
    n = args.jobs
    kind = NOOP if args.kind == "noop" else PICKUP

    async def body(queries: Queries) -> int:
        return len(await queries.enqueue([kind] * n, [_payload(i) for i in range(n)], [0] * n))

    return {"jobs": n, "inserted": _run(args, body)}


def pickup(args: argparse.Namespace) -> dict[str, Any]:
    run = common.Pickup(args)

    async def body(queries: Queries) -> None:
        for i in range(common.WARMUP_CALLS):
            await queries.enqueue(WARMUP, _payload(i))
        await queries.enqueue(PICKUP, _payload(common.PICKUP_WARM_KEY))
        run.wait_warm()
        for i in range(run.jobs):
            pause = run.pause(i)
            if pause > 0:
                await asyncio.sleep(pause)
            before = time.time()
            await queries.enqueue(PICKUP, _payload(i))
            run.record(i, before, time.time())

    _run(args, body)
    return run.result()


COMMANDS: dict[str, common.Command] = {
    "versions": versions,
    "enqueue_one": enqueue_one,
    "enqueue_many": enqueue_many,
    "seed": seed,
    "pickup": pickup,
}

if __name__ == "__main__":
    common.run(COMMANDS, prog="python -m bench.peers.pgqueuer_side")
