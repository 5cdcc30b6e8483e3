"""What the worker records and reports of each job it ran.

A job's outcome goes three ways at once: to the database (a failure, a
release, a snooze: written here with their retries; a success by the
completer), to the console (one line per outcome, its fields as the record's
extra) and to the hooks (``job_finished``, ``store_call``), and it is
counted in :attr:`Worker.stats`. The executor, the completer and the claimer
all end jobs, so they share this one recorder instead of each wording,
counting and reporting outcomes its own way.

A database fault while recording is retried a few times; past that (or on a
lost lease) the claim is given up: its lease expires and the reaper requeues
it. An unknown job type is *released*, not failed (a worker that knows the
type may still be rolling out), counted in the job's ``releases``; see
docs/architecture.md.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from jobrun.job import outage
from jobrun.job.errors import DatabaseError, JobrunError, LeaseLost
from jobrun.job.model import CompleteManyResult, Job, State
from jobrun.job.ports import Store
from jobrun.worker import logs, text
from jobrun.worker.config import WorkerConfig
from jobrun.worker.hooks import HookRunner, JobOutcome, OutcomeKind, StoreCall, StoreOperation
from jobrun.worker.leases import Finished, Leases
from jobrun.worker.logs import job_fields
from jobrun.worker.registry import Registration, Registry, Snooze

log = logging.getLogger("jobrun.worker")

DB_RETRY_BACKOFF = (0.05, 0.2, 0.5, 1.0, 2.0)
"""Pauses between tries of a write a database fault failed."""

_T = TypeVar("_T")


class Outcomes:
    """Records, logs, counts and reports job outcomes and store calls for one worker."""

    def __init__(
        self,
        *,
        store: Store,
        registry: Registry,
        config: WorkerConfig,
        owner: str,
        leases: Leases,
        hooks: HookRunner | None,
        hard_stop: threading.Event,
    ) -> None:
        self.store = store
        self.registry = registry
        self.config = config
        self.owner = owner
        self._leases = leases
        self.hooks = hooks
        self._hard_stop = hard_stop
        self._lock = threading.Lock()
        self.stats = {
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "lease_lost": 0,
            "adopted": 0,
            "released": 0,
            "snoozed": 0,
            "parked": 0,  # in a durable wait (jobrun.worker.waits)
        }
        self.success_level = logs.success_level(config.success_log_level)
        self._unknown_types: set[str] = set()  # warned about once each

    def call(
        self,
        operation: StoreOperation,
        jobs: int | Callable[[_T], int],
        call: Callable[[], _T],
        queues: tuple[str, ...] = (),
        completed: int = 0,
    ) -> _T:
        """``call()``, reported to the hooks as one round trip of ``operation``.

        ``jobs``: how many jobs it carries, or how to count them in its answer
        (0 when it raised); ``completed``: the successes a claim's round
        records along the way. A success is one for the outage reporter too.
        """
        hooks = self.hooks
        reporter = outage.of(self.store)
        started = reporter.mark()
        if hooks is None or not hooks.calls:
            answer = call()
            reporter.ok(started)
            return answer
        began = time.perf_counter()
        try:
            answer = call()
        except BaseException as exc:
            carried = 0 if callable(jobs) else jobs
            hooks.store_call(
                StoreCall(operation, time.perf_counter() - began, carried, exc, queues, 0)
            )
            raise
        reporter.ok(started)
        carried = jobs(answer) if callable(jobs) else jobs
        hooks.store_call(
            StoreCall(operation, time.perf_counter() - began, carried, None, queues, completed)
        )
        return answer

    def count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.stats[outcome] += n

    def finished(
        self,
        kind: OutcomeKind,
        job: Job,
        *,
        duration: float | None = None,
        error: BaseException | None = None,
        error_text: str | None = None,
        next_run_at: dt.datetime | None = None,
        result: Any = None,
    ) -> None:
        hooks = self.hooks
        if hooks is not None and hooks.finished:
            hooks.job_finished(
                JobOutcome(kind, job, duration, error, error_text, next_run_at, result)
            )

    def finished_all(self, kind: OutcomeKind, batch: Sequence[Finished]) -> None:
        if self.hooks is not None:
            for done in batch:
                self.finished(kind, done.job, duration=done.duration)

    def note(self, level: int, job: Job, message: str) -> None:
        """A line about ``job`` that is not its outcome."""
        if log.isEnabledFor(level):
            extra = job_fields(job)
            extra["owner"] = self.owner
            log.log(level, "%s", message, extra=extra)

    def job_log(
        self,
        level: int,
        job: Job,
        outcome: str,
        message: str,
        fields: Mapping[str, Any] | None = None,
        *,
        exc_info: BaseException | None = None,
    ) -> None:
        """One line about ``job``, its fields (and ``outcome``) as the record's extra."""
        if not log.isEnabledFor(level):
            return
        extra = job_fields(job)
        extra["owner"] = self.owner
        extra["outcome"] = outcome
        if fields:
            extra.update(fields)
        log.log(level, "%s", message, extra=extra, exc_info=exc_info)

    def record(
        self,
        job: Job,
        write: Callable[[], Job],
        what: str,
        *,
        duration: float | None = None,
        handler_error: BaseException | None = None,
    ) -> Job | None:
        """Write a job's outcome (a failure, a release), retrying database faults.

        None when it could not be written: the lease was lost (another owner
        has the job), or the database kept failing (the claim is abandoned:
        its lease expires and the reaper requeues it). Both are logged.
        """
        for attempt in range(len(DB_RETRY_BACKOFF) + 1):
            try:
                return write()
            except LeaseLost:
                self.count("lease_lost", 1)
                self.job_log(
                    logging.WARNING,
                    job,
                    "lease_lost",
                    f"lease lost before its {what} was recorded: another worker owns the job now",
                )
                if self.hooks is not None:
                    self.finished("lease_lost", job, duration=duration, error=handler_error)
                return None
            except JobrunError as exc:
                if (
                    db_fault(exc)
                    and attempt < len(DB_RETRY_BACKOFF)
                    and not self._hard_stop.is_set()
                ):
                    time.sleep(DB_RETRY_BACKOFF[attempt])
                    continue
                self.job_log(
                    logging.ERROR,
                    job,
                    "unrecorded",
                    f"could not record the {what} ({exc}); its lease will expire and "
                    "the reaper will requeue it",
                )
                self._leases.abandon([job])
                if self.hooks is not None:  # its lease will expire: lost to this worker
                    self.finished("lease_lost", job, duration=duration, error=handler_error)
                return None
        return None  # pragma: no cover - the loop always returns

    def fail(
        self,
        job: Job,
        error: str,
        *,
        permanent: bool = False,
        exc: BaseException | None = None,
        started: float | None = None,
        at_once: bool = False,
    ) -> None:
        """Record a failed attempt (retried, dead or cancelled) and log its outcome.

        ``at_once``: retried now, without the job's backoff (not the job's fault).
        """
        duration = None if started is None else time.monotonic() - started

        def write() -> Job:
            retry_at = (
                None if permanent or at_once else self.store.now() + job.backoff.delay(job.attempts)
            )
            return self.call(
                "fail", 1, lambda: self.store.fail(job, error, retry_at, permanent=permanent)
            )

        failed = self.record(job, write, "failure", duration=duration, handler_error=exc)
        if failed is None:
            return
        self.count("cancelled" if failed.state is State.CANCELLED else "failed")
        if self.hooks is not None:
            kind: OutcomeKind = (
                "cancelled"
                if failed.state is State.CANCELLED
                else "dead"
                if failed.state is State.DEAD
                else "failed"
            )
            self.finished(
                kind,
                job,
                duration=duration,
                error=exc,
                error_text=error,
                next_run_at=failed.run_at if kind == "failed" else None,
            )
        summary = error.split("\n", 1)[0]
        fields: dict[str, Any] = {"error": summary}
        if duration is not None:
            fields["duration_ms"] = round(duration * 1000, 3)
        took = "" if duration is None else f" in {text.ms(duration)}"
        if failed.state is State.CANCELLED:
            how = "it stopped" if summary.startswith("cancelled (") else summary
            message = f"cancelled{took}: cancel was requested ({how})"
            self.job_log(logging.INFO, job, "cancelled", message, fields)
            return
        # The traceback goes with the line when DEBUG is on.
        exc_info = exc if exc is not None and log.isEnabledFor(logging.DEBUG) else None
        if failed.state is State.DEAD:
            why = (
                "permanent failure"
                if permanent
                else f"no attempts left ({job.attempts} of {job.max_attempts})"
            )
            self.job_log(
                logging.WARNING,
                job,
                "dead",
                f"dead{took} ({why}): {summary}",
                fields,
                exc_info=exc_info,
            )
            return
        fields["next_run_at"] = text.iso(failed.run_at)
        wait = (failed.run_at - failed.updated_at).total_seconds()
        self.job_log(
            logging.INFO,
            job,
            "failed",
            f"failed{took}: {summary}; next attempt ({job.attempts + 1} of "
            f"{job.max_attempts}) at {text.iso(failed.run_at)} (in {text.seconds(wait)})",
            fields,
            exc_info=exc_info,
        )

    def unknown_type(self, job: Job) -> None:
        """No handler for the job's type: release it, not counting the attempt, up to a
        limit; then it is dead.

        Not failed: that would burn its attempts while a worker that knows the
        type rolls out. The release count is the job's own, across workers
        (``Job.releases``, counted by the store's release); a retry from a
        terminal state starts it again.
        """
        known = ", ".join(self.registry.types) or "none"
        limit = self.config.unknown_type_releases
        release = job.releases + 1
        if release > limit:
            self.fail(
                job,
                f"no handler for job type {job.type!r} in any worker that claimed it "
                f"({limit} release(s)); dead (jobrun retry {job.id} runs it again); "
                f"worker {self.owner} knows: {known}",
                permanent=True,
            )
            return
        delay = self.config.unknown_type_delay_for(release)
        reason = (
            f"no handler for job type {job.type!r} (release {release} of {limit}, "
            f"attempt not counted); worker {self.owner} knows: {known}"
        )
        released = self.record(job, lambda: self.store.release(job, delay, reason), "release")
        if released is None:
            return
        if released.state is State.CANCELLED:
            self.count("cancelled")
            if self.hooks is not None:
                self.finished("cancelled", job, error_text=reason)
            self.job_log(
                logging.INFO, job, "cancelled", "cancelled (requested) instead of released"
            )
            return
        self.count("released")
        if self.hooks is not None:
            self.finished("released", job, error_text=reason, next_run_at=released.run_at)
        with self._lock:
            first = job.type not in self._unknown_types
            self._unknown_types.add(job.type)
        fields = {"next_run_at": text.iso(released.run_at), "error": reason}
        if first:
            self.job_log(
                logging.WARNING,
                job,
                "released",
                f"no handler for job type {job.type!r} in this worker (it knows: {known}); "
                f"released back to its queue for {text.seconds(delay.total_seconds())}, "
                f"attempt not counted (release {release} of {limit}, then dead). "
                "A worker that knows the type may still be rolling out; otherwise check "
                "its spelling. (Said once per type; later releases are DEBUG lines.)",
                fields,
            )
        elif log.isEnabledFor(logging.DEBUG):
            self.job_log(
                logging.DEBUG,
                job,
                "released",
                f"released again (no handler; release {release} of {limit}), "
                f"next try at {text.iso(released.run_at)}",
                fields,
            )

    def snooze(self, job: Job, registration: Registration, snooze: Snooze, started: float) -> None:
        """The handler snoozed: queue the job again after the delay, its attempt
        given back (snoozing never burns ``max_attempts``), or fail the attempt
        past ``max_snoozes``, so that a job that snoozes forever still ends."""
        limit = registration.max_snoozes
        if limit is not None and job.snoozes >= limit:
            self.fail(
                job,
                f"snoozed more than {limit} times (max_snoozes={limit} for {job.type!r}): "
                f"this snooze ({snooze}) counts as a failed attempt",
                exc=snooze,
                started=started,
            )
            return
        duration = time.monotonic() - started
        delay = snooze.delay
        seconds = delay.total_seconds()
        count = job.snoozes + 1
        of = "" if limit is None else f" of {limit}"
        reason = (
            f"snoozed by its handler for {seconds:g} s (snooze {count}{of}, attempt not counted)"
        )
        released = self.record(
            job,
            lambda: self.store.release(job, delay, reason, snooze=True),
            "snooze",
            duration=duration,
        )
        if released is None:
            return
        fields: dict[str, Any] = {"duration_ms": round(duration * 1000, 3)}
        if released.state is State.CANCELLED:
            self.count("cancelled")
            if self.hooks is not None:
                self.finished("cancelled", job, duration=duration, error_text=reason)
            self.job_log(
                logging.INFO,
                job,
                "cancelled",
                f"cancelled in {text.ms(duration)}: cancel was requested (it wins over the "
                "handler's snooze)",
                fields,
            )
            return
        self.count("snoozed")
        if self.hooks is not None:
            self.finished(
                "snoozed", job, duration=duration, error_text=reason, next_run_at=released.run_at
            )
        fields.update(
            next_run_at=text.iso(released.run_at), delay_seconds=seconds, snoozes=released.snoozes
        )
        self.job_log(
            logging.INFO,
            job,
            "snoozed",
            f"snoozed for {seconds:g} s after {text.ms(duration)} (snooze {count}{of}, attempt not "
            f"counted); next run at {text.iso(released.run_at)}",
            fields,
        )

    def account(self, result: CompleteManyResult | None, batch: Sequence[Finished]) -> None:
        """Count a completion's outcomes and log one line per job.

        The success lines cost one ``isEnabledFor`` check per batch when
        their level is off (the default: DEBUG).
        """
        if result is None:
            return
        self.count("succeeded", len(result.completed))
        self.count("cancelled", len(result.cancelled))
        self.count("lease_lost", len(result.lease_lost))
        if self.hooks is not None and self.hooks.finished:
            for done in batch:
                job_id = done.job.id
                kind: OutcomeKind | None = (
                    "succeeded"
                    if job_id in result.completed
                    else "cancelled"
                    if job_id in result.cancelled
                    else "lease_lost"
                    if job_id in result.lease_lost
                    else None  # a failed commit callable: reported by _fail
                )
                if kind is not None:
                    self.finished(
                        kind,
                        done.job,
                        duration=done.duration,
                        result=done.result.value if kind == "succeeded" and done.result else None,
                    )
        level = self.success_level
        if result.completed and log.isEnabledFor(level):
            for done in batch:
                if done.job.id in result.completed:
                    stored = "" if done.result is None else ", result stored"
                    self.job_log(
                        level,
                        done.job,
                        "succeeded",
                        f"succeeded in {text.ms(done.duration)}{stored}",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )
        if result.cancelled or result.lease_lost:
            for done in batch:
                if done.job.id in result.cancelled:
                    self.job_log(
                        logging.INFO,
                        done.job,
                        "cancelled",
                        f"cancelled: its handler returned in {text.ms(done.duration)} but cancel "
                        "was requested first (cancel wins)",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )
                elif done.job.id in result.lease_lost:
                    self.job_log(
                        logging.WARNING,
                        done.job,
                        "lease_lost",
                        f"lease lost before its success was recorded (the handler ran "
                        f"{text.ms(done.duration)}): another worker owns the job now and may run "
                        "it again",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )

    def unrecorded(self, job: Job, exc: BaseException) -> None:
        extra = {**job_fields(job), "owner": self.owner, "outcome": "unrecorded"}
        log.error(
            "unexpected error running the job; its lease expires",
            exc_info=exc,
            extra=extra,
        )
        self._leases.abandon([job])
        self.finished("lease_lost", job, error=exc)  # lost to this worker


def db_fault(exc: JobrunError) -> bool:
    """A database fault (retry later), as opposed to a verdict like LeaseLost."""
    return isinstance(exc, DatabaseError)


def let_go(error: BaseException | None) -> None:
    """Free what a recorded exception holds: the locals of the finished frames
    its traceback (and those of its cause and context) passed through.

    Called once the outcome is recorded (its text written, the hooks and the
    log line given the exception). A handler's exception keeps its frames,
    and so every object the handler held (a 300 MB buffer), for as long as
    the exception lives; through a cycle (a frame that holds the exception
    it is on the traceback of) that is until the cyclic collector runs. The
    frames still executing (the worker's own) are left alone.
    """
    pending = [error]
    seen: set[int] = set()
    while pending:
        exc = pending.pop()
        if exc is None or id(exc) in seen:
            continue
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        pending += (exc.__cause__, exc.__context__)
