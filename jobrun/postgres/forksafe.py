"""Fork safety: a pool made before a fork is never used after it in the child.

Why
---
A process that opens a pool and then forks (gunicorn ``--preload``, uwsgi,
``multiprocessing`` with the fork start method, a handler that forks) gives
the child copies of the pool's sockets. Parent and child then write queries
into the same server sessions and read each other's answers: measured,
thousands of wrong results in both processes, plus
``DuplicatePreparedStatement`` and ``InternalError``. Silent corruption, so
the rule is absolute: **after a fork the child never writes to or reads from
a connection it inherited**, and never closes one in a way that talks to the
server (closing sends a Terminate message on the shared socket, which ends
the *parent's* session).

The decision
------------
Pools from :func:`jobrun.postgres.pool.open_pool` are :class:`ForkSafePool`
and **reopen themselves in the child**: same conninfo, connection kwargs,
sizes, timeouts and configure callback, with connections of the child's own,
made on first use. The pool object stays the same (the Store, the client and
the runtime keep their references); only its insides are new. A pool the
user built themselves (a plain ``psycopg_pool.ConnectionPool`` handed to a
Store) cannot be rebuilt faithfully from outside, so the Store refuses it in
the child with :class:`~jobrun.job.errors.InheritedPool`, which says what to
do instead. Either way the parent keeps working, untouched.

How the child lets go of the parent's connections
-------------------------------------------------
Right after the fork, in the child (``os.register_at_fork``, when the child
has a single thread), every connection jobrun knows of (each pool connection
is tracked when it is made or first checked out) is **severed**: a
``/dev/null`` descriptor is ``dup2``'d over its socket's descriptor. The
child's copy of the socket is thereby closed, without a byte sent and
without touching the parent's copy; libpq still believes it owns the
descriptor, so anything it later writes there (a Terminate from a close, a
query from a stray reference) goes nowhere, and a read sees end-of-file, an
immediate connection error. The descriptor number stays reserved for libpq,
so a close in the child can never close an unrelated file that reused it.
Nothing in libpq's own memory is touched: another parent thread may have
been inside a libpq call on that connection when the fork happened.

Then the inherited pool state is abandoned, never closed: psycopg_pool's
locks may have been held by parent threads at the fork and its worker
threads do not exist in the child. A :class:`ForkSafePool` reruns its
constructor in place (fresh locks, queues, counters, no threads) and opens
on first use; a plain pool is marked closed, so neither its ``close()`` nor
its garbage collection waits on a lock or a thread of the parent. The cost
is one ``/dev/null`` descriptor per inherited connection, held until the
child exits.

Besides the hook, each checkout compares ``os.getpid()`` with the pool's
owner (a syscall, well under a microsecond), so that even a fork that ran
no Python at-fork hooks cannot hand the child a parent's connection.

Dedicated connections
---------------------
The AdvisoryLocker tracks its session, so a child's unlock or close cannot
end the parent's leadership term (without this, a child's ``release()``
unlocked the parent's lock and the child then took it); the child's next
try reconnects on a session of its own. The Notifier's listener connection
is used only by the listener thread, which a child does not have, and is
closed only by that thread; it is not tracked yet (one ``track(conn)`` after
its connect would do it), so a child keeps its descriptor open, unused.

Not covered: a connection being opened by a pool worker at the very moment
of the fork is not tracked yet; its descriptor stays open in the child,
unused (harmless, except that the server ends that session only once both
processes have closed it). Locks of the Locker and the Notifier themselves
are not reset: a child that calls into one a parent thread was inside at
the fork can block.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import weakref
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from jobrun.job.errors import InheritedPool
from jobrun.postgres.reconnect import ReconnectingPool

_OWNER = "_jobrun_owner_pid"
"""The attribute naming the process a tracked connection or guarded pool belongs to."""
_ANOTHER_PROCESS = 0
"""The owner of a pool found inherited without knowing from whom (never a real pid)."""

_tracked: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
_pools: weakref.WeakSet[ConnectionPool[Any]] = weakref.WeakSet()
_lock = threading.Lock()
"""Serialises a child's lazy reopen; replaced in every child (a parent thread may hold it)."""


def track(conn: psycopg.Connection[Any]) -> None:
    """Make ``conn`` one that a forked child severs; cheap when already tracked.

    Also for dedicated connections (listener, leader lock): once tracked, a
    child that inherits them cannot talk on the parent's session.
    """
    pid = os.getpid()
    if getattr(conn, _OWNER, None) == pid:
        return
    setattr(conn, _OWNER, pid)
    _tracked.add(conn)


def inherited(conn: psycopg.Connection[Any]) -> bool:
    """Whether ``conn`` was tracked in another process, i.e. came through a fork."""
    owner = getattr(conn, _OWNER, None)
    return owner is not None and owner != os.getpid()


def sever(conn: psycopg.Connection[Any]) -> bool:
    """Detach this process's copy of ``conn``'s socket, silently (see the module docs).

    True when the connection can no longer reach the server from here (it
    had no socket, was severed before, or is severed now).
    """
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:
        return True  # finished or dropped by libpq: no descriptor to share
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            return True  # already /dev/null
        devnull = os.open(os.devnull, os.O_RDWR)
    except OSError:
        return False
    try:
        os.dup2(devnull, fd, inheritable=False)
    except OSError:
        return False
    finally:
        os.close(devnull)
    return True


