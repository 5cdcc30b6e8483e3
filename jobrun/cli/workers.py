"""``jobrun workers``: every registered worker, idle ones included.

Each running worker keeps a row in the database (``jobrun.workers``, see
:mod:`jobrun.job.workers`): its id (the lease owner of its jobs), host,
pid, version, queues, concurrency, the job types it runs, when it started
and when it was last seen (by the database clock). A worker not seen
within its lease TTL is shown ``gone``; the scheduler's leader is marked.
"""

from __future__ import annotations

import argparse

from jobrun.job.workers import WorkerStatus
from jobrun.postgres.leader import leader_election

from .exits import EXIT_OK
from .output import print_json, print_table, row, say, table, when
from .parser import Commands
from .settings import open_client


def register(commands: Commands) -> None:
    """Add ``workers``."""
    commands.add(
        "workers",
        cmd_workers,
        "list the workers (idle ones too): host, pid, queues, job types, last seen",
        json=True,
    )


def _status(w: WorkerStatus) -> str:
    status = "busy" if w.leased else "idle"
    if not w.live:
        status = "gone"
    return f"{status}, leader" if w.leader else status


def _ago(w: WorkerStatus) -> str:
    seconds = max((w.db_now - w.last_seen_at).total_seconds(), 0.0)
    return f"{seconds:.0f}s ago"


def cmd_workers(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        workers = client.store.workers(leader_election(client.store.schema))
    if args.json:
        print_json(
            [
                {
                    **_fields(w),
                    "status": _status(w),
                }
                for w in workers
            ]
        )
    elif not workers:
        say("no workers registered")
    else:
        grid = table("id", "status", "host", "pid", "queues", "conc", "leased", "types", "seen")
        for w in workers:
            i = w.info
            row(
                grid,
                i.id,
                _status(w),
                i.host,
                i.pid,
                ",".join(i.queues),
                i.concurrency,
                w.leased,
                ",".join(i.types) or "(none)",
                _ago(w),
            )
        print_table(grid)
    return EXIT_OK


def _fields(w: WorkerStatus) -> dict[str, object]:
    i = w.info
    return {
        "id": i.id,
        "host": i.host,
        "pid": i.pid,
        "version": i.version,
        "queues": list(i.queues),
        "concurrency": i.concurrency,
        "types": list(i.types),
        "lease_ttl": i.lease_ttl,
        "started_at": when(w.started_at),
        "last_seen_at": when(w.last_seen_at),
        "live": w.live,
        "leased": w.leased,
        "leader": w.leader,
    }
