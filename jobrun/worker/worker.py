"""The threaded worker: claim, run, heartbeat, finish.

Threads (all named, so ``py-spy dump`` and logs say who is who)::

    jobrun-claimer      claims only as many jobs as there are free handler
                        threads (and per-queue slots), then waits for a
                        notification or the poll interval
    jobrun-handler-N    run one job each: the handler, then fail it, or hand
                        its result to the completer (``concurrency`` of them,
                        started with the worker; with an async handler
                        registered, started only as plain handlers need them)
    jobrun-async-loop   the event loop of ``async def`` handlers (only when one
                        is registered): each job one task on it
    jobrun-async-io_N   what an async job's outcome writes (a failure, a
                        snooze) and its progress writes, off the event loop
                        (at most ``ASYNC_IO_THREADS``, started as needed)
    jobrun-completer    completes handler results in batches, flushed when a
                        batch fills or a few milliseconds pass: plain results
                        with complete_many, commit callables with
                        complete_many_tx (one transaction and one COMMIT for
                        the batch; the callables run on this thread, so keep
                        them to a few statements)
    jobrun-heartbeat    extends the leases of running and not-yet-flushed
                        jobs; cancels the context of every job the store
                        leaves out (cancel requested, lease lost)
    jobrun-timeouts     cancels the context of a job past its deadline
    jobrun-stall-watch  says so when a loop is stuck: a WARNING naming the
                        loop, what it is doing and where it is blocked
                        (its innermost frames), once per ``stall_warning``
                        while it stays stuck, then INFO when it moves again

Lost claims: a claim whose connection died (``OutcomeUnknown``) may still
have committed, either because only its reply was lost or because the
request reached the server later (TCP delivers what a dead link held once
the link heals). Such a job is leased to this worker, which never saw it:
nobody would heartbeat or run it until its lease expired and a reaper
requeued it (with an attempt burned for nothing). For a while after such a
failure the claimer therefore looks for jobs leased to its own owner id
that it does not know, confirms each lease with a heartbeat (fenced by its
token) and runs them: the claim happened, so its attempt is the one that
runs.

Delivery: the transactional path (a handler returning a commit callable) is
exactly-once in effect, through the effect ledger. Plain results are
at-least-once: a crash after a handler returned but before its batch
committed runs the job again.

Shutdown (``stop``, or SIGTERM/SIGINT through :meth:`run`): stop claiming;
let running handlers finish until the grace period ends; cancel the rest and
give them a moment to return (an interrupted job is failed back to the
queue, and keeps the attempt it burned); flush the completer; stop
heartbeats last. A handler that ignores cancellation is abandoned, and its
job failed back to the queue at once, its attempt kept (it did run), with
a "retrying" event saying why, instead of staying leased to an exiting
process until its lease expires (``Worker._give_back_abandoned``). A second
signal stops at once (then the leases expire and the reaper requeues).

Completions within the lease: the worker reckons when each lease it holds
ends on its own monotonic clock (the time its claim, or the last heartbeat
that kept it, was sent, plus the lease TTL: never later than the database's
end) and the completer bounds each try of a completion by the first end
among its jobs (``Store.bounded``: the watchdog, the wait for a connection
and the statement_timeout are cut to it). A completion stuck on a half-open
connection is therefore given up when its lease runs out, not after
``call_timeout`` + ``commit_timeout``; faults are retried until then, and
past it the jobs are abandoned as lease lost (the reaper requeues them; the
work is redone at most once, as at-least-once allows).

A handler's exception never kills its thread; a database error never kills
a loop (it is logged, and the loop backs off and tries again). Nothing of a
finished job is kept by reference cycles: once its outcome is recorded (the
hooks and the log line had the exception) the frames on its exception's
traceback are cleared (``_let_go``) and the worker drops its references, so
what a failed handler allocated is freed at once, not at the next run of
the cyclic collector.

Results: a handler's return value other than None, a callable or
:class:`~jobrun.worker.registry.Done` is the job's result (see
:mod:`jobrun.worker.registry`). It is checked in the handler's thread
(``validate.result``), so a value that cannot be stored fails that attempt
alone, and it travels with the job to the completer, which stores it with the
success in the same transaction: ``complete_many(results=...)`` for plain
successes, ``complete_many_tx(results=...)`` (and ``complete(result=...)``
when a batch falls back to one by one) next to a commit callable.

Async handlers: an ``async def`` handler (see :mod:`jobrun.worker.registry`)
runs as one asyncio task on the worker's own event loop, on the
``jobrun-async-loop`` thread, started when such a handler is registered
(``asyncio.run_coroutine_threadsafe`` from the claimer), so a thousand jobs
waiting on the network hold no thread each. Everything else is shared with
plain handlers:

- concurrency: ``concurrency`` bounds the jobs running at once of both
  kinds together, and per-queue limits count both: the claim plan sees one
  count of jobs claimed and not yet returned, whoever runs them. A worker
  with only async handlers starts no handler thread at all (a job of an
  unknown type, or a plain handler registered later, starts threads as it
  needs them, up to ``concurrency``);
- leases, heartbeats and the completer: the same running-jobs registry, the
  same batches; a coroutine's return value means what a plain handler's
  does (None, a JSON result, a commit callable, ``Done``, ``Snooze``), and a
  commit callable stays a plain ``def``: it runs on the completer thread
  inside Complete's transaction, as ever;
- cancellation and timeouts: when the job's context is cancelled (a cancel
  requested, a lost lease, its timeout, the end of the shutdown grace) its
  task is cancelled: ``asyncio.CancelledError`` at its next ``await``. A
  handler that lets it propagate (or returns anyway) is failed with
  ``cancelled (reason)``, like a plain handler that returned after
  cancellation; a cancel requested ends the job cancelled (cancel wins);
- blocking work stays off the loop: an outcome that needs a database write
  (a failure, a snooze) and ``ctx.progress`` writes run on the
  ``jobrun-async-io`` threads, a job's held progress written before its
  outcome; a success only joins the completer's queue;
- hooks: ``job_started`` and ``job_returned`` run on the loop thread inside
  the job's own task (its own ``contextvars`` context: a tracing span
  attached there is the handler's alone); ``job_finished`` for a failure or
  a snooze on a ``jobrun-async-io`` thread, for a success on the completer;
- the stall watch: a coroutine that blocks the loop (``time.sleep``, a sync
  database call) holds up every other async job; past ``stall_warning`` a
  WARNING names ``jobrun-async-loop`` and the frames it is stuck in;
- shutdown: as below, running coroutines may finish until the grace period
  ends, then their tasks are cancelled and the interrupted jobs failed back
  to the queue with their attempt kept; the loop stops last but one, before
  the heartbeats. A coroutine that ignores cancellation is abandoned like a
  thread (its job failed back to the queue at once, attempt kept).

Unknown job types: a job whose type this worker has no handler for is not
failed (which would burn its attempts into a dead job while a newer worker
that knows the type rolls out). It is *released*: ``Store.release`` gives
the claim's attempt back and queues the job again after a delay that grows
with each release (``unknown_type_delay``, 60 s by default, doubling each
time up to ten times that: 1, 2, 4, 8, then every 10 minutes), with a
"released" event (when all events are recorded) and ``last_error`` saying
``no handler for job type 'x' (release n of N, attempt not counted); worker
W knows: a, b``. That text is the counter: the next worker that claims the
job and does not know its type reads ``n`` back from ``last_error`` (no
extra query, and it holds whatever the event mode), so the count is the
job's own, across workers. Anything else written to ``last_error`` (a real
attempt that failed, a reaped lease, the dead verdict below) starts the
count again. After ``unknown_type_releases`` releases (24 by default: about
3.6 hours with the default delay) the job is dead, its ``last_error`` saying
why (``jobrun retry ID`` runs it again); ``unknown_type_releases=0`` makes it
dead at once. A cancel requested meanwhile wins (the release ends it
cancelled). Each worker logs one WARNING per unknown type, naming the types
it knows; later releases of that type are DEBUG lines.

Snoozes: a handler that raises (or returns) :class:`~jobrun.worker.registry.Snooze`
asks to run later. The worker calls ``Store.release(job, delay, reason,
snooze=True)``: the job is queued again at the database's now + delay, the
attempt its claim burned is given back (``attempts`` unchanged), ``snoozes``
counts one more, a "snoozed" event is written and ``last_error`` is left as
it was. Snoozing therefore never burns ``max_attempts``: a job that snoozes
30 times and then fails still gets all of its real attempts. A handler
registered with ``max_snoozes=N`` bounds the snoozes (None, the default, is
unlimited, as in Oban and River): once the job's ``snoozes`` reached N, a
further Snooze is a failed attempt ("snoozed more than N times", the normal
fail path: backoff, then dead when its attempts run out), so a job that
snoozes forever still ends. A cancel requested meanwhile wins (the release
ends it cancelled). A Snooze with a bad delay is a ValidationError raised
where it is made, in the handler: that attempt fails with its message.

Progress: ``ctx.progress(fraction, message)`` is checked at the call and
written on the handler's thread with ``Store.record_progress`` (fenced by
the claim), at most once per ``progress_interval`` (1 s by default): the
first report at once, the latest of those in between by the next report
after the interval, and a report still held when the handler returns
(however it ends) before the outcome is recorded. A write that finds the
lease gone cancels the job's context; a database error is logged once per
job and never fails it.

Queue limits (``Store.set_queue_limits``: concurrency, per key, rate; held
in the database for every worker): a claim of a limited queue takes only
what the limits allow. A slot freed by another worker, or a rate window
moving on, sends no wake-up, so after a short claim the claimer asks
``Store.limits_hold_back(queues)``; when a limit (not a lack of work) held
ready jobs back, it claims again after ``LIMITED_RECLAIM`` (50 ms; doubling,
up to the poll interval, while such claims get nothing), or at
once when its completer flushes (a flushed batch freed its slots), instead
of waiting for a notification or the poll interval.

Complete-and-claim (a limited queue): a lease lasts until the job's success
is recorded, so a worker whose completions and claims alternate (a
completion frees slots while the previous claim is on its way; the next
claim comes a round trip later) holds far fewer leases than a concurrency
or per-key limit allows, and drains such a queue at two thirds of its
speed; and a limited claim is a transaction of its own anyway. So the plain
successes of limited queues go to the claimer, not the completer, while the
claimer is claiming: its next claim of the queue completes them in the same
transaction (``Store.complete_and_claim``, one round trip, committed
synchronously), and the slots they free are claimed again there, at once
(no waiting for more threads to free). A claim never takes more jobs than
this worker has free threads: every job it leases starts at once, its
attempt counted by the claim (``start`` of ``Store.claim``: all), and a
process that dies burns the attempts of the jobs it was running, never of
jobs waiting for a thread (it holds none). The claimer hands what it holds
to the completer whenever it is about to wait for anything other than a
freed thread (no work, a fault, the stop), or when no thread frees within
``complete_flush_interval``; a complete-and-claim that fails hands its
completions over too (completing again is safe). A queue whose global
concurrency limit this worker's own leases fill is not claimed at all (the
claim would get nothing), and the completer then flushes its jobs at once
instead of collecting a batch. Commit callables are always the completer's.

Console (see :mod:`jobrun.worker.logs` for the formats): a start banner
(version, database, queues with their limits, concurrency, registered job
types), then one line per job outcome, each carrying the job's id, type,
attempt, max_attempts and queue as ``extra``: ``succeeded in N ms`` at
``success_log_level`` (DEBUG unless configured: free when off), ``failed``
at INFO with the next run time and the error (the traceback attached when
DEBUG is on), ``dead`` at WARNING, ``cancelled`` at INFO, ``lease lost`` at
WARNING, ``released`` (unknown type) as above, ``snoozed for N s`` at INFO
with the next run time.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import functools
import heapq
import inspect
import itertools
import logging
import math
import os
import queue
import re
import signal
import socket
import sys
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

from jobrun.job import outage, validate
from jobrun.job.errors import (
    ConnectionUnavailable,
    DatabaseError,
    JobrunError,
    LeaseLost,
    OutcomeUnknown,
    ValidationError,
)
from jobrun.job.model import CompleteManyResult, Job, State
from jobrun.job.ports import CommitCallable as Commit
from jobrun.job.ports import Dispatcher, Store, Waiter
from jobrun.worker import logs
from jobrun.worker.context import JobContext, ProgressSink
from jobrun.worker.hooks import (
    HookRunner,
    JobOutcome,
    OutcomeKind,
    StoreCall,
    StoreOperation,
    WorkerHooks,
)
from jobrun.worker.logs import job_fields
from jobrun.worker.registry import Done, PermanentFailure, Registration, Registry, Snooze

log = logging.getLogger("jobrun.worker")

DEFAULT_CONCURRENCY = 10
DEFAULT_LEASE_TTL = dt.timedelta(seconds=30)
DEFAULT_HEARTBEAT_INTERVAL = dt.timedelta(seconds=5)
DEFAULT_POLL_INTERVAL = dt.timedelta(seconds=1)
DEFAULT_SHUTDOWN_GRACE = dt.timedelta(seconds=30)
DEFAULT_COMPLETE_BATCH = 200
DEFAULT_COMPLETE_FLUSH = dt.timedelta(milliseconds=5)
DEFAULT_PROGRESS_INTERVAL = dt.timedelta(seconds=1)
LIMITED_RECLAIM = 0.05
"""Seconds a claimer whose claim a queue limit held back waits for a slot of
its own to free before it claims again (another worker's freed slot, or a
rate window moving on, sends no wake-up)."""
MAX_CONCURRENCY = 1000
ASYNC_IO_THREADS = 8
"""Threads of a worker's async side (``jobrun-async-io``) for the blocking
writes of async jobs (failures, snoozes, progress), started as needed."""
_DB_RETRY_BACKOFF = (0.05, 0.2, 0.5, 1.0, 2.0)
CLAIM_COALESCE = 0.002  # seconds a busy worker waits to claim several jobs at once
LOST_CLAIM_DELIVERY = 30.0
"""Seconds after a claim's connection died during which the server may still
run it: a request stuck in a dead link is delivered when the link heals, for
as long as the kernel retransmits it (``tcp_user_timeout``, 20 s by default).
The claimer looks for lost claims this long plus one lease TTL."""
_LIST_PAGE = 1000
ABANDONED_RELEASE_BOUND = 5.0
"""Seconds a stopping worker spends at most giving back the jobs of handlers
that ignored cancellation (see ``Worker._give_back_abandoned``)."""
DEFAULT_UNKNOWN_TYPE_DELAY = dt.timedelta(seconds=60)
DEFAULT_UNKNOWN_TYPE_RELEASES = 24
UNKNOWN_TYPE_DELAY_GROWTH = 10
"""A released job's delay doubles from ``unknown_type_delay`` up to this many times it."""
_RELEASED = re.compile(
    r"no handler for job type '[^']*' \(release (\d+) of \d+, attempt not counted\)"
)
"""The release counter, read back from ``last_error`` (see the module docstring)."""


