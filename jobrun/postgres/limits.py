"""Queue limits: global concurrency, per-key concurrency, a sliding rate window.

The limits live in the database (``queue_limits``), so every worker on every
host applies them to its next claim. Exact, because claims of a limited queue
take turns on its limits row (the limited claim locks it, then claims with a
snapshot taken after the previous claim committed). A claim sent the
lock-free way skips every limited queue it sees, so the store only has to
know, roughly, which queues have limits: it trusts what it read for
:data:`LIMITED_QUEUES_TTL` seconds (a limit set meanwhile holds that queue
back for up to this long, never lets it overshoot).
"""

from __future__ import annotations

import builtins
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import psycopg

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import KEEP, Keep, QueueLimits, RateLimit
from jobrun.postgres.admin import Admin
from jobrun.postgres.convert import utc
from jobrun.postgres.plans import MAX_NOTIFY_QUEUE_USAGE
from jobrun.postgres.sqlc import jobs as jq

ClaimedRow = jq.ClaimJobsRow | jq.ClaimLimitedJobsRow
"""A claim's row: the job, and its parents' outcomes (migration 0016)."""

log = logging.getLogger("jobrun.postgres.store")  # the name users filter on

LIMITED_QUEUES_TTL = 1.0
"""Seconds a store trusts what it last read about which queues have limits."""
LIMITED_CLAIM_IDLE_SECONDS = 2.0
"""How long a limited claim's transaction may wait for its client's COMMIT
while it holds the queue's limits row before the server ends the session
(idle_in_transaction_session_timeout): the longest a frozen worker can hold
up the other claims of a limited queue. The claim is rolled back, so nothing
is leased to the frozen worker. The server arms that timer only at a Sync,
and the claim is pipelined (its Sync leaves with COMMIT): a worker's round
(``Exchange``) frozen between the lock and COMMIT is held to its
``transaction_timeout`` instead (its call bound, PostgreSQL 17 and later);
a bare ``Store.claim`` of a limited queue is not. A
``transaction_timeout`` of these 2 s would also end the claims waiting
behind it for the lock (the timer counts lock waits, and once set it cannot
be shortened), so it is not used here."""
_LIMITED_CLAIM_IDLE_TIMEOUT = (
    f"SET LOCAL idle_in_transaction_session_timeout = {int(LIMITED_CLAIM_IDLE_SECONDS * 1000)}"
)


