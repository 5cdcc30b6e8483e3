"""How a job looks on a terminal: the one-line-per-job table, one job's details, its events.

``jobrun list`` keeps one line per job at any width, with its id first
(what ``jobrun get`` takes, so it is never cut: the full id when the whole
row fits, else its short id, a unique prefix): queue, type, state and
attempts always come next (a leased job reads ``cancelling`` once its
cancel was asked, ``waiting`` while a worker holds it claimed ahead of its
free threads, not started: :func:`state_word`), queue and type cut with an ellipsis when the
names are long, then last_error (cut with an ellipsis; at 80 columns it
keeps its column) and run_at when they fit (:func:`jobs_table`). A pipe
without COLUMNS is wide enough for all of them, full ids included.

``jobrun get`` shows every field people ask about, including the result (a
handler's return value), and the concurrency key, snoozes, releases and progress when
the job has them (:func:`job_details`). ``jobrun events`` says each event's
detail in words, one line each (:func:`event_lines`).

These are for people; ``--json`` prints the jobs themselves
(:func:`jobrun.cli.output.to_json`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence

from rich.table import Table
from rich.text import Text

from jobrun.job.model import Event, Job, JSONValue, State

from .output import compact, cut, when

JOB_COLUMNS = ("id", "queue", "type", "state", "attempts", "run_at", "last_error")
_REQUIRED_JOB_COLUMNS = 5
"""id, queue, type, state and attempts are always shown; run_at and last_error when they fit."""
_MIN_NAME_WIDTH = 8
"""queue and type are cut (with an ellipsis) to no fewer columns than this."""
_MIN_ERROR_WIDTH = 12
_ERROR_BESIDE_RUN_AT = 30
"""run_at is shown beside last_error only when the error keeps this much room (or all of it)."""


def jobs_table(
    jobs: Sequence[Job], width: int, short: Mapping[uuid.UUID, str] | None = None
) -> Table:
    """One line per job within ``width`` columns, its id first (what ``jobrun get`` takes).

    The full ids when every column fits at its natural width, else each job's
    short id from ``short`` (a unique prefix, see :meth:`DashboardReads.short_ids`).
    queue, type, state and attempts always come next (queue and type cut with
    an ellipsis when the names are long); then last_error, which is what a
    person reads a list of failed jobs for, before run_at, each when room is left.
    """
    rows = [_job_row(job, str(job.id)) for job in jobs]
    if short and _natural_width(rows) > width:
        rows = [_job_row(job, short.get(job.id, str(job.id))) for job in jobs]
    gap = 2
    headers = list(JOB_COLUMNS)
    widths = [max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(headers)]
    shown = list(range(_REQUIRED_JOB_COLUMNS))

    def used(extra: Sequence[int] = ()) -> int:
        columns = [*shown, *extra]
        return sum(widths[i] for i in columns) + gap * (len(columns) - 1)

    queue, type_, attempts, run_at, last_error = 1, 2, 4, 5, 6
    errors = any(row[last_error] for row in rows)
    if used() > width:  # first a shorter header: the counts are narrower than "attempts"
        headers[attempts] = "tries"
        widths[attempts] = max([len("tries"), *(len(row[attempts]) for row in rows)])

    def fits(room: int) -> bool:
        return used() + gap + room <= width

    # Cut the longer of queue and type, a column at a time, until the required columns fit.
    while used() > width:
        longer = queue if widths[queue] >= widths[type_] else type_
        if widths[longer] <= _MIN_NAME_WIDTH:
            break  # a terminal this narrow wraps whatever is shown
        widths[longer] -= 1
    error_width = 0
    if errors:
        # run_at too when the error keeps enough of itself beside it, else the error alone
        beside = width - used() - gap - widths[run_at] - gap
        if beside >= min(widths[last_error], _ERROR_BESIDE_RUN_AT):
            shown.append(run_at)
            error_width = min(widths[last_error], beside)
        elif fits(_MIN_ERROR_WIDTH):
            error_width = min(widths[last_error], width - used() - gap)
    elif fits(widths[run_at]):
        shown.append(run_at)
    if error_width:
        widths[last_error] = error_width
        shown.append(last_error)

    table = Table(
        box=None, show_edge=False, pad_edge=False, padding=(0, gap // 2), header_style="bold"
    )
    for i in shown:
        table.add_column(headers[i], width=widths[i], no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown))
    return table


def _job_row(job: Job, ident: str) -> tuple[str, ...]:
    return (
        ident,
        job.queue,
        job.type,
        state_word(job),
        f"{job.attempts}/{job.max_attempts}",
        when(job.run_at),
        cut(job.last_error),
    )


def _natural_width(rows: Sequence[tuple[str, ...]]) -> int:
    """The columns every field of ``rows`` takes uncut, with the gaps between them."""
    widths = [
        max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(JOB_COLUMNS)
    ]
    if not any(row[-1] for row in rows):
        widths.pop()
    return sum(widths) + 2 * (len(widths) - 1)


def state_word(job: Job) -> str:
    """A job's state in one word for the list: a leased job is ``cancelling`` once
    its cancel was asked, ``claimed`` while not started (claimed ahead of a
    worker's free threads, its attempt not counted yet; not ``waiting``, the
    state of a job waiting for its parents), else ``leased``."""
    if job.state != State.LEASED:
        return str(job.state)
    if job.cancel_requested:
        return "cancelling"
    return "leased" if job.started else "claimed"


def state_text(job: Job) -> str:
    """A job's state for ``jobrun get``: a leased job says whether it started."""
    if job.state == State.LEASED and not job.started:
        return "leased, waiting for a thread (claimed ahead, not started)"
    return str(job.state)


