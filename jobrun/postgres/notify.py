"""Wake-ups for idle workers over LISTEN/NOTIFY: the :class:`Notifier` (a ``Dispatcher``).

The store sends ``pg_notify(channel, queue)`` in the same transaction as the
row it announces, so a notification arrives only at COMMIT (a rolled-back
enqueue wakes no one). One **dedicated listener connection** (never pooled:
a pool would recycle it and lose the LISTEN) and a daemon thread
(``jobrun-listener``) turn notifications into wake-ups.

A worker registers its queues once (:meth:`Notifier.subscribe`) and gets a
:class:`Waiter`, a **one-slot channel**: notifications coalesce (a burst of
10,000 costs one wake-up), and one that arrives while the worker is busy
stays in the slot until its next ``wait``, so it is never lost. A delayed
job's enqueue sends ``<queue>@<ms>`` (the milliseconds until its run_at, by
the database clock); its waiters end their wait then, on this process's
monotonic clock, and keep the :data:`MAX_DUE_TIMES` soonest due times.

Notifications are hints: workers poll as well, and a payload is only ever
compared with the queue names registered (anything else is counted and
ignored). Any error while connecting or listening is a connection fault:
close, back off with jitter, reconnect and LISTEN again, then wake every
waiter once (notifications sent during the gap are lost). A half-open
network is found by a probe every ``liveness_interval``, bounded
client-side by ``probe_timeout`` (:func:`~jobrun.postgres.session.interrupt_after`).
``Notifier(..., enabled=False)`` or :class:`NullDispatcher` opens no
connection, and everything works by polling (as behind a transaction pooler,
where LISTEN does not stick).
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import logging
import math
import re
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import psycopg
from psycopg import sql

from jobrun.job import outage, validate
from jobrun.job.errors import ValidationError
from jobrun.job.service import Closing, Service
from jobrun.job.validate import redact
from jobrun.postgres import forksafe
from jobrun.postgres.pool import conninfo_with, describe
from jobrun.postgres.session import (
    DEFAULT_CHANNEL,
    ProbeTimeout,
    backoff_delay,
    check_seconds,
    configure_session,
    interrupt_after,
    validate_channel,
)

log = logging.getLogger(__name__)

DEFAULT_LIVENESS_INTERVAL = 5.0
DEFAULT_PROBE_TIMEOUT = 5.0
DEFAULT_BACKOFF_INITIAL = 0.1
DEFAULT_BACKOFF_MAX = 1.0
"""Seconds, at most, between two reconnects (jittered down to half): the listener
comes back within a second of the server, however long it was away."""

_TICK = 0.5
"""Longest the listener thread blocks before looking at its stop flag."""

MAX_DUE_TIMES = 1024
"""How many due times of delayed jobs a waiter keeps (the soonest)."""

DELAYED_PAYLOAD = re.compile(rf"({validate.QUEUE_NAME_PATTERN.pattern})@([0-9]{{1,15}})")
"""A delayed job's notification: ``<queue>@<milliseconds until it is due>``."""


# -- waiters ------------------------------------------------------------------


class Waiter(Closing):
    """A one-slot wake-up channel for a fixed set of queues (see the module docs).

    Created by :meth:`Notifier.subscribe`; keep it for the life of the worker
    loop and call :meth:`wait` between claims. Closing it (or dropping the last
    reference) unsubscribes.
    """

    def __init__(self, hub: _Hub, queues: frozenset[str]) -> None:
        self.queues = queues
        self._cond = threading.Condition(threading.Lock())
        self._slot = False
        self._due: list[float] = []
        """Due times of delayed jobs (``time.monotonic()``, on a 1 ms grid), sorted."""
        self._hub: _Hub | None = hub
        self.wakeups = 0
        """How many times :meth:`wait` returned True."""

    def wait(self, timeout: float) -> bool:
        """Block until a notification for one of :attr:`queues` (or a reconnect)
        arrived since the previous ``wait`` returned, a delayed job announced to
        this waiter is due, or ``timeout`` seconds pass.

        True when woken (the slot and the due times passed are consumed),
        False on timeout.
        """
        seconds = check_seconds(timeout, "timeout", allow_zero=True)
        end = time.monotonic() + seconds
        with self._cond:
            while True:
                now = time.monotonic()
                if self._slot or (self._due and self._due[0] <= now):
                    self._slot = False
                    del self._due[: bisect.bisect_right(self._due, now)]
                    self.wakeups += 1
                    return True
                left = end - now
                if left <= 0:
                    return False
                if self._due:
                    left = min(left, self._due[0] - now)
                self._cond.wait(left)

    def pending(self) -> bool:
        """Whether a wake-up is waiting (without consuming it)."""
        with self._cond:
            return self._slot or bool(self._due and self._due[0] <= time.monotonic())

    def wake(self) -> None:
        """Set the slot (idempotent: wake-ups coalesce)."""
        with self._cond:
            self._slot = True
            self._cond.notify_all()

    def wake_at(self, when: float) -> None:
        """Wake at ``when`` (a ``time.monotonic()`` reading): a delayed job is due then.

        Rounded up to the millisecond, so that a burst of such jobs costs at
        most one entry per millisecond; only the :data:`MAX_DUE_TIMES`
        soonest are kept.
        """
        at = math.ceil(when * 1000) / 1000
        with self._cond:
            i = bisect.bisect_left(self._due, at)
            if i >= MAX_DUE_TIMES or (i < len(self._due) and self._due[i] == at):
                return
            self._due.insert(i, at)
            del self._due[MAX_DUE_TIMES:]
            if i == 0:
                self._cond.notify_all()  # a wait in progress ends sooner

    def close(self) -> None:
        """Unsubscribe; safe to call twice. ``wait`` then only sleeps."""
        hub, self._hub = self._hub, None
        if hub is not None:
            hub._unsubscribe(self)


