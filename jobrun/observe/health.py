"""Liveness and readiness of a jobrun process, for ``/healthz`` and ``/readyz`` (stdlib only).

::

    health = Health(store)                                  # readiness asks this Store
    worker = Worker(store, registry, config, hooks=[health])
    worker.start()
    health.watch_worker(worker)
    ObserveServer(health, port=8080).start()                # jobrun.observe.http

:class:`jobrun.Runtime` does all of this when ``JOBRUN_HEALTH_PORT`` or
``JOBRUN_METRICS_PORT`` is set.

**Liveness** (``/healthz``; an orchestrator restarts the process when it
fails) asks whether the process still does its job, without a query of
its own, from what the worker already does:

- the process answers (the server runs on a thread of its own);
- none of the worker's threads died (``Worker.dead_threads``);
- the worker had a successful claim or heartbeat round trip within
  ``stale_after`` seconds. It learns them as a :class:`WorkerHooks`
  (``store_call``). An idle worker claims at least once per poll interval and
  a busy one heartbeats its jobs every heartbeat interval, so a healthy worker
  refreshes this several times per lease TTL; one whose loops are wedged, or
  whose every attempt fails (the database is gone, its connections are killed
  as fast as they come back), goes stale. The default bound is twice the lease
  TTL (and at least three poll intervals): after one lease TTL without a
  heartbeat the worker's leases are lost anyway, and the second one leaves
  room for a slow but working database. A database outage makes every worker
  unhealthy once it lasts longer than that: restarting them then is harmless,
  and it is what brings back a worker that cannot recover on its own;
- a scheduler in the process (:meth:`watch_scheduler`) still has its loop
  thread. That is all a scheduler-only process (``jobrun scheduler``) is judged
  on: its loop catches every error and tries again each tick, so the thread
  being alive is what "live" means for it, and an unreachable database shows
  in readiness instead.

While the process shuts down (:meth:`mark_stopping`) liveness stays ok: a
worker draining its last jobs claims nothing, and must not be killed for it.

**Readiness** (``/readyz``; traffic and rollouts wait for it) asks the
database: ``Store.check_schema()`` is one cheap query that proves a
connection can be had and that the schema is at this jobrun's version
(``jobrun migrate`` was run). One check runs at a time however many probes
arrive; a probe waits for it at most ``check_timeout`` seconds and is then
told the database did not answer; while the database is known to be away
(its outage reporter, :mod:`jobrun.job.outage`), a probe is told so at once,
with since when. Readiness fails while the process stops.

Each answer is a :class:`Verdict`: ok, or the one-line reasons of what failed.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
import time
from typing import TYPE_CHECKING, Protocol

from jobrun.job.errors import SchemaMismatch, ValidationError
from jobrun.job.outage import Outage
from jobrun.job.validate import redact
from jobrun.worker.hooks import StoreCall, WorkerHooks

if TYPE_CHECKING:
    from jobrun.scheduler.service import SchedulerService
    from jobrun.worker.worker import Worker

__all__ = ["DEFAULT_CHECK_TIMEOUT", "Health", "SchemaCheck", "Verdict", "default_stale_after"]

DEFAULT_CHECK_TIMEOUT = 2.0
"""Seconds a readiness probe waits for the database check."""

_ERROR_CHARS = 200
_OUTAGE_POLL = 0.05
"""Seconds between two looks at the outage reporter while a readiness check waits."""
_LIVE_OPERATIONS = ("claim", "heartbeat")


class SchemaCheck(Protocol):
    """What readiness needs of a Store (``jobrun.postgres.Store`` is one)."""

    def check_schema(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """ok, or why not: each failure a short line naming what failed."""

    failures: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return "ok" if self.ok else "; ".join(self.failures)


def default_stale_after(lease_ttl: dt.timedelta, poll_interval: dt.timedelta) -> float:
    """Twice the lease TTL, and at least three poll intervals (see the module docstring)."""
    return max(2 * lease_ttl.total_seconds(), 3 * poll_interval.total_seconds())


def _seconds(value: float | dt.timedelta | None, name: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValidationError(name, "must be a positive number of seconds (or a timedelta)")
    return float(value)


def _describe(error: BaseException) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    if len(text) > _ERROR_CHARS:
        text = text[: _ERROR_CHARS - 3] + "..."
    return redact(text)


class _Check:
    """One readiness check in flight, shared by every probe that arrives meanwhile."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.failure: str | None = None


