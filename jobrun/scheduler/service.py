"""The scheduler service: one elected leader materialises cron, reaps, and prunes.

Every instance runs the same loop; only the one holding the Locker acts::

              try_acquire() ok                 held() False (connection gone)
    follower ──────────────────▶ leader ───────────────────────────────────▶ follower
        ▲                          │ each tick, held(force) before acting:
        └──────── release() ───────┘   materialise due schedules
                                        reap_expired   (every reap_interval)
                                        purge / prune  (every retention_interval)

The leader checks that it still holds the lock before every action, so a
leader whose connection died acts at most once more, and even then the
durable guards (the occurrence's idempotency key, the reaper's re-checked
lease) make that action harmless. A Locker with a term (the lease-row
leader, :mod:`jobrun.postgres.leader`) fences every action as well: the
leader acts through ``store.fenced(term)``, whose transactions refuse to
run (``LeaderLost``) once the term is over, so no action of an old term
can commit beside the next one. Every many-row call works in bounded
batches and is repeated until less than a batch comes back.

Time arguments are the database clock (``store.now()``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time

from jobrun.job import outage, validate
from jobrun.job.errors import JobrunError, LeaderLost, ValidationError
from jobrun.job.ports import Locker, Store
from jobrun.job.service import LoopThread

log = logging.getLogger("jobrun.scheduler")

DEFAULT_TICK_INTERVAL = dt.timedelta(seconds=1)
DEFAULT_REAP_INTERVAL = dt.timedelta(seconds=5)
DEFAULT_RETENTION_INTERVAL = dt.timedelta(minutes=1)
DEFAULT_FINISHED_RETENTION = dt.timedelta(days=7)
DEFAULT_EVENTS_RETENTION = dt.timedelta(days=7)
DEFAULT_BATCH = 1000
MAX_ROUNDS = 100  # per action and tick: a huge backlog is worked off over several ticks


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    """How often the leader does what, and how long finished jobs and events are kept.

    A retention of None keeps them forever.
    """

    tick_interval: dt.timedelta = DEFAULT_TICK_INTERVAL
    reap_interval: dt.timedelta = DEFAULT_REAP_INTERVAL
    retention_interval: dt.timedelta = DEFAULT_RETENTION_INTERVAL
    finished_retention: dt.timedelta | None = DEFAULT_FINISHED_RETENTION
    events_retention: dt.timedelta | None = DEFAULT_EVENTS_RETENTION
    batch: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        for name in ("tick_interval", "reap_interval", "retention_interval"):
            validate.positive_duration(name, getattr(self, name))
        for name in ("finished_retention", "events_retention"):
            if getattr(self, name) is not None:
                validate.positive_duration(name, getattr(self, name))
        b = self.batch
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 100_000:
            raise ValidationError("batch", "must be an int between 1 and 100000")


@dataclasses.dataclass
class TickReport:
    """What one leader tick did (for logs and tests)."""

    leader: bool = False
    materialized: int = 0
    reaped: int = 0
    purged: int = 0
    pruned: int = 0


class SchedulerService(LoopThread):
    """Leader election plus the leader's periodic work, on the ``jobrun-scheduler`` thread.

    ``start``/``stop`` are idempotent; ``with service:`` starts and stops it.
    """

    def __init__(
        self,
        store: Store,
        locker: Locker,
        config: SchedulerConfig | None = None,
        *,
        worker_id: str | None = None,
    ) -> None:
        super().__init__("jobrun-scheduler")
        self.store = store
        self.locker = locker
        self.worker_id = worker_id
        """The worker of this process (its owner id), shown as the leader in the
        workers' registry while this scheduler leads; None: no worker here."""
        self._marked = False
        self._acting = store
        """The store leader actions go through: fenced by the term, when the locker has one."""
        self.config = config or SchedulerConfig()
        self._leader = False
        self._last_reap = float("-inf")
        self._last_retention = float("-inf")
        self.totals = TickReport()

    @property
    def is_leader(self) -> bool:
        return self._leader

    @property
    def dead_threads(self) -> list[str]:
        """The loop's thread name when it died while the service runs (empty when healthy).

        Empty before start() and once stop() began, like ``Worker.dead_threads``:
        for health checks (:mod:`jobrun.observe.health`).
        """
        return [self.thread.name] if self.dead else []

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop ticking (waiting up to ``timeout`` seconds), step down, close the locker."""
        ended = super().stop(timeout)
        self._step_down("stopping", expected=True)
        self.locker.close()
        return ended

    def loop(self) -> None:
        interval = self.config.tick_interval.total_seconds()
        while not self.stopping.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("scheduler tick failed")
            self.stopping.wait(interval)

    def _step_down(self, why: str, *, expected: bool = False) -> None:
        if self._leader:
            (log.info if expected else log.warning)("scheduler: no longer the leader (%s)", why)
        self._leader = False
        self._marked = False

    def _mark_leader(self) -> None:
        """Name this process's worker as the leader in the registry: the session
        holding the advisory lock (its backend pid) is noted on the worker's
        row; a lease-row leader's holder is the worker's id already. Tried
        again next tick when the database does not answer, or when the
        worker's row is not there yet (elected before the worker's
        registration reached the database: the two start side by side)."""
        if self.worker_id is None:
            self._marked = True
            return
        pid = getattr(self.locker, "backend_pid", None)
        try:
            self._marked = self.store.mark_leader(
                self.worker_id, pid if isinstance(pid, int) else None
            )
        except JobrunError as exc:
            outage.of(self.store).failed(exc, "scheduler: naming the leader's worker")

    def _still_leader(self) -> bool:
        if not self.locker.held(force=True):
            self._step_down("lock lost")
            return False
        return True

    def run_once(self) -> TickReport:
        """One tick: (re)elect, then do whatever is due. Tests call this instead of sleeping."""
        report = TickReport()
        if not self._leader:
            if not self.locker.try_acquire():
                return report
            self._leader = True
            term = self.locker.term()
            self._acting = self.store if term is None else self.store.fenced(term)
            log.info("scheduler: elected leader" + ("" if term is None else f" (term {term.term})"))
        if not self._still_leader():
            return report
        report.leader = True
        if not self._marked:
            self._mark_leader()
        try:
            report.materialized = self._materialize()
            now_mono = time.monotonic()
            reap_due = now_mono - self._last_reap >= self.config.reap_interval.total_seconds()
            if reap_due and self._still_leader():
                report.reaped = self._reap()
                self._last_reap = now_mono
            retention_interval = self.config.retention_interval.total_seconds()
            if now_mono - self._last_retention >= retention_interval and self._still_leader():
                report.purged, report.pruned = self._retention()
                self._last_retention = now_mono
        except LeaderLost as exc:
            self._step_down(str(exc))
        except JobrunError as exc:
            # Retried next tick; an outage is said once (jobrun.job.outage).
            outage.of(self.store).failed(exc, "scheduler tick")
        for field in ("materialized", "reaped", "purged", "pruned"):
            setattr(self.totals, field, getattr(self.totals, field) + getattr(report, field))
        return report

    def _materialize(self) -> int:
        count = 0
        store = self._acting
        for _ in range(MAX_ROUNDS):
            now = store.now()
            due = store.due_schedules(now, self.config.batch)
            for schedule in due:
                if not self._still_leader():
                    return count
                try:
                    if store.materialize(schedule, now) is not None:
                        count += 1
                except LeaderLost:
                    raise
                except JobrunError as exc:
                    log.warning("scheduler: schedule %s not materialised: %s", schedule.id, exc)
            if len(due) < self.config.batch:
                break
        return count

    def _reap(self) -> int:
        total = 0
        for _ in range(MAX_ROUNDS):
            result = self._acting.reap_expired(self._acting.now(), self.config.batch)
            total += result.total
            if result.total:
                log.info(
                    "reaped %d expired lease(s): %d requeued, %d dead, %d cancelled",
                    result.total,
                    len(result.requeued),
                    len(result.dead),
                    len(result.cancelled),
                )
            if result.total < self.config.batch or not self._still_leader():
                break
        return total

    def _retention(self) -> tuple[int, int]:
        purged = pruned = 0
        if self.config.finished_retention is not None:
            for _ in range(MAX_ROUNDS):
                n = self._acting.purge(self.config.finished_retention, self.config.batch)
                purged += n
                if n < self.config.batch or not self._still_leader():
                    break
        if self.config.events_retention is not None:
            for _ in range(MAX_ROUNDS):
                n = self._acting.prune_events(self.config.events_retention, self.config.batch)
                pruned += n
                if n < self.config.batch or not self._still_leader():
                    break
        return purged, pruned
