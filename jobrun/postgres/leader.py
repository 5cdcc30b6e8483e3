"""Leader election without a session: :class:`LeaseLocker` (a ``Locker``), a lease row with a term.

Why
---
:class:`~jobrun.postgres.lock.AdvisoryLocker` holds a *session* advisory
lock. Behind a transaction pooler (PgBouncer in transaction mode) a client
has no session of its own: the lock is taken on whichever server connection
ran the statement, stays there when the pooler hands that connection to
someone else, and the holder's next probe runs elsewhere. Measured before
this module: leadership flapping 25 times in 150 s, two leaders at once for
up to 5 s, cron occurrences missed. Without a direct connection
(``JOBRUN_DIRECT_URL``), the leader is therefore a **lease row**
(``jobrun.leader``, migration 0008), which needs nothing but transactions.

The row and its term
--------------------
One row per election (``name``: ``scheduler``, or ``scheduler:<schema>``
style names for several deployments in one database). Every statement is
one autocommit transaction, every time is the database clock::

    AcquireLeader   insert the row (term 1), or take it over when its lease
                    has expired: holder = me, term = term + 1,
                    expires_at = now() + ttl
    RenewLeader     expires_at = now() + ttl   WHERE holder = me AND term = mine
                                                 AND expires_at > now()
    ResignLeader    expires_at = now()          (same guard; the term stays)
    FenceLeader     SELECT ... FOR SHARE        (same guard), inside an action

States::

                  AcquireLeader -> term n
    +----------+ --------------------------> +-----------+  RenewLeader each
    | follower |                             | leader(n) |  held(force=True)
    +----------+ <-------------------------- +-----------+
         ^     release(): ResignLeader            |  RenewLeader -> nothing, or no
         |                                        |  answer before the local deadline
         +----------------------------------------+  (a loss: step down at once)

A term's number is never reused: the row is never deleted, each takeover
adds one. ``(name, term)`` therefore names one leadership.

The fence: two leaders never overlap, by the term
-------------------------------------------------
Every leader action runs through ``store.fenced(locker.term())``: its
transaction begins with FenceLeader, which finds the row only while this
holder's term ``n`` is running (``expires_at > now()``) and locks it FOR
SHARE until the action commits or rolls back; otherwise the action raises
:class:`~jobrun.job.errors.LeaderLost` having done nothing. A takeover to
term ``n + 1`` is an UPDATE of the same row, which conflicts with that
share lock. So:

1. an action of term ``n`` that passed its fence holds the row; term
   ``n + 1`` cannot be granted until that action's transaction has ended;
2. an action of term ``n`` that starts after term ``n + 1`` was granted
   finds ``term <> n`` and is refused.

In the database's commit order every action of term ``n`` precedes term
``n + 1``, whatever the clocks, pauses or network of the old leader do.
This is stronger than the session lock's guarantee ("at most one action of
overlap"): a stalled old leader can never commit beside its successor.

Timing
------
``ttl`` (default 15 s) is how long a lease lasts unrenewed, by the database
clock. The scheduler renews it before every action (each tick, by default
every second). A leader that cannot renew steps down once its local
deadline passes (the send time of its last successful renewal plus
``ttl``, by the monotonic clock: the lease cannot have outlived that). A
crashed leader is replaced ``ttl`` after its last renewal; a resigning one
at once.

Mixed fleets
------------
Every process of one deployment should elect the same way: all with a
direct connection (the session lock) or all through the pooler (this
lease). As a guard, AcquireLeader refuses while any session holds the
session lock of the same election, so a lease leader is never elected
beside a session-lock leader; the converse is not guarded (the session
lock knows nothing of the row), and the durable guards (the cron
occurrence's idempotency key, the reaper's re-checked lease) cover it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING

from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import LeaderTerm
from jobrun.job.service import Closing
from jobrun.postgres.lock import LOCK_LEADER, lock_key
from jobrun.postgres.session import check_seconds

if TYPE_CHECKING:
    from jobrun.postgres.sqlc.leader import GetLeaderRow
    from jobrun.postgres.store import Store

log = logging.getLogger(__name__)

DEFAULT_LEASE_TTL = 15.0
DEFAULT_CHECK_INTERVAL = 1.0
ELECTION = "scheduler"
"""The election's name for the default schema (``scheduler:<name>`` for others)."""


def election_name(name: str | None) -> str:
    """The row's name for a lock ``name`` (as :func:`jobrun.postgres.lock.lock_key` takes it)."""
    if name is None:
        return ELECTION
    if not isinstance(name, str) or not name or len(name) > 200 or "\x00" in name:
        raise ValidationError("name", "must be 1-200 characters without NUL")
    return f"{ELECTION}:{name}"


