"""Enqueue and read jobs: ``enqueue``, ``get``, ``list``, ``events`` and ``depth``.

``jobrun enqueue`` checks everything it can (type, payload, queue, priority,
delay, keys) before it opens the database, so a typo costs no connection and
says which flag is wrong (exit code 7). It prints the job's id, which is
what ``get``, ``events``, ``cancel`` and ``retry`` take.

``jobrun list`` shows the newest jobs first, a page at a time (``--before
ID`` for the next page), walking the primary key downwards through the
dashboard's read side (:func:`newest_jobs`) rather than sorting the table;
``--oldest`` and ``--after ID`` page the other way through the client's own
listing. Its last line says how to ask for the next page.
"""

from __future__ import annotations

import argparse
import itertools
import uuid
from typing import Any

from jobrun.client import Client
from jobrun.job import validate
from jobrun.job.model import Event, Job, NewJob, QueueDepth
from jobrun.postgres.store import MAX_LIST_LIMIT
from jobrun.postgres.web import MAX_PAGE as WEB_MAX_PAGE
from jobrun.postgres.web import DashboardReads, JobFilter

from .batch import cmd_enqueue_batch
from .exits import EXIT_OK, UsageError
from .ids import job_id
from .output import (
    count_jobs,
    output_width,
    print_json,
    print_table,
    report,
    row,
    say,
    table,
    to_json,
)
from .parser import (
    Commands,
    job_filters,
    job_options,
    parse_payload,
    parse_state,
    payload_options,
)
from .settings import open_client, optional_duration
from .views import event_lines, job_details, jobs_table

LIST_LIMIT = 100
"""Jobs ``jobrun list`` shows unless told ``--limit``."""


def register(commands: Commands) -> None:
    """Add ``enqueue``, ``get``, ``list``, ``events`` and ``depth``."""
    p = commands.add(
        "enqueue", cmd_enqueue, "enqueue a job (or --batch: many); prints its id", json=True
    )
    p.add_argument(
        "type", metavar="TYPE", nargs="?", help="the job type (a handler's name; not with --batch)"
    )
    payload_options(p)
    job_options(p)
    p.add_argument(
        "--delay",
        metavar="DURATION",
        help="run later: 90s, 5m, 1h30m, 2d or plain seconds like 300 (default: now)",
    )
    p.add_argument("--key", metavar="KEY", help="idempotency key (unique per queue)")
    p.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="what the queue's per-key limit counts the job under: a tenant, an account "
        "(default: none, only the queue's own limits apply)",
    )
    p.add_argument(
        "--batch",
        metavar="FILE",
        help="enqueue one job per JSON line of FILE ('-': stdin), all or nothing: "
        '{"type": T, "payload": {...}, "queue": Q, "priority": N, "max_attempts": N, '
        '"delay": "1h30m", "key": K, "concurrency_key": K}; the flags are every line\'s defaults',
    )

    p = commands.add("get", cmd_get, "show one job", json=True)
    p.add_argument(
        "id", metavar="ID", help="the job id, or its start (as list prints it): unique prefix"
    )

    p = commands.add("list", cmd_list, "list jobs, newest first", json=True)
    job_filters(p)
    p.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT,
        metavar="N",
        help=f"how many jobs to show (default: {LIST_LIMIT})",
    )
    p.add_argument("--before", metavar="ID", help="the next page: jobs older than this id")
    p.add_argument("--oldest", action="store_true", help="oldest first (pages with --after)")
    p.add_argument("--after", metavar="ID", help="jobs newer than this id, oldest first")

    p = commands.add("events", cmd_events, "a job's audit trail", json=True)
    p.add_argument("id", metavar="ID", help="the job id, or its start (a unique prefix)")

    commands.add("depth", cmd_depth, "jobs per queue and state; paused queues", json=True)