class Limits(Admin):
    """The queue-limits half of the Store (see the module docstring)."""

    _limited: dict[tuple[str, ...], tuple[float, dict[str, int | None], frozenset[str]]]
    """What was last read of which queues have limits, per list of queues:
    (until when it is trusted, each one's global concurrency, those whose
    slots a finished job frees)."""

    def _limited_claim(
        self,
        c: psycopg.Connection[Any],
        names: builtins.list[str],
        args: dict[str, Any],
        committing: list[bool],
        *,
        commit_async: bool,
    ) -> Callable[[], Sequence[ClaimedRow]]:
        """Send the rest of a limited claim's transaction, in the pipeline its
        caller opened with BEGIN, and COMMIT; the claim's rows come later.

        A generic plan for the claim (planning it afresh costs more than
        running it), the limits rows' lock, then the claim (a statement of its
        own: its snapshot is taken once the lock is granted), sent deferred
        so that COMMIT leaves with it: one round trip in all. The queue's
        lock is held until COMMIT arrives; a client frozen in between (a
        stopped process, a dead link) must not stall every claim of the
        queue, so the server ends such a transaction (rolling the claim back)
        after a while.
        """
        c.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        c.execute(_LIMITED_CLAIM_IDLE_TIMEOUT)
        self.q.lock_queue_limits(c, queues=names)
        claimed = self.q.claim_limited_jobs_deferred(c, **args, commit_async=commit_async)
        committing[0] = True
        c.execute("COMMIT")
        return claimed

    def _any_limited(self, names: builtins.list[str]) -> bool:
        """Whether a limit applies to one of the queues (cached, see _read_limits)."""
        return bool(self._read_limits(names)[0])

    def _read_limits(
        self, names: builtins.list[str]
    ) -> tuple[dict[str, int | None], frozenset[str]]:
        """The limited queues among ``names``, each with its global concurrency
        (None: not limited that way), and those whose slots a finished job
        frees; read at most every LIMITED_QUEUES_TTL seconds per list of queues."""
        key = tuple(names)
        now = time.monotonic()
        cached = self._limited.get(key)
        if cached is not None and cached[0] > now:
            return cached[1], cached[2]
        rows = self._on_pool_read(lambda c: self.q.limited_queues(c, queues=names))
        limits = {row.queue: row.concurrency for row in rows}
        slots = frozenset(row.queue for row in rows if row.frees_slots)
        if len(self._limited) > 1024:
            self._limited.clear()
        self._limited[key] = (now + LIMITED_QUEUES_TTL, limits, slots)
        return limits, slots

    def queues_limited(self, queues: Sequence[str]) -> bool:
        """Whether a limit applies to one of ``queues``, as this store last read
        it (at most LIMITED_QUEUES_TTL seconds ago): no round trip most times."""
        return bool(self.limited_queues(queues))

    def limited_queues(self, queues: Sequence[str]) -> Mapping[str, int | None]:
        """The limited queues among ``queues``, each with its global
        concurrency limit (None: limited otherwise), as this store last read
        them (at most LIMITED_QUEUES_TTL seconds ago, or since this store last
        changed a limit): no round trip most times."""
        names = [validate.queue_name(name, "queues") for name in queues]
        return self._read_limits(names)[0] if names else {}

    def slot_limited_queues(self, queues: Sequence[str]) -> frozenset[str]:
        """The queues among ``queues`` with a limit whose slots a finished job
        frees (a concurrency limit, global or per key; not a rate), cached like
        :meth:`limited_queues`."""
        names = [validate.queue_name(name, "queues") for name in queues]
        return self._read_limits(names)[1] if names else frozenset()

    def limits_hold_back(self, queues: Sequence[str]) -> float | None:
        """Whether a limit (not a lack of work) holds back ready jobs of ``queues``.

        For a worker whose claim came back short. None: no limit holds work
        back. Otherwise the seconds until a claim may get some: until the
        oldest start leaves a full rate window, or 0 when that cannot be told
        (a slot frees when a job finishes, here or on another worker). Either
        way no wake-up comes, so the worker claims again by itself.
        """
        names = [validate.queue_name(name, "queues") for name in queues]
        if not names or not self._any_limited(names):
            return None
        wait: float | None = self._on_pool_read(lambda c: self.q.limits_hold_back(c, queues=names))
        return None if wait is None else max(float(wait), 0.0)

    def set_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | None = None,
        per_key: int | None = None,
        rate: RateLimit | str | None = None,
    ) -> QueueLimits:
        """Replace every limit of ``queue``; None removes that limit.

        The limits live in the database, so every worker on every host applies
        them to its next claim (within LIMITED_QUEUES_TTL for a queue that had
        none). Exact, because claims of a limited queue take turns on its
        limits row and count with a snapshot taken after the previous claim
        committed:

        - ``concurrency``: never more than this many of the queue's jobs
          leased at once. A lease counts until its job leaves the leased
          state: a killed worker's jobs hold their slots until the reaper
          requeues them after their lease expires.
        - ``per_key``: never more than this many leased at once with the same
          ``concurrency_key`` (jobs without a key count only against
          ``concurrency``). A busy key never holds back the keys behind it.
        - ``rate`` (``RateLimit`` or text such as ``"100/s"``): in any window
          of ``rate.period``, at most ``rate.limit`` jobs started, where a
          start is a claim, timed by the database clock
          (``statement_timestamp()`` once the claim holds the queue's lock).
          A sliding window, not a bucket: no burst above the limit, ever.

        Leases taken before a limit was set or lowered are not revoked; the
        limit holds for every claim after it. Raising or setting a limit wakes
        the queue's workers.
        """
        if isinstance(rate, str):
            rate = RateLimit.parse(rate)
        limits = QueueLimits(queue=queue, concurrency=concurrency, per_key=per_key, rate=rate)
        if concurrency is None and per_key is None and rate is None:
            raise ValidationError(
                "limits",
                "give at least one of concurrency, per_key, rate (clear_queue_limits lifts them)",
            )
        self._on_pool(
            lambda c: self.q.set_queue_limits(
                c,
                queue=limits.queue,
                concurrency=concurrency,
                per_key=per_key,
                rate_limit=None if rate is None else rate.limit,
                rate_period_seconds=None if rate is None else rate.period.total_seconds(),
                channel=self.notify_channel,
                max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
            )
        )
        self._limited.clear()
        return self.queue_limits(limits.queue)

    def change_queue_limits(
        self,
        queue: str,
        *,
        concurrency: int | Keep | None = KEEP,
        per_key: int | Keep | None = KEEP,
        rate: RateLimit | str | Keep | None = KEEP,
    ) -> QueueLimits:
        """Change only the limits named (None removes one); the others stay.

        What ``jobrun queues limit`` does: atomic against another change of
        the same queue (two operators each setting a different limit both
        land). Removing the last limit lifts them all. The guarantees are
        :meth:`set_queue_limits`'s.
        """
        validate.queue_name(queue)
        if isinstance(rate, str):
            rate = RateLimit.parse(rate)
        QueueLimits(
            queue=queue,
            concurrency=None if isinstance(concurrency, Keep) else concurrency,
            per_key=None if isinstance(per_key, Keep) else per_key,
            rate=None if isinstance(rate, Keep) else rate,
        )  # every value checked before any SQL runs
        if all(isinstance(v, Keep) for v in (concurrency, per_key, rate)):
            return self.queue_limits(queue)
        if any(v is not None and not isinstance(v, Keep) for v in (concurrency, per_key, rate)):
            # A limit is set, so the row can never be left empty: one upsert.
            rate_value = None if isinstance(rate, Keep) else rate
            self._on_pool(
                lambda c: self.q.change_queue_limits(
                    c,
                    queue=queue,
                    concurrency=None if isinstance(concurrency, Keep) else concurrency,
                    per_key=None if isinstance(per_key, Keep) else per_key,
                    rate_limit=None if rate_value is None else rate_value.limit,
                    rate_period_seconds=None
                    if rate_value is None
                    else rate_value.period.total_seconds(),
                    keep_concurrency=isinstance(concurrency, Keep),
                    keep_per_key=isinstance(per_key, Keep),
                    keep_rate=isinstance(rate, Keep),
                    channel=self.notify_channel,
                    max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                )
            )
        else:
            # Only removals: rewrite (or delete) the row while holding it.
            def remove(c: psycopg.Connection[Any]) -> None:
                row = self.q.lock_queue_limits_row(c, queue=queue)
                if row is None:
                    return
                left_concurrency = None if concurrency is None else row.concurrency
                left_per_key = None if per_key is None else row.per_key
                left_rate = None if rate is None else row.rate_limit
                left_period = None if rate is None else row.rate_period_seconds
                if left_concurrency is None and left_per_key is None and left_rate is None:
                    self.q.delete_queue_limits(
                        c,
                        queue=queue,
                        channel=self.notify_channel,
                        max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                    )
                else:
                    self.q.set_queue_limits(
                        c,
                        queue=queue,
                        concurrency=left_concurrency,
                        per_key=left_per_key,
                        rate_limit=left_rate,
                        rate_period_seconds=left_period,
                        channel=self.notify_channel,
                        max_notify_usage=MAX_NOTIFY_QUEUE_USAGE,
                    )

            self._with_tx(remove)
        self._limited.clear()
        return self.queue_limits(queue)

    def clear_queue_limits(self, queue: str) -> bool:
        """Lift every limit of ``queue``; False when it had none."""
        validate.queue_name(queue)
        removed = self._on_pool(
            lambda c: self.q.delete_queue_limits(
                c, queue=queue, channel=self.notify_channel, max_notify_usage=MAX_NOTIFY_QUEUE_USAGE
            )
        )
        self._limited.clear()
        return bool(removed)

    def queue_limits(self, queue: str) -> QueueLimits:
        """The queue's limits and what they hold now (all None: no limits)."""
        validate.queue_name(queue)
        found = [lim for lim in self.all_queue_limits() if lim.queue == queue]
        return found[0] if found else QueueLimits(queue=queue)

    def all_queue_limits(self) -> builtins.list[QueueLimits]:
        """Every limited queue's limits and what they hold now, by queue name.

        A row no jobrun call could have written (a queue name or a limit out
        of range, put there by hand) is left out with a WARNING, rather than
        making every reader fail: no worker can claim such a queue anyway.
        """
        found: builtins.list[QueueLimits] = []
        for r in self._on_pool_read(self.q.list_queue_limits):
            try:
                found.append(
                    QueueLimits(
                        queue=r.queue,
                        concurrency=r.concurrency,
                        per_key=r.per_key,
                        rate=None
                        if r.rate_limit is None or r.rate_period_seconds is None
                        else RateLimit(r.rate_limit, dt.timedelta(seconds=r.rate_period_seconds)),
                        leased=r.leased or 0,
                        started_in_window=r.started_in_window or 0,
                        updated_at=utc(r.updated_at),
                    )
                )
            except ValidationError as exc:
                log.warning("ignoring the queue_limits row of queue %r: %s", r.queue, exc)
        return found
