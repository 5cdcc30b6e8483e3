"""Leader election for the scheduler: :class:`AdvisoryLocker` (a ``Locker``).

The lock is a PostgreSQL *session* advisory lock in the two-int form
(namespace ``0x6A6F62``, "job", shared with the migration lock; purpose 2 =
leader), so it cannot collide with an application's one-bigint advisory
locks; a ``name`` derives a different key, for several deployments in one
database. It is taken on a **dedicated connection** (``jobrun-leader``,
autocommit), never a pooled one, which a pool would recycle and so drop the
lock; the session switches off ``idle_session_timeout`` for itself.

A follower calls :meth:`~AdvisoryLocker.try_acquire` on every tick; it never
blocks (a connection fault is "not acquired", the next call reconnects). A
leader calls :meth:`~AdvisoryLocker.held` before **every** action and steps
down as soon as it returns False.

The lock lives exactly as long as the holder's session on the server. A
terminated backend or a restart frees it at once, and the old holder
notices at its next ``held()`` (a round trip at most every
``check_interval``, always with ``force=True``, each bounded by
``probe_timeout``). On a half-open network the server keeps the lock until
its own keepalive gives up, while the old holder's probe fails first: the
cluster is briefly leaderless, never doubly led. The overlap between an old
leader that has not noticed and a new one is at most one action, which the
durable guards cover (the cron occurrence's key, the reaper's re-check).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from typing import Any

import psycopg

from jobrun.job import outage
from jobrun.job.errors import ValidationError
from jobrun.job.service import Closing
from jobrun.job.validate import redact
from jobrun.postgres import forksafe
from jobrun.postgres.migrate import LOCK_NAMESPACE
from jobrun.postgres.pool import conninfo_with, describe
from jobrun.postgres.session import check_seconds, configure_session, interrupt_after

log = logging.getLogger(__name__)

LOCK_LEADER = 2
"""The purpose key of the scheduler's leader lock (1 is the migration lock)."""

RESERVED_PURPOSES = 1024
"""Purposes are small ints below this; keys derived from a name lie above it."""

DEFAULT_CHECK_INTERVAL = 1.0
DEFAULT_PROBE_TIMEOUT = 5.0

_TRY_SQL = "SELECT pg_try_advisory_lock(%s::int4, %s::int4)"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(%s::int4, %s::int4)"
# Two-int advisory locks appear in pg_locks as classid = key1, objid = key2
# (both as oid, i.e. unsigned), objsubid = 2.
_HELD_SQL = """
SELECT EXISTS (
    SELECT 1 FROM pg_locks
     WHERE locktype = 'advisory'
       AND classid = %s::int4::oid AND objid = %s::int4::oid AND objsubid = 2
       AND pid = pg_backend_pid() AND granted
)
"""


def lock_key(purpose: int = LOCK_LEADER, name: str | None = None) -> tuple[int, int]:
    """The two-int advisory lock key for ``purpose`` (and optionally ``name``)."""
    if isinstance(purpose, bool) or not isinstance(purpose, int):
        raise ValidationError("purpose", f"must be an int, not {type(purpose).__name__}")
    if not 0 <= purpose < RESERVED_PURPOSES:
        raise ValidationError("purpose", f"must be between 0 and {RESERVED_PURPOSES - 1}")
    if name is None:
        return (LOCK_NAMESPACE, purpose)
    if not isinstance(name, str):
        raise ValidationError("name", f"must be a str, not {type(name).__name__}")
    if not name or len(name) > 255 or "\x00" in name:
        raise ValidationError("name", "must be 1-255 characters without NUL")
    digest = hashlib.sha256(f"{purpose}:{name}".encode()).digest()
    span = 2**31 - RESERVED_PURPOSES
    return (LOCK_NAMESPACE, RESERVED_PURPOSES + int.from_bytes(digest[:4], "big") % span)


def _reason(exc: BaseException | str) -> str:
    if isinstance(exc, str):
        return exc
    text = str(exc).strip()
    return redact(f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}")