class _Hub:
    """The waiter registry shared by :class:`Notifier` and :class:`NullDispatcher`."""

    def __init__(self) -> None:
        self._waiters_lock = threading.Lock()
        # Weak: a waiter whose worker thread is gone (the per-thread cache of
        # the port's ``wait``) unsubscribes itself by being collected.
        self._waiters: weakref.WeakSet[Waiter] = weakref.WeakSet()
        self._local = threading.local()

    def subscribe(self, queues: Iterable[str]) -> Waiter:
        """A :class:`Waiter` for ``queues`` (valid queue names, at least one)."""
        if isinstance(queues, str):
            raise ValidationError("queues", "must be a sequence of queue names, not a str")
        names = frozenset(validate.queue_name(q, "queues") for q in queues)
        if not names:
            raise ValidationError("queues", "must name at least one queue")
        waiter = Waiter(self, names)
        with self._waiters_lock:
            self._waiters.add(waiter)
        return waiter

    def _unsubscribe(self, waiter: Waiter) -> None:
        with self._waiters_lock:
            self._waiters.discard(waiter)

    def _snapshot(self) -> list[Waiter]:
        with self._waiters_lock:
            return list(self._waiters)

    def _wake_all(self) -> None:
        for waiter in self._snapshot():
            waiter.wake()

    def _wake_queue(self, queue: str) -> int:
        woken = 0
        for waiter in self._snapshot():
            if queue in waiter.queues:
                waiter.wake()
                woken += 1
        return woken

    def _wake_queue_at(self, queue: str, when: float) -> None:
        for waiter in self._snapshot():
            if queue in waiter.queues:
                waiter.wake_at(when)

    def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """The ``Dispatcher`` port: wait on this thread's waiter for ``queues``.

        The waiter is created on the first call from a thread for a given set
        of queues and reused afterwards, so a notification that arrives between
        two calls is kept for the next one. Prefer :meth:`subscribe` when the
        queue set is fixed: it also covers the time before the first call.
        """
        key = frozenset(queues)
        cache: dict[frozenset[str], Waiter] | None = getattr(self._local, "waiters", None)
        if cache is None:
            cache = {}
            self._local.waiters = cache
        waiter = cache.get(key)
        if waiter is None:
            waiter = cache[key] = self.subscribe(key)
        return waiter.wait(timeout)


class NullDispatcher(_Hub, Service):
    """A ``Dispatcher`` without notifications: ``wait`` sleeps until its timeout.

    For deployments where LISTEN cannot work (PgBouncer in transaction mode)
    or is switched off; workers then find jobs by polling alone.
    """

    def start(self) -> None:
        """Nothing to start."""

    def stop(self, timeout: float = 5.0) -> None:
        """Wake every waiter once, so blocked workers re-check their state."""
        self._wake_all()

    def close(self) -> None:
        self.stop()


# -- the notifier ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NotifierStats:
    """Counters for metrics and tests."""

    connects: int
    """Successful connect + LISTEN, the first one included."""
    reconnects: int
    """Successful connects after the first."""
    faults: int
    """Connection faults: failed connects, dropped connections, failed probes."""
    probes: int
    """Liveness probes that succeeded."""
    received: int
    """Notifications read on the channel."""
    ignored: int
    """Notifications whose payload is not a queue name or a delayed job's (never trusted)."""