def parse_queues(spec: str | Sequence[str] | Mapping[str, int | None]) -> dict[str, int | None]:
    """Parse ``"emails=4,default"``, ``["a", "b"]`` or ``{"a": 4}`` into {queue: limit or None}."""
    items: list[tuple[str, int | None]]
    if isinstance(spec, Mapping):
        items = list(spec.items())
    else:
        parts = spec.split(",") if isinstance(spec, str) else list(spec)
        items = []
        for part in parts:
            name, _, count = str(part).strip().partition("=")
            if count:
                try:
                    items.append((name.strip(), int(count)))
                except ValueError:
                    raise ValidationError(
                        "queues", f"{part!r}: the limit after '=' must be an int"
                    ) from None
            else:
                items.append((name.strip(), None))
    queues: dict[str, int | None] = {}
    for name, limit in items:
        validate.queue_name(name, "queues")
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValidationError("queues", f"the limit of queue {name!r} must be a positive int")
        if name in queues:
            raise ValidationError("queues", f"queue {name!r} is listed twice")
        queues[name] = limit
    if not queues:
        raise ValidationError("queues", "at least one queue is needed")
    return queues


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """How a worker runs. Validated on construction: bad values fail at start."""

    queues: Mapping[str, int | None] = dataclasses.field(default_factory=lambda: {"default": None})
    concurrency: int = DEFAULT_CONCURRENCY
    lease_ttl: dt.timedelta = DEFAULT_LEASE_TTL
    heartbeat_interval: dt.timedelta = DEFAULT_HEARTBEAT_INTERVAL
    poll_interval: dt.timedelta = DEFAULT_POLL_INTERVAL
    shutdown_grace: dt.timedelta = DEFAULT_SHUTDOWN_GRACE
    complete_batch_size: int = DEFAULT_COMPLETE_BATCH
    complete_flush_interval: dt.timedelta = DEFAULT_COMPLETE_FLUSH
    owner: str | None = None
    """Defaults to host:pid:random, unique per process start."""
    stall_warning: dt.timedelta | None = None
    """How long a loop (claimer, completer, heartbeat, listener) may take over
    one step before the stall watch logs a WARNING naming it and where it is
    blocked. Defaults to the lease TTL."""
    unknown_type_delay: dt.timedelta = DEFAULT_UNKNOWN_TYPE_DELAY
    """How long a job of a type no handler knows waits after its first release
    (doubling with each release, up to ten times this; see the module docstring)."""
    unknown_type_releases: int = DEFAULT_UNKNOWN_TYPE_RELEASES
    """How many times such a job is released before it is dead (0: dead at once)."""
    success_log_level: int | str | None = None
    """The level of the ``succeeded`` line: ``logging.DEBUG`` or ``INFO``
    (``"debug"``, ``"info"``); None takes the process default
    (:func:`jobrun.worker.logs.set_success_level`, ``--log-success``), DEBUG."""
    progress_interval: dt.timedelta = DEFAULT_PROGRESS_INTERVAL
    """The least time between two progress writes of one job
    (:meth:`JobContext.progress` keeps the reports in between)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "queues", parse_queues(self.queues))
        c = self.concurrency
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= MAX_CONCURRENCY:
            raise ValidationError("concurrency", f"must be an int between 1 and {MAX_CONCURRENCY}")
        for name in (
            "lease_ttl",
            "heartbeat_interval",
            "poll_interval",
            "shutdown_grace",
            "complete_flush_interval",
            "progress_interval",
        ):
            validate.positive_duration(name, getattr(self, name))
        if self.stall_warning is not None:
            validate.positive_duration("stall_warning", self.stall_warning)
        if self.heartbeat_interval * 3 > self.lease_ttl:
            # Refused, not warned: with fewer than three heartbeats per lease,
            # one late or lost heartbeat loses leases of healthy jobs, which
            # then run twice; no deployment wants that.
            raise ValidationError(
                "heartbeat_interval",
                f"{_seconds(self.heartbeat_interval.total_seconds())} must be at most a third "
                f"of lease_ttl ({_seconds(self.lease_ttl.total_seconds())}), so that one lost "
                "heartbeat never loses a lease",
            )
        b = self.complete_batch_size
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= 10_000:
            raise ValidationError("complete_batch_size", "must be an int between 1 and 10000")
        if self.owner is not None:
            validate.owner(self.owner)
        validate.positive_duration("unknown_type_delay", self.unknown_type_delay)
        validate.delay(self.unknown_type_delay * UNKNOWN_TYPE_DELAY_GROWTH, "unknown_type_delay")
        r = self.unknown_type_releases
        if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= 10_000:
            raise ValidationError("unknown_type_releases", "must be an int between 0 and 10000")
        if self.success_log_level is not None:
            logs.success_level(self.success_log_level)

    def unknown_type_delay_for(self, release: int) -> dt.timedelta:
        """The delay of a job's ``release``-th release (1 for the first)."""
        growth: int = min(2 ** min(release - 1, 30), UNKNOWN_TYPE_DELAY_GROWTH)
        delay: dt.timedelta = self.unknown_type_delay * growth
        return delay

    def with_owner(self) -> WorkerConfig:
        if self.owner is not None:
            return self
        owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        return dataclasses.replace(self, owner=owner)


@dataclasses.dataclass(eq=False)
class _Running:
    job: Job
    ctx: JobContext
    in_handler: bool = False
    """While its handler runs (plain writes by its thread: threads_busy reads them)."""
    on_loop: bool = False
    """An async handler's job: a task on the event loop, not a thread's."""
    progress: _OffloadedProgress | None = None
    """An async job's progress writer (its writes off the loop)."""


class _FlushNow:
    """Put on the completer's queue: flush the batch collected so far at once
    (the claimer waits on a limit that those leases hold)."""


_FLUSH_NOW = _FlushNow()


@dataclasses.dataclass(eq=False, slots=True)
class _Finished:
    """A handler's success on its way to the completer."""

    job: Job
    commit: Commit | None
    result: Any
    """The job's result (a checked JSON value), or None."""
    duration: float
    """Seconds the handler ran."""


