"""The threaded worker: claim, run, heartbeat, finish, as named parts.

A :class:`Worker` runs the jobs of its queues, ``concurrency`` at once:
plain handlers on threads, ``async def`` handlers as tasks on one event
loop. It is a handful of parts, each a module with one role, around one
ledger of what the worker holds:

- :mod:`~jobrun.worker.leases`: the ledger (running, unflushed, lease ends)
  and where a finished job's success goes;
- :mod:`~jobrun.worker.claimer` (``jobrun-claimer``): claims what the
  worker can start now, complete-and-claim, lost claims;
- :mod:`~jobrun.worker.executor` (``jobrun-handler-N``, and
  :mod:`~jobrun.worker.event_loop`: ``jobrun-async-loop``,
  ``jobrun-async-io_N``): runs the handlers and settles their outcome;
- :mod:`~jobrun.worker.completer` (``jobrun-completer``): records
  successes in batches, within their leases;
- :mod:`~jobrun.worker.heartbeat`, :mod:`~jobrun.worker.timeouts`,
  :mod:`~jobrun.worker.stall_watch`: the other loop threads;
- :mod:`~jobrun.worker.outcomes`: writes, logs, counts and reports outcomes.

This module keeps what concerns the whole: building and wiring the parts,
the start banner, and the ordered shutdown. Stop claiming; let running
handlers finish until the grace period ends; cancel the rest and give them a
moment (an interrupted job is failed back to its queue, its attempt kept);
flush the completer; stop the event loop; give back the jobs of handlers
that ignored cancellation; stop heartbeats last (a lease is kept until its
outcome is recorded). A second signal stops at once: the leases expire and
the reaper requeues the jobs. The threads are named, so ``py-spy dump`` and
the logs say who is who; docs/architecture.md has the whole story.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence

from jobrun.job import outage
from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import Job
from jobrun.job.ports import Dispatcher, Store
from jobrun.job.service import Service
from jobrun.job.workers import WorkerInfo
from jobrun.worker import logs, text
from jobrun.worker.claimer import CLAIM_COALESCE, LIMITED_RECLAIM, LOST_CLAIM_DELIVERY, Claimer
from jobrun.worker.completer import Completer
from jobrun.worker.config import (
    DEFAULT_COMPLETE_BATCH,
    DEFAULT_COMPLETE_FLUSH,
    DEFAULT_CONCURRENCY,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_LEASE_TTL,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_PROGRESS_INTERVAL,
    DEFAULT_SHUTDOWN_GRACE,
    DEFAULT_UNKNOWN_TYPE_DELAY,
    DEFAULT_UNKNOWN_TYPE_RELEASES,
    MAX_CONCURRENCY,
    UNKNOWN_TYPE_DELAY_GROWTH,
    WorkerConfig,
    parse_queues,
)
from jobrun.worker.event_loop import ASYNC_IO_THREADS, EventLoop
from jobrun.worker.executor import Executor
from jobrun.worker.heartbeat import Heartbeat
from jobrun.worker.hooks import HookRunner, WorkerHooks
from jobrun.worker.leases import Leases
from jobrun.worker.outcomes import Outcomes
from jobrun.worker.parts import Parts
from jobrun.worker.registry import Registry
from jobrun.worker.stall_watch import ActivityProbe, StallWatch
from jobrun.worker.starter import Starter
from jobrun.worker.stop_signals import StopSignals
from jobrun.worker.timeouts import Timeouts

__all__ = [
    "ABANDONED_RELEASE_BOUND",
    "ASYNC_IO_THREADS",
    "CLAIM_COALESCE",
    "DEFAULT_COMPLETE_BATCH",
    "DEFAULT_COMPLETE_FLUSH",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_LEASE_TTL",
    "DEFAULT_POLL_INTERVAL",
    "DEFAULT_PROGRESS_INTERVAL",
    "DEFAULT_SHUTDOWN_GRACE",
    "DEFAULT_UNKNOWN_TYPE_DELAY",
    "DEFAULT_UNKNOWN_TYPE_RELEASES",
    "LIMITED_RECLAIM",
    "LOST_CLAIM_DELIVERY",
    "MAX_CONCURRENCY",
    "UNKNOWN_TYPE_DELAY_GROWTH",
    "ActivityProbe",
    "Worker",
    "WorkerConfig",
    "parse_queues",
]

log = logging.getLogger("jobrun.worker")

ABANDONED_RELEASE_BOUND = 5.0
"""Seconds a stopping worker spends at most giving back the jobs of handlers
that ignored cancellation (see ``Worker._give_back_abandoned``)."""


REGISTER_BOUND = 5.0
"""Seconds a starting worker waits at most for its registration (see
``Worker._register``); the heartbeat registers it when this ran out."""


class Worker(Service):
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
        """A password-free description of the database, for the start banner."""
        # None without hooks: every call site pays one `is not None` check.
        hook_runner = HookRunner(hooks) if hooks else None
        self.registry = registry
        self.config = (config or WorkerConfig()).with_owner()
        assert self.config.owner is not None
        self.owner: str = self.config.owner
        self.dispatcher = dispatcher
        self._queue_names = list(self.config.queues)
        self._hard_stop = threading.Event()  # give up on everything
        self._started = False
        self._stopped = False
        self._stop_lock = threading.RLock()  # one stop at a time; re-entered: see stop()
        self._stop_entered = False
        self._stop_requested = threading.Event()  # ends run()
        self._drained = True
        self._log = logging.LoggerAdapter(log, {"owner": self.owner})
        cfg = self.config
        stall = (cfg.stall_warning or cfg.lease_ttl).total_seconds()
        self._stalls = StallWatch(stall, self._log, outage.of(store))
        self._leases = Leases(
            cfg.queues,
            cfg.lease_ttl.total_seconds(),
            concurrency=cfg.concurrency,
            allowance=max(cfg.concurrency, cfg.complete_batch_size),
        )
        self._outcomes = Outcomes(
            store=store,
            config=cfg,
            leases=self._leases,
            registry=registry,
            owner=self.owner,
            hooks=hook_runner,
            hard_stop=self._hard_stop,
        )
        self.stats = self._outcomes.stats
        self._timeouts = Timeouts()
        parts = Parts(store, cfg, self._leases, self._outcomes)
        self._executor = Executor(
            parts,
            self._timeouts,
            loop_activity=self._stalls.track("jobrun-async-loop"),
            loop_tick=min(max(stall / 4, 0.01), 1.0),
            hard_stop=self._hard_stop,
        )
        self._claimer = Claimer(parts, self._stalls.track("jobrun-claimer"), self._executor)
        self._lanes = [
            Claimer(
                parts,
                self._stalls.track(f"jobrun-claimer-{n}"),
                self._executor,
                primary=self._claimer,
                lane=n,
            )
            for n in range(2, (cfg.claim_lanes or 1) + 1)
        ]
        self._starter = Starter(parts, self._stalls.track("jobrun-starter"), self._executor)
        self._completer = Completer(parts, self._stalls.track("jobrun-completer"), self._hard_stop)
        self._heartbeat = Heartbeat(parts, self._stalls.track("jobrun-heartbeat"))

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start every thread. Safe to call twice."""
        if self._started:
            return
        self._started = True
        self._outcomes.success_level = logs.success_level(self.config.success_log_level)
        self._log_banner()
        self._warn_contradictions()
        if self.dispatcher is not None:
            self._claimer.waiter = self.dispatcher.subscribe(self._queue_names)
            # Woken from its wait for work, the claimer completes a success
            # that releases a dependent together with its next claim (polling,
            # it would not wake: the completer records such successes then).
            self._leases.wake_claimer = self._claimer.wake
            probe = getattr(self.dispatcher, "activity", None)
            if callable(probe):
                self._stalls.track_probe("jobrun-listener", probe)
        self._register()
        self._timeouts.start()
        self._executor.start()
        for part in (
            self._claimer,
            *self._lanes,
            self._starter,
            self._completer,
            self._heartbeat,
            self._stalls,
        ):
            part.start()

    def _register(self) -> None:
        """Put this worker in the registry (jobrun.workers) before it claims: the
        claim reads the types it knows from there. A database that does not
        answer now is no reason not to start: the heartbeat registers it
        later, and until then its claims take every type (and release the
        unknown ones), as an unregistered worker's do."""
        info = WorkerInfo(
            id=self.owner,
            host=socket.gethostname()[:255],
            pid=os.getpid(),
            version=logs.version()[:255],
            queues=tuple(self.config.queues),
            concurrency=self.config.concurrency,
            types=tuple(self.registry.types),
            lease_ttl=self.config.lease_ttl,
        )
        self._heartbeat.info = info
        try:
            with self.store.bounded(REGISTER_BOUND):
                self.store.register_worker(info)
            self._heartbeat.registered = True
        except JobrunError as exc:
            # Not an outage of its own: the claims and heartbeats that follow
            # say that, if it lasts.
            self._log.warning(
                "worker %s not registered yet (%s): its heartbeat registers it", self.owner, exc
            )

    def _unregister(self) -> None:
        """A clean stop takes the registry row away, bounded like the give-back:
        a database that is gone leaves the row to be pruned."""
        if self._hard_stop.is_set() or not self._heartbeat.registered:
            return
        try:
            with self.store.bounded(ABANDONED_RELEASE_BOUND):
                self.store.unregister_worker(self.owner)
        except JobrunError as exc:
            self._log.warning(
                "worker %s left in the registry (it is pruned later): %s", self.owner, exc
            )

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
        completion up when its lease runs out (:mod:`jobrun.worker.completer`),
        so a commit callable never gets the whole commit timeout. Warned, not
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
                text.seconds(commit.total_seconds()),
                text.seconds(ttl.total_seconds()),
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
        for lane in self._lanes:
            lane.request_stop()
        self._claimer.work.set()  # idle lanes wait for work: let them see the stop
        for lane in self._lanes:
            lane.stop(max(deadline - time.monotonic(), 0.0) + 2.0)
        self._starter.stop(max(deadline - time.monotonic(), 0.0) + 2.0)
        self._claimer.stop(max(deadline - time.monotonic(), 0.0) + 2.0)  # gives the buffer back
        drained = self._leases.wait_idle(deadline)
        if not drained:
            running = self._leases.running()
            self._log.warning(
                "cancelling %d job(s) still running at the end of the grace period", len(running)
            )
            for r in running:
                r.ctx.cancel("worker shutting down")
            drained = self._leases.wait_idle(time.monotonic() + min(5.0, max(grace, 1.0)))
        # Idle handler threads end at once; those of abandoned handlers are not waited for.
        self._executor.stop_threads(wait=5.0 if drained else 0.0)
        self._completer.stop(30)  # it flushes what it holds first
        self._executor.stop_loop(5.0)  # coroutines that ignored cancellation are abandoned
        if not drained:
            self._give_back_abandoned()
        self._heartbeat.stop(10)
        self._unregister()
        self._timeouts.request_stop()
        self._stalls.request_stop()
        if self._claimer.waiter is not None:
            self._claimer.waiter.close()
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
        abandoned = [r.job for r in self._leases.running()]
        if not abandoned or self._hard_stop.is_set():
            return
        grace = text.seconds(self.config.shutdown_grace.total_seconds())
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
                self._outcomes.fail(
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
        self._claimer.stopping.set()
        for lane in self._lanes:
            lane.request_stop()
        self._starter.request_stop()
        self._heartbeat.request_stop()
        self._leases.slot_freed.set()
        self._stalls.request_stop()
        self._stopped = True
        self._stop_requested.set()

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

        def kill() -> None:
            self.kill()
            stop_requested.set()

        with contextlib.ExitStack() as stack:
            if install_signals:
                stack.enter_context(StopSignals()).attach(stop_requested.set, kill)
            self.start()
            while not stop_requested.wait(0.5):
                pass
            if not self._hard_stop.is_set():
                done = threading.Thread(target=self.stop, name="jobrun-shutdown", daemon=True)
                done.start()
                while done.is_alive() and not self._hard_stop.is_set():
                    done.join(0.2)

    def drain(self, *, max_jobs: int | None = None) -> int:
        """Run runnable jobs one by one in the calling thread until none is left.

        No worker threads: the handler runs here (an async handler on the
        worker's event loop, the calling thread waiting for it), and its
        completion (batch or commit callable) or failure is written before
        the next claim. For tests and :func:`jobrun.testing.run_jobs`; a
        retry scheduled for later is left queued. Returns how many jobs ran.
        """
        self._timeouts.start()
        ran = 0
        try:
            while max_jobs is None or ran < max_jobs:
                jobs = self._claimer.claim(self._queue_names, 1)
                if not jobs:
                    break
                [job] = jobs
                self._executor.run_here(job)
                self._completer.flush_queued()
                ran += 1
        finally:
            if not self._started:  # a loop started here ends here
                self._executor.stop_loop(5.0)
        return ran

    # -- introspection -----------------------------------------------------------

    @property
    def _threads(self) -> list[threading.Thread]:
        """The loop threads: claimer, completer, heartbeat (for tests and health)."""
        return [
            self._claimer.thread,
            *(lane.thread for lane in self._lanes),
            self._starter.thread,
            self._completer.thread,
            self._heartbeat.thread,
        ]

    @property
    def _handlers(self) -> list[threading.Thread]:
        return self._executor.handlers

    @property
    def _loop(self) -> EventLoop | None:
        return self._executor.loop

    def heartbeat_once(self) -> None:
        """Extend every lease this worker holds; cancel the jobs the store left out."""
        self._heartbeat.heartbeat_once()

    @property
    def concurrency(self) -> int:
        """Jobs this worker runs at once: on handler threads and on its event loop together."""
        return self.config.concurrency

    @property
    def threads_busy(self) -> int:
        """Handler threads running a handler right now (counted when asked: the
        handlers pay no lock for it). Async handlers are :attr:`coroutines_busy`."""
        return self._leases.in_handler(on_loop=False)

    @property
    def coroutines_busy(self) -> int:
        """Async handlers running on the event loop right now."""
        return self._leases.in_handler(on_loop=True)

    @property
    def buffered(self) -> int:
        """Jobs claimed ahead of the free threads and not started yet (leased,
        their attempt not counted): the buffer the claimer keeps (claim_ahead)."""
        return self._leases.holdings().buffered

    @property
    def dead_threads(self) -> list[str]:
        """Names of this worker's threads that died while it runs (empty when healthy).

        Empty before start() and once stop() began: threads end then on purpose.
        """
        if not self._started or self._claimer.stopping.is_set():
            return []
        loop = self._loop
        extra = () if loop is None else (loop.thread,)
        return [t.name for t in (*self._handlers, *self._threads, *extra) if not t.is_alive()]

    @property
    def running_jobs(self) -> list[Job]:
        return [r.job for r in self._leases.running()]

    @property
    def stalled_loops(self) -> dict[str, float]:
        """The loops stuck on one step longer than the stall bound: name -> seconds."""
        return self._stalls.stalled()

    @property
    def idle(self) -> bool:
        return self._leases.idle()