class _Gone(Exception):
    """The listener connection is unusable; reconnect."""


class Notifier(_Hub, Service):
    """The ``Dispatcher`` over LISTEN/NOTIFY (see the module docs).

    ``conninfo`` is a URL or key=value string; the listener connection adds
    ``application_name`` (``jobrun-listener``), a connect timeout and TCP
    keepalives. Call :meth:`start` once, :meth:`stop` (or :meth:`close`, or
    leave the ``with`` block) at the end; both are safe to call twice.
    """

    def __init__(
        self,
        conninfo: str,
        *,
        channel: str = DEFAULT_CHANNEL,
        enabled: bool = True,
        liveness_interval: float = DEFAULT_LIVENESS_INTERVAL,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        backoff_initial: float = DEFAULT_BACKOFF_INITIAL,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        application_name: str = "jobrun-listener",
    ) -> None:
        super().__init__()
        self.channel = validate_channel(channel)
        self.enabled = bool(enabled)
        self.liveness_interval = check_seconds(liveness_interval, "liveness_interval")
        self.probe_timeout = check_seconds(probe_timeout, "probe_timeout")
        self.backoff_initial = check_seconds(backoff_initial, "backoff_initial")
        self.backoff_max = max(self.backoff_initial, check_seconds(backoff_max, "backoff_max"))
        # Parsed now, so that a bad string fails here (without its password).
        self._conninfo = conninfo_with(conninfo, application_name=application_name)
        self._outage = outage.for_database(describe(conninfo))
        self._listen_sql = sql.SQL("LISTEN {}").format(sql.Identifier(self.channel))

        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._state_lock = threading.Lock()
        self._connected = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._connects = 0
        self._faults = 0
        self._probes = 0
        self._received = 0
        self._ignored = 0
        self._closed = False
        # (what, busy since (monotonic) or None while backing off, thread ident)
        self._activity: tuple[str, float | None, int | None] = ("not started", None, None)
        self.last_error: str | None = None
        """The last connection fault, redacted (for logs and health checks)."""

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Start the listener thread (no-op when disabled, started or stopped).

        Returns at once; :meth:`wait_connected` waits for the first LISTEN.
        """
        with self._state_lock:
            if not self.enabled or self._thread is not None or self._closed:
                return
            self._thread = threading.Thread(target=self._run, name="jobrun-listener", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening, close the connection and wake every waiter once.

        Safe to call twice. Waits up to ``timeout`` for the thread (a connect in
        progress is bounded by the connect timeout; the thread is a daemon).
        Afterwards ``wait`` only sleeps, as in disabled mode.
        """
        with self._state_lock:
            self._closed = True
            thread = self._thread
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        self._wake_all()

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    # -- observable state -------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Whether the listener is connected and LISTENing right now."""
        return self._connected.is_set()

    @property
    def running(self) -> bool:
        """Whether the listener thread is alive."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def reconnects(self) -> int:
        return max(0, self._connects - 1)

    @property
    def stats(self) -> NotifierStats:
        return NotifierStats(
            connects=self._connects,
            reconnects=self.reconnects,
            faults=self._faults,
            probes=self._probes,
            received=self._received,
            ignored=self._ignored,
        )

    def activity(self) -> tuple[str, float | None, int | None]:
        """What the listener thread is doing: (step, busy since or None, thread ident).

        "busy since" is a ``time.monotonic()`` reading, renewed at every step
        (at least every half second while listening); None while the thread
        sleeps between reconnects or is not running. A step that lasts much
        longer than ``probe_timeout`` or the connect timeout is a stuck listener.
        """
        return self._activity

    def _busy(self, what: str) -> None:
        self._activity = (what, time.monotonic(), threading.get_ident())

    def _idle(self, what: str) -> None:
        self._activity = (what, None, threading.get_ident())

    def wait_connected(self, timeout: float) -> bool:
        """Block until the listener is connected (True) or ``timeout`` passes."""
        return self._connected.wait(check_seconds(timeout, "timeout", allow_zero=True))

    def backend_pid(self) -> int | None:
        """The listener session's backend pid while connected (for operators and tests)."""
        conn = self._conn
        if conn is None or not self.connected:
            return None
        with contextlib.suppress(psycopg.Error):
            return int(conn.info.backend_pid)
        return None

    # -- the listener thread ------------------------------------------------------

    def _run(self) -> None:
        attempt = 0
        while not self._stop.is_set():
            self._busy("connecting and running LISTEN")
            began = self._outage.mark()
            try:
                conn = self._connect()
            except Exception as exc:  # noqa: BLE001 - any connect error is a fault: retry
                self._fault("connect", exc)
                self._idle("backing off before reconnecting")
                self._stop.wait(backoff_delay(attempt, self.backoff_initial, self.backoff_max))
                attempt += 1
                continue
            up_since = time.monotonic()
            self._conn = conn
            self._connects += 1
            self._connected.set()
            self._outage.ok(began)
            if self._connects > 1:
                log.info("listener reconnected to channel %s", self.channel)
            # Anything sent while we were not listening is lost: everyone polls once.
            self._wake_all()
            try:
                self._listen(conn)
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                self._fault("listen", exc)
            finally:
                self._connected.clear()
                self._conn = None
                with contextlib.suppress(Exception):
                    conn.close()
            if self._stop.is_set():
                break
            if time.monotonic() - up_since >= self.backoff_max:
                attempt = 0  # it was healthy for a while: start over from a short pause
            self._idle("backing off before reconnecting")
            self._stop.wait(backoff_delay(attempt, self.backoff_initial, self.backoff_max))
            attempt += 1
        self._connected.clear()
        self._activity = ("stopped", None, None)

    def _fault(self, where: str, exc: BaseException) -> None:
        self._faults += 1
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        self.last_error = redact(f"{type(exc).__name__}: {message}")
        if self._stop.is_set():
            return
        # One voice for the outage (jobrun.job.outage), not a line per attempt.
        self._outage.failed(self.last_error, f"listener {where}")

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.Connection.connect(self._conninfo, autocommit=True)
        forksafe.track(conn)  # a forked child severs it instead of keeping the session
        try:
            with interrupt_after(conn, self.probe_timeout):
                configure_session(conn, self.probe_timeout)
                conn.execute(self._listen_sql)
            self._probe(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _probe(self, conn: psycopg.Connection[Any]) -> None:
        """Same-session liveness: the server answers and we still LISTEN on the channel."""
        with interrupt_after(conn, self.probe_timeout):
            row = conn.execute(
                "SELECT %s = ANY (ARRAY(SELECT pg_listening_channels()))", [self.channel]
            ).fetchone()
        if not row or row[0] is not True:
            raise _Gone(f"the session no longer listens on {self.channel!r}")
        self._probes += 1

    def _listen(self, conn: psycopg.Connection[Any]) -> None:
        next_probe = time.monotonic() + self.liveness_interval
        while not self._stop.is_set():
            now = time.monotonic()
            if now >= next_probe:
                self._busy("probing its session")
                self._probe(conn)
                now = time.monotonic()
                next_probe = now + self.liveness_interval
            timeout = min(_TICK, max(0.0, next_probe - now))
            self._busy("waiting for notifications")
            # A decode error (a non-UTF-8 payload in a SQL_ASCII database) or a
            # connection error ends the generator; both end this connection.
            for notify in conn.notifies(timeout=timeout):
                self._dispatch(notify.payload)
                if self._stop.is_set():
                    return

    def _dispatch(self, payload: str) -> None:
        self._received += 1
        # Untrusted: any role that can connect can NOTIFY. The payload is only
        # compared with the queue names waiters registered, never used otherwise.
        if validate.QUEUE_NAME_PATTERN.fullmatch(payload):
            self._wake_queue(payload)
            return
        delayed = DELAYED_PAYLOAD.fullmatch(payload)
        if delayed is None:
            self._ignored += 1
            return
        # Counted from its arrival: the delay was measured before the COMMIT.
        self._wake_queue_at(delayed[1], time.monotonic() + int(delayed[2]) / 1000)

    # -- the Dispatcher port ----------------------------------------------------

    def wait(self, queues: Sequence[str], timeout: float) -> bool:
        """Block until a job may be ready in one of ``queues`` or ``timeout`` passes.

        True when woken by a notification or a reconnect, False on timeout.
        See :meth:`_Hub.wait` for the per-thread waiter it uses.
        """
        return super().wait(queues, timeout)


__all__ = [
    "DEFAULT_CHANNEL",
    "DELAYED_PAYLOAD",
    "MAX_DUE_TIMES",
    "Notifier",
    "NotifierStats",
    "NullDispatcher",
    "ProbeTimeout",
    "Waiter",
    "backoff_delay",
    "check_seconds",
    "configure_session",
    "interrupt_after",
    "validate_channel",
]
