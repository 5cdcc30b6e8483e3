"""The ledger of what a worker holds: its leases, from claim to recorded outcome.

Every job a worker claimed is, until its outcome is recorded, in one of three
places here: *buffered* (claimed ahead of the free threads, not started: its
attempt is not counted until the claimer's next round starts it), *running*
(started: its handler on a thread or the event loop, or about to be) or
*unflushed* (its handler succeeded; the success waits for the claimer's next
round or the completer). The claimer plans
its claims from these counts, the heartbeat extends exactly these leases, the
completer bounds each completion by when they end, and the shutdown waits for
them. So the counts, the lease ends and the one lock that guards them live in
one object, and the other parts ask it rather than share its dicts.

It also decides where a success goes (:meth:`Leases.finished`): a plain
success of a limited queue whose slots bind (``binding``), while the
claimer is claiming, waits for the claimer's next round (one transaction
completes it and claims the slot it frees again); everything else goes to
the completer's queue. Not every queue's: a round that completes commits
synchronously, and a claim that waits for the WAL to reach disk measured
slower than a claim and a completion sent side by side on two connections
(docs/performance.md), so a limit that does not bind (a rate, a key's or a
queue's limit far above what runs) costs its queue nothing here. A success
that may release a dependent soon (:meth:`Leases.releases_soon`) goes to the
claimer too, whatever it is doing, and wakes it: its round completes it and
claims in one transaction, which takes the released job (the continuation).
The claimer hands what it holds back to the completer whenever it is about
to wait for anything other than a freed slot.

Leases are keyed by their token, not the job id: a job reaped and claimed
again by this same worker runs under two claims for a moment (the stale
handler has not returned yet), and each must be tracked alone. Lease ends
are this worker's own reckoning on its monotonic clock (the time the claim,
or the last heartbeat that kept it, was sent, plus the TTL), never later
than the database's.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from jobrun.job.model import Job
from jobrun.job.ports import CommitCallable as Commit
from jobrun.job.validate import CheckedResult
from jobrun.worker.context import JobContext

if TYPE_CHECKING:
    from jobrun.worker.progress import OffloadedProgress


_RUN_WEIGHT = 0.05
"""Weight of the newest run time in its moving average."""


def _signal(event: threading.Event) -> None:
    """Set ``event`` unless it is set: a job's end signals two waiters, and
    setting a set Event still takes its lock and notifies no one."""
    if not event.is_set():
        event.set()


def token(job: Job) -> uuid.UUID:
    """The lease token: what identifies one claim of a job."""
    assert job.lease_token is not None  # claimed jobs carry their lease
    return job.lease_token


@dataclasses.dataclass(eq=False, slots=True)
class Running:
    """A claimed job whose handler runs (or waits for a thread)."""

    job: Job
    ctx: JobContext
    in_handler: bool = False
    """While its handler runs (plain writes by its thread: threads_busy reads them)."""
    on_loop: bool = False
    """An async handler's job: a task on the event loop, not a thread's."""
    progress: OffloadedProgress | None = None
    """An async job's progress writer (its writes off the loop)."""
    since: float = dataclasses.field(default_factory=time.monotonic)
    """When it started running (monotonic): its run time feeds the buffer's size."""


@dataclasses.dataclass(eq=False, slots=True)
class Finished:
    """A handler's success on its way to the completer (or the claimer)."""

    job: Job
    commit: Commit | None
    result: CheckedResult | None
    """The job's result, checked and serialised once on the handler's thread."""
    duration: float
    """Seconds the handler ran."""


class FlushNow:
    """Put on the completer's queue: flush the batch collected so far at once
    (the claimer waits on a limit that those leases hold)."""


FLUSH_NOW = FlushNow()

Completion = Finished | FlushNow | None
"""What the completer's queue carries (None: the worker is stopping)."""


