"""``jobrun schedules add|list|remove|pause|resume``: cron schedules in the database.

A schedule enqueues a job of its type at each occurrence of its cron
expression in its time zone; the scheduler (in ``jobrun worker``, or ``jobrun
scheduler``) runs them. ``add`` refuses an id that exists (exit code 4,
naming ``--replace`` and ``remove`` as the ways out) unless told
``--replace``. With ``--app`` it also checks that a handler takes the type and
warns (exit 0) when none does: the schedule is valid, but its jobs would wait
for a worker that handles them. ``resume`` continues from the schedule's next
occurrence.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from jobrun.job.errors import AlreadyExists
from jobrun.job.model import Schedule, ScheduleSpec

from .apps import load_app
from .exits import EXIT_CONFLICT, EXIT_OK, CommandError, warn
from .output import print_json, print_table, report, row, say, table, when
from .parser import Commands, job_options, parse_payload, payload_options
from .settings import open_client

if TYPE_CHECKING:
    from jobrun.worker.registry import Registry


def register(commands: Commands) -> None:
    """Add ``schedules`` and its actions."""
    schedules = commands.nest("schedules", "cron schedules")
    p = schedules.add("add", cmd_schedule_add, "create a schedule", json=True)
    p.add_argument("id", metavar="ID", help="the schedule's id, like nightly-report")
    p.add_argument(
        "cron",
        metavar="CRON",
        help="'minute hour day month weekday' (6 fields: seconds first), "
        "or @hourly, @daily, @weekly, @monthly, @yearly",
    )
    p.add_argument("type", metavar="TYPE", help="the job type each run enqueues")
    payload_options(p)
    p.add_argument(
        "--tz",
        default="UTC",
        metavar="ZONE",
        help="IANA time zone, like Europe/Paris (default: UTC)",
    )
    job_options(p)
    p.add_argument("--replace", action="store_true", help="replace the schedule if the id exists")
    p.add_argument(
        "--app",
        metavar="MODULE:REGISTRY",
        help="the handlers: warn when none of them handles TYPE",
    )
    schedules.add("list", cmd_schedule_list, "list schedules", json=True)
    for name, func, what in (
        ("remove", cmd_schedule_remove, "delete a schedule"),
        ("pause", cmd_schedule_pause, "stop a schedule enqueuing"),
        ("resume", cmd_schedule_resume, "resume a schedule from its next occurrence"),
    ):
        p = schedules.add(name, func, what, json=True)
        p.add_argument("id", metavar="ID", help="the schedule's id")


def _schedule_out(args: argparse.Namespace, schedule: Schedule, what: str) -> None:
    """The schedule as JSON, or what was done to it and when it runs next."""
    then = " (paused)" if schedule.paused else f"; next run at {when(schedule.next_run_at)}"
    report(args, schedule, f"schedule {schedule.id} {what}{then}")


def cmd_schedule_add(args: argparse.Namespace) -> int:
    spec = ScheduleSpec(
        id=args.id,
        cron=args.cron,
        type=args.type,
        payload=parse_payload(args),
        timezone=args.tz,
        queue=args.queue,
        priority=args.priority,
        max_attempts=args.max_attempts,
    )
    registry: Registry | None = None if args.app is None else load_app(args.app)
    with open_client(args) as client:
        if args.replace:
            schedule = client.upsert_schedule(spec)
        else:
            try:
                schedule = client.create_schedule(spec)
            except AlreadyExists:
                raise CommandError(
                    f"schedule {spec.id!r} already exists: add --replace to replace it "
                    f"(or remove it first: jobrun schedules remove {spec.id})",
                    EXIT_CONFLICT,
                ) from None
    _schedule_out(args, schedule, "saved" if args.replace else "created")
    if registry is not None and spec.type not in registry:
        known = ", ".join(registry.types[:10]) or "none"
        warn(
            f"no handler in {args.app} handles type {spec.type!r} (it handles: {known}); "
            "its jobs will wait for a worker that does"
        )
    return EXIT_OK


def cmd_schedule_list(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedules = client.list_schedules()
    if args.json:
        print_json(schedules)
    elif not schedules:
        say("no schedules")
    else:
        grid = table("id", "cron", "timezone", "queue", "type", "next_run_at", "paused")
        for s in schedules:
            paused = "paused" if s.paused else ""
            row(grid, s.id, s.cron, s.timezone, s.queue, s.type, when(s.next_run_at), paused)
        print_table(grid)
    return EXIT_OK


def cmd_schedule_remove(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.delete_schedule(args.id)
    report(args, {"id": args.id, "removed": True}, f"schedule {args.id} removed")
    return EXIT_OK


def cmd_schedule_pause(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedule = client.pause_schedule(args.id)
    _schedule_out(args, schedule, "paused")
    return EXIT_OK


def cmd_schedule_resume(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedule = client.resume_schedule(args.id)
    _schedule_out(args, schedule, "resumed")
    return EXIT_OK
