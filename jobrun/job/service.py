"""One shape for everything that holds a resource or runs in the background.

jobrun has two kinds of long-lived objects. A *resource* (a client, a lock
session, a waiter) is usable from construction and must be closed. A
*service* (the worker, the notifier, the runtime, each loop thread inside the
worker) does nothing until started and must be stopped, which waits for its
work to end. Both are used in a ``with`` block the same way everywhere, so the
protocol is written once here instead of once per class:

- :class:`Closing`: ``with resource:`` closes it on the way out;
- :class:`Service`: ``with service:`` starts it on the way in and stops it on
  the way out; ``stop()`` is idempotent and safe before ``start()``;
- :class:`LoopThread`: a service that is one named thread running a loop until
  asked to stop (the worker's claimer, completer, heartbeat, timeouts and
  stall watch, the scheduler's ticker), so that start, stop, join and "did it
  die" are written once.

Pure Python, no I/O: the domain may hold it, and every layer may use it.
"""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Self


class Closing:
    """A resource that a ``with`` block closes on the way out."""

    def close(self) -> None:
        """Release what the object holds; safe to call more than once."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Service:
    """A background service that a ``with`` block starts and stops."""

    def start(self) -> None:
        """Begin the service's work; returns once it is running."""
        raise NotImplementedError

    def stop(self) -> object:
        """End the service's work and wait for it; idempotent.

        Subclasses may take an optional timeout and report whether the work
        ended in time; the ``with`` block ignores the report.
        """
        raise NotImplementedError

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class LoopThread(Service):
    """A service that is one named daemon thread running :meth:`loop` until stopped.

    ``loop()`` returns once :attr:`stopping` is set (it waits on it, or on
    something :meth:`wake` unblocks). :meth:`request_stop` asks without
    waiting; :meth:`stop` asks and waits up to ``timeout`` seconds (None:
    until it ends), returning whether the thread ended. Not restartable.
    """

    def __init__(self, name: str) -> None:
        self.stopping = threading.Event()
        """Set when the loop is asked to end."""
        self.thread = threading.Thread(target=self.loop, name=name, daemon=True)
        self.started = False

    def loop(self) -> None:
        """The thread's work: return once :attr:`stopping` is set."""
        raise NotImplementedError

    def wake(self) -> None:
        """Unblock the loop when it waits on something other than :attr:`stopping`."""

    def start(self) -> None:
        if self.started:
            return
        self.started = True
        self.thread.start()

    def request_stop(self) -> None:
        """Ask the loop to end, without waiting for it."""
        self.stopping.set()
        self.wake()

    def stop(self, timeout: float | None = None) -> bool:
        self.request_stop()
        return self.join(timeout)

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread up to ``timeout`` seconds; whether it ended."""
        if self.started and self.thread is not threading.current_thread():
            self.thread.join(timeout)
        return not self.thread.is_alive()

    @property
    def dead(self) -> bool:
        """The thread ended while nobody asked it to (a health check's question)."""
        return self.started and not self.stopping.is_set() and not self.thread.is_alive()