@dataclasses.dataclass(frozen=True)
class Holdings:
    """A consistent reading of the ledger's counts, for the claim plan."""

    inflight: int
    inflight_by_queue: dict[str, int]
    unflushed: int
    unflushed_by_queue: dict[str, int]
    completing: frozenset[str]
    """Queues whose successes the claimer holds for its next claim."""
    buffered: int = 0
    """Jobs claimed ahead of the free threads, not started."""
    reserved: int = 0
    """Threads the rounds on their way will start jobs on."""
    claiming_ahead: int = 0
    """Jobs the claims on their way ask for ahead, into the buffer."""


class Leases:
    """What one worker holds, under one lock (see the module docstring)."""

    def __init__(
        self, queues: Iterable[str], lease_ttl: float, *, concurrency: int = 1, allowance: int = 1
    ) -> None:
        self._lock = threading.Lock()
        self._ttl = lease_ttl
        self._concurrency = concurrency
        self._allowance = allowance
        """Successes waiting to be recorded that do not yet slow claiming down."""
        self._running: dict[uuid.UUID, Running] = {}
        self._unflushed: dict[uuid.UUID, Job] = {}
        self._unflushed_by_queue: dict[str, int] = {}
        # When each claim's lease ends by this worker's reckoning (monotonic).
        self._lease_until: dict[uuid.UUID, float] = {}
        # Claims whose handler ran but whose outcome could not be recorded:
        # still leased to this owner in the database, and not lost claims.
        self._abandoned: dict[uuid.UUID, float] = {}
        self._inflight = 0  # claimed and not yet returned by its handler
        self._inflight_by_queue: dict[str, int] = dict.fromkeys(queues, 0)
        self._on_threads = 0  # of those, the jobs dispatched to handler threads
        self._mean_run: float | None = None  # moving average of run times, seconds
        self._buffered: dict[uuid.UUID, Job] = {}  # claim order
        self._reserved = 0  # threads the rounds in flight start jobs on
        self._claiming_ahead = 0  # jobs the claims in flight ask for ahead
        self._claimer_done: list[Finished] = []
        self._claimer_completes = False
        self._claimer_gone = False  # stopped: nothing more rides with its claims
        self.wake_claimer: Callable[[], None] | None = None
        """Wakes the claimer from any wait (set by the worker): a success that
        may release a dependent soon is taken to it to complete and claim."""
        self.claim_sent = 0.0
        """When the claimer's latest claim was sent (the leases it grants start after)."""
        self.binding: frozenset[str] = frozenset()
        """The limited queues whose slots bind now (the claimer decides): their
        plain successes ride with the claims, or the completer flushes them at
        once (their slots are what claims wait for)."""
        self.completions: queue.SimpleQueue[Completion] = queue.SimpleQueue()
        """The completer's queue."""
        self.slot_freed = threading.Event()
        """Set when a job's run ended or a batch was flushed: the claimer may claim."""
        self._slot_events = [self.slot_freed]
        self.thread_freed = threading.Event()
        """Set when a job's run ended or jobs were buffered: the starter may start."""

    # -- running -------------------------------------------------------------------

    def sent_claim(self) -> None:
        self.claim_sent = time.monotonic()

    def add(self, running: Running, *, reckon: bool) -> None:
        """Track a claimed job as running; ``reckon``: bound its lease (not in drain()).

        A buffered job started now keeps the lease end it had (a start does
        not extend the lease); a fresh claim's starts when the claim was sent.
        """
        lease_from = self.claim_sent or time.monotonic()
        job = running.job
        with self._lock:
            self._running[token(job)] = running
            if reckon:
                self._lease_until.setdefault(token(job), lease_from + self._ttl)
            self._inflight += 1
            self._inflight_by_queue[job.queue] = self._inflight_by_queue.get(job.queue, 0) + 1

    def get(self, job: Job) -> Running | None:
        with self._lock:
            return self._running.get(token(job))

    def to_thread(self) -> int:
        """One more job for the handler threads: how many they have now."""
        with self._lock:
            self._on_threads += 1
            return self._on_threads

    def release(self, job: Job, *, on_thread: bool = False) -> None:
        """The job's run is over (its outcome recorded or handed on): free its slot."""
        now = time.monotonic()
        claim = token(job)
        with self._lock:
            running = self._running.pop(claim, None)
            if running is not None:
                mean, ran = self._mean_run, now - running.since
                self._mean_run = ran if mean is None else mean + _RUN_WEIGHT * (ran - mean)
            if claim not in self._unflushed:  # its success waits for the completer
                self._lease_until.pop(claim, None)
            self._inflight -= 1
            self._inflight_by_queue[job.queue] -= 1
            if on_thread:
                self._on_threads -= 1
        if running is not None:
            # The context and its progress writer (or what makes it) refer to
            # each other: a cycle (with the job and its payload) the collector
            # alone would free.
            running.ctx._progress_sink = None
            running.ctx._make_progress_sink = None
        self._wake_starter()
        self.slots_freed()

    def watch_slots(self) -> threading.Event:
        """An Event of its own for another claim lane, set with ``slot_freed``
        (each lane clears its own: one lane's wake-up is not another's loss)."""
        event = threading.Event()
        self._slot_events.append(event)
        return event

    def slots_freed(self) -> None:
        """A job's run ended, a batch was flushed, the buffer shrank: claims may follow."""
        for event in self._slot_events:
            _signal(event)

    # -- the buffer: claimed ahead, not started ----------------------------------

    def take_threads(self, most: int) -> int:
        """Reserve up to ``most`` free threads for a round on its way (the claimer
        and the starter both start jobs); how many were reserved. Free: not
        running a job nor reserved, less the completion backlog beyond the
        allowance (successes waiting to be recorded still hold their leases,
        so a completer slower than the handlers slows starting down)."""
        with self._lock:
            backlog = max(len(self._unflushed) - self._allowance, 0)
            free = self._concurrency - self._inflight - self._reserved - backlog
            granted = max(min(most, free), 0)
            self._reserved += granted
            return granted

    def release_threads(self, n: int) -> None:
        """The round reserving ``n`` threads is back (its started jobs now run)."""
        with self._lock:
            self._reserved -= n
        if n:
            self._wake_starter()

    def take_ahead(self, most: int) -> int:
        """Reserve up to ``most`` jobs to claim ahead, within the bound on leases
        (``concurrency`` plus the allowance); how many were reserved. Counted
        under this lock with what every round on its way may bring back (its
        threads and its ahead), so that two claim lanes planning at once do not
        both fill the same room. :meth:`claiming` ``(-n)`` gives it back."""
        with self._lock:
            held = (
                self._inflight
                + len(self._buffered)
                + len(self._unflushed)
                + self._reserved
                + self._claiming_ahead
            )
            granted = max(min(most, self._concurrency + self._allowance - held), 0)
            self._claiming_ahead += granted
            return granted

    def claiming(self, ahead: int) -> None:
        """A claim asks for ``ahead`` jobs into the buffer (negative: it is back)."""
        with self._lock:
            self._claiming_ahead += ahead

    def buffer(self, jobs: Sequence[Job], *, asked: int = 0) -> None:
        """Hold claimed jobs that no thread is free for yet (not started), and
        give back the ``asked`` the claim reserved (:meth:`take_ahead`) at the
        same moment: never counted twice, nor in neither place."""
        if not jobs and not asked:
            return
        lease_from = self.claim_sent or time.monotonic()
        with self._lock:
            self._claiming_ahead -= asked
            for job in jobs:
                claim = token(job)
                self._buffered[claim] = job
                self._lease_until.setdefault(claim, lease_from + self._ttl)
                self._inflight_by_queue[job.queue] = self._inflight_by_queue.get(job.queue, 0) + 1
        if jobs:
            self.thread_freed.set()

    def _wake_starter(self) -> None:
        """A thread is free: the starter wants to know only while jobs wait in
        the buffer (filling it wakes the starter too), so that a worker
        without a buffer does not wake it at every job's end."""
        if self._buffered:
            _signal(self.thread_freed)

    def buffered(self, n: int) -> list[Job]:
        """The first ``n`` buffered jobs (claim order): the next to start."""
        with self._lock:
            return list(itertools.islice(self._buffered.values(), n))

    def unbuffer(self, jobs: Iterable[Job], *, started: bool) -> None:
        """These jobs leave the buffer: ``started`` (they run next, their lease
        end kept) or dropped (their lease is gone, or they were given back)."""
        with self._lock:
            for job in jobs:
                claim = token(job)
                if self._buffered.pop(claim, None) is None:
                    continue
                self._inflight_by_queue[job.queue] -= 1
                if not started:
                    self._lease_until.pop(claim, None)
        self.slots_freed()

    def mean_run_time(self) -> float | None:
        """Seconds a job runs, as a moving average (None: none ran yet)."""
        return self._mean_run

    def all_buffered(self) -> list[Job]:
        with self._lock:
            return list(self._buffered.values())

    # -- finished ------------------------------------------------------------------

    def finished(self, done: Finished) -> None:
        """A success to record: the claimer's next claim takes it along (a plain
        success of a queue whose limit binds, while it claims), else the completer."""
        job = done.job
        wake: Callable[[], None] | None = None  # set: the continuation's
        with self._lock:
            self._unflushed[token(job)] = job
            self._unflushed_by_queue[job.queue] = self._unflushed_by_queue.get(job.queue, 0) + 1
            if done.commit is None and not self._claimer_gone:
                if self.releases_soon(job):
                    wake = self.wake_claimer  # None for a polling worker
                to_claimer = wake is not None or (
                    self._claimer_completes and job.queue in self.binding
                )
            else:
                to_claimer = False
            if to_claimer:
                self._claimer_done.append(done)
        if not to_claimer:
            self.completions.put(done)
        elif wake is not None:
            wake()

    def releases_soon(self, job: Job) -> bool:
        """Whether a job's success may release a dependent soon: one waits for
        it and for at most as many parents as this worker runs at once (a
        chain's next link, a small fan-in), or its claim did not say. Such a
        success is completed by the claimer's next round, which claims in the
        same transaction (the continuation: the released job starts here
        without a wake-up and a claim of its own), or by the completer at once;
        a child of a wide fan-in is recorded in a batch like a plain job."""
        pending = job.dependents_pending
        return job.has_dependents and (pending is None or pending <= self._concurrency)

    def flushed(self, batch: Sequence[Finished]) -> None:
        """These results are recorded (or given up on): their leases no longer
        count against this worker."""
        with self._lock:
            for done in batch:
                claim = token(done.job)
                if self._unflushed.pop(claim, None) is not None:
                    self._unflushed_by_queue[done.job.queue] -= 1
                    if claim not in self._running:
                        self._lease_until.pop(claim, None)
        self.slots_freed()  # the backlog shrank: the claimer may claim again
        self._wake_starter()

    def to_completer(self, batch: Iterable[Finished]) -> None:
        for done in batch:
            self.completions.put(done)

    # -- the claimer's completions (complete-and-claim) ----------------------------

    def claimer_completes(self) -> None:
        """From now on plain successes of binding queues wait for the claimer."""
        with self._lock:
            self._claimer_completes = True

    def holding(self) -> bool:
        """Whether the claimer holds completions to send with its next claim."""
        with self._lock:
            return bool(self._claimer_done)

    def take(self, queues: list[str], limit: int) -> list[Finished]:
        """The successes of ``queues`` held for the claimer, at most ``limit`` and
        one claim per job (a job that finished under two claims, reaped and
        claimed again meanwhile, sends the other with a later claim: fenced by
        its token, one of them is lease_lost)."""
        with self._lock:
            if not self._claimer_done:
                return []
            taken: list[Finished] = []
            kept: list[Finished] = []
            ids: set[uuid.UUID] = set()
            for done in self._claimer_done:
                if done.job.queue in queues and len(taken) < limit and done.job.id not in ids:
                    taken.append(done)
                    ids.add(done.job.id)
                else:
                    kept.append(done)
            self._claimer_done = kept
            return taken

    def hand_over(self, *, for_good: bool = False) -> None:
        """Give the completer what the claimer holds, and what handlers finish
        from now on, until the claimer claims again (it is about to wait for
        something other than a freed slot, to fail over, or to stop). Even
        then a success that releases soon is taken to the claimer, which it
        wakes, unless the claimer stopped (``for_good``)."""
        with self._lock:
            self._claimer_completes = False
            self._claimer_gone = self._claimer_gone or for_good
            held, self._claimer_done = self._claimer_done, []
        self.to_completer(held)

    def hand_over_unplanned(self, planned: set[str]) -> None:
        """Give the completer the completions of queues this round did not
        claim (a per-worker limit left no room): no claim is due to take them."""
        with self._lock:
            unplanned = [done for done in self._claimer_done if done.job.queue not in planned]
            if unplanned:
                self._claimer_done = [d for d in self._claimer_done if d.job.queue in planned]
        self.to_completer(unplanned)

    # -- readings ------------------------------------------------------------------

    def holdings(self) -> Holdings:
        """The counts; ``inflight_by_queue`` counts buffered jobs too (their
        leases fill a queue's limits like running ones)."""
        with self._lock:
            return Holdings(
                inflight=self._inflight,
                inflight_by_queue=dict(self._inflight_by_queue),
                unflushed=len(self._unflushed),
                unflushed_by_queue=dict(self._unflushed_by_queue),
                completing=frozenset(done.job.queue for done in self._claimer_done),
                buffered=len(self._buffered),
                reserved=self._reserved,
                claiming_ahead=self._claiming_ahead,
            )

    def held_in(self, queues: list[str]) -> tuple[bool, bool]:
        """Whether this worker holds leases of ``queues``: (unflushed, running)."""
        with self._lock:
            unflushed = any(job.queue in queues for job in self._unflushed.values())
            running = any(self._inflight_by_queue.get(name, 0) for name in queues)
        return unflushed, running

    def running(self) -> list[Running]:
        with self._lock:
            return list(self._running.values())

    def held(self) -> tuple[list[Running], list[Job]]:
        """Every lease held, read at once: (running, the others: unflushed or buffered)."""
        with self._lock:
            return list(self._running.values()), [
                *self._unflushed.values(),
                *self._buffered.values(),
            ]

    def busy(self) -> bool:
        with self._lock:
            return self._inflight > 0

    def idle(self) -> bool:
        with self._lock:
            return self._inflight == 0 and not self._unflushed and not self._buffered

    def in_handler(self, *, on_loop: bool) -> int:
        """Handlers running right now, on the event loop or on threads."""
        with self._lock:
            return sum(1 for r in self._running.values() if r.in_handler and r.on_loop == on_loop)

    def wait_idle(self, deadline: float) -> bool:
        """Wait until no job runs, at most until ``deadline``; whether none does."""
        while time.monotonic() < deadline:
            with self._lock:
                if self._inflight == 0:
                    return True
            self.slot_freed.wait(0.05)
            self.slot_freed.clear()
        with self._lock:
            return self._inflight == 0

    # -- lease ends ----------------------------------------------------------------

    def extend(self, kept: Iterable[uuid.UUID], until: float) -> None:
        """A heartbeat kept these leases until ``until`` (monotonic)."""
        with self._lock:
            for claim in kept:
                if claim in self._lease_until:
                    self._lease_until[claim] = max(self._lease_until[claim], until)

    def lease_left(self, jobs: Sequence[Job]) -> float:
        """Seconds until the first of these leases ends by this worker's reckoning."""
        now = time.monotonic()
        with self._lock:
            ends = [self._lease_until.get(token(job)) for job in jobs]
        return min((end for end in ends if end is not None), default=math.inf) - now

    def abandon(self, jobs: Sequence[Job]) -> None:
        """These claims ran but their outcome is not recorded: they stay leased
        to this owner until they expire, and they are not lost claims."""
        now = time.monotonic()
        with self._lock:
            for job in jobs:
                self._abandoned[token(job)] = now

    def known(self) -> set[uuid.UUID]:
        """The claims this worker knows of (running, unflushed, recently abandoned)."""
        with self._lock:
            cutoff = time.monotonic() - 2 * self._ttl
            for claim in [t for t, at in self._abandoned.items() if at < cutoff]:
                del self._abandoned[claim]
            return (
                set(self._running)
                | set(self._unflushed)
                | set(self._buffered)
                | set(self._abandoned)
            )