def cmd_enqueue(args: argparse.Namespace) -> int:
    if args.batch is not None:
        return cmd_enqueue_batch(args)
    if args.type is None:
        raise UsageError("enqueue: give a job TYPE, or --batch FILE for many jobs")
    # Every check runs here, before the database is even opened.
    new = NewJob(
        type=args.type,
        payload=parse_payload(args),
        queue=args.queue,
        priority=args.priority,
        max_attempts=args.max_attempts,
        delay=optional_duration(args.delay, "--delay"),
        idempotency_key=args.key,
        concurrency_key=args.concurrency_key,
    )
    with open_client(args) as client:
        job = client.enqueue_job(new)
    report(args, job, str(job.id))
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        job = client.get(job_id(client, args.id))
    if args.json:
        print_json(job)
    else:
        print_table(job_details(job))
    return EXIT_OK


def newest_jobs(
    client: Client, filters: dict[str, Any], count: int, before: uuid.UUID | None = None
) -> list[Job]:
    """The ``count`` matching jobs with the highest ids (below ``before``), newest first.

    The dashboard's read side walks the primary key downwards a page per round
    trip; reading stops once ``count`` jobs are in hand.
    """
    if before is not None and before.int == 0:
        return []
    upto = None if before is None else uuid.UUID(int=before.int - 1)
    where = JobFilter(
        queue=filters.get("queue"), state=filters.get("state"), type=filters.get("type")
    )
    page = max(1, min(count, WEB_MAX_PAGE))
    matching = DashboardReads(client.store).matching(where, upto=upto, page=page)
    return list(itertools.islice(matching, count))


def cmd_list(args: argparse.Namespace) -> int:
    state = None if args.state is None else parse_state(args.state)
    oldest_first = args.oldest or args.after is not None
    if oldest_first and args.before is not None:
        raise UsageError("list: --before pages newest first, --after and --oldest oldest first")
    validate.batch_limit(args.limit, MAX_LIST_LIMIT)
    where: dict[str, Any] = {"queue": args.queue, "state": state, "type": args.type}
    with open_client(args) as client:
        if oldest_first:
            after = None if args.after is None else job_id(client, args.after, "--after")
            jobs = client.list(**where, after=after, limit=args.limit)
            more = len(jobs) == args.limit
        else:
            before = None if args.before is None else job_id(client, args.before, "--before")
            jobs = newest_jobs(client, where, args.limit + 1, before)
            more = len(jobs) > args.limit
            jobs = jobs[: args.limit]
        short = {} if args.json else DashboardReads(client.store).short_ids([j.id for j in jobs])
    if args.json:
        print_json(jobs)
    elif not jobs:
        say("no jobs")
    else:
        print_table(jobs_table(jobs, output_width(), short))
        last = str(jobs[-1].id)  # whole, as scripts that page read it
        if oldest_first:
            say(count_jobs(len(jobs)) + (f"; more may follow: --after {last}" if more else ""))
        else:
            older = f"; older: --before {last}" if more else ""
            say(f"{count_jobs(len(jobs))}, newest first{older}")
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        ident = job_id(client, args.id)
        client.get(ident)  # NotFound for an unknown job, not an empty trail
        events: list[Event] = client.events(ident)
    if args.json:
        print_json(events)
    elif not events:
        say("no events")
    else:
        for line in event_lines(events, output_width()):
            say(line)
    return EXIT_OK


def _depth_rows(client: Client) -> list[dict[str, Any]]:
    depths: dict[str, QueueDepth] = {d.queue: d for d in client.depth()}
    paused = set(client.paused_queues())
    rows = []
    for name in sorted(set(depths) | paused):
        d = depths.get(name) or QueueDepth(queue=name, ready=0, scheduled=0, leased=0, dead=0)
        rows.append({**to_json(d), "paused": name in paused})
    return rows


def cmd_depth(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        rows = _depth_rows(client)
    if args.json:
        print_json(rows)
    elif not rows:
        say("no queued, leased or dead jobs")
    else:
        grid = table("queue", "ready", "scheduled", "leased", "dead", "paused")
        for r in rows:
            paused = "paused" if r["paused"] else ""
            row(grid, r["queue"], r["ready"], r["scheduled"], r["leased"], r["dead"], paused)
        print_table(grid)
    return EXIT_OK
