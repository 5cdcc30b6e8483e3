"""What both stores are before they touch a connection: settings, bounds, hooks.

The sync :class:`~jobrun.postgres.store.Store` and the asyncio
:class:`~jobrun.postgres.async_store.AsyncStore` share their client half
(transactions, enqueue, inspect and administer, wait), written once in the
``*_async.py`` modules and turned into the sync ones by
``tools/async_to_sync.py``. What is neither sync nor async, the options, the
caller's deadline, the throttle of the full-notification-queue warning,
lives here, so that both halves read it from one place.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import select
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg

from jobrun.job import validate
from jobrun.job.errors import TransientError, ValidationError
from jobrun.job.model import LeaderTerm
from jobrun.postgres import reconnect
from jobrun.postgres.events import EventMode
from jobrun.postgres.plans import MAX_NOTIFY_QUEUE_USAGE, NOTIFY_WARNING_INTERVAL
from jobrun.postgres.schema import DEFAULT_SCHEMA, schema_name
from jobrun.postgres.session import DEFAULT_CHANNEL, validate_channel

log = logging.getLogger("jobrun.postgres.store")  # the name users filter on

DEFAULT_CALL_TIMEOUT = dt.timedelta(seconds=10)
"""Client-side bound of one store call (a Complete adds commit_timeout)."""
CALL = object()
"""A ``timeout`` argument meaning "the store's call_timeout"."""


class StoreBase:
    """The options and the bookkeeping of a store, without any I/O."""

    def __init__(
        self,
        pool: Any,
        *,
        event_mode: EventMode | str = EventMode.ALL,
        notify_channel: str = DEFAULT_CHANNEL,
        call_timeout: dt.timedelta | None = DEFAULT_CALL_TIMEOUT,
        schema: str = DEFAULT_SCHEMA,
        direct_url: str | None = None,
    ) -> None:
        self._accept(pool)
        self.schema = schema_name(schema)
        self.direct_url = direct_url
        """A connection string to PostgreSQL itself (JOBRUN_DIRECT_URL), for
        :meth:`wait`'s LISTEN when the pool goes through a transaction pooler."""
        self._fence: LeaderTerm | None = None
        try:
            self.event_mode = EventMode(event_mode)
        except ValueError:
            raise ValidationError("event_mode", "must be 'all' or 'terminal'") from None
        if call_timeout is not None:
            validate.positive_duration("call_timeout", call_timeout)
        self.call_timeout = None if call_timeout is None else call_timeout.total_seconds()
        self.notify_channel = validate_channel(notify_channel, "notify_channel")
        self.finish_channel = validate_channel(f"{notify_channel}_done", "notify_channel")
        """Where the end of a watched job is announced (the job's id; see :meth:`watch`)."""
        self.pool = pool
        self.outage = reconnect.outage_of(pool)
        """Where this store's database faults are reported (:mod:`jobrun.job.outage`):
        the pool's own reporter, shared by the loops that use this store."""
        self._notify_warned_at = -math.inf
        self._notify_warn_lock = threading.Lock()
        self._bounds = threading.local()  # .until: this thread's deadline (see bounded)
        self._setup()

    def _accept(self, pool: Any) -> None:
        """Refuse a pool of the wrong kind, before anything else is checked."""

    def _setup(self) -> None:
        """What a store adds once its options are set (its queries, its state)."""

    @contextlib.contextmanager
    def bounded(self, seconds: float) -> Iterator[None]:
        """Give up on the calls this thread makes inside the block ``seconds`` from now.

        Each call's client-side bound (the watchdog, the wait for a pooled
        connection) and a Complete's statement_timeout are cut to what is
        left; a call begun past it raises TransientError before anything is
        sent. The worker completes jobs within their leases this way. Nested
        blocks keep the earlier deadline.
        """
        until = time.monotonic() + seconds
        outer: float | None = getattr(self._bounds, "until", None)
        self._bounds.until = until if outer is None else min(until, outer)
        try:
            yield
        finally:
            self._bounds.until = outer

    def _left(self, timeout: float | None) -> float | None:
        """``timeout`` cut to this thread's deadline (see :meth:`bounded`)."""
        until: float | None = getattr(self._bounds, "until", None)
        if until is None:
            return timeout
        left = until - time.monotonic()
        if left <= 0:
            raise TransientError("the caller's deadline passed before the call was sent")
        return left if timeout is None else min(timeout, left)

    def _bound(self, timeout: float | object | None) -> float | None:
        if timeout is CALL:
            return self.call_timeout
        assert timeout is None or isinstance(timeout, float)
        return timeout

    def _notified(self, usage: float) -> None:
        """Warn (at most every NOTIFY_WARNING_INTERVAL) when a wake-up was skipped."""
        if usage < MAX_NOTIFY_QUEUE_USAGE:
            return
        with self._notify_warn_lock:
            now = time.monotonic()
            if now - self._notify_warned_at < NOTIFY_WARNING_INTERVAL:
                return
            self._notify_warned_at = now
        # Apart from the caller: never inside its transaction, never holding
        # up the enqueue that noticed it.
        self._warn_apart(usage)

    def _warn_apart(self, usage: float) -> None:
        """Start ``_warn_notify_queue_full(usage)`` on a thread or task of its own."""
        raise NotImplementedError


def warn_notify_queue_full(usage: float, blockers: Sequence[Any] | BaseException) -> None:
    """The WARNING of a full notification queue, naming the sessions that may hold it."""
    if isinstance(blockers, BaseException):
        named = f"(sessions not listed: {blockers})"
    else:
        named = (
            ", ".join(
                f"PID {b.pid} ({b.application_name or 'no application_name'}, "
                f"{b.state} since {b.xact_start:%Y-%m-%d %H:%M:%S%z})"
                for b in blockers
            )
            or "none visible to this role"
        )
    log.warning(
        "the PostgreSQL NOTIFY queue is %.0f%% full (pg_notification_queue_usage()): "
        "jobrun sends no wake-ups until it drains, jobs are still written and workers "
        "find them by polling. A session LISTENing while idle in a long transaction "
        "holds it; sessions idle in a transaction, oldest first: %s",
        usage * 100,
        named,
    )


def stale(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> bool:
    """Whether an idle connection has been hung up on: bytes (the FATAL message
    or EOF) wait on its socket. One non-blocking poll, no round trip."""
    if conn.closed or conn.broken:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
