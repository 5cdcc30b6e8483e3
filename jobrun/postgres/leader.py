"""Leader election without a session: :class:`LeaseLocker` (a ``Locker``), a lease row with a term.

Why: :class:`~jobrun.postgres.lock.AdvisoryLocker` holds a *session*
advisory lock, and behind a transaction pooler a client has no session of
its own (the lock stays on whichever server connection ran the statement;
measured: leadership flapping, two leaders at once, cron occurrences
missed). Without a direct connection (``JOBRUN_DIRECT_URL``) the leader is
therefore a **lease row** (``jobrun.leader``), which needs nothing but
transactions: AcquireLeader inserts it or takes it over once expired (term
+ 1), RenewLeader extends it while holder and term match, ResignLeader
expires it. A term's number is never reused, so ``(name, term)`` names one
leadership.

The fence: every leader action runs through ``store.fenced(locker.term())``,
whose transaction begins by locking the row FOR SHARE while this term is
running (else LeaderLost, having done nothing). A takeover is an UPDATE of
that row, so it waits for every fenced action in flight: in the database's
commit order every action of term ``n`` precedes term ``n + 1``, whatever
the clocks, pauses or network of the old leader do.

Timing: ``ttl`` (default 15 s, database clock) is how long a lease lasts
unrenewed; the scheduler renews before every action, and a leader that
cannot renew steps down once its local deadline (last successful renewal
plus ``ttl``, monotonic clock) passes. A crashed leader is replaced ``ttl``
after its last renewal, a resigning one at once. AcquireLeader refuses
while any session holds the session lock of the same election, so a lease
leader is never elected beside a session-lock leader.
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
from jobrun.postgres.schema import DEFAULT_SCHEMA
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


def leader_lock_name(schema: str) -> str | None:
    """The leader lock's name for ``schema``: each schema in a database elects its own leader.

    None (the historical key) for the default schema, so that processes of
    an older jobrun and of this one still agree on a single leader.
    """
    return None if schema == DEFAULT_SCHEMA else f"schema:{schema}"


def leader_election(schema: str) -> tuple[tuple[int, int], str]:
    """The scheduler's election in ``schema`` as the Runtime holds it: the
    advisory lock key and the lease row's name (for who-leads reads)."""
    name = leader_lock_name(schema)
    return lock_key(LOCK_LEADER, name), election_name(name)


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