class Health(WorkerHooks):
    """Judges liveness and readiness (see the module docstring).

    ``store`` is what readiness asks (None: readiness checks no database).
    ``stale_after`` (seconds or a timedelta) bounds the time since the last
    successful claim or heartbeat; None derives it from the watched worker's
    configuration (:func:`default_stale_after`). Pass it to the worker as a
    hook, then :meth:`watch_worker` once the worker starts.
    """

    def __init__(
        self,
        store: SchemaCheck | None = None,
        *,
        stale_after: float | dt.timedelta | None = None,
        check_timeout: float = DEFAULT_CHECK_TIMEOUT,
    ) -> None:
        self.store = store
        self._stale_after = _seconds(stale_after, "stale_after")
        timeout = _seconds(check_timeout, "check_timeout")
        assert timeout is not None
        self.check_timeout = timeout
        self._lock = threading.Lock()
        self._worker: Worker | None = None
        self._scheduler: SchedulerService | None = None
        self._watched_at: float | None = None
        self._last_ok: dict[str, float] = {}
        self._last_error: dict[str, str] = {}
        self._stopping = False
        self._check: _Check | None = None

    # -- what it watches ---------------------------------------------------------

    def watch_worker(self, worker: Worker) -> None:
        """Judge ``worker`` from now on: its threads, and its round trips since now at the latest.

        Call it when the worker starts: a worker watched long before it
        starts is stale at once.
        """
        with self._lock:
            self._worker = worker
            self._watched_at = time.monotonic()

    def watch_scheduler(self, scheduler: SchedulerService) -> None:
        """Judge ``scheduler``'s loop thread too."""
        self._scheduler = scheduler

    def mark_stopping(self) -> None:
        """The process is shutting down: readiness fails, liveness stops judging the loops."""
        self._stopping = True

    @property
    def stale_after(self) -> float | None:
        """The liveness bound in seconds (None until a worker is watched, unless given)."""
        if self._stale_after is not None:
            return self._stale_after
        worker = self._worker
        if worker is None:
            return None
        return default_stale_after(worker.config.lease_ttl, worker.config.poll_interval)

    def seconds_since(self, operation: str) -> float | None:
        """Seconds since the last successful ``claim`` or ``heartbeat`` (None: none yet)."""
        with self._lock:
            at = self._last_ok.get(operation)
        return None if at is None else time.monotonic() - at

    # -- the hook ------------------------------------------------------------------

    def store_call(self, call: StoreCall) -> None:
        if call.operation not in _LIVE_OPERATIONS:
            return
        now = time.monotonic()
        with self._lock:
            if call.error is None:
                self._last_ok[call.operation] = now
                self._last_error.pop(call.operation, None)
            else:
                self._last_error[call.operation] = _describe(call.error)

    # -- the verdicts --------------------------------------------------------------

    def liveness(self) -> Verdict:
        """Whether the process still does its job (``/healthz``)."""
        if self._stopping:
            return Verdict()
        failures: list[str] = []
        worker = self._worker
        if worker is not None:
            dead = worker.dead_threads
            if dead:
                failures.append(f"worker threads died: {', '.join(dead)}")
            stale = self._staleness()
            if stale is not None:
                failures.append(stale)
        scheduler = self._scheduler
        if scheduler is not None:
            dead = scheduler.dead_threads
            if dead:
                failures.append(f"scheduler thread died: {', '.join(dead)}")
        return Verdict(tuple(failures))

    def readiness(self) -> Verdict:
        """Whether the database answers and holds the schema this jobrun needs (``/readyz``)."""
        if self._stopping:
            return Verdict(("stopping",))
        if self.store is None:
            return Verdict()
        failure = self._check_database()
        return Verdict(() if failure is None else (failure,))

    def _staleness(self) -> str | None:
        bound = self.stale_after
        now = time.monotonic()
        with self._lock:
            if self._watched_at is None or bound is None:
                return None
            last = {op: self._last_ok.get(op) for op in _LIVE_OPERATIONS}
            errors = dict(self._last_error)
            since = max([self._watched_at, *(t for t in last.values() if t is not None)])
        silent = now - since
        if silent <= bound:
            return None
        parts = []
        for op in _LIVE_OPERATIONS:
            at = last[op]
            seen = "never" if at is None else f"{now - at:.1f} s ago"
            parts.append(f"last {op} {seen}" + (f" ({errors[op]})" if op in errors else ""))
        return (
            f"no successful claim or heartbeat for {silent:.1f} s (bound {bound:g} s): "
            + ", ".join(parts)
        )

    def _check_database(self) -> str | None:
        store = self.store
        assert store is not None
        with self._lock:
            check = self._check
            if check is None:
                check = self._check = _Check()
                threading.Thread(
                    target=self._run_check,
                    args=(store, check),
                    name="jobrun-readiness",
                    daemon=True,
                ).start()
        # While the database is known to be away (its outage reporter, fed by the
        # pools' connection attempts and the loops' calls), say so at once: the
        # check still runs, and its connection request is what notices the return.
        reporter = getattr(store, "outage", None)
        deadline = time.monotonic() + self.check_timeout
        while not check.done.wait(min(_OUTAGE_POLL, max(0.0, deadline - time.monotonic()))):
            why = reporter.describe() if isinstance(reporter, Outage) else None
            if why is not None:
                return f"database: {why}"
            if time.monotonic() >= deadline:
                return f"database: no answer within {self.check_timeout:g} s"
        return check.failure

    def _run_check(self, store: SchemaCheck, check: _Check) -> None:
        try:
            store.check_schema()
        except SchemaMismatch as exc:
            check.failure = f"schema: {exc}"
        except Exception as exc:  # noqa: BLE001 - every failure is the verdict, never a crash
            check.failure = f"database: {_describe(exc)}"
        finally:
            with self._lock:
                if self._check is check:
                    self._check = None
            check.done.set()