class AdvisoryLocker(Closing):
    """A leadership lock held by a session advisory lock (see the module docs).

    Thread-safe. ``check_interval`` is the longest ``held()`` trusts its last
    round trip; ``probe_timeout`` bounds every statement client-side.
    """

    def __init__(
        self,
        conninfo: str,
        name: str | None = None,
        *,
        purpose: int = LOCK_LEADER,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        probe_timeout: float = DEFAULT_PROBE_TIMEOUT,
        application_name: str = "jobrun-leader",
    ) -> None:
        self.key = lock_key(purpose, name)
        self.check_interval = check_seconds(check_interval, "check_interval", allow_zero=True)
        self.probe_timeout = check_seconds(probe_timeout, "probe_timeout")
        self._conninfo = conninfo_with(conninfo, application_name=application_name)
        self._outage = outage.for_database(describe(conninfo))
        self._mutex = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._held = False
        self._checked_at = 0.0
        self.terms = 0
        """How many times the lock was acquired (each acquisition is a new term)."""
        self.losses = 0
        """How many terms ended without :meth:`release` (connection died, lock gone)."""
        self.last_error: str | None = None
        """The last connection fault, redacted."""

    # -- the Locker port ----------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never blocks for it.

        True when this instance holds the lock afterwards (already holding it
        counts, after a forced check). False when another session holds it, or
        on a connection fault (the next call reconnects); a holder whose lock
        turns out to be lost gets False once, so that it steps down before a
        new term starts.
        """
        with self._mutex:
            if self._held:
                return self._check(force=True)
            conn = self._connection()
            if conn is None:
                return False
            try:
                with interrupt_after(conn, self.probe_timeout):
                    row = conn.execute(_TRY_SQL, self.key).fetchone()
            except Exception as exc:  # noqa: BLE001 - a fault means "not acquired"
                # If the server granted the lock before the connection failed,
                # closing the session releases it again.
                self._drop(_reason(exc))
                return False
            if not (row and row[0] is True):
                return False
            self._held = True
            self._checked_at = time.monotonic()
            self.terms += 1
            log.info("leadership acquired (lock %s, term %d)", self.key, self.terms)
            return True

    def held(self, *, force: bool = False) -> bool:
        """Whether this instance still holds the lock; False once its connection is gone.

        Does a bounded round trip (its own backend must hold the lock in
        ``pg_locks``) when the last one is older than ``check_interval`` or
        when ``force`` is set; otherwise answers from that last round trip,
        unless the connection is already known to be broken.
        """
        with self._mutex:
            return self._check(force=force)

    def release(self) -> None:
        """Give the lock up. Safe to call twice, and after the connection died.

        The connection stays open for the next :meth:`try_acquire` when the
        unlock succeeds; any trouble closes it, which releases the lock too.
        """
        with self._mutex:
            was_held, self._held = self._held, False
            conn = self._conn
            if not was_held or conn is None:
                return
            if conn.closed or conn.broken:
                self._close_conn()
                return
            try:
                with interrupt_after(conn, self.probe_timeout):
                    row = conn.execute(_UNLOCK_SQL, self.key).fetchone()
            except Exception as exc:  # noqa: BLE001 - closing the session releases the lock
                self.last_error = _reason(exc)
                self._close_conn()
                return
            if not (row and row[0] is True):
                self._close_conn()  # we did not hold it after all: start from a clean session
            log.info("leadership released (lock %s)", self.key)

    def term(self) -> None:
        """None: a session lock has no term to fence actions by (its session is
        the fence; see the module docs). :class:`jobrun.postgres.leader.LeaseLocker`
        has one."""
        return None

    # -- extras -------------------------------------------------------------------

    def close(self) -> None:
        """Release the lock and close the connection. Safe to call twice."""
        self.release()
        with self._mutex:
            self._close_conn()

    @property
    def backend_pid(self) -> int | None:
        """The lock session's backend pid, while it has a connection."""
        conn = self._conn
        if conn is None or conn.closed:
            return None
        with contextlib.suppress(psycopg.Error):
            return int(conn.info.backend_pid)
        return None

    # -- internals (called with the mutex held) -----------------------------------

    def _connection(self) -> psycopg.Connection[Any] | None:
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._close_conn()
        began = self._outage.mark()
        try:
            conn = psycopg.Connection.connect(self._conninfo, autocommit=True)
        except Exception as exc:  # noqa: BLE001 - a connection fault means "not acquired"
            self._fault("connect", exc)
            return None
        self._outage.ok(began)
        # A forked child severs its copy: its unlock or close can never end
        # the parent's term, and its next try reconnects (see forksafe).
        forksafe.track(conn)
        try:
            with interrupt_after(conn, self.probe_timeout):
                configure_session(conn, self.probe_timeout)
        except Exception as exc:  # noqa: BLE001
            conn.close()
            self._fault("configure", exc)
            return None
        self._conn = conn
        return conn

    def _check(self, *, force: bool) -> bool:
        if not self._held:
            return False
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._lose("the lock connection is closed")
            return False
        if not force and time.monotonic() - self._checked_at < self.check_interval:
            return True
        try:
            with interrupt_after(conn, self.probe_timeout):
                row = conn.execute(_HELD_SQL, self.key).fetchone()
        except Exception as exc:  # noqa: BLE001 - any failure of the probe is a loss
            self._lose(_reason(exc))
            return False
        if not (row and row[0] is True):
            self._lose("the lock is no longer held by this session")
            return False
        self._checked_at = time.monotonic()
        return True

    def _lose(self, reason: str) -> None:
        self._held = False
        self.losses += 1
        self.last_error = reason
        log.warning("leadership lost (lock %s): %s", self.key, reason)
        self._close_conn()

    def _drop(self, reason: str) -> None:
        self.last_error = reason
        self._outage.failed(reason, "leader lock")  # one voice for an outage
        self._close_conn()

    def _fault(self, where: str, exc: BaseException) -> None:
        self.last_error = _reason(exc)
        self._outage.failed(self.last_error, f"leader lock {where}")

    def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()


__all__ = ["LOCK_LEADER", "AdvisoryLocker", "lock_key"]
