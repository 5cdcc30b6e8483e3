"""``jobrun queues pause|resume|limit|unlimit|list``: queues as every worker sees them.

A queue's pause and its limits live in the database, so one command changes
what every worker does at its next claim (see
:meth:`jobrun.postgres.store.Store.set_queue_limits` for the guarantees).

``jobrun queues limit`` changes the limits it names and keeps the others,
in one change in the database, so two operators changing one queue's limits
at the same instant lose neither change; ``--no-...`` removes one. Every
value is checked before the database is opened, and the command prints the
queue's limits as they are now. ``jobrun queues unlimit`` lifts them all.

``jobrun queues list`` shows every known queue (with jobs, paused, or
limited) with what its limits hold: jobs leased against the concurrency
limit, jobs started in the rate limit's window.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, TypeVar

from jobrun.client import Client
from jobrun.job.errors import ValidationError
from jobrun.job.model import KEEP, MAX_LIMIT, Keep, QueueDepth, QueueLimits, RateLimit

from .exits import EXIT_OK, UsageError
from .output import print_json, print_table, report, row, say, table, to_json
from .parser import Commands
from .settings import open_client

_DIGITS = re.compile(r"[0-9]+")
_T = TypeVar("_T")


def register(commands: Commands) -> None:
    """Add ``queues`` and its actions."""
    queues = commands.nest("queues", "pause, resume, limit and list queues")
    for name, func, what in (
        ("pause", cmd_queue_pause, "stop workers claiming from a queue"),
        ("resume", cmd_queue_resume, "let workers claim from a queue again"),
    ):
        p = queues.add(name, func, what, json=True)
        p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    p = queues.add(
        "limit",
        cmd_queue_limit,
        "set a queue's limits, for every worker: the ones given are replaced, the others "
        "kept; prints the queue's limits",
        json=True,
    )
    p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    p.add_argument(
        "concurrency",
        metavar="CONCURRENCY",
        nargs="?",
        help="at most this many of its jobs running at once, across every worker "
        "(default: unchanged)",
    )
    p.add_argument(
        "--per-key",
        metavar="K",
        help="at most K running at once with the same concurrency key (default: unchanged)",
    )
    p.add_argument(
        "--rate",
        metavar="JOBS/PERIOD",
        help="at most this many started in any window of the period, like 100/s, 10/min, "
        "5/10s, 1000/h (default: unchanged)",
    )
    # dest drop_*: "no_concurrency" would read as the worker's --concurrency setting.
    for flag, what in (
        ("concurrency", "the concurrency limit"),
        ("per-key", "the per-key limit"),
        ("rate", "the rate limit"),
    ):
        p.add_argument(
            f"--no-{flag}",
            dest=f"drop_{flag.replace('-', '_')}",
            action="store_true",
            help=f"remove {what}",
        )
    p = queues.add("unlimit", cmd_queue_unlimit, "lift every limit of a queue", json=True)
    p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    queues.add(
        "list",
        cmd_queue_list,
        "known queues: paused or not, their limits and what they hold",
        json=True,
    )


def cmd_queue_pause(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.pause_queue(args.queue)
    report(args, {"queue": args.queue, "paused": True}, f"queue {args.queue} paused")
    return EXIT_OK


def cmd_queue_resume(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        was_paused = client.resume_queue(args.queue)
    value = {"queue": args.queue, "paused": False, "was_paused": was_paused}
    report(args, value, f"queue {args.queue} {'resumed' if was_paused else 'was not paused'}")
    return EXIT_OK


def _limit_arg(text: str | None, field: str) -> int | None:
    """A limit as typed (None: not given), checked before anything is sent."""
    if text is None:
        return None
    value = text.strip()
    if _DIGITS.fullmatch(value) and len(value) <= len(str(MAX_LIMIT)):
        number = int(value)
        if 1 <= number <= MAX_LIMIT:
            return number
    raise ValidationError(field, f"must be a whole number from 1 to {MAX_LIMIT:,}, not {text!r}")


def _limits_json(limits: QueueLimits) -> dict[str, Any]:
    """A queue's limits for --json: the QueueLimits fields but the queue's name."""
    out: dict[str, Any] = to_json(limits)
    out.pop("queue")
    return out


def _merged_limits(args: argparse.Namespace) -> tuple[QueueLimits, set[str]]:
    """The limits the command line names (checked), and the ones it removes."""
    if args.concurrency is not None and args.drop_concurrency:
        raise UsageError("queues limit: give CONCURRENCY or --no-concurrency, not both")
    if args.per_key is not None and args.drop_per_key:
        raise UsageError("queues limit: give --per-key or --no-per-key, not both")
    if args.rate is not None and args.drop_rate:
        raise UsageError("queues limit: give --rate or --no-rate, not both")
    given = QueueLimits(
        queue=args.queue,
        concurrency=_limit_arg(args.concurrency, "concurrency"),
        per_key=_limit_arg(args.per_key, "--per-key"),
        rate=None if args.rate is None else RateLimit.parse(args.rate),
    )
    dropped = {
        name
        for name, drop in (
            ("concurrency", args.drop_concurrency),
            ("per_key", args.drop_per_key),
            ("rate", args.drop_rate),
        )
        if drop
    }
    named = {n for n in ("concurrency", "per_key", "rate") if getattr(given, n) is not None}
    if not named and not dropped:
        raise UsageError(
            "queues limit: give CONCURRENCY, --per-key or --rate (or --no-concurrency, "
            "--no-per-key, --no-rate); jobrun queues list shows the limits"
        )
    return given, dropped


def _change(given: _T | None, dropped: bool) -> _T | Keep | None:
    """A limit's change: removed, set to the one given, or kept."""
    if dropped:
        return None
    return KEEP if given is None else given