def job_details(job: Job) -> Table:
    """One job, a field a line: ``jobrun get``."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    b = job.backoff
    rows: list[tuple[str, object]] = [
        ("id", job.id),
        ("queue", job.queue),
        ("type", job.type),
        ("state", state_text(job)),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        *([("snoozes", job.snoozes)] if job.snoozes else []),
        *([("releases", job.releases)] if job.releases else []),
        *([("progress", progress_text(job))] if job.progress is not None else []),
        ("priority", job.priority),
        ("payload", compact(job.payload)),
        ("result", "" if job.result is None else compact(job.result)),
        ("run_at", when(job.run_at)),
        ("idempotency_key", job.idempotency_key or ""),
        *([("concurrency_key", job.concurrency_key)] if job.concurrency_key is not None else []),
        ("cancel_requested", "yes" if job.cancel_requested else "no"),
        *([("started_at", when(job.started_at))] if job.state == State.LEASED else []),
        ("lease_owner", job.lease_owner or ""),
        ("lease_expires_at", when(job.lease_expires_at)),
        ("last_error", job.last_error or ""),
        ("backoff", f"{b.kind} base={b.base}s factor={b.factor} max={b.max_delay}s"),
        ("created_at", when(job.created_at)),
        ("updated_at", when(job.updated_at)),
        ("finished_at", when(job.finished_at)),
    ]
    for key, value in rows:
        grid.add_row(Text(key), Text(str(value)))
    return grid


def percent(fraction: float) -> str:
    """A fraction done as people read it: 40%, 99.9% (never 100% before it is 1)."""
    tenths = math.floor(fraction * 1000 + 1e-9)
    return f"{tenths // 10}%" if tenths % 10 == 0 else f"{tenths / 10:.1f}%"


def progress_text(job: Job) -> str:
    """``40% at 2026-12-01T15:20:00Z: chunk 4 of 10`` (empty without progress)."""
    if job.progress is None:
        return ""
    text = percent(job.progress)
    if job.progress_at is not None:
        text += f" at {when(job.progress_at)}"
    if job.progress_message:
        text += f": {' '.join(job.progress_message.split())}"
    return text


def event_lines(events: Sequence[Event], width: int) -> list[str]:
    """One line per event: time, kind, attempt, and the detail in words, cut to ``width``."""
    kinds = max(len(str(e.kind)) for e in events)
    attempts = max(len(f"attempt {e.attempt}") for e in events)
    lines = []
    for e in events:
        attempt = f"attempt {e.attempt}" if e.attempt else ""
        line = f"{when(e.at)}  {e.kind!s:<{kinds}}  {attempt:<{attempts}}  {_summary(e.detail)}"
        line = line.rstrip()
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def _summary(detail: JSONValue) -> str:
    """An event's detail in words: ``effect=applied``, ``permanent error: boom``."""
    if detail in (None, {}, []):
        return ""
    if not isinstance(detail, dict):
        return compact(detail)
    words = []
    for key, value in sorted(detail.items()):
        if key == "error" or value is False or value is None:
            continue
        words.append(key if value is True else f"{key}={_word(value)}")
    if detail.get("error"):
        words.append(f"error: {_word(detail['error'])}")
    return " ".join(words)


def _word(value: JSONValue) -> str:
    return " ".join(value.split()) if isinstance(value, str) else compact(value)
