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

After ``fork()`` the child has no watchdog thread, and the lock may have been
held by a parent thread at the moment of the fork, so that it would never be
released in the child. Every watchdog is therefore reset in the child (a new
lock, no thread, no calls): the child starts its own thread on its first
watched call. The parent's calls are forgotten rather than carried over: a
child that shut those sockets down would cut the parent's sessions (a
shutdown acts on the socket both processes share).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import logging
import os
import socket
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from typing import Any

import psycopg

log = logging.getLogger(__name__)

_TICK = 0.25


class _SockaddrUnspec(ctypes.Structure):
    _fields_ = (("sa_family", ctypes.c_ushort), ("sa_data", ctypes.c_char * 14))


_LIBC: ctypes.CDLL | None = None
if sys.platform.startswith("linux"):
    with contextlib.suppress(OSError):
        _LIBC = ctypes.CDLL(None, use_errno=True)


def shutdown_socket(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket down under whoever is blocked on it, then abort it.

    ``shutdown()`` wakes the blocked call, but leaves a request already sent
    into a dead link in the kernel's send queue, and TCP delivers it when the
    link heals, seconds after the caller was told the call failed: a claim
    that arrives then leases jobs to a worker that gave up on it. Connecting
    the socket to ``AF_UNSPEC`` (Linux) resets it and drops that queue, so a
    call given up on never happens later. (Bytes already on the wire may still
    arrive; the worker adopts such claims, see jobrun.worker.)
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return  # already closed
    # fromfd duplicates the descriptor; shutdown() acts on the shared socket,
    # so a thread blocked on the original sees EOF and libpq fails the call.
    # The abort goes through our duplicate too: libpq closes its own
    # descriptor as soon as the shutdown wakes it.
    with contextlib.suppress(OSError), socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as s:
        s.shutdown(socket.SHUT_RDWR)
        if _LIBC is not None and s.getsockopt(socket.SOL_SOCKET, socket.SO_DOMAIN) in (
            socket.AF_INET,
            socket.AF_INET6,
        ):
            unspec = _SockaddrUnspec(socket.AF_UNSPEC)
            _LIBC.connect(s.fileno(), ctypes.byref(unspec), ctypes.sizeof(unspec))


class CallWatchdog:
    """Shuts down the connection of any watched call that outlives its deadline."""

    def __init__(self) -> None:
        self._reset()
        self.fired = 0
        _WATCHDOGS.add(self)

    def _reset(self) -> None:
        """Start empty: at construction, and in a forked child (see the module docs)."""
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[float, psycopg.Connection[Any], float]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

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


_WATCHDOGS: weakref.WeakSet[CallWatchdog] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for watchdog in list(_WATCHDOGS):
        watchdog._reset()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


WATCHDOG = CallWatchdog()
"""The process-wide watchdog every Store uses."""
