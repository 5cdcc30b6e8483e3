"""SIGTERM and SIGINT in a process that runs a Runtime, from its first line to its exit.

A worker (or scheduler) process meets a stop signal in one of three phases::

    starting ──signal──▶ Interrupted is raised in the main thread: start-up
       │                 stops where it is (a Runtime being built closes what
       │                 it opened); ``jobrun worker`` exits 128 + the signal
       ▼ Runtime.run()
    running  ──signal──▶ draining: no new claims, running jobs get the
                         shutdown grace; exit 0 once drained
                            │
                            └──second signal──▶ stopped at once: the leases of
                                jobs still running expire and they run again
                                elsewhere; exit 128 + the second signal

Without handlers of its own, a process opening its pools (which may take a
connect timeout) would be killed by SIGTERM's default action, and SIGINT's
KeyboardInterrupt could surface anywhere. So ``jobrun worker`` and ``jobrun
scheduler`` enter :class:`StopSignals` before they import the app, and
:meth:`jobrun.runtime.Runtime.run` takes the installed handlers over (it
installs a StopSignals of its own when none is). The exit codes follow the
shell's convention for a process ended by a signal (130 for Ctrl-C, 143 for
SIGTERM): the work was cut short. A graceful stop is a success, 0, whichever
signal asked for it: it is how orchestrators end a worker every day.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from jobrun.job.service import Service

__all__ = ["STOP_SIGNALS", "Interrupted", "StopSignals"]

log = logging.getLogger("jobrun")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(BaseException):
    """A stop signal came while the process was starting: it stops where it is.

    A BaseException, like KeyboardInterrupt, so that ``except Exception`` in
    the code it interrupts (the app's import, the pools' opening) lets it
    through. ``signum`` is the signal's number.
    """

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"interrupted by {signal.Signals(signum).name} while starting")


class StopSignals(Service):
    """Handlers for SIGTERM and SIGINT, installed on enter, the previous ones put back on exit.

    Until :meth:`attach`, a signal raises :class:`Interrupted`; attached, the
    first signal calls ``stop`` and every later one ``kill``, and
    :attr:`forced_by` is then the number of the signal that forced the stop.
    Off the main thread (where Python cannot install handlers) it installs
    nothing.
    """

    def __init__(self) -> None:
        self.received = 0
        """Signals received since :meth:`attach`."""
        self.forced_by: int | None = None
        """The signal that stopped at once (the second one), or None."""
        self._stop: Callable[[], None] | None = None
        self._kill: Callable[[], None] | None = None
        self._previous: dict[int, Any] = {}

    @staticmethod
    def installed() -> StopSignals | None:
        """The StopSignals whose handlers are installed now, if any."""
        owner = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
        return owner if isinstance(owner, StopSignals) else None

    def start(self) -> None:
        """Install the handlers (what entering the ``with`` block does)."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def stop(self) -> None:
        """Put the previous handlers back (what leaving the ``with`` block does)."""
        previous, self._previous = self._previous, {}
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def attach(self, stop: Callable[[], None], kill: Callable[[], None]) -> None:
        """From now on a signal calls ``stop`` (graceful), a second one ``kill`` (at once).

        Both are called in the signal handler: they must return at once.
        """
        self.received = 0
        self.forced_by = None
        self._kill = kill
        self._stop = stop

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        stop, kill = self._stop, self._kill
        if stop is None or kill is None:
            raise Interrupted(signum)
        self.received += 1
        if self.received == 1:
            log.info("signal %d: stopping gracefully (again to stop at once)", signum)
            stop()
        else:
            log.warning("second signal: stopping at once")
            self.forced_by = signum
            kill()
