"""How the worker words what it logs and stores: durations, times, exceptions.

One place, so that a job's ``last_error``, its log line and the start banner
say a duration or an error the same way.
"""

from __future__ import annotations

import datetime as dt
import traceback
from pathlib import Path

from jobrun.job import validate


def ms(seconds: float) -> str:
    """A handler's run time as people read it: 0.4 ms, 12 ms, 3.2 s."""
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 10_000:
        return f"{ms:.0f} ms"
    return f"{seconds:.1f} s"


def seconds(seconds: float) -> str:
    """A wait as people read it: 2.0 s, 4 min, 1.5 h."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def iso(when: dt.datetime) -> str:
    """A database time in ISO 8601 UTC (``Z``), to the millisecond."""
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_JOBRUN_DIR = str(Path(__file__).resolve().parents[1])  # jobrun/
TRACEBACK_FRAMES = 8
"""Frames kept of a failed job's traceback (the innermost): last_error is capped anyway."""


def describe(exc: BaseException, *, with_traceback: bool = False) -> str:
    """An exception as logged and stored, without any password it quotes."""
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback:
        text = f"{text}\n{user_traceback(exc)}"
    return validate.redact(text)


def user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame that is not jobrun's own.

    The worker's frames that called the handler (or the store's that called a
    commit callable) say nothing to the reader of a job's last_error; frames
    of jobrun's below the user's code (a jobrun call that failed) are kept.
    """
    summary = traceback.TracebackException.from_exception(exc)
    frames = list(summary.stack)
    while len(frames) > 1 and frames[0].filename.startswith(_JOBRUN_DIR):
        frames.pop(0)
    summary.stack = traceback.StackSummary.from_list(frames[-TRACEBACK_FRAMES:])
    return "".join(summary.format())