class _Timeouts(threading.Thread):
    """Cancels contexts past their deadline (one thread for every job)."""

    def __init__(self) -> None:
        super().__init__(name="jobrun-timeouts", daemon=True)
        # Weak: a job's context (its job, an async job's task) is not kept
        # until its deadline once the job is over.
        self._heap: list[tuple[float, int, weakref.ref[JobContext]]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._stopped = False

    def add(self, ctx: JobContext) -> None:
        if ctx.deadline is None:
            return
        with self._cond:
            heapq.heappush(self._heap, (ctx.deadline, next(self._seq), weakref.ref(ctx)))
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify()

    def run(self) -> None:
        with self._cond:
            while not self._stopped:
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, _, ref = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
                ctx = ref()
                if ctx is not None and not ctx.is_cancelled:
                    ctx.cancel("timeout")
                del ctx


class _Activity:
    """What one loop is doing, for the stall watch.

    ``busy(what)`` when a step starts (a step must end within the stall
    bound), ``idle()`` while the loop waits for work (never a stall). Plain
    attribute writes: the loop pays no lock.
    """

    __slots__ = ("ident", "name", "since", "what")

    def __init__(self, name: str) -> None:
        self.name = name
        self.what = "starting"
        self.since: float | None = None
        self.ident: int | None = None

    def busy(self, what: str) -> None:
        self.what = what
        self.since = time.monotonic()
        self.ident = threading.get_ident()

    def idle(self) -> None:
        self.since = None


ActivityProbe = Callable[[], tuple[str, float | None, int | None]]
"""An outside loop's state: (what it does, busy since (monotonic) or None, thread ident)."""


class _StallWatch(threading.Thread):
    """Logs a WARNING when a loop has been busy on one step longer than ``bound``.

    The warning names the loop, what it is doing and the innermost frames of
    its thread (what it is blocked on); it repeats every ``bound`` while the
    loop stays stuck, and an INFO line says when it moves again. Not while
    the database is known to be away (``reporter``): the loops then wait for
    it, and the outage reporter says so.
    """

    def __init__(
        self,
        bound: float,
        logger: logging.LoggerAdapter[logging.Logger],
        reporter: outage.Outage | None = None,
    ) -> None:
        super().__init__(name="jobrun-stall-watch", daemon=True)
        self.bound = bound
        self._log = logger
        self._outage = reporter
        self._activities: list[_Activity] = []
        self._probes: list[tuple[str, ActivityProbe]] = []
        self._stop_event = threading.Event()
        self._stuck: dict[str, tuple[float, float]] = {}  # name -> (busy since, next warning)

    def track(self, name: str) -> _Activity:
        activity = _Activity(name)
        self._activities.append(activity)
        return activity

    def track_probe(self, name: str, probe: ActivityProbe) -> None:
        self._probes.append((name, probe))

    def stop(self) -> None:
        self._stop_event.set()

    def stalled(self) -> dict[str, float]:
        """The loops stuck right now: name -> seconds busy on the current step."""
        now = time.monotonic()
        return {
            name: now - since
            for name, (what, since, _) in self._states()
            if since is not None and now - since >= self.bound
        }

    def _states(self) -> list[tuple[str, tuple[str, float | None, int | None]]]:
        states = [(a.name, (a.what, a.since, a.ident)) for a in self._activities]
        for name, probe in self._probes:
            try:
                states.append((name, probe()))
            except Exception:  # a broken probe must not kill the watch
                self._log.debug("activity probe of %s failed", name, exc_info=True)
        return states

    def run(self) -> None:
        tick = min(1.0, max(self.bound / 4, 0.05))
        while not self._stop_event.wait(tick):
            self.check()

    def check(self) -> None:
        now = time.monotonic()
        for name, (what, since, ident) in self._states():
            stuck = self._stuck.get(name)
            if stuck is not None and since != stuck[0]:
                del self._stuck[name]
                self._log.info("%s is moving again after %.1f s on one step", name, now - stuck[0])
                stuck = None
            if since is None or now - since < self.bound:
                continue
            if stuck is not None and now < stuck[1]:
                continue
            if self._outage is not None and self._outage.down:
                continue
            self._stuck[name] = (since, now + self.bound)
            self._log.warning(
                "%s has been stuck for %.1f s (bound %g s) %s; blocked in: %s",
                name,
                now - since,
                self.bound,
                what,
                _where(ident),
            )


def _where(ident: int | None, depth: int = 8) -> str:
    """The innermost frames of thread ``ident``, innermost first."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return "(thread not running)"
    stack = traceback.extract_stack(frame)[-depth:]
    return " <- ".join(
        f"{f.name} ({os.path.basename(f.filename)}:{f.lineno})" for f in reversed(stack)
    )


class _OffloadedProgress:
    """An async job's progress sink: the write runs on an io thread, never on the loop.

    One write at a time per job, the latest value winning: a report made
    while a write is in flight is written right after it. ``pending()`` is
    what the worker waits for before it records the job's outcome.
    """

    def __init__(
        self, ctx: JobContext, write: ProgressSink, executor: concurrent.futures.Executor
    ) -> None:
        self._ctx = ctx
        self._write = write
        self._executor = executor
        self._lock = threading.Lock()
        self._next: tuple[float, str | None] | None = None
        self._future: concurrent.futures.Future[None] | None = None

    def __call__(self, value: float, message: str | None) -> bool:
        with self._lock:
            self._next = (value, message)
            if self._future is None:
                try:
                    self._future = self._executor.submit(self._drain)
                except RuntimeError:  # the executor is shut down: the worker stopped
                    self._next = None
                    return True
        return True  # handed over (a failed write holds the value again: _drain)

    def _drain(self) -> None:
        while True:
            with self._lock:
                item, self._next = self._next, None
                if item is None:
                    self._future = None
                    return
            if not self._write(*item):  # a database error: write it again later
                self._ctx._hold_progress()

    def pending(self) -> concurrent.futures.Future[None] | None:
        with self._lock:
            return self._future


class _EventLoop:
    """The worker's event loop for async handlers, on the ``jobrun-async-loop`` thread.

    A ticker task marks the loop busy on every tick (the stall watch sees a
    loop that stopped ticking: a coroutine blocking it). Blocking work of
    async jobs goes to ``io`` (``jobrun-async-io`` threads).
    """

    def __init__(self, activity: _Activity, tick: float) -> None:
        self.loop = asyncio.new_event_loop()
        self.io = concurrent.futures.ThreadPoolExecutor(
            max_workers=ASYNC_IO_THREADS, thread_name_prefix="jobrun-async-io"
        )
        self.thread = threading.Thread(target=self._run, name="jobrun-async-loop", daemon=True)
        self._activity = activity
        self._tick = tick

    def start(self) -> None:
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float | None) -> None:
        """Stop the loop (tasks still pending are abandoned) and the io threads."""
        with contextlib.suppress(RuntimeError):  # already closed
            self.loop.call_soon_threadsafe(self.loop.stop)
        if timeout is not None and self.thread.is_alive():
            self.thread.join(timeout)
        self.io.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        ticker = self.loop.create_task(self._ticks(), name="jobrun-stall-ticker")
        try:
            self.loop.run_forever()
        finally:
            ticker.cancel()
            with contextlib.suppress(BaseException):
                self.loop.run_until_complete(asyncio.wait([ticker], timeout=1.0))
            self._activity.idle()
            # Close it only when nothing is left on it: a task that ignored its
            # cancellation is abandoned (its lease expires), not destroyed.
            if not any(not t.done() for t in asyncio.all_tasks(self.loop)):
                with contextlib.suppress(Exception):
                    self.loop.run_until_complete(self.loop.shutdown_asyncgens())
                self.loop.close()

    async def _ticks(self) -> None:
        while True:
            self._activity.busy(
                "running async handlers (a coroutine that blocks it holds up every other one)"
            )
            await asyncio.sleep(self._tick)


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` from any thread (a context cancelled by the heartbeat, the timeouts...)."""
    with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to cancel
        loop.call_soon_threadsafe(task.cancel)


class Worker:
    """Runs jobs of ``config.queues``, ``config.concurrency`` at once: plain handlers
    on threads, ``async def`` handlers as tasks on one event loop."""

    def __init__(
        self,
        store: Store,
        registry: Registry,
        config: WorkerConfig | None = None,
        *,
        dispatcher: Dispatcher | None = None,
        database: str | None = None,
        hooks: Sequence[WorkerHooks] = (),
    ) -> None:
        if not callable(getattr(store, "release", None)):
            raise ValidationError(
                "store", "the worker needs a Store with release() (jobrun.postgres.Store has it)"
            )
        self.store = store
        self.database = database
        # None without hooks: every call site pays one `is not None` check.
        self._hooks: HookRunner | None = HookRunner(hooks) if hooks else None
        """A password-free description of the database, for the start banner."""
        self.registry = registry
        self.config = (config or WorkerConfig()).with_owner()
        assert self.config.owner is not None
        self.owner: str = self.config.owner
        self.dispatcher = dispatcher
        self._waiter: Waiter | None = None
        self._queue_names = list(self.config.queues)
        self._lock = threading.Lock()
        # Keyed by lease token, not job id: a job reaped and claimed again by
        # this same worker runs under two claims at once for a moment (the
        # stale handler has not returned yet), and each must be tracked alone.
        self._running: dict[uuid.UUID, _Running] = {}
        self._unflushed: dict[uuid.UUID, Job] = {}
        # When each claim's lease ends by this worker's own reckoning
        # (time.monotonic): the time its claim or last heartbeat was sent,
        # plus the lease TTL, an end never later than the database's. The
        # completer gives up on a completion by then (see _retrying).
        self._lease_until: dict[uuid.UUID, float] = {}
        self._claim_sent = 0.0  # when the claimer's latest claim was sent
        self._unflushed_by_queue: dict[str, int] = {}
        self._inflight = 0  # claimed and not yet returned by its handler
        self._inflight_by_queue: dict[str, int] = dict.fromkeys(self.config.queues, 0)
        self._on_threads = 0  # of those, the jobs dispatched to handler threads
        self._work: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._loop: _EventLoop | None = None  # started when an async job needs it
        self._loop_lock = threading.Lock()
        # Handler successes waiting for their batch.
        self._done: queue.SimpleQueue[_Finished | _FlushNow | None] = queue.SimpleQueue()
        self._slot_freed = threading.Event()
        # The limited queues among this worker's (as the store last read them):
        # their plain successes ride with the claims (complete-and-claim), or
        # the completer flushes them at once (their slots are what claims wait for).
        self._limited: frozenset[str] = frozenset()
        # Plain successes of those queues that the claimer completes with its
        # next claim of them (complete_and_claim), while it is set to.
        self._claimer_done: list[_Finished] = []
        self._claimer_completes = False
        self._stopping = threading.Event()  # stop claiming
        self._hard_stop = threading.Event()  # give up on everything
        self._heartbeat_stop = threading.Event()
        self._timeouts = _Timeouts()
        self._timeouts_started = False
        self._threads: list[threading.Thread] = []
        self._handlers: list[threading.Thread] = []
        self._started = False
        self._stopped = False
        self._stop_lock = threading.RLock()  # one stop at a time; re-entered: see stop()
        self._stop_entered = False
        self._stop_requested = threading.Event()  # ends run()
        self._drained = True
        self._log = logging.LoggerAdapter(log, {"owner": self.owner})
        self.stats = {
            "succeeded": 0,
            "failed": 0,
            "cancelled": 0,
            "lease_lost": 0,
            "adopted": 0,
            "released": 0,
            "snoozed": 0,
        }
        self._success_level = logs.success_level(self.config.success_log_level)
        self._unknown_types: set[str] = set()  # warned about once each
        # Lost claims (see the module docstring): look for them until then.
        self._lost_claims_until = 0.0
        self._next_lost_claim_check = 0.0
        # Claims whose handler ran but whose outcome could not be recorded:
        # still leased to this owner in the database, and not lost claims.
        self._abandoned: dict[uuid.UUID, float] = {}
        stall = self.config.stall_warning or self.config.lease_ttl
        self._stalls = _StallWatch(stall.total_seconds(), self._log, outage.of(store))
        self._claimer_activity = self._stalls.track("jobrun-claimer")
        self._completer_activity = self._stalls.track("jobrun-completer")
        self._heartbeat_activity = self._stalls.track("jobrun-heartbeat")
        self._loop_activity = self._stalls.track("jobrun-async-loop")

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start every thread. Safe to call twice."""
        if self._started:
            return
        self._started = True
        self._success_level = logs.success_level(self.config.success_log_level)
        self._log_banner()
        self._warn_contradictions()
        if self.dispatcher is not None:
            self._waiter = self.dispatcher.subscribe(self._queue_names)
            probe = getattr(self.dispatcher, "activity", None)
            if callable(probe):
                self._stalls.track_probe("jobrun-listener", probe)
        self._start_timeouts()
        if self.registry.has_async:
            self._ensure_loop()  # handler threads start as plain jobs need them
        else:
            for n in range(self.config.concurrency):
                t = threading.Thread(
                    target=self._handler_loop, name=f"jobrun-handler-{n}", daemon=True
                )
                self._handlers.append(t)
        self._threads = [
            threading.Thread(target=self._claim_loop, name="jobrun-claimer", daemon=True),
            threading.Thread(target=self._complete_loop, name="jobrun-completer", daemon=True),
            threading.Thread(target=self._heartbeat_loop, name="jobrun-heartbeat", daemon=True),
        ]
        for t in [*self._handlers, *self._threads]:
            t.start()
        self._stalls.start()

    def _ensure_loop(self) -> _EventLoop:
        """The event loop of async handlers, started on first need."""
        loop = self._loop
        if loop is not None:
            return loop
        with self._loop_lock:
            if self._loop is None:
                tick = min(max(self._stalls.bound / 4, 0.01), 1.0)
                started = _EventLoop(self._loop_activity, tick)
                started.start()
                self._loop = started
            return self._loop

    def _stop_loop(self, timeout: float | None) -> None:
        with self._loop_lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop(timeout)

    def _log_banner(self) -> None:
        """The start banner: what this worker is, on one record (fields for JSON too)."""
        version = logs.version()
        queues = ", ".join(
            name if limit is None else f"{name} (at most {limit} at once)"
            for name, limit in self.config.queues.items()
        )
        types = self.registry.types
        async_types = {
            name for name in types if (r := self.registry.get(name)) is not None and r.is_async
        }
        lines = [f"jobrun {version} worker {self.owner} starting"]
        if self.database is not None:
            lines.append(f"  database:    {self.database}")
        lines.append(f"  queues:      {queues}")
        shared = self._shared_limits()
        if shared:
            lines.append(f"  limits:      {shared} (in the database: for every worker)")
        lines.append(f"  concurrency: {self.config.concurrency}")
        if types:
            lines.append(f"  job types ({len(types)}):")
            lines += [f"    . {name}{' (async)' * (name in async_types)}" for name in types]
        else:
            lines.append("  job types:   none (every job claimed is released back to its queue)")
        log.info(
            "%s",
            "\n".join(lines),
            extra={
                "owner": self.owner,
                "version": version,
                "database": self.database,
                "queues": dict(self.config.queues),
                "concurrency": self.config.concurrency,
                "job_types": types,
            },
        )

    def _warn_contradictions(self) -> None:
        """One WARNING line for settings that contradict each other but can run.

        A commit timeout longer than the lease: the completer gives a
        completion up when its lease runs out (see the module docstring), so
        a commit callable never gets the whole commit timeout. Warned, not
        refused: nothing runs twice because of it, and the default commit
        timeout (30 s) would otherwise refuse every worker configured with
        only a shorter lease.
        """
        commit = getattr(self.store, "commit_timeout", None)
        ttl = self.config.lease_ttl
        if isinstance(commit, dt.timedelta) and commit > ttl:
            self._log.warning(
                "commit_timeout (JOBRUN_COMMIT_TIMEOUT, %s) is longer than lease_ttl "
                "(JOBRUN_LEASE_TTL, %s): a completion is given up when its lease runs out, so "
                "a commit callable never gets the whole commit timeout; set it to at most the "
                "lease TTL",
                _seconds(commit.total_seconds()),
                _seconds(ttl.total_seconds()),
            )

    def _shared_limits(self) -> str:
        """The database's limits on this worker's queues, for the banner ("" when
        none, or when they cannot be read now: the claims apply them anyway)."""
        try:
            limits = self.store.all_queue_limits()
        except JobrunError:
            return ""
        return "; ".join(
            f"{lim.queue}: {lim.describe()}" for lim in limits if lim.queue in self.config.queues
        )

    def stop(self, timeout: float | None = None) -> bool:
        """Shut down in order (see the module docstring). Ends :meth:`run`.

        Safe to call twice and from any thread: a second caller waits for the
        first and gets its answer. ``timeout`` defaults to the configured
        shutdown grace. Returns True when every handler returned.
        """
        self._stop_requested.set()
        with self._stop_lock:
            # Not started, done, or re-entered (a signal handler on this thread).
            if not self._started or self._stopped or self._stop_entered:
                return self._drained
            self._stop_entered = True
            self._drained = self._shut_down(timeout)
            return self._drained

    def _shut_down(self, timeout: float | None) -> bool:
        grace = self.config.shutdown_grace.total_seconds() if timeout is None else timeout
        deadline = time.monotonic() + grace
        self._stopping.set()
        self._slot_freed.set()
        if self._waiter is not None:
            self._waiter.wake()
        claimer = self._threads[0]
        claimer.join(max(deadline - time.monotonic(), 0.0) + 2.0)
        drained = self._wait_idle(deadline)
        if not drained:
            with self._lock:
                running = list(self._running.values())
            self._log.warning(
                "cancelling %d job(s) still running at the end of the grace period", len(running)
            )
            for r in running:
                r.ctx.cancel("worker shutting down")
            drained = self._wait_idle(time.monotonic() + min(5.0, max(grace, 1.0)))
        for _ in self._handlers:
            self._work.put(None)
        self._done.put(None)
        self._threads[1].join(30)  # the completer flushes what it holds
        self._stop_loop(5.0)  # coroutines that ignored cancellation are abandoned
        if not drained:
            self._give_back_abandoned()
        self._heartbeat_stop.set()
        self._threads[2].join(10)
        self._timeouts.stop()
        self._stalls.stop()
        if self._waiter is not None:
            self._waiter.close()
        self._stopped = True
        self._log.info(
            "worker %s stopped (%s)",
            self.owner,
            "drained" if drained else "abandoned handlers that ignored cancellation",
        )
        return drained

    def _give_back_abandoned(self) -> None:
        """Fail the jobs whose handlers ignored cancellation back to their queue,
        at once: the process is exiting, so their leases would only keep them
        from running elsewhere until they expire.

        Their attempt is kept (it did run): ``Store.fail`` with no backoff,
        fenced by the claim, so a job out of attempts is dead and a cancel
        requested wins, as the reaper would decide, only sooner; its
        "retrying" event and ``last_error`` say why. Bounded, so that a
        database that is gone cannot hold the exit up (then the leases expire
        as before).
        """
        with self._lock:
            abandoned = [r.job for r in self._running.values()]
        if not abandoned or self._hard_stop.is_set():
            return
        grace = _seconds(self.config.shutdown_grace.total_seconds())
        end = time.monotonic() + ABANDONED_RELEASE_BOUND
        with self.store.bounded(ABANDONED_RELEASE_BOUND):
            for n, job in enumerate(abandoned):
                if time.monotonic() >= end:
                    self._log.warning(
                        "%d job(s) of handlers that ignored cancellation stay leased until "
                        "their leases expire (the database did not answer in time)",
                        len(abandoned) - n,
                    )
                    return
                self._fail(
                    job,
                    "abandoned at shutdown: its handler ignored cancellation after the "
                    f"shutdown grace ({grace}); queued again at once by the exiting worker "
                    f"{self.owner} (attempt kept)",
                    at_once=True,
                )

    def kill(self) -> None:
        """Stop at once: nothing more is claimed, completed or heartbeated.

        Leases of running jobs expire and the reaper requeues them.
        """
        self._hard_stop.set()
        self._stopping.set()
        self._heartbeat_stop.set()
        self._slot_freed.set()
        self._stalls.stop()
        self._stopped = True
        self._stop_requested.set()

    def __enter__(self) -> Worker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def run(self, *, install_signals: bool = True) -> None:
        """Start, then block until stopped, then stop gracefully.

        With ``install_signals`` SIGTERM and SIGINT stop it (a second signal
        at once) and the previous handlers are put back on return. Without,
        the program keeps its own signal handling and ends ``run`` by calling
        :meth:`stop` (from a signal handler or another thread).
        """
        if install_signals and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "Worker.run() installs signal handlers, which only the main thread can; "
                "pass install_signals=False and call stop() yourself"
            )
        stop_requested = self._stop_requested
        signals = 0

        def on_signal(signum: int, frame: FrameType | None) -> None:
            nonlocal signals
            signals += 1
            if signals == 1:
                self._log.info("signal %d: stopping gracefully (again to stop at once)", signum)
                stop_requested.set()
            else:
                self._log.warning("second signal: stopping at once")
                self.kill()
                stop_requested.set()

        previous: dict[int, Any] = {}
        if install_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                previous[signum] = signal.signal(signum, on_signal)
        try:
            self.start()
            while not stop_requested.wait(0.5):
                pass
            if not self._hard_stop.is_set():
                done = threading.Thread(target=self.stop, name="jobrun-shutdown", daemon=True)
                done.start()
                while done.is_alive() and not self._hard_stop.is_set():
                    done.join(0.2)
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    def _wait_idle(self, deadline: float) -> bool:
        while time.monotonic() < deadline:
            with self._lock:
                if self._inflight == 0:
                    return True
            self._slot_freed.wait(0.05)
            self._slot_freed.clear()
        with self._lock:
            return self._inflight == 0

    def _start_timeouts(self) -> None:
        if not self._timeouts_started:
            self._timeouts_started = True
            self._timeouts.start()

    def drain(self, *, max_jobs: int | None = None) -> int:
        """Run runnable jobs one by one in the calling thread until none is left.

        No worker threads: the handler runs here (an async handler on the
        worker's event loop, the calling thread waiting for it), and its
        completion (batch or commit callable) or failure is written before
        the next claim. For tests and :func:`jobrun.testing.run_jobs`; a
        retry scheduled for later is left queued. Returns how many jobs ran.
        """
        self._start_timeouts()
        ran = 0
        try:
            while max_jobs is None or ran < max_jobs:
                jobs = self._claim_call(self._queue_names, 1)
                if not jobs:
                    break
                [job] = jobs
                running, registration = self._register(job)
                if registration is not None and registration.is_async:
                    loop = self._ensure_loop()
                    loop.submit(self._run_async(running, registration, loop.io)).result()
                else:
                    try:
                        self._run_one(running)
                    finally:
                        self._release(job)
                pending: list[_Finished] = []
                while not self._done.empty():
                    item = self._done.get_nowait()
                    if isinstance(item, _Finished):
                        pending.append(item)
                if pending:
                    self._flush(pending)
                ran += 1
        finally:
            if not self._started:  # a loop started here ends here
                self._stop_loop(5.0)
        return ran

    # -- claiming ------------------------------------------------------------------

    def _busy(self) -> bool:
        with self._lock:
            return self._inflight > 0

    def _claim_plan(self) -> list[tuple[list[str], int]]:
        """What to claim now: per-queue limited queues alone, the others together.

        Free threads, less the completion backlog beyond one batch's worth
        (the larger of ``concurrency`` and ``complete_batch_size``): results
        waiting for the completer still hold their leases, so a completer
        slower than the handlers (commit callables run one after another)
        slows claiming down instead of letting leased jobs pile up without
        bound, while a completer that keeps up is never waited for. A worker
        holds at most ``concurrency`` plus that allowance of leases, and
        claims no more jobs than it can start at once (see complete-and-claim
        in the module docstring).

        A queue whose global concurrency limit this worker's own leases fill
        (running, or finished and waiting for the completer) is left out: a
        claim of it would get nothing, unless the claimer holds completions
        of it to send along. The completer then flushes at once instead of
        collecting a batch, since the freed slots are what the next claim
        waits for (the limit as the store last read it, at most a second
        old: a limit raised since is seen within that second).
        """
        limits = self._queue_limits()
        self._limited = frozenset(limits)
        with self._lock:
            completing = {done.job.queue for done in self._claimer_done}
            full = {
                name
                for name, limit in limits.items()
                if limit is not None
                and self._inflight_by_queue.get(name, 0) + self._unflushed_by_queue.get(name, 0)
                >= limit
                and name not in completing
            }
            allowance = max(self.config.concurrency, self.config.complete_batch_size)
            backlog = max(len(self._unflushed) - allowance, 0)
            free = self.config.concurrency - self._inflight - backlog
            plan: list[tuple[list[str], int]] = []
            unlimited: list[str] = []
            for name, limit in self.config.queues.items():
                if free <= 0:
                    break
                if name in full:
                    continue
                if limit is None:
                    unlimited.append(name)
                    continue
                n = min(limit - self._inflight_by_queue[name], free)
                if n > 0:
                    plan.append(([name], n))
                    free -= n
            if unlimited and free > 0:
                plan.append((unlimited, free))
            return plan

    def _queue_limits(self) -> Mapping[str, int | None]:
        """The limited queues among this worker's, each with its global
        concurrency limit (None: none), as the store last read them (none
        known when it cannot tell: the claims then find out)."""
        self._claimer_activity.busy("reading the limits of its queues")
        try:
            return self.store.limited_queues(self._queue_names)
        except JobrunError as exc:
            self._log.debug("reading the queues' limits failed: %s", exc)
            return {}

    def _claim_loop(self) -> None:
        failures = 0
        # Claim in batches: with only a few threads free while others still
        # run, wait a moment for more to free up (one claim statement for
        # several jobs); an idle worker claims at once.
        batch = max(1, min(self.config.concurrency // 2, 16))
        activity = self._claimer_activity
        held_streak = 0  # claims in a row that a limit held back and got nothing
        while not self._stopping.is_set():
            activity.busy("planning a claim")
            self._adopt_lost_claims_if_due()
            with self._lock:
                self._claimer_completes = True
            plan = self._claim_plan()
            if not plan:
                activity.idle()
                if self._holding():
                    # A slot freed soon takes them along with its claim; if
                    # none frees within a batch window, the completer does.
                    window = self.config.complete_flush_interval.total_seconds()
                    if not self._slot_freed.wait(window):
                        self._hand_over_completions()
                else:
                    self._slot_freed.wait(self.config.poll_interval.total_seconds())
                self._slot_freed.clear()
                continue
            coalesce_until = time.monotonic() + CLAIM_COALESCE
            while sum(n for _, n in plan) < batch and self._busy() and not self._holding():
                left = coalesce_until - time.monotonic()
                if left <= 0:
                    break
                self._slot_freed.wait(left)
                self._slot_freed.clear()
                plan = self._claim_plan()
            drained = False
            held_back: float | None = None  # seconds until a limit lets more through
            claimed = 0
            try:
                for queues, n in plan:
                    activity.busy(f"claiming up to {n} job(s) of {queues}")
                    finished = self._take_completions(queues)
                    if finished:
                        jobs = self._complete_and_claim(
                            finished, queues, min(n, validate.MAX_CLAIM_LIMIT)
                        )
                    else:
                        jobs = self._claim_call(queues, min(n, validate.MAX_CLAIM_LIMIT))
                    self._dispatch(jobs)
                    claimed += len(jobs)
                    if len(jobs) < n:
                        drained = True
                        wait = self._held_back_by_limits(queues)
                        if wait is not None:
                            held_back = wait if held_back is None else min(held_back, wait)
                failures = 0
                self._hand_over_unplanned({name for queues, _ in plan for name in queues})
            except JobrunError as exc:
                activity.idle()
                self._hand_over_completions()
                if isinstance(exc, OutcomeUnknown):
                    # It may have committed (now, or when a dead link heals).
                    self._claim_may_be_lost()
                failures += 1
                pause = _DB_RETRY_BACKOFF[min(failures, len(_DB_RETRY_BACKOFF)) - 1]
                if isinstance(exc, ConnectionUnavailable):
                    pause = 0.0  # it waited its whole bound for a connection already
                outage.of(self.store).failed(exc, "claim")
                self._stopping.wait(pause)
                continue
            except Exception:
                activity.idle()
                self._hand_over_completions()
                self._log.exception("claim loop error")
                self._stopping.wait(1.0)
                continue
            activity.idle()
            # Ready jobs a queue limit held back: no wake-up comes when a slot
            # frees elsewhere or the rate window moves on, so claim again by
            # itself: when the full rate window opens, or (a slot frees who
            # knows when) soon, at once when the completer frees a slot here.
            # Such claims that get nothing back off, doubling up to the poll
            # interval, so that workers facing a full limit do not poll it 20
            # times a second.
            held_streak = held_streak + 1 if held_back is not None and not claimed else 0
            if held_back is not None:
                poll = max(self.config.poll_interval.total_seconds(), LIMITED_RECLAIM)
                if held_back > 0:
                    pause = min(held_back + 0.001, poll)
                else:
                    pause = min(LIMITED_RECLAIM * 2 ** min(max(held_streak - 1, 0), 8), poll)
                self._slot_freed.wait(pause)
                self._slot_freed.clear()
            elif drained:
                self._hand_over_completions()  # the wait ends on new work, not on them
                self._wait_for_work()
        self._hand_over_completions()

    def _holding(self) -> bool:
        """Whether the claimer holds completions to send with its next claim."""
        with self._lock:
            return bool(self._claimer_done)

    def _take_completions(self, queues: list[str]) -> list[_Finished]:
        """The plain successes of ``queues`` held for the claimer, at most one
        completion batch and one claim per job (a job that finished under two
        claims, reaped and claimed again meanwhile, sends the other with a
        later claim: fenced by its token, one of them is lease_lost)."""
        with self._lock:
            if not self._claimer_done:
                return []
            taken: list[_Finished] = []
            kept: list[_Finished] = []
            ids: set[uuid.UUID] = set()
            limit = self.config.complete_batch_size
            for done in self._claimer_done:
                if done.job.queue in queues and len(taken) < limit and done.job.id not in ids:
                    taken.append(done)
                    ids.add(done.job.id)
                else:
                    kept.append(done)
            self._claimer_done = kept
            return taken

    def _hand_over_completions(self) -> None:
        """Give the completer what the claimer holds, and what handlers finish
        from now on, until the claimer claims again (it is about to wait for
        something other than a freed slot, to fail over, or to stop)."""
        with self._lock:
            self._claimer_completes = False
            held, self._claimer_done = self._claimer_done, []
        for done in held:
            self._done.put(done)

    def _hand_over_unplanned(self, planned: set[str]) -> None:
        """Give the completer the completions of queues this round did not
        claim (a per-worker limit left no room): no claim is due to take them."""
        with self._lock:
            unplanned = [done for done in self._claimer_done if done.job.queue not in planned]
            if unplanned:
                self._claimer_done = [d for d in self._claimer_done if d.job.queue in planned]
        for done in unplanned:
            self._done.put(done)

    def _complete_and_claim(
        self, finished: list[_Finished], queues: list[str], n: int
    ) -> list[Job]:
        """Complete ``finished`` and claim up to ``n`` jobs of ``queues`` in one
        transaction (Store.complete_and_claim): the slots they hold under the
        queue's limits are claimed again at once. On any error the
        completions go to the completer, which retries them alone (safe: a
        completion that committed after all reports completed)."""
        jobs = [done.job for done in finished]
        results = {d.job.id: d.result for d in finished if d.result is not None} or None
        self._claim_sent = time.monotonic()
        try:
            outcome, claimed = self._call(
                "claim",
                lambda answer: len(answer[1]),
                lambda: self.store.complete_and_claim(
                    jobs, results=results, queues=queues, limit=n, ttl=self.config.lease_ttl
                ),
                tuple(queues),
            )
        except BaseException:
            for done in finished:
                self._done.put(done)
            raise
        self._account(outcome, finished)
        self._flushed(finished)
        return claimed

    def _held_back_by_limits(self, queues: list[str]) -> float | None:
        """After a short claim: None when no queue limit held back ready jobs of
        ``queues``, else the seconds until a claim may get some (0: unknown).

        A worker that itself holds leases of a limited queue among them (jobs
        running, or finished and waiting for the completer) frees slots when
        they end: it asks the completer to flush at once and claims again then,
        without asking the database (the limit is likely what it ran into;
        if the queue is empty instead, the next short claim asks).
        """
        if not self.store.queues_limited(queues):
            return None
        with self._lock:
            unflushed = any(job.queue in queues for job in self._unflushed.values())
            running = any(self._inflight_by_queue.get(name, 0) for name in queues)
        if unflushed:
            self._done.put(_FLUSH_NOW)
            return 0.0
        if running:
            return 0.0
        self._claimer_activity.busy(f"asking whether a limit holds back {queues}")
        try:
            return self.store.limits_hold_back(queues)
        except JobrunError as exc:  # then wait for work as usual
            self._log.debug("asking whether a limit holds back %s failed: %s", queues, exc)
            return None

    # -- lost claims ---------------------------------------------------------------

    def _claim_may_be_lost(self) -> None:
        now = time.monotonic()
        window = LOST_CLAIM_DELIVERY + self.config.lease_ttl.total_seconds()
        self._lost_claims_until = max(self._lost_claims_until, now + window)
        if self._next_lost_claim_check <= now:
            self._next_lost_claim_check = now + self._lost_claim_interval()

    def _lost_claim_interval(self) -> float:
        # Often enough to find a lost claim long before its lease expires.
        return min(
            self.config.heartbeat_interval.total_seconds(),
            max(self.config.poll_interval.total_seconds(), 0.1),
        )

    def _adopt_lost_claims_if_due(self) -> None:
        now = time.monotonic()
        if now >= self._lost_claims_until or now < self._next_lost_claim_check:
            return
        self._next_lost_claim_check = now + self._lost_claim_interval()
        self._claimer_activity.busy("looking for claims whose reply was lost")
        try:
            self._adopt_lost_claims()
        except JobrunError as exc:
            self._log.info("looking for lost claims failed (%s); trying again", exc)

    def _adopt_lost_claims(self) -> list[Job]:
        """Run the jobs leased to this worker's owner id that it never saw claimed.

        A claim whose reply was lost leaves such a lease. Each is confirmed by
        a heartbeat (owner + token, not expired, not cancel-requested) before
        it is dispatched like a fresh claim; a lost claim of a job whose cancel
        was requested meanwhile is failed, which ends it cancelled. Called by
        the claimer (the only thread that claims) for a while after a claim
        failed with an unknown outcome; returns the jobs adopted.
        """
        # Known before the listing: a claim this worker finished since then
        # had committed its outcome before the listing began.
        with self._lock:
            cutoff = time.monotonic() - 2 * self.config.lease_ttl.total_seconds()
            for token in [t for t, at in self._abandoned.items() if at < cutoff]:
                del self._abandoned[token]
            known = set(self._running) | set(self._unflushed) | set(self._abandoned)
        lost: list[Job] = []
        for name in self._queue_names:
            after: uuid.UUID | None = None
            while True:
                page = self.store.list(
                    queue=name, state=State.LEASED, after=after, limit=_LIST_PAGE
                )
                lost += [
                    job
                    for job in page
                    if job.lease_owner == self.owner
                    and job.lease_token is not None
                    and job.lease_token not in known
                ]
                if len(page) < _LIST_PAGE:
                    break
                after = page[-1].id
        if not lost:
            return []
        self._claim_sent = time.monotonic()  # the heartbeat below is their lease
        until = self.store.now() + self.config.lease_ttl
        kept = self.store.heartbeat(self.owner, [(job.id, _claim(job)) for job in lost], until)
        adopted = [job for job in lost if job.id in kept]
        if adopted:
            self._log.warning(
                "adopting %d job(s) leased to this worker by a claim whose reply was lost: %s",
                len(adopted),
                ", ".join(str(job.id) for job in adopted),
            )
            self._count("adopted", len(adopted))
            self._dispatch(adopted)
        for job in lost:
            if job.id not in kept and job.cancel_requested:
                self._fail(job, "cancelled (requested while the claim's reply was lost)")
        return adopted

    def _wait_for_work(self) -> None:
        timeout = self.config.poll_interval.total_seconds()
        if self._waiter is None:
            self._stopping.wait(timeout)
            return
        try:
            self._waiter.wait(timeout)
        except Exception:
            self._log.exception("dispatcher wait failed; polling")
            self._stopping.wait(timeout)

    def _dispatch(self, jobs: list[Job]) -> None:
        for job in jobs:
            running, registration = self._register(job)
            if registration is not None and registration.is_async:
                loop = self._ensure_loop()
                future = loop.submit(self._run_async(running, registration, loop.io))
                future.add_done_callback(functools.partial(self._async_ended, job))
            else:
                self._to_thread(job)

    def _register(self, job: Job) -> tuple[_Running, Registration | None]:
        """Track a claimed job as running (its context, its timeout, the counts)."""
        interval = self.config.progress_interval.total_seconds()
        ctx = JobContext(
            job=job, cancelled=threading.Event(), deadline=None, _progress_interval=interval
        )
        registration = self.registry.get(job.type)
        running = _Running(job, ctx)
        write = self._progress_sink(ctx)
        if registration is not None and registration.is_async:
            running.on_loop = True
            running.progress = _OffloadedProgress(ctx, write, self._ensure_loop().io)
            ctx._progress_sink = running.progress
        else:
            ctx._progress_sink = write
        timeout = self.registry.timeout_for(registration)
        if timeout is not None:
            ctx.deadline = time.monotonic() + timeout.total_seconds()
        lease_from = self._claim_sent or time.monotonic()
        with self._lock:
            self._running[_claim(job)] = running
            if self._started:  # drain() sends no heartbeats: no reckoning, no bound
                ttl = self.config.lease_ttl.total_seconds()
                self._lease_until[_claim(job)] = lease_from + ttl
            self._inflight += 1
            self._inflight_by_queue[job.queue] = self._inflight_by_queue.get(job.queue, 0) + 1
        self._timeouts.add(ctx)
        return running, registration

    def _to_thread(self, job: Job) -> None:
        """Hand a plain job to the handler threads, starting one if none is free
        (a worker with async handlers starts them as needed, up to concurrency)."""
        thread: threading.Thread | None = None
        with self._lock:
            self._on_threads += 1
            n = len(self._handlers)
            if self._on_threads > n and n < self.config.concurrency and self._started:
                thread = threading.Thread(
                    target=self._handler_loop, name=f"jobrun-handler-{n}", daemon=True
                )
                self._handlers.append(thread)
        if thread is not None:
            thread.start()
        self._work.put(job)

    def _release(self, job: Job, *, on_thread: bool = False) -> None:
        """The job's run is over (its outcome recorded or handed on): free its slot."""
        with self._lock:
            running = self._running.pop(_claim(job), None)
            if _claim(job) not in self._unflushed:  # its success waits for the completer
                self._lease_until.pop(_claim(job), None)
            self._inflight -= 1
            self._inflight_by_queue[job.queue] -= 1
            if on_thread:
                self._on_threads -= 1
        if running is not None:
            # The context and its progress writer refer to each other: a cycle
            # (with the job and its payload) the collector alone would free.
            running.ctx._progress_sink = None
        self._slot_freed.set()

    # -- running -----------------------------------------------------------------

    def _handler_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None or self._hard_stop.is_set():
                return
            with self._lock:
                running = self._running.get(_claim(job))
            if running is None:  # pragma: no cover - dispatched jobs are registered first
                continue
            try:
                self._run_one(running)
            except BaseException as exc:
                self._unrecorded(job, exc)
                _let_go(exc)
            finally:
                self._release(job, on_thread=True)
            job = running = None  # not kept while this thread waits for the next job

    def _unrecorded(self, job: Job, exc: BaseException) -> None:
        extra = {**job_fields(job), "owner": self.owner, "outcome": "unrecorded"}
        log.error(
            "unexpected error running the job; its lease expires",
            exc_info=exc,
            extra=extra,
        )
        self._abandon([job])
        self._finished("lease_lost", job, error=exc)  # lost to this worker

    def _run_one(self, running: _Running) -> None:
        job, ctx = running.job, running.ctx
        registration = self.registry.get(job.type)
        if registration is None:
            self._unknown_type(job)
            return
        hooks = self._hooks
        if hooks is not None and hooks.started:
            hooks.job_started(job, ctx)
        running.in_handler = True
        started = time.monotonic()
        value: Any = None
        error: BaseException | None = None
        try:
            try:
                value = registration.handler(ctx, job)
            finally:
                running.in_handler = False
                ctx.flush_progress()  # a value kept by the throttle, before the outcome
                if hooks is not None and hooks.returned:
                    hooks.job_returned(job, sys.exc_info()[1])
        except Exception as exc:
            error = exc
        try:
            self._settle(running, registration, started, value, error)
        finally:
            # Recorded (or given up on): what the handler held goes now, not
            # when the cyclic collector runs (this frame is on the error's
            # traceback, and held the error: a cycle).
            _let_go(error)
            error = value = None

    async def _run_async(
        self, running: _Running, registration: Registration, io: concurrent.futures.Executor
    ) -> None:
        """An async job, on the event loop: its handler as a task of its own (what
        the context's cancellation cancels), then its outcome, off the loop (on ``io``)."""
        job, ctx = running.job, running.ctx
        try:
            loop = asyncio.get_running_loop()
            started = time.monotonic()
            value: Any = None
            error: BaseException | None = None
            task = loop.create_task(self._invoke(running, registration), name=f"jobrun {job.id}")
            ctx._on_cancel = functools.partial(_cancel_soon, loop, task)
            if ctx.is_cancelled:  # cancelled before its task existed
                task.cancel()
            try:
                value = await task
            except asyncio.CancelledError as exc:  # its context's cancel, or its own
                error = exc
            except Exception as exc:
                error = exc
            ctx.flush_progress()  # a value kept by the throttle, before the outcome
            written = running.progress.pending() if running.progress is not None else None
            if written is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wrap_future(written)
            try:
                if error is None and value is None and not ctx.is_cancelled:
                    # The common case needs no write of its own: it joins the batch here.
                    self._settle(running, registration, started, value, error)
                else:
                    await loop.run_in_executor(
                        io,
                        self._settle,
                        running,
                        registration,
                        started,
                        value,
                        error,
                    )
            finally:
                # Recorded: drop the error (its traceback holds the handler's
                # frames, and this one, which held it) and the task (which
                # keeps its exception), as _run_one does.
                ctx._on_cancel = None
                _let_go(error)
                del error, value, task
        except BaseException as exc:
            self._unrecorded(job, exc)
            _let_go(exc)
            if not isinstance(exc, Exception):
                raise
        finally:
            self._release(job)

    async def _invoke(self, running: _Running, registration: Registration) -> Any:
        """The handler's own task: the hooks run inside it (its own context)."""
        job, ctx = running.job, running.ctx
        hooks = self._hooks
        if hooks is not None and hooks.started:
            hooks.job_started(job, ctx)
        running.in_handler = True
        try:
            return await registration.handler(ctx, job)
        finally:
            running.in_handler = False
            if hooks is not None and hooks.returned:
                hooks.job_returned(job, sys.exc_info()[1])

    def _async_ended(self, job: Job, future: concurrent.futures.Future[None]) -> None:
        """A job's coroutine ended without finishing its bookkeeping (the loop stopped)."""
        if future.cancelled():
            self._note(logging.WARNING, job, "its coroutine was dropped; its lease expires")

    def _settle(
        self,
        running: _Running,
        registration: Registration,
        started: float,
        value: Any,
        error: BaseException | None,
    ) -> None:
        """Record what the handler did: raised ``error`` or returned ``value``
        (for plain and async handlers alike; see :mod:`jobrun.worker.registry`)."""
        job, ctx = running.job, running.ctx
        if error is not None:
            if isinstance(error, Snooze):
                self._snooze(job, registration, error, started)
            elif isinstance(error, PermanentFailure):
                self._fail(job, _describe(error), permanent=True, exc=error, started=started)
            elif isinstance(error, asyncio.CancelledError) and ctx.is_cancelled:
                self._fail(job, f"cancelled ({ctx.cancel_reason})", exc=error, started=started)
            else:
                self._fail(job, _describe(error, with_traceback=True), exc=error, started=started)
            return
        commit: Commit | None = None
        result: Any = None
        if value is None:  # the common case first: no other check costs it anything
            pass
        elif isinstance(value, Done):
            commit, result = value.commit, value.result
        elif isinstance(value, Snooze):
            self._snooze(job, registration, value, started)
            return
        elif callable(value):
            commit = value
        elif inspect.isawaitable(value):
            _close(value)
            advice = (
                "an async handler's value is what it returns: await this one inside it"
                if registration.is_async
                else "jobrun awaits only handlers registered as async def functions: "
                "register an async def (or await it inside this one)"
            )
            self._fail(
                job,
                f"the handler returned a {type(value).__name__}, which nothing awaits; {advice}",
                permanent=True,  # it would fail every attempt the same way
                started=started,
            )
            return
        else:
            result = value
        if ctx.is_cancelled:
            # Cancel wins: a handler that returns after cancellation never succeeds.
            self._fail(job, f"cancelled ({ctx.cancel_reason})", started=started)
            return
        if result is not None:
            try:
                validate.result(result)
            except ValidationError as exc:
                # Refused here, in its own attempt: never in the batch it would join.
                self._fail(
                    job,
                    f"the handler's return value cannot be stored as the job's result: {exc}",
                    exc=exc,
                    started=started,
                )
                return
        # Completed in a batch by the completer thread, or with the claimer's
        # next claim of a limited queue; heartbeated until then.
        finished = _Finished(job, commit, result, time.monotonic() - started)
        with self._lock:
            self._unflushed[_claim(job)] = job
            self._unflushed_by_queue[job.queue] = self._unflushed_by_queue.get(job.queue, 0) + 1
            to_claimer = commit is None and self._claimer_completes and job.queue in self._limited
            if to_claimer:
                self._claimer_done.append(finished)
        if not to_claimer:
            self._done.put(finished)

    def _fail(
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
            return self._call(
                "fail", 1, lambda: self.store.fail(job, error, retry_at, permanent=permanent)
            )

        failed = self._record(job, write, "failure", duration=duration, handler_error=exc)
        if failed is None:
            return
        self._count("cancelled" if failed.state is State.CANCELLED else "failed")
        if self._hooks is not None:
            kind: OutcomeKind = (
                "cancelled"
                if failed.state is State.CANCELLED
                else "dead"
                if failed.state is State.DEAD
                else "failed"
            )
            self._finished(
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
        took = "" if duration is None else f" in {_ms(duration)}"
        if failed.state is State.CANCELLED:
            how = "it stopped" if summary.startswith("cancelled (") else summary
            message = f"cancelled{took}: cancel was requested ({how})"
            self._job_log(logging.INFO, job, "cancelled", message, fields)
            return
        # The traceback goes with the line when DEBUG is on.
        exc_info = exc if exc is not None and log.isEnabledFor(logging.DEBUG) else None
        if failed.state is State.DEAD:
            why = (
                "permanent failure"
                if permanent
                else f"no attempts left ({job.attempts} of {job.max_attempts})"
            )
            self._job_log(
                logging.WARNING,
                job,
                "dead",
                f"dead{took} ({why}): {summary}",
                fields,
                exc_info=exc_info,
            )
            return
        fields["next_run_at"] = _iso(failed.run_at)
        wait = (failed.run_at - failed.updated_at).total_seconds()
        self._job_log(
            logging.INFO,
            job,
            "failed",
            f"failed{took}: {summary}; next attempt ({job.attempts + 1} of "
            f"{job.max_attempts}) at {_iso(failed.run_at)} (in {_seconds(wait)})",
            fields,
            exc_info=exc_info,
        )

    def _record(
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
        for attempt in range(len(_DB_RETRY_BACKOFF) + 1):
            try:
                return write()
            except LeaseLost:
                self._count("lease_lost", 1)
                self._job_log(
                    logging.WARNING,
                    job,
                    "lease_lost",
                    f"lease lost before its {what} was recorded: another worker owns the job now",
                )
                if self._hooks is not None:
                    self._finished("lease_lost", job, duration=duration, error=handler_error)
                return None
            except JobrunError as exc:
                if (
                    _db_fault(exc)
                    and attempt < len(_DB_RETRY_BACKOFF)
                    and not self._hard_stop.is_set()
                ):
                    time.sleep(_DB_RETRY_BACKOFF[attempt])
                    continue
                self._job_log(
                    logging.ERROR,
                    job,
                    "unrecorded",
                    f"could not record the {what} ({exc}); its lease will expire and "
                    "the reaper will requeue it",
                )
                self._abandon([job])
                if self._hooks is not None:  # its lease will expire: lost to this worker
                    self._finished("lease_lost", job, duration=duration, error=handler_error)
                return None
        return None  # pragma: no cover - the loop always returns

    def _unknown_type(self, job: Job) -> None:
        """No handler for the job's type: release it, not counting the attempt, up to a
        limit; then it is dead (see the module docstring)."""
        known = ", ".join(self.registry.types) or "none"
        limit = self.config.unknown_type_releases
        match = _RELEASED.match(job.last_error or "")
        release = (int(match.group(1)) if match else 0) + 1
        if release > limit:
            self._fail(
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
        released = self._record(job, lambda: self.store.release(job, delay, reason), "release")
        if released is None:
            return
        if released.state is State.CANCELLED:
            self._count("cancelled")
            if self._hooks is not None:
                self._finished("cancelled", job, error_text=reason)
            self._job_log(
                logging.INFO, job, "cancelled", "cancelled (requested) instead of released"
            )
            return
        self._count("released")
        if self._hooks is not None:
            self._finished("released", job, error_text=reason, next_run_at=released.run_at)
        with self._lock:
            first = job.type not in self._unknown_types
            self._unknown_types.add(job.type)
        fields = {"next_run_at": _iso(released.run_at), "error": reason}
        if first:
            self._job_log(
                logging.WARNING,
                job,
                "released",
                f"no handler for job type {job.type!r} in this worker (it knows: {known}); "
                f"released back to its queue for {_seconds(delay.total_seconds())}, "
                f"attempt not counted (release {release} of {limit}, then dead). "
                "A worker that knows the type may still be rolling out; otherwise check "
                "its spelling. (Said once per type; later releases are DEBUG lines.)",
                fields,
            )
        elif log.isEnabledFor(logging.DEBUG):
            self._job_log(
                logging.DEBUG,
                job,
                "released",
                f"released again (no handler; release {release} of {limit}), "
                f"next try at {_iso(released.run_at)}",
                fields,
            )

    def _snooze(self, job: Job, registration: Registration, snooze: Snooze, started: float) -> None:
        """The handler snoozed: queue the job again after the delay, its attempt
        given back, or fail the attempt past ``max_snoozes`` (see the module
        docstring)."""
        limit = registration.max_snoozes
        if limit is not None and job.snoozes >= limit:
            self._fail(
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
        released = self._record(
            job,
            lambda: self.store.release(job, delay, reason, snooze=True),
            "snooze",
            duration=duration,
        )
        if released is None:
            return
        fields: dict[str, Any] = {"duration_ms": round(duration * 1000, 3)}
        if released.state is State.CANCELLED:
            self._count("cancelled")
            if self._hooks is not None:
                self._finished("cancelled", job, duration=duration, error_text=reason)
            self._job_log(
                logging.INFO,
                job,
                "cancelled",
                f"cancelled in {_ms(duration)}: cancel was requested (it wins over the "
                "handler's snooze)",
                fields,
            )
            return
        self._count("snoozed")
        if self._hooks is not None:
            self._finished(
                "snoozed", job, duration=duration, error_text=reason, next_run_at=released.run_at
            )
        fields.update(
            next_run_at=_iso(released.run_at), delay_seconds=seconds, snoozes=released.snoozes
        )
        self._job_log(
            logging.INFO,
            job,
            "snoozed",
            f"snoozed for {seconds:g} s after {_ms(duration)} (snooze {count}{of}, attempt not "
            f"counted); next run at {_iso(released.run_at)}",
            fields,
        )

    # -- progress ------------------------------------------------------------------

    def _progress_sink(self, ctx: JobContext) -> ProgressSink:
        """How ``ctx.progress`` writes: on the handler's thread, fenced by the
        claim; a lost lease cancels the context, a database error is logged
        once per job (and never fails it)."""
        record = self.store.record_progress
        job = ctx.job
        lost = warned = False

        def write(value: float, message: str | None) -> bool:
            nonlocal lost, warned
            if lost:
                return True
            try:
                record(job, value, message)
            except LeaseLost:
                lost = True
                self._note(
                    logging.INFO,
                    job,
                    "cancelling: its lease is gone (a progress write found the job "
                    "no longer held by this claim)",
                )
                ctx.cancel("lease lost")
                return True
            except Exception as exc:
                if not warned:
                    warned = True
                    self._note(
                        logging.WARNING,
                        job,
                        f"recording its progress failed ({_describe(exc)}); the job runs on "
                        "(said once per job)",
                    )
                return False
            return True

        return write

    def _note(self, level: int, job: Job, message: str) -> None:
        """A line about ``job`` that is not its outcome."""
        if log.isEnabledFor(level):
            extra = job_fields(job)
            extra["owner"] = self.owner
            log.log(level, "%s", message, extra=extra)

    def _job_log(
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

    # -- completing ----------------------------------------------------------------

    def _complete_loop(self) -> None:
        size = self.config.complete_batch_size
        flush_after = self.config.complete_flush_interval.total_seconds()
        closing = False
        activity = self._completer_activity
        while not closing:
            activity.idle()
            first = self._done.get()
            if first is _FLUSH_NOW:
                continue  # nothing collected: nothing to flush
            activity.busy("collecting a batch")
            if first is None:
                closing = True
                batch: list[_Finished] = []
            else:
                assert isinstance(first, _Finished)
                batch = [first]
            # A limited queue's slots wait for it: then flush what has come by now.
            eager = isinstance(first, _Finished) and first.job.queue in self._limited
            deadline = time.monotonic() + (0.0 if eager else flush_after)
            while len(batch) < size:
                wait = deadline - time.monotonic()
                try:
                    item = self._done.get(timeout=wait) if wait > 0 else self._done.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    continue
                if isinstance(item, _FlushNow):
                    break  # the claimer waits on the slots this batch holds
                batch.append(item)
            if batch:
                self._flush(batch)

    def _flush(self, batch: list[_Finished]) -> None:
        """Complete a batch: plain successes with complete_many, commit callables with
        complete_many_tx (one transaction each), results stored by the same
        statements. Database faults are retried (both are safe to repeat);
        until then the jobs keep being heartbeated."""
        newest: dict[uuid.UUID, _Finished] = {}
        for done in batch:
            seen = newest.get(done.job.id)
            if seen is None or done.job.attempts > seen.job.attempts:
                newest[done.job.id] = done
        superseded = len(batch) - len(newest)
        if superseded:  # a stale claim of a job this worker claimed again
            self._count("lease_lost", superseded)
            for done in batch:
                if newest[done.job.id] is not done:
                    if self._hooks is not None:
                        self._finished("lease_lost", done.job, duration=done.duration)
                    self._job_log(
                        logging.INFO,
                        done.job,
                        "lease_lost",
                        "superseded by a newer claim of the same job; this one is dropped",
                    )
        plain = [done for done in newest.values() if done.commit is None]
        with_commit = [done for done in newest.values() if done.commit is not None]
        self._completer_activity.busy(
            f"completing {len(plain)} plain result(s) and {len(with_commit)} with a commit callable"
        )
        if plain:
            jobs = [done.job for done in plain]
            results = {d.job.id: d.result for d in plain if d.result is not None} or None
            outcome = self._retrying(
                lambda: self._call(
                    "complete", len(jobs), lambda: self.store.complete_many(jobs, results=results)
                ),
                jobs,
            )
            self._account(outcome, plain)
            if outcome is None:
                self._abandon(jobs)
                self._finished_all("lease_lost", plain)
        if with_commit:
            items = [(done.job, done.commit) for done in with_commit]
            results = {d.job.id: d.result for d in with_commit if d.result is not None} or None
            outcome = self._retrying(
                lambda: self._call(
                    "complete_tx",
                    len(items),
                    lambda: self.store.complete_many_tx(items, results=results),
                ),
                [job for job, _ in items],
                runs_callables=True,
            )
            self._account(outcome, with_commit)
            if outcome is None:
                self._abandon([job for job, _ in items])
                self._finished_all("lease_lost", with_commit)
            by_id = {done.job.id: done for done in with_commit}
            for job_id, exc in (outcome.failed if outcome else {}).items():
                done = by_id[job_id]
                self._fail(
                    done.job,
                    f"commit callable failed: {_describe(exc, with_traceback=True)}",
                    exc=exc,
                    started=time.monotonic() - done.duration,
                )
                _let_go(exc)  # the callable's frames: the store keeps the error in a cycle
        self._flushed(batch)

    def _flushed(self, batch: Sequence[_Finished]) -> None:
        """These results are recorded (or given up on): their leases no longer
        count against this worker."""
        with self._lock:
            for done in batch:
                if self._unflushed.pop(_claim(done.job), None) is not None:
                    self._unflushed_by_queue[done.job.queue] -= 1
                    if _claim(done.job) not in self._running:
                        self._lease_until.pop(_claim(done.job), None)
        self._slot_freed.set()  # the backlog shrank: the claimer may claim again

    def _retrying(
        self,
        complete: Callable[[], CompleteManyResult],
        jobs: Sequence[Job],
        *,
        runs_callables: bool = False,
    ) -> CompleteManyResult | None:
        """``complete()`` of ``jobs``, within their leases: each try is given up
        when the first of their leases ends by this worker's reckoning, and
        database faults are retried until then. None: not completed (the
        caller abandons them; their leases expire and the reaper requeues
        them).

        The end is taken once, before the first try: a heartbeat skips a row
        that a completion holds locked (and still reports it live), so a
        heartbeat sent meanwhile may not have extended it. A first try when
        that end has passed already (heartbeats failed for a while) still
        gets one heartbeat interval: the database's fence decides then (the
        job completes unless the reaper took it).

        With ``runs_callables`` (the transactional path) the first try keeps
        the store's own bound (``commit_timeout``): it locks the jobs' rows
        before it runs the handlers' commit callables, so the reaper cannot
        take them while it runs, and a callable may rightly take longer than
        the lease. Its retries, after a fault that released those locks, are
        held to the lease like any other.
        """
        size = len(jobs)
        failures = 0
        lease_ends = time.monotonic() + self._lease_left(jobs)
        floor = self.config.heartbeat_interval.total_seconds()
        while not self._hard_stop.is_set():
            left = lease_ends - time.monotonic()
            if failures == 0:
                left = max(left, floor)
            elif left <= 0:
                self._count("lease_lost", size)
                self._log.warning(
                    "completing %d job(s) given up: their lease ran out before the database "
                    "answered (lease TTL %s; the first of them ended %s ago by this worker's "
                    "clock); another worker may run them again",
                    size,
                    _seconds(self.config.lease_ttl.total_seconds()),
                    _seconds(-left),
                )
                return None
            if runs_callables and failures == 0:
                left = math.inf
            bound = self.store.bounded(left) if left < math.inf else contextlib.nullcontext()
            try:
                with bound:
                    result = complete()
            except DatabaseError as exc:  # a fault: retrying is safe
                failures += 1
                pause = _DB_RETRY_BACKOFF[min(failures, len(_DB_RETRY_BACKOFF)) - 1]
                outage.of(self.store).failed(exc, f"completing {size} job(s)")
                time.sleep(pause)
                continue
            except JobrunError as exc:
                self._log.error(
                    "completing %d job(s) failed for good (%s); their leases will expire", size, exc
                )
                return None
            return result
        return None

    def _lease_left(self, jobs: Sequence[Job]) -> float:
        """Seconds until the first of these leases ends by this worker's reckoning."""
        now = time.monotonic()
        with self._lock:
            ends = [self._lease_until.get(_claim(job)) for job in jobs]
        return min((end for end in ends if end is not None), default=math.inf) - now

    def _abandon(self, jobs: Sequence[Job]) -> None:
        """These claims ran but their outcome is not recorded: they stay leased
        to this owner until they expire, and they are not lost claims."""
        now = time.monotonic()
        with self._lock:
            for job in jobs:
                self._abandoned[_claim(job)] = now

    def _account(self, result: CompleteManyResult | None, batch: Sequence[_Finished]) -> None:
        """Count a completion's outcomes and log one line per job.

        The success lines cost one ``isEnabledFor`` check per batch when
        their level is off (the default: DEBUG).
        """
        if result is None:
            return
        self._count("succeeded", len(result.completed))
        self._count("cancelled", len(result.cancelled))
        self._count("lease_lost", len(result.lease_lost))
        if self._hooks is not None and self._hooks.finished:
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
                    self._finished(
                        kind,
                        done.job,
                        duration=done.duration,
                        result=done.result if kind == "succeeded" else None,
                    )
        level = self._success_level
        if result.completed and log.isEnabledFor(level):
            for done in batch:
                if done.job.id in result.completed:
                    stored = "" if done.result is None else ", result stored"
                    self._job_log(
                        level,
                        done.job,
                        "succeeded",
                        f"succeeded in {_ms(done.duration)}{stored}",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )
        if result.cancelled or result.lease_lost:
            for done in batch:
                if done.job.id in result.cancelled:
                    self._job_log(
                        logging.INFO,
                        done.job,
                        "cancelled",
                        f"cancelled: its handler returned in {_ms(done.duration)} but cancel "
                        "was requested first (cancel wins)",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )
                elif done.job.id in result.lease_lost:
                    self._job_log(
                        logging.WARNING,
                        done.job,
                        "lease_lost",
                        f"lease lost before its success was recorded (the handler ran "
                        f"{_ms(done.duration)}): another worker owns the job now and may run it "
                        "again",
                        {"duration_ms": round(done.duration * 1000, 3)},
                    )

    # -- heartbeats ----------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        interval = self.config.heartbeat_interval.total_seconds()
        ttl = self.config.lease_ttl.total_seconds()
        last_ok = time.monotonic()
        activity = self._heartbeat_activity
        while not self._heartbeat_stop.wait(interval):
            activity.busy("extending leases")
            try:
                self.heartbeat_once()
                last_ok = time.monotonic()
            except JobrunError as exc:
                outage.of(self.store).failed(exc, "heartbeat")
                if time.monotonic() - last_ok > ttl:
                    # Our leases may be gone: stop the handlers rather than
                    # let them finish work someone else may already redo.
                    with self._lock:
                        running = list(self._running.values())
                    for r in running:
                        r.ctx.cancel("heartbeats failing for longer than the lease TTL")
            except Exception:
                self._log.exception("heartbeat loop error")
            activity.idle()

    def heartbeat_once(self) -> None:
        """Extend every lease this worker holds; cancel the jobs the store left out.

        Only the leases sent are judged: a job claimed while the heartbeat
        was in flight is not "left out". When the same job runs under two
        claims of this worker (reaped, then claimed again before the stale
        handler returned), only the newest claim is live: the older one is
        cancelled at once.
        """
        with self._lock:
            running = list(self._running.values())
            unflushed = list(self._unflushed.values())
        newest: dict[uuid.UUID, Job] = {}
        for job in [r.job for r in running] + unflushed:
            current = newest.get(job.id)
            if current is None or job.attempts > current.attempts:
                newest[job.id] = job
        for r in running:
            if newest[r.job.id] is not r.job and not r.ctx.is_cancelled:
                r.ctx.cancel("superseded by a newer claim of the same job")
        if not newest:
            return
        leases = [(job.id, _claim(job)) for job in newest.values()]
        sent_at = time.monotonic()
        until = self.store.now() + self.config.lease_ttl
        kept = self._call(
            "heartbeat", len(leases), lambda: self.store.heartbeat(self.owner, leases, until)
        )
        sent = {token for _, token in leases}
        lease_until = sent_at + self.config.lease_ttl.total_seconds()
        with self._lock:
            for job_id, token in leases:
                if job_id in kept and token in self._lease_until:
                    self._lease_until[token] = max(self._lease_until[token], lease_until)
        for r in running:
            token = _claim(r.job)
            if token in sent and r.job.id not in kept and not r.ctx.is_cancelled:
                r.ctx.logger.info("cancelling: cancel requested or lease lost")
                r.ctx.cancel("cancel requested or lease lost")

    # -- hooks ---------------------------------------------------------------------

    def _claim_call(self, queues: list[str], limit: int) -> list[Job]:
        self._claim_sent = time.monotonic()  # the leases it grants start after this
        return self._call(
            "claim",
            len,  # the jobs it got
            lambda: self.store.claim(self.owner, queues, limit, self.config.lease_ttl),
            tuple(queues),
        )

    def _call(
        self,
        operation: StoreOperation,
        jobs: int | Callable[[_T], int],
        call: Callable[[], _T],
        queues: tuple[str, ...] = (),
    ) -> _T:
        """``call()``, reported to the hooks as one round trip of ``operation``.

        ``jobs``: how many jobs it carries, or how to count them in its answer
        (0 when it raised). A success is one for the outage reporter too.
        """
        hooks = self._hooks
        if hooks is None or not hooks.calls:
            answer = call()
            outage.of(self.store).ok()
            return answer
        began = time.perf_counter()
        try:
            answer = call()
        except BaseException as exc:
            carried = 0 if callable(jobs) else jobs
            hooks.store_call(
                StoreCall(operation, time.perf_counter() - began, carried, exc, queues)
            )
            raise
        outage.of(self.store).ok()
        carried = jobs(answer) if callable(jobs) else jobs
        hooks.store_call(StoreCall(operation, time.perf_counter() - began, carried, None, queues))
        return answer

    def _finished(
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
        hooks = self._hooks
        if hooks is not None and hooks.finished:
            hooks.job_finished(
                JobOutcome(kind, job, duration, error, error_text, next_run_at, result)
            )

    def _finished_all(self, kind: OutcomeKind, batch: Sequence[_Finished]) -> None:
        if self._hooks is not None:
            for done in batch:
                self._finished(kind, done.job, duration=done.duration)

    # -- introspection -----------------------------------------------------------

    @property
    def concurrency(self) -> int:
        """Jobs this worker runs at once: on handler threads and on its event loop together."""
        return self.config.concurrency

    @property
    def threads_busy(self) -> int:
        """Handler threads running a handler right now (counted when asked: the
        handlers pay no lock for it). Async handlers are :attr:`coroutines_busy`."""
        with self._lock:
            return sum(1 for r in self._running.values() if r.in_handler and not r.on_loop)

    @property
    def coroutines_busy(self) -> int:
        """Async handlers running on the event loop right now."""
        with self._lock:
            return sum(1 for r in self._running.values() if r.in_handler and r.on_loop)

    @property
    def dead_threads(self) -> list[str]:
        """Names of this worker's threads that died while it runs (empty when healthy).

        Empty before start() and once stop() began: threads end then on purpose.
        """
        if not self._started or self._stopping.is_set():
            return []
        loop = self._loop
        extra = () if loop is None else (loop.thread,)
        return [t.name for t in (*self._handlers, *self._threads, *extra) if not t.is_alive()]

    def _count(self, outcome: str, n: int = 1) -> None:
        with self._lock:
            self.stats[outcome] += n

    @property
    def running_jobs(self) -> list[Job]:
        with self._lock:
            return [r.job for r in self._running.values()]

    @property
    def stalled_loops(self) -> dict[str, float]:
        """The loops stuck on one step longer than the stall bound: name -> seconds."""
        return self._stalls.stalled()

    @property
    def idle(self) -> bool:
        with self._lock:
            return self._inflight == 0 and not self._unflushed


_T = TypeVar("_T")


def _claim(job: Job) -> uuid.UUID:
    """The lease token: what identifies one claim of a job."""
    assert job.lease_token is not None  # claimed jobs carry their lease
    return job.lease_token


def _db_fault(exc: JobrunError) -> bool:
    """A database fault (retry later), as opposed to a verdict like LeaseLost."""
    return isinstance(exc, DatabaseError)


def _close(value: object) -> None:
    """Close a coroutine nothing will await (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if callable(close):
        with contextlib.suppress(Exception):  # best effort on a value being refused
            close()


def _ms(seconds: float) -> str:
    """A handler's run time as people read it: 0.4 ms, 12 ms, 3.2 s."""
    ms = seconds * 1000
    if ms < 10:
        return f"{ms:.1f} ms"
    if ms < 10_000:
        return f"{ms:.0f} ms"
    return f"{seconds:.1f} s"


def _seconds(seconds: float) -> str:
    """A wait as people read it: 2.0 s, 4 min, 1.5 h."""
    seconds = max(seconds, 0.0)
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _iso(when: dt.datetime) -> str:
    """A database time in ISO 8601 UTC (``Z``), to the millisecond."""
    return when.astimezone(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


_JOBRUN_DIR = str(Path(__file__).resolve().parents[1])
TRACEBACK_FRAMES = 8
"""Frames kept of a failed job's traceback (the innermost): last_error is capped anyway."""


def _let_go(error: BaseException | None) -> None:
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


def _describe(exc: BaseException, *, with_traceback: bool = False) -> str:
    """An exception as logged and stored, without any password it quotes."""
    text = f"{type(exc).__name__}: {exc}"
    if with_traceback:
        text = f"{text}\n{_user_traceback(exc)}"
    return validate.redact(text)


def _user_traceback(exc: BaseException) -> str:
    """The traceback from the first frame that is not jobrun's own.

    The worker's frames that called the handler (or the store's that called a
    commit callable) say nothing to the reader of a job's last_error; frames
    of jobrun's below the user's code (a jobrun call that failed) are kept.
    """
    summary = traceback.TracebackException.from_exception(exc)
    frames = list(summary.stack)
    while len(frames) > 1 and frames[0].filename.startswith(_JOBRUN_DIR):
        frames.pop(0)
    summary.stack = traceback.StackSummary.from_list(frames[-TRACEBACK_FRAMES:])
    return "".join(summary.format())
