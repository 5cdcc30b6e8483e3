"""Change jobs: ``cancel`` and ``retry`` (one job, or every job matching ``--state``), ``purge``.

``cancel ID`` and ``retry ID`` act on one job and fail with its reason (not
found, exit 3; a state the action does not apply to, exit 5). ``--state S``
with ``--queue`` and ``--type`` filters acts on every matching job instead,
a page (:data:`BULK_PAGE`) at a time, each page acted on before the next is
read: a job that changed state between the page and the action is counted
as left alone rather than failing the whole run, and the line at the end
says how many there were. Bulk actions that cannot apply to a state (cancel
of finished jobs, retry of running ones) are refused before any job is read.

Every bulk form counts first and is guarded (:mod:`jobrun.cli.confirm`):
``--dry-run`` shows the count and a sample, ``--yes`` acts, a terminal is
asked, and anything else is refused (exit 9). The bulk action then acts on
the jobs counted, no newer: a job that came to match after the count (its
id above the last one counted) is left for the next run, so the count a
person confirmed is the most that is changed.

A running job cannot be cancelled from outside its worker: cancelling it
requests the cancel, and its worker stops it.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Iterator

from jobrun.client import Client
from jobrun.config import parse_duration
from jobrun.job.errors import InvalidState, NotFound
from jobrun.job.model import Job, State
from jobrun.postgres.web import DashboardReads

from .confirm import confirmed, guard_options
from .exits import EXIT_INVALID_STATE, EXIT_OK, CommandError, UsageError
from .ids import job_id
from .output import count_jobs, output_width, print_json, print_table, report, say, when
from .parser import Commands, job_filters, parse_state
from .settings import open_client
from .views import jobs_table

BULK_PAGE = 500
"""Jobs fetched per page by the bulk ``cancel`` and ``retry``."""
SAMPLE = 5
"""Jobs ``--dry-run`` shows of a bulk ``cancel`` or ``retry`` (the oldest matching)."""

_LEFT_ALONE = "; {} changed state meanwhile and were left alone"
_REQUESTED = "is running: cancel requested (its worker stops it)"


def register(commands: Commands) -> None:
    """Add ``cancel`` and ``retry``."""
    for name, func, what in (
        ("cancel", cmd_cancel, "cancel a job, or every job matching --state"),
        ("retry", cmd_retry, "run a job again now, or every job matching --state"),
    ):
        p = commands.add(name, func, what, json=True)
        p.add_argument(
            "id",
            metavar="ID",
            nargs="?",
            help="the job id or its start, a unique prefix (or none, and --state for many)",
        )
        job_filters(p)
        guard_options(p)


def register_purge(commands: Commands) -> None:
    """Add ``purge``."""
    p = commands.add("purge", cmd_purge, "delete finished jobs; prints the count", json=True)
    p.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="delete jobs finished longer ago than this, like 7d or 1h30m (required)",
    )
    guard_options(p)


def _single_or_bulk(args: argparse.Namespace) -> State | None:
    """The bulk --state, or None for the single ID form; usage errors for mixes."""
    verb = args.command
    if args.id is not None:
        if args.state is not None or args.queue is not None or args.type is not None:
            raise UsageError(
                f"{verb}: give a job ID or --state (with --queue/--type filters), not both"
            )
        return None
    if args.state is None:
        if args.queue is not None or args.type is not None:
            raise UsageError(f"{verb}: --queue and --type filter a bulk --state {verb}")
        raise UsageError(f"{verb}: give a job ID, or --state for a bulk {verb}")
    return parse_state(args.state)


def _matching(
    client: Client,
    state: State,
    queue: str | None,
    type_: str | None,
    upto: uuid.UUID | None = None,
) -> Iterator[Job]:
    """Every job matching the filters, oldest first, a page at a time (acting on each
    before the next page), none with an id above ``upto``."""
    after: uuid.UUID | None = None
    while True:
        page = client.list(queue=queue, state=state, type=type_, after=after, limit=BULK_PAGE)
        for job in page:
            if upto is not None and job.id > upto:
                return
            yield job
        if len(page) < BULK_PAGE:
            return
        after = page[-1].id


def _counted(args: argparse.Namespace, client: Client, state: State, verb: str) -> uuid.UUID | None:
    """Count the matching jobs and pass the guard; the last id counted (None: act on none).

    Under --dry-run, prints the count and a sample and returns None.
    """
    count = 0
    sample: list[Job] = []
    last: uuid.UUID | None = None
    for job in _matching(client, state, args.queue, args.type):
        count += 1
        last = job.id
        if len(sample) < SAMPLE:
            sample.append(job)
    what = f"{verb} {count_jobs(count)} ({_filters(state, args)})"
    if args.dry_run:
        if args.json:
            print_json({"matched": count, "sample": sample})
        else:
            say(f"would {what}; nothing changed (--dry-run)")
            if sample:
                short = DashboardReads(client.store).short_ids([j.id for j in sample])
                print_table(jobs_table(sample, output_width(), short))
                if count > len(sample):
                    say(f"... and {count - len(sample)} more")
        return None
    if count == 0:
        return None
    confirmed(args, what)
    return last


def _filters(state: State, args: argparse.Namespace) -> str:
    words = [f"state {state}"]
    if args.queue is not None:
        words.append(f"queue {args.queue}")
    if args.type is not None:
        words.append(f"type {args.type}")
    return ", ".join(words)


def _single_dry_run(args: argparse.Namespace, verb: str) -> int:
    """``--dry-run`` with one ID: the job as it stands, unchanged."""
    with open_client(args) as client:
        job = client.get(job_id(client, args.id))
    report(args, job, f"would {verb} job {job.id} (now {job.state}); nothing changed (--dry-run)")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    state = _single_or_bulk(args)
    if state is None and args.dry_run:
        return _single_dry_run(args, "cancel")
    if state is None:
        with open_client(args) as client:
            job = client.cancel(job_id(client, args.id))
        if job.state in (State.SUCCEEDED, State.DEAD):
            raise InvalidState(job.id, str(job.state), "cancel")
        outcome = "cancelled" if job.state == State.CANCELLED else _REQUESTED
        report(args, job, f"job {job.id} {outcome}")
        return EXIT_OK

    if state.terminal:
        raise CommandError(
            f"cannot cancel {state} jobs: only waiting, queued or leased jobs can be cancelled",
            EXIT_INVALID_STATE,
        )
    cancelled = requested = skipped = 0
    with open_client(args) as client:
        upto = _counted(args, client, state, "cancel")
        if upto is None:
            return _nothing(args, {"cancelled": 0, "cancel_requested": 0, "skipped": 0})
        for job in _matching(client, state, args.queue, args.type, upto):
            try:
                done = client.cancel(job.id)
            except NotFound:
                skipped += 1
                continue
            if done.state == State.CANCELLED:
                cancelled += 1
            elif done.state == State.LEASED and done.cancel_requested:
                requested += 1
            else:
                skipped += 1
    text = f"cancelled {count_jobs(cancelled + requested)}"
    if requested:
        text += f" ({requested} running: cancel requested)"
    if skipped:
        text += _LEFT_ALONE.format(skipped)
    report(args, {"cancelled": cancelled, "cancel_requested": requested, "skipped": skipped}, text)
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    state = _single_or_bulk(args)
    if state is None and args.dry_run:
        return _single_dry_run(args, "retry")
    if state is None:
        with open_client(args) as client:
            job = client.retry(job_id(client, args.id))
        report(args, job, f"job {job.id} queued to run now")
        return EXIT_OK

    if state == State.LEASED:
        raise CommandError(
            "cannot retry leased jobs: they are running (cancel them, or let the reaper "
            "requeue them when their lease expires)",
            EXIT_INVALID_STATE,
        )
    if state == State.WAITING:
        raise CommandError(
            "cannot retry waiting jobs: they run when their parents have finished",
            EXIT_INVALID_STATE,
        )
    retried = skipped = 0
    with open_client(args) as client:
        upto = _counted(args, client, state, "retry")
        if upto is None:
            return _nothing(args, {"retried": 0, "skipped": 0})
        for job in _matching(client, state, args.queue, args.type, upto):
            try:
                client.retry(job.id)
            except (NotFound, InvalidState):
                skipped += 1
            else:
                retried += 1
    text = f"retried {count_jobs(retried)}"
    if skipped:
        text += _LEFT_ALONE.format(skipped)
    report(args, {"retried": retried, "skipped": skipped}, text)
    return EXIT_OK


def _nothing(args: argparse.Namespace, value: dict[str, int]) -> int:
    """The end of a bulk action that changed nothing: a dry run (already reported), or no match."""
    if not args.dry_run:
        report(args, value, "no jobs match; nothing changed")
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    older_than = parse_duration(args.older_than, "--older-than")
    with open_client(args) as client:
        matched, oldest, newest = client.store.purgeable(older_than)
        what = f"purge {count_jobs(matched)} finished before {args.older_than.strip()} ago"
        if args.dry_run:
            value = {
                "matched": matched,
                "oldest_finished_at": oldest,
                "newest_finished_at": newest,
            }
            span = f", finished {when(oldest)} to {when(newest)}" if matched else ""
            report(args, value, f"would {what}{span}; nothing changed (--dry-run)")
            return EXIT_OK
        if matched == 0:
            report(args, {"purged": 0}, "no jobs to purge; nothing changed")
            return EXIT_OK
        confirmed(args, what)
        count = client.purge(older_than)
    report(args, {"purged": count}, f"purged {count_jobs(count)}")
    return EXIT_OK
