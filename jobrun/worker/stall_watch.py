"""The stall watch: says so when one of the worker's loops is stuck.

A loop (claimer, completer, heartbeat, the async handlers' event loop, the
notification listener) that hangs on one step (a half-open connection, a
coroutine that blocks the loop) looks, from outside, like a worker that is
merely quiet. Each loop marks the step it is on (:class:`Activity`: plain
attribute writes, no lock); this thread warns when one step lasts longer
than the bound, naming the loop, what it does and the frames it is blocked
in, once per bound while it stays stuck, then says when it moves again.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

from jobrun.job import outage
from jobrun.job.service import LoopThread


class Activity:
    """What one loop is doing, for the stall watch.

    ``busy(what)`` when a step starts (a step must end within the stall
    bound), ``idle()`` while the loop waits for work (never a stall). Plain
    attribute writes: the loop pays no lock.
    """

    __slots__ = ("ident", "name", "since", "what")

    def __init__(self, name: str) -> None:
        self.name = name
        self.what = "starting"
        self.since: float | None = None
        self.ident: int | None = None

    def busy(self, what: str) -> None:
        self.what = what
        self.since = time.monotonic()
        self.ident = threading.get_ident()

    def idle(self) -> None:
        self.since = None


ActivityProbe = Callable[[], tuple[str, float | None, int | None]]
"""An outside loop's state: (what it does, busy since (monotonic) or None, thread ident)."""


class StallWatch(LoopThread):
    """Logs a WARNING when a loop has been busy on one step longer than ``bound``.

    The warning names the loop, what it is doing and the innermost frames of
    its thread (what it is blocked on); it repeats every ``bound`` while the
    loop stays stuck, and an INFO line says when it moves again. Not while
    the database is known to be away (``reporter``): the loops then wait for
    it, and the outage reporter says so.
    """

    def __init__(
        self,
        bound: float,
        logger: logging.LoggerAdapter[logging.Logger],
        reporter: outage.Outage | None = None,
    ) -> None:
        super().__init__("jobrun-stall-watch")
        self.bound = bound
        self._log = logger
        self._outage = reporter
        self._activities: list[Activity] = []
        self._probes: list[tuple[str, ActivityProbe]] = []
        self._stuck: dict[str, tuple[float, float]] = {}  # name -> (busy since, next warning)

    def track(self, name: str) -> Activity:
        activity = Activity(name)
        self._activities.append(activity)
        return activity

    def track_probe(self, name: str, probe: ActivityProbe) -> None:
        self._probes.append((name, probe))

    def stalled(self) -> dict[str, float]:
        """The loops stuck right now: name -> seconds busy on the current step."""
        now = time.monotonic()
        return {
            name: now - since
            for name, (what, since, _) in self._states()
            if since is not None and now - since >= self.bound
        }

    def _states(self) -> list[tuple[str, tuple[str, float | None, int | None]]]:
        states = [(a.name, (a.what, a.since, a.ident)) for a in self._activities]
        for name, probe in self._probes:
            try:
                states.append((name, probe()))
            except Exception:  # a broken probe must not kill the watch
                self._log.debug("activity probe of %s failed", name, exc_info=True)
        return states

    def loop(self) -> None:
        tick = min(1.0, max(self.bound / 4, 0.05))
        while not self.stopping.wait(tick):
            self.check()

    def check(self) -> None:
        now = time.monotonic()
        for name, (what, since, ident) in self._states():
            stuck = self._stuck.get(name)
            if stuck is not None and since != stuck[0]:
                del self._stuck[name]
                self._log.info("%s is moving again after %.1f s on one step", name, now - stuck[0])
                stuck = None
            if since is None or now - since < self.bound:
                continue
            if stuck is not None and now < stuck[1]:
                continue
            if self._outage is not None and self._outage.down:
                continue
            self._stuck[name] = (since, now + self.bound)
            self._log.warning(
                "%s has been stuck for %.1f s (bound %g s) %s; blocked in: %s",
                name,
                now - since,
                self.bound,
                what,
                where(ident),
            )


def where(ident: int | None, depth: int = 8) -> str:
    """The innermost frames of thread ``ident``, innermost first."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "(thread not running)"
    stack = traceback.extract_stack(frame)[-depth:]
    return " <- ".join(
        f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(stack)
    )
