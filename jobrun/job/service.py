"""One shape for everything that holds a resource or runs in the background.

jobrun has two kinds of long-lived objects. A *resource* (a client, a lock
session, a waiter) is usable from construction and must be closed. A
*service* (the worker, the notifier, the runtime, each loop thread inside the
worker) does nothing until started and must be stopped, which waits for its
work to end. Both are used in a ``with`` block the same way everywhere, so the
protocol is written once here instead of once per class:

- :class:`Closing`: ``with resource:`` closes it on the way out;
- :class:`Service`: ``with service:`` starts it on the way in and stops it on
  the way out; ``stop()`` is idempotent and safe before ``start()``.

Pure Python, no I/O: the domain may hold it, and every layer may use it.
"""

from __future__ import annotations

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