def cmd_queue_limit(args: argparse.Namespace) -> int:
    # Every check runs here, before the database is even opened.
    given, dropped = _merged_limits(args)
    queue = given.queue
    with open_client(args) as client:
        # One change in the database: the limits not named stay, even when
        # another operator changes them at the same moment.
        limits = client.change_queue_limits(
            queue,
            concurrency=_change(given.concurrency, "concurrency" in dropped),
            per_key=_change(given.per_key, "per_key" in dropped),
            rate=_change(given.rate, "rate" in dropped),
        )
    report(args, limits, f"queue {queue}: {limits.describe()}")
    return EXIT_OK


def cmd_queue_unlimit(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        had_limits = client.clear_queue_limits(args.queue)
    value = {"queue": args.queue, "limits": None, "had_limits": had_limits}
    done = ": limits lifted" if had_limits else " had no limits"
    report(args, value, f"queue {args.queue}{done}")
    return EXIT_OK


def _queue_rows(client: Client) -> list[dict[str, Any]]:
    """Every known queue (with jobs, paused, or limited): paused, leased, its limits."""
    depths: dict[str, QueueDepth] = {d.queue: d for d in client.depth()}
    paused = set(client.paused_queues())
    limits = {lim.queue: lim for lim in client.all_queue_limits()}
    rows = []
    for name in sorted(set(depths) | paused | set(limits)):
        lim = limits.get(name)
        depth = depths.get(name)
        leased = lim.leased if lim is not None else depth.leased if depth is not None else 0
        rows.append(
            {
                "queue": name,
                "paused": name in paused,
                "leased": leased,
                "limits": None if lim is None else _limits_json(lim),
                "_limits": lim,
            }
        )
    return rows


def cmd_queue_list(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        rows = _queue_rows(client)
    if args.json:
        print_json([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    elif not rows:
        say("no queues")
    else:
        grid = table("queue", "paused", "limits", "leased", "started")
        for r in rows:
            lim: QueueLimits | None = r["_limits"]
            leased = str(r["leased"])
            started = ""
            if lim is not None and lim.concurrency is not None:
                leased += f"/{lim.concurrency}"
            if lim is not None and lim.rate is not None:
                started = f"{lim.started_in_window}/{lim.rate.limit}"
            limits = "" if lim is None else lim.describe()
            row(grid, r["queue"], "paused" if r["paused"] else "", limits, leased, started)
        print_table(grid)
    return EXIT_OK
