"""Client-side deadlines for calls on pooled connections.

``statement_timeout`` is enforced by the server, so it cannot help when the
server never sees the query or its answer never arrives: a half-open
network, a stalled middlebox, a frozen server process whose kernel still
acknowledges packets. TCP keepalives and ``tcp_user_timeout`` (set on every
connection, see :mod:`jobrun.postgres.pool`) cover a dead link at the kernel
level; this covers the rest.

One daemon thread watches every call in flight. A call still running past its
deadline has its socket shut down: the blocked psycopg call fails at once,
the connection is broken (the pool drops it) and the store reports a
connection fault, so no worker thread can hang forever. Registering a call is
a dict insert under a lock; the thread wakes every quarter second.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg

log = logging.getLogger(__name__)

_TICK = 0.25


def shutdown_socket(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down under whoever is blocked on it."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    # fromfd duplicates the descriptor; shutdown() acts on the shared socket,
    # so a thread blocked on the original sees EOF and libpq fails the call.
    with contextlib.suppress(OSError), socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
        s.shutdown(socket.SHUT_RDWR)


class CallWatchdog:
    """Shuts down the connection of any watched call that outlives its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[float, psycopg.Connection[Any], float]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self.fired = 0

    @contextlib.contextmanager
    def watch(self, conn: psycopg.Connection[Any], seconds: float | None) -> Iterator[None]:
        """Bound the block's use of ``conn`` by ``seconds`` (None: not watched)."""
        if seconds is None:
            yield
            return
        call = next(self._ids)
        with self._lock:
            self._calls[call] = (time.monotonic() + seconds, conn, seconds)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="jobrun-call-watchdog", daemon=True
                )
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(call, None)

    def _run(self) -> None:
        while True:
            time.sleep(_TICK)
            now = time.monotonic()
            with self._lock:
                late = [
                    (call, conn, seconds)
                    for call, (deadline, conn, seconds) in self._calls.items()
                    if deadline <= now
                ]
                for call, _, _ in late:
                    del self._calls[call]
            for _, conn, seconds in late:
                self.fired += 1
                log.warning(
                    "no answer from PostgreSQL within %g s: dropping the connection", seconds
                )
                shutdown_socket(conn)


WATCHDOG = CallWatchdog()
"""The process-wide watchdog every Store uses."""