def new_holder() -> str:
    """A candidate's id: host and pid for operators, a random part for uniqueness."""
    return f"{socket.gethostname()[:100]}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class LeaseLocker(Closing):
    """A leadership held by a lease row with a fencing term (see the module docs).

    ``store`` is the scheduler's Store (its pool may go through a transaction
    pooler); ``name`` is the election, as for AdvisoryLocker. Thread-safe.
    """

    def __init__(
        self,
        store: Store,
        name: str | None = None,
        *,
        ttl: float = DEFAULT_LEASE_TTL,
        check_interval: float = DEFAULT_CHECK_INTERVAL,
        holder: str | None = None,
    ) -> None:
        self.store = store
        self.name = election_name(name)
        self.lock_key = lock_key(LOCK_LEADER, name)
        """The session lock of the same election (AcquireLeader defers to its holder)."""
        self.ttl = check_seconds(ttl, "ttl")
        self.check_interval = check_seconds(check_interval, "check_interval", allow_zero=True)
        if self.check_interval >= self.ttl:
            raise ValidationError("check_interval", "must be shorter than ttl")
        self.holder = holder if holder is not None else new_holder()
        if not isinstance(self.holder, str) or not 1 <= len(self.holder) <= 255:
            raise ValidationError("holder", "must be 1-255 characters")
        self._mutex = threading.Lock()
        self._term: LeaderTerm | None = None
        self._renewed_at = 0.0  # monotonic send time of the last successful acquire/renew
        self.terms = 0
        """How many terms this instance was granted."""
        self.losses = 0
        """How many terms ended without :meth:`release` (lease expired or taken over)."""
        self.last_error: str | None = None
        """The last database fault, redacted."""

    # -- the Locker port ----------------------------------------------------------

    def try_acquire(self) -> bool:
        """Take the election if its lease is free or expired (a new term); never blocks.

        True when this instance leads afterwards (already leading counts,
        after a renewal). A database fault counts as False.
        """
        with self._mutex:
            if self._term is not None:
                return self._check(force=True)
            sent = time.monotonic()
            try:
                row = self.store._on_pool(
                    lambda c: self.store.q.acquire_leader(
                        c,
                        name=self.name,
                        holder=self.holder,
                        ttl_seconds=self.ttl,
                        lock_class=self.lock_key[0],
                        lock_key=self.lock_key[1],
                    )
                )
            except JobrunError as exc:
                self._fault("acquire", exc)
                return False
            if row is None:
                return False
            self._term = LeaderTerm(name=self.name, holder=self.holder, term=row.term)
            self._renewed_at = sent
            self.terms += 1
            log.info("leadership acquired (%s, term %d, lease %gs)", self.name, row.term, self.ttl)
            return True

    def held(self, *, force: bool = False) -> bool:
        """Whether this instance still leads.

        Renews the lease (a round trip) when ``force`` is set or the last
        renewal is older than ``check_interval``; False once a renewal finds
        the term over, or once the local deadline passed without one.
        """
        with self._mutex:
            return self._check(force=force)

    def release(self) -> None:
        """End the term now (the next candidate need not wait for the lease). Safe twice."""
        with self._mutex:
            term, self._term = self._term, None
            if term is None:
                return
            try:
                self.store._on_pool(
                    lambda c: self.store.q.resign_leader(
                        c, name=term.name, holder=term.holder, term=term.term
                    )
                )
            except JobrunError as exc:
                self._fault("resign", exc)  # the lease runs out by itself
                return
            log.info("leadership released (%s, term %d)", self.name, term.term)

    def close(self) -> None:
        """Same as :meth:`release` (the locker holds no connection of its own)."""
        self.release()

    def term(self) -> LeaderTerm | None:
        """The running term (the fence for ``Store.fenced``), or None when not leading."""
        return self._term

    # -- extras -------------------------------------------------------------------

    def current(self) -> GetLeaderRow | None:
        """The election's row as the database has it now (for status and tests)."""
        return self.store._on_pool_read(lambda c: self.store.q.get_leader(c, name=self.name))

    # -- internals (called with the mutex held) -----------------------------------

    def _check(self, *, force: bool) -> bool:
        term = self._term
        if term is None:
            return False
        now = time.monotonic()
        if now - self._renewed_at >= self.ttl:
            self._lose(term, "the lease ran out before it could be renewed")
            return False
        if not force and now - self._renewed_at < self.check_interval:
            return True
        try:
            expires = self.store._on_pool(
                lambda c: self.store.q.renew_leader(
                    c, name=term.name, holder=term.holder, term=term.term, ttl_seconds=self.ttl
                )
            )
        except JobrunError as exc:
            # Not yet a loss: the lease still runs until the local deadline.
            self._fault("renew", exc)
            if time.monotonic() - self._renewed_at >= self.ttl:
                self._lose(term, "the lease ran out before it could be renewed")
                return False
            return True
        if expires is None:
            self._lose(term, "the term is over (the lease expired or was taken over)")
            return False
        self._renewed_at = now
        return True

    def _lose(self, term: LeaderTerm, reason: str) -> None:
        self._term = None
        self.losses += 1
        self.last_error = reason
        log.warning("leadership lost (%s, term %d): %s", self.name, term.term, reason)

    def _fault(self, where: str, exc: BaseException) -> None:
        self.last_error = f"{type(exc).__name__}: {exc}"
        self.store.outage.failed(self.last_error, f"leader lease {where}")  # one voice


__all__ = ["DEFAULT_LEASE_TTL", "LeaseLocker", "election_name"]