def check_pool(pool: ConnectionPool[Any]) -> None:
    """Refuse a pool that belongs to another process (the Store calls this per checkout).

    A :class:`ForkSafePool` reopens itself instead. A plain pool is adopted
    by the process that first checks it out, unless it is visibly inherited:
    open, while its scheduler thread (which a fork does not copy) is dead.
    """
    if isinstance(pool, ForkSafePool):
        return
    pid = os.getpid()
    owner = getattr(pool, _OWNER, None)
    if owner == pid:
        return
    if owner is None:
        if not _looks_inherited(pool):
            setattr(pool, _OWNER, pid)
            _pools.add(pool)
            return
        _disown(pool)  # what the at-fork hook does for pools it knew of
        setattr(pool, _OWNER, _ANOTHER_PROCESS)
    raise InheritedPool(owner or None, pid)


def _disown(pool: ConnectionPool[Any]) -> None:
    """Sever an inherited plain pool's idle connections and mark it closed, in the child.

    Its close() and __del__ would otherwise wait on the parent's locks and
    threads, and close the parent's sessions; closed, they return at once.
    """
    for conn in list(getattr(pool, "_pool", ())):
        sever(conn)
    if hasattr(pool, "_closed"):
        pool._closed = True


def _looks_inherited(pool: ConnectionPool[Any]) -> bool:
    runner = getattr(pool, "_sched_runner", None)
    return not pool.closed and isinstance(runner, threading.Thread) and not runner.is_alive()


class ForkSafePool(ReconnectingPool):
    """A ConnectionPool that reopens itself in a forked child (see the module docs).

    Takes ConnectionPool's arguments. In the parent it behaves exactly like
    one (a :class:`~jobrun.postgres.reconnect.ReconnectingPool`); in a child
    it never hands out, returns to itself, or closes a connection of the parent.
    """

    def __init__(self, conninfo: str, **options: Any) -> None:
        configure = options.pop("configure", None)
        options["configure"] = _bind_configure(configure)
        self._ctor_options = dict(options)
        self._owner = os.getpid()
        self._reopen_on_use = False
        super().__init__(conninfo, **options)
        setattr(self, _OWNER, self._owner)
        _pools.add(self)

    # -- the child side -----------------------------------------------------------

    def _forget_parent(self) -> None:
        """Sever the inherited connections and start over with empty insides.

        Runs in the child with no other thread (the at-fork hook), or under
        the process lock (a checkout that found no hook had run).
        """
        for conn in list(getattr(self, "_pool", ())):
            sever(conn)
        # Still to be reopened (forked again before its first use) counts as open.
        was_open = not self.closed or self._reopen_on_use
        options = dict(self._ctor_options)
        # What may have changed since construction (resize(), attributes).
        options.update(
            kwargs=self.kwargs,
            connection_class=self.connection_class,
            min_size=self.min_size,
            max_size=self.max_size,
            name=self.name,
            close_returns=self.close_returns,
            timeout=self.timeout,
            max_waiting=self.max_waiting,
            max_lifetime=self.max_lifetime,
            max_idle=self.max_idle,
            reconnect_timeout=self.reconnect_timeout,
            num_workers=self.num_workers,
            open=False,
        )
        ConnectionPool.__init__(self, self.conninfo, **options)
        self._reopen_on_use = was_open
        self._owner = os.getpid()
        setattr(self, _OWNER, self._owner)

    def _adopt(self, *, reopen: bool) -> None:
        """Make the pool this process's own; open it when it was open (and ``reopen``)."""
        with _lock:
            if self._owner != os.getpid():
                self._forget_parent()
            if self._reopen_on_use:
                if reopen:
                    super().open()
                # Cleared last: until the pool is open, other threads wait here.
                self._reopen_on_use = False

    def _in_child(self) -> bool:
        return self._reopen_on_use or self._owner != os.getpid()

    # -- ConnectionPool's entry points ------------------------------------------

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        if self._in_child():
            self._adopt(reopen=True)
        return super().getconn(timeout)

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        if inherited(conn):
            # Checked out before the fork and returned in the child (a fork
            # inside a ``with pool.connection()``): never the child's to reuse.
            if sever(conn):
                with contextlib.suppress(Exception):
                    conn.close()  # after severing, PQfinish writes only to /dev/null
            return
        super().putconn(conn)

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        if self._in_child():
            self._adopt(reopen=False)
        super().open(wait=wait, timeout=timeout)

    def wait(self, timeout: float = 30.0) -> None:
        if self._in_child():
            self._adopt(reopen=True)
        super().wait(timeout)

    def check(self) -> None:
        if self._in_child():
            self._adopt(reopen=True)
        super().check()

    def close(self, timeout: float = 5.0) -> None:
        if self._in_child():
            self._adopt(reopen=False)  # the parent's insides are dropped, not closed
        super().close(timeout)


def _bind_configure(
    configure: Callable[[psycopg.Connection[Any]], None] | None,
) -> Callable[[psycopg.Connection[Any]], None]:
    def configure_tracked(conn: psycopg.Connection[Any]) -> None:
        track(conn)
        if configure is not None:
            configure(conn)

    return configure_tracked


def _after_fork_in_child() -> None:
    """Sever every inherited connection and abandon every inherited pool state.

    Runs in the new child while it has a single thread; must never raise or
    block (an exception here is printed and ignored by Python).
    """
    global _lock  # noqa: PLW0603 - a new object: the parent's may be held forever
    _lock = threading.Lock()
    for conn in list(_tracked):
        with contextlib.suppress(Exception):
            sever(conn)
    _tracked.clear()
    for pool in list(_pools):
        try:
            if isinstance(pool, ForkSafePool):
                pool._forget_parent()
                continue
            _disown(pool)
        except Exception:  # noqa: BLE001, S112 - the checkout path retries or refuses
            continue


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = ["ForkSafePool", "check_pool", "inherited", "sever", "track"]
