"""What a command writes on stdout: tables for people, JSON for programs.

Every command prints either a line or a table (people) or, with ``--json``,
JSON: objects with stable keys, ISO-8601 UTC timestamps and UUIDs as strings;
list commands print an array. The helpers are here once so that every
command's output follows the same rules:

- Tables are plain text (no colour codes) when stdout is not a terminal, and
  as wide as the terminal, or COLUMNS when set, else unlimited in a pipe
  (:data:`PIPE_WIDTH`): ``grep`` and ``awk`` see one line per row, and no
  trailing blanks.
- Timestamps in tables are UTC to the second (:func:`when`), payloads compact
  JSON (:func:`compact`), long error texts cut with an ellipsis (:func:`cut`).
- :func:`to_json` turns jobrun's dataclasses, enums, UUIDs and datetimes into
  JSON values in one place, so ``get --json`` and ``list --json`` agree.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import io
import json
import os
import sys
import uuid
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobrun.job.model import Backoff, JSONValue

PIPE_WIDTH = 1000
"""Columns of a table when stdout is not a terminal and COLUMNS is not set: no wrapping."""
ERROR_WIDTH = 60
"""last_error is cut to this many characters in job tables."""


def to_json(value: Any) -> Any:
    """A JSON-ready copy: dataclasses as objects (field order), UTC ISO timestamps, UUID strings."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Backoff):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def print_json(value: Any) -> None:
    """``value`` as indented JSON on stdout (see :func:`to_json`)."""
    sys.stdout.write(json.dumps(to_json(value), indent=2, ensure_ascii=False) + "\n")


def say(text: str) -> None:
    """One line on stdout."""
    sys.stdout.write(text + "\n")


def report(args: argparse.Namespace, value: Any, text: str) -> None:
    """What a command did: ``value`` as JSON when asked ``--json``, else the line ``text``."""
    if args.json:
        print_json(value)
    else:
        say(text)


def output_width() -> int:
    """The columns tables fit in: the terminal's (COLUMNS first, as rich reads it).

    When stdout is not a terminal: COLUMNS when set, else :data:`PIPE_WIDTH`.
    """
    if sys.stdout.isatty():
        return console().width
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def console() -> Console:
    """Rich on stdout; plain text (no colour, no wrapping at 80 columns) when not a terminal."""
    tty = sys.stdout.isatty()
    return _console(sys.stdout, tty=tty, width=None if tty else output_width())


def _console(file: Any, *, tty: bool, width: int | None) -> Console:
    return Console(
        file=file,
        color_system="auto" if tty else None,
        force_terminal=tty,
        width=width,
        highlight=False,
        markup=False,
        emoji=False,
    )


def print_table(table: Table) -> None:
    """A table on stdout; when not a terminal, plain lines without trailing blanks."""
    if sys.stdout.isatty():
        console().print(table)
        return
    buffer = io.StringIO()
    _console(buffer, tty=False, width=output_width()).print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))


def table(*columns: str, caption: str | None = None) -> Table:
    """An empty table with these columns, borderless, two spaces between columns."""
    grid = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),  # two spaces between columns: 80 columns go further
        header_style="bold",
        caption=caption,
        caption_justify="left",
    )
    for name in columns:
        grid.add_column(name, no_wrap=name in ("id", "run_at", "at", "next_run_at"))
    return grid


def row(grid: Table, *cells: object) -> None:
    """A row of cells as plain text (never rich markup: a job type may hold brackets)."""
    grid.add_row(*(Text("" if c is None else str(c)) for c in cells))


def count_jobs(count: int) -> str:
    """``1 job``, ``3 jobs``."""
    return f"{count} job" if count == 1 else f"{count} jobs"


def when(value: dt.datetime | None) -> str:
    """A timestamp in UTC to the second, ``2026-12-01T15:20:00Z`` (empty for None)."""
    if value is None:
        return ""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def compact(value: JSONValue) -> str:
    """JSON on one line, keys sorted: a payload in a table cell."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def cut(text: str | None, width: int = ERROR_WIDTH) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"
