"""The outage reporter: one voice for "the database is away", however many loops notice.

Why
---
When PostgreSQL goes away, everything in a process that talks to it fails
at once and keeps failing: the worker's claim loop, its heartbeat loop and
its completer, the scheduler's ticks, the listener's reconnects, the pools'
reconnection attempts (several a second each). Logged one by one, that is
hundreds of lines that all say the same thing and bury the only facts an
operator needs: since when, is it still so, and when did it come back.

So every one of them reports to the same :class:`Outage` for its database,
which says it in three kinds of lines (logger ``jobrun.outage``):

- one WARNING at the first failure after a success: the database is
  unavailable, and why (the first line of the error, password-free);
- while it stays so, one WARNING every :data:`SUMMARY_INTERVAL` seconds:
  for how long, how many failures of what (claim, heartbeat, connecting,
  listener, ...), the last reason;
- one INFO at the first success after that: available again, after how long
  and how many failures of what.

A success costs one attribute read while the database is available, so the
loops report every success without a thought.

One reporter per database per process (:func:`for_database`, keyed by the
password-free description of where it is), whatever the number of pools,
stores and loops pointing there; :func:`of` finds the one of a Store (its
``outage`` attribute) for code that knows only the Store port (the worker,
the scheduler). Durations are measured with ``time.monotonic`` in this
process; nothing here is compared with the database's clock.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from jobrun.job.errors import ConnectionUnavailable
from jobrun.job.redaction import redact

__all__ = ["SUMMARY_INTERVAL", "Outage", "for_database", "of"]

SUMMARY_INTERVAL = 30.0
"""Seconds between the WARNINGs that summarise an outage that goes on."""

log = logging.getLogger("jobrun.outage")


def _reason(error: BaseException | str) -> str:
    text = error if isinstance(error, str) else str(error)
    text = text.strip()
    if not text:
        return type(error).__name__ if not isinstance(error, str) else "unknown error"
    return redact(text.splitlines()[0].strip())


class Outage:
    """Whether a database is available, as the failures and successes reported say.

    ``where`` names the database in the log lines. Thread-safe; ``clock`` is
    for tests.
    """

    def __init__(
        self,
        where: str,
        *,
        interval: float = SUMMARY_INTERVAL,
        logger: logging.Logger = log,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.where = where
        self.interval = interval
        self._log = logger
        self._clock = clock
        self._lock = threading.Lock()
        self._since: float | None = None  # the first failure of the current outage
        self._summarised_at = 0.0
        self._failures = 0
        self._by_source: dict[str, int] = {}  # failures by what was tried (its first word)
        self._last = ""

    @property
    def down(self) -> bool:
        """Whether the last report was a failure."""
        return self._since is not None

    def down_for(self) -> float | None:
        """Seconds since the outage began, or None while the database is available."""
        since = self._since
        return None if since is None else max(0.0, self._clock() - since)

    def describe(self) -> str | None:
        """One line on the current outage (None while the database is available)."""
        with self._lock:
            if self._since is None:
                return None
            return (
                f"database at {self.where} unavailable for {self._clock() - self._since:.1f} s "
                f"({self._failures} failure(s); last: {self._last})"
            )

    def _counts(self) -> str:
        """``57 failures: claim 3, connecting 52, heartbeat 2`` (with the lock held)."""
        by = ", ".join(f"{name} {n}" for name, n in sorted(self._by_source.items()))
        return f"{self._failures} failures: {by}"

    def failed(self, error: BaseException | str, during: str | None = None) -> None:
        """A call or a connection attempt to the database failed with ``error``
        (``during``: what was tried, for the first line)."""
        reason = _reason(error)
        if during:
            reason = f"{during}: {reason}"
        # A call that got no connection says what this reporter already knows
        # (its message is our describe()): the connection attempts' own error
        # stays the reason given.
        keep = isinstance(error, ConnectionUnavailable)
        now = self._clock()
        source = during.split()[0] if during else "call"
        with self._lock:
            self._failures += 1
            self._by_source[source] = self._by_source.get(source, 0) + 1
            if not (keep and self._last):
                self._last = reason
            reason = self._last
            if self._since is None:
                self._since = self._summarised_at = now
                first = True
            elif now - self._summarised_at >= self.interval:
                self._summarised_at = now
                first = False
            else:
                return
            failures, lasted = self._counts(), now - self._since
        if first:
            self._log.warning(
                "database at %s unavailable: %s; retrying (a summary every %g s until it is back)",
                self.where,
                reason,
                self.interval,
            )
        else:
            self._log.warning(
                "database at %s still unavailable after %.0f s (%s; last: %s)",
                self.where,
                lasted,
                failures,
                reason,
            )

    def mark(self) -> float:
        """The time a call or connection attempt begins, for :meth:`ok`'s ``began``."""
        return self._clock()

    def ok(self, began: float | None = None) -> None:
        """A call or a connection attempt to the database succeeded.

        ``began`` (from :meth:`mark`, read before the call was made): a call
        that was already in flight when the outage was first noticed says
        nothing about the database now (it may have got its answer just before
        the server went away), so its success does not end the outage. Without
        it, a call finishing a moment after a listener's failure announced the
        database back at once, and the next failure announced the outage again.
        """
        if self._since is None:  # the common case: no lock, one read
            return
        now = self._clock()
        with self._lock:
            if self._since is None or (began is not None and began <= self._since):
                return
            lasted, failures = now - self._since, self._counts()
            self._since = None
            self._failures = 0
            self._by_source = {}
            self._last = ""
        self._log.info(
            "database at %s available again after %.1f s (%s)",
            self.where,
            lasted,
            failures,
        )


_registry: dict[str, Outage] = {}
_registry_lock = threading.Lock()


def for_database(where: str) -> Outage:
    """The process's reporter for the database ``where`` (a password-free description)."""
    with _registry_lock:
        reporter = _registry.get(where)
        if reporter is None:
            reporter = _registry[where] = Outage(where)
        return reporter


def of(store: object) -> Outage:
    """The reporter of ``store`` (its ``outage`` attribute), else the process's default one."""
    reporter = getattr(store, "outage", None)
    if isinstance(reporter, Outage):
        return reporter
    return for_database("the database")


def _after_fork_in_child() -> None:
    """New locks in a forked child: a parent thread may have held one at the fork."""
    global _registry_lock  # noqa: PLW0603 - a new object: the parent's may be held forever
    _registry_lock = threading.Lock()
    for reporter in list(_registry.values()):
        reporter._lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
