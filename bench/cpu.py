"""CPU time of processes from /proc (Linux): a worker's, and a local PostgreSQL's.

A drain's figure is a rate, but whether the machine was busy is a question
of CPU: the worker's processes and the server's (the postmaster and every
backend, autovacuum and checkpointer included), each as CPU seconds over the
drain's wall seconds, i.e. cores. Both readings are cumulative counters, so
a measurement takes one before and one after and divides the difference by
the wall time between them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat fields after the command name: [0] state, [1] ppid, [11] utime,
    [12] stime, [13] cutime, [14] cstime (in clock ticks)."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process so far (all its threads)."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / TICKS


def postmaster_pid(datadir: Path) -> int:
    """The postmaster's pid, from the first line of ``postmaster.pid``."""
    return int((datadir / "postmaster.pid").read_text().split()[0])


def tree_cpu_seconds(parent: int) -> float:
    """User + system CPU seconds of ``parent``, its live children and the children it
    has reaped (its cutime and cstime).

    A backend's CPU is counted while it lives (as a child) and after it exits
    (in the parent's cutime once the parent has waited for it, which the
    postmaster does at once): the sum only grows, so two readings bound the
    CPU the tree used between them, whichever backends came and went. The
    children of children are not read: a PostgreSQL server has none.
    """
    own = _stat(parent)
    total = sum(int(own[i]) for i in (11, 12, 13, 14))
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = _stat(int(entry.name))
            if int(fields[1]) == parent:
                total += int(fields[11]) + int(fields[12])
    return total / TICKS


def server_cpu_seconds(datadir: Path) -> float | None:
    """CPU seconds of the local PostgreSQL whose data directory is ``datadir`` so far
    (see :func:`tree_cpu_seconds`); None when it cannot be read (not Linux, no
    server)."""
    try:
        return tree_cpu_seconds(postmaster_pid(datadir))
    except (OSError, ValueError, IndexError):
        return None


def cores(seconds0: float | None, seconds1: float | None, wall: float) -> float | None:
    """CPU seconds between two readings per wall second (None if either is unknown)."""
    if seconds0 is None or seconds1 is None or wall <= 0:
        return None
    return (seconds1 - seconds0) / wall


def text(worker: float, server: float | None) -> str:
    """``worker 0.66 + server 0.58 cores`` (the server's part only when it was read)."""
    if server is None:
        return f"worker {worker:.2f} cores"
    return f"worker {worker:.2f} + server {server:.2f} = {worker + server:.2f} cores"
