"""Wiring: a worker process (or a worker inside your own program) from Settings and a Registry.

::

    with jobrun.Runtime(jobrun.Settings.from_env(), registry):   # started; drained on exit
        serve_my_http_api()

    jobrun.Runtime(settings, registry).run()   # or block until SIGTERM/SIGINT, as `jobrun worker`

Why one object: the pieces of a worker process (the worker's pool, the
listener, the scheduler's lock and its own small pool) must be opened,
started and stopped in one order, and a process that starts too early must
fail at once. So the Settings are frozen and checked before anything
connects; the constructor opens the pools and checks the schema version
(``SchemaMismatch`` when ``jobrun migrate`` was not run); ``start()`` and
``stop()`` are safe twice and from any thread; the shutdown drains the
worker, then stops the scheduler (releasing leadership), the listener and
the pools. Behind a transaction pooler the session work (LISTEN, the leader
lock) goes to ``JOBRUN_DIRECT_URL``, or degrades to polling and a lease row;
one INFO line says which.

Observability (metrics, health, tracing) is asked for by the settings, but
the runtime does not know it: it calls an :class:`Observer` made by the
factory plugged in with :func:`observe_with` (the ``jobrun`` package plugs
:mod:`jobrun.observe.wiring` in, imported only when asked for), so the core
never imports the optional part.

A Runtime needs a database URL: silently starting a private embedded
database because a setting was misspelt would hide the mistake, so that
fallback belongs to the ``jobrun`` command and ``Client.connect()`` (see
:func:`resolve_database_url`), which say so.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from jobrun.client import make_store
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.service import Service
from jobrun.postgres import dsn
from jobrun.postgres.connect import ConnectionPool, database_url_or_embedded
from jobrun.postgres.leader import LeaseLocker, leader_lock_name
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.notify import Notifier, NullDispatcher
from jobrun.postgres.pool import describe, open_pool, pooler_of
from jobrun.postgres.store import Store
from jobrun.scheduler.service import SchedulerService
from jobrun.worker.hooks import WorkerHooks
from jobrun.worker.registry import Registry
from jobrun.worker.stop_signals import StopSignals
from jobrun.worker.worker import Worker

__all__ = [
    "Observer",
    "Runtime",
    "leader_lock_name",
    "make_store",
    "observe_with",
    "resolve_database_url",
]

log = logging.getLogger("jobrun")


def resolve_database_url(settings: Settings, *, say: Callable[[str], None] | None = None) -> str:
    """``settings.database_url``, or the embedded PostgreSQL (started or reused), said out loud.

    For the ``jobrun`` command and ``Client.connect()`` without a URL only:
    the fallback is announced in one line, given to ``say`` (the command
    writes it on stderr), by default a WARNING of the ``jobrun`` logger.
    """
    return database_url_or_embedded(settings.database_url, say=say)


class Observer(Protocol):
    """What rides along with a Runtime: hooks on its worker, servers beside it.

    :class:`jobrun.observe.wiring.Observability` is the one jobrun has.
    """

    @property
    def hooks(self) -> Sequence[WorkerHooks]:
        """The worker hooks to add (given at the worker's construction)."""
        ...

    def attach(
        self,
        *,
        worker: Worker | None,
        worker_store: Store | None,
        scheduler: SchedulerService | None,
        scheduler_store: Store | None,
    ) -> None:
        """Watch what the Runtime built."""

    def start(self, worker: Worker | None) -> None:
        """Serve, just before the worker starts."""

    def stopping(self) -> None:
        """The Runtime begins to stop (readiness fails from now on)."""

    def stop(self) -> None:
        """Stop serving; called once, after the worker drained."""


ObserverFactory = Callable[[Settings], Observer | None]
"""Makes the observer ``settings`` ask for (None: they ask for nothing)."""

_observer_factory: list[ObserverFactory] = []


def observe_with(factory: ObserverFactory | None) -> None:
    """Every Runtime built from now on gets ``factory(settings)`` as its ``observe``.

    The ``jobrun`` package plugs in :mod:`jobrun.observe`'s at import; None unplugs.
    """
    _observer_factory[:] = [] if factory is None else [factory]


class Runtime(Service):
    """A worker (and, by default, a scheduler candidate) in this process.

    ``settings`` must name the database (``database_url``, or the
    ``database_url`` argument); ``registry`` holds the handlers and is
    required unless ``worker=False``. With ``check_schema`` (the default)
    the constructor raises :class:`~jobrun.SchemaMismatch` when the schema
    is missing or at another version, before anything runs. ``hooks``
    (:class:`~jobrun.WorkerHooks`) go to the worker: metrics, tracing,
    your own tools.
    """

    def __init__(
        self,
        settings: Settings,
        registry: Registry | None = None,
        *,
        database_url: str | None = None,
        worker: bool = True,
        scheduler: bool = True,
        check_schema: bool = True,
        hooks: Sequence[WorkerHooks] = (),
    ) -> None:
        self.settings = settings
        url = database_url or settings.database_url
        if not url:
            raise ValidationError(
                "DATABASE_URL",
                "no database URL: set DATABASE_URL or Settings(database_url=...) "
                "(a Runtime never falls back to the embedded PostgreSQL; only the "
                "jobrun command and Client.connect() do, and they say so)",
            )
        if worker and registry is None:
            raise ValidationError("registry", "a worker needs a Registry of handlers")
        if not worker and not scheduler:
            raise ValidationError("worker", "a Runtime runs a worker, a scheduler or both")
        url = dsn.normalize(url)
        self.observe: Observer | None = None
        """Metrics, tracing and health, when the settings ask for them."""
        for factory in _observer_factory:
            self.observe = factory(settings)  # a missing extra fails before connecting
        if self.observe is not None:
            hooks = [*hooks, *self.observe.hooks]
        self._pools: list[ConnectionPool[Any]] = []
        self.worker: Worker | None = None
        self.scheduler: SchedulerService | None = None
        self.notifier: Notifier | NullDispatcher | None = None
        self._lock = threading.RLock()
        self._release_lock = threading.Lock()
        self._released = False
        self._started = False
        self._stopping = False
        self._stopped = False
        self._drained = True
        self._stop_requested = threading.Event()
        self._killed = threading.Event()
        try:
            stores: list[Store] = []
            if worker:
                assert registry is not None
                pool = open_pool(
                    url,
                    concurrency=settings.concurrency,
                    application_name="jobrun-worker",
                    pooler=settings.pooler,
                )
                self._pools.append(pool)
                stores.append(make_store(pool, settings))
                if check_schema:
                    stores[0].check_schema()
                listen_url = settings.session_url(url, pooler_of(pool))
                if settings.notifications and listen_url is not None:
                    self.notifier = Notifier(listen_url, channel=settings.notify_channel)
                else:
                    if settings.notifications:
                        log.info(
                            "jobrun: no LISTEN through a transaction pooler: workers poll every "
                            "%gs (set JOBRUN_DIRECT_URL to a direct connection for wake-ups)",
                            settings.poll_interval.total_seconds(),
                        )
                    self.notifier = NullDispatcher()
                self.worker = Worker(
                    stores[0],
                    registry,
                    settings.worker_config(),
                    dispatcher=self.notifier,
                    database=f"{describe(url)} (schema {settings.schema})",  # no password
                    hooks=hooks,
                )
            sstore: Store | None = None
            if scheduler:
                spool = open_pool(
                    url,
                    concurrency=1,
                    min_size=1,
                    max_size=3,
                    application_name="jobrun-reaper",
                    pooler=settings.pooler,
                )
                self._pools.append(spool)
                sstore = make_store(spool, settings)
                if check_schema and not stores:
                    sstore.check_schema()
                lock_url = settings.session_url(url, pooler_of(spool))
                locker: AdvisoryLocker | LeaseLocker
                if lock_url is not None:
                    locker = AdvisoryLocker(lock_url, leader_lock_name(settings.schema))
                else:
                    locker = LeaseLocker(
                        sstore,
                        leader_lock_name(settings.schema),
                        holder=None if self.worker is None else self.worker.owner,
                    )
                    log.info(
                        "jobrun: through a transaction pooler the leader is elected by a lease "
                        "row (%s) with a fencing term (set JOBRUN_DIRECT_URL for the session lock)",
                        locker.name,
                    )
                self.scheduler = SchedulerService(
                    sstore,
                    locker,
                    settings.scheduler_config(),
                    worker_id=None if self.worker is None else self.worker.owner,
                )
            if self.observe is not None:
                self.observe.attach(
                    worker=self.worker,
                    worker_store=stores[0] if stores else None,
                    scheduler=self.scheduler,
                    scheduler_store=sstore,
                )
        except BaseException:
            self._release()
            raise
        if self.worker is None:  # a worker's start banner names the database already
            log.info("jobrun scheduler on %s (schema %s)", describe(url), settings.schema)

    # -- lifecycle ---------------------------------------------------------------

    def start(self) -> None:
        """Start the observability server (if any), the listener, the scheduler and the worker.

        Returns at once. A metrics or health port that cannot be bound raises
        a ValidationError naming its setting, before anything else started
        (the Runtime is released then). Safe to call twice. A stopped Runtime
        cannot start again (its pools are closed): build a new one.
        """
        with self._lock:
            if self._stopping or self._stopped:
                raise RuntimeError("this Runtime was stopped; create a new one to start again")
            if self._started:
                return
            self._started = True
            if self.observe is not None:
                try:
                    self.observe.start(self.worker)
                except BaseException:
                    self._stopped = True
                    self._release()
                    raise
            if self.notifier is not None:
                self.notifier.start()
            if self.scheduler is not None:
                self.scheduler.start()
            if self.worker is not None:
                self.worker.start()

    def stop(self, timeout: float | None = None) -> bool:
        """Stop claiming, drain, and release everything (see the module docstring).

        Running handlers get ``timeout`` seconds (default: the settings'
        shutdown grace) before they are cancelled. Safe to call twice and
        from any thread: a second caller waits for the first and gets its
        answer. Returns True when every handler returned. Ends :meth:`run`.
        """
        self._stop_requested.set()
        with self._lock:
            if self._stopping or self._stopped:  # done, or re-entered (a signal handler)
                return self._drained
            self._stopping = True
            if self.observe is not None:
                self.observe.stopping()
            try:
                if self.worker is not None and self._started:
                    self._drained = self.worker.stop(timeout)
            finally:
                self._release()
                self._stopped = True
        return self._drained

    def close(self) -> None:
        """Same as :meth:`stop`."""
        self.stop()

    def run(self, *, install_signals: bool = True) -> None:
        """Start, block until told to stop, then stop gracefully.

        With ``install_signals`` (what ``jobrun worker`` does) SIGTERM and
        SIGINT stop it, a second signal at once; the previous handlers are
        put back on return. Only the main thread can install them. A program
        that entered :class:`~jobrun.worker.stop_signals.StopSignals` before
        building the Runtime (so that a signal during start-up stops it
        cleanly, as ``jobrun worker`` does) keeps them: run() attaches to
        them, and their ``forced_by`` then says whether a second signal cut
        the drain short. Without ``install_signals``, the program keeps its
        own signal handling and ends ``run`` by calling :meth:`stop` (from a
        signal handler or another thread).
        """
        if install_signals and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "Runtime.run() installs signal handlers, which only the main thread can; "
                "pass install_signals=False and call stop() yourself"
            )
        with contextlib.ExitStack() as own:
            signals = StopSignals.installed() if install_signals else None
            if install_signals and signals is None:
                signals = own.enter_context(StopSignals())
            try:
                if signals is not None:
                    signals.attach(self._stop_requested.set, self._kill)
                self.start()
            except BaseException:
                if not self._started:  # interrupted before it started: release what is open
                    self.stop(timeout=0)
                raise
            while not self._stop_requested.wait(0.5):
                pass
            # The graceful stop runs on a thread of its own, so that a second
            # signal (handled on this thread) can cut it short.
            done = threading.Thread(target=self.stop, name="jobrun-shutdown", daemon=True)
            done.start()
            while done.is_alive() and not self._killed.is_set():
                done.join(0.2)
            if self._killed.is_set():
                self._release()  # leadership and connections go now; leases expire

    def _kill(self) -> None:
        """Stop at once: nothing more is claimed, completed or heartbeated (leases expire)."""
        self._killed.set()
        self._stop_requested.set()
        if self.worker is not None:
            self.worker.kill()

    def _release(self) -> None:
        """Stop the scheduler and the listener and close the pools, once (from any thread)."""
        with self._release_lock:
            if self._released:
                return
            self._released = True
        if self.observe is not None:
            self.observe.stop()
        if self.scheduler is not None:
            self.scheduler.stop()
        if self.notifier is not None:
            self.notifier.stop()
        for pool in self._pools:
            pool.close()
