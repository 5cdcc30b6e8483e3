"""The claimer: claims only the jobs this worker can start now, and hands them on.

It claims as many jobs as there are free handler slots (and per-queue
slots), then waits for a freed slot, a notification or the poll interval. A
limited queue (``Store.set_queue_limits``) sends no wake-up when another
worker frees a slot or a rate window moves on, so after a short claim the
claimer asks whether a limit held ready jobs back and, if so, claims again
soon (``LIMITED_RECLAIM``, doubling up to the poll interval while it gets
nothing), at once when its own completer frees a slot.

Complete-and-claim: a lease lasts until its success is recorded, so a worker
whose completions and claims alternate holds far fewer leases than a limit
allows. The plain successes of a limited queue whose slots *bind* therefore
wait for the claimer's next claim of their queue
(:class:`~jobrun.worker.leases.Leases` routes them), which completes them in
the same transaction (``Store.complete_and_claim``) and claims the freed
slots again at once. A limit binds when this worker's own leases of the
queue and its free threads could fill the queue's global concurrency, or
when a claim of it came back short because of a limit within the last
``BINDING_HOLD`` seconds. A limit that does not bind (a rate far above what
runs, one job per key over many keys, a concurrency no claim reaches)
leaves the queue on the ordinary path: successes batched by the completer
and claims that commit asynchronously, since a round that completes must
wait for the WAL. The claimer hands what it holds to the completer whenever
it is about to wait for anything other than a freed slot (no work, a fault,
the stop).

Lost claims: a claim whose connection died (``OutcomeUnknown``) may still
have committed, now or when a dead link heals, leaving jobs leased to this
worker that it never saw. For a while after such a failure the claimer looks
for them, confirms each lease with a heartbeat and runs them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Mapping

from jobrun.job import outage, validate
from jobrun.job.errors import ConnectionUnavailable, JobrunError, OutcomeUnknown
from jobrun.job.model import Job, State
from jobrun.job.ports import Waiter
from jobrun.worker.ahead import Ahead
from jobrun.worker.executor import Executor
from jobrun.worker.leases import FLUSH_NOW, Holdings, token
from jobrun.worker.outcomes import DB_RETRY_BACKOFF
from jobrun.worker.parts import Parts, WorkerLoop
from jobrun.worker.stall_watch import Activity

LIMITED_RECLAIM = 0.05
"""Seconds a claimer whose claim a queue limit held back waits for a slot of
its own to free before it claims again (another worker's freed slot, or a
rate window moving on, sends no wake-up)."""
BINDING_HOLD = 1.0
"""Seconds a queue counts as binding after a claim of it that a limit held
back (its successes ride with the claims meanwhile)."""
CLAIM_COALESCE = 0.002  # seconds a busy worker waits to claim several jobs at once
LOST_CLAIM_DELIVERY = 30.0
"""Seconds after a claim's connection died during which the server may still
run it: a request stuck in a dead link is delivered when the link heals, for
as long as the kernel retransmits it (``tcp_user_timeout``, 20 s by default).
The claimer looks for lost claims this long plus one lease TTL."""
_LIST_PAGE = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """One claim of a round: up to ``jobs`` of ``queues``, ``start`` of them at
    once (threads free now), the rest into the buffer when ``ahead``."""

    queues: list[str]
    jobs: int
    start: int
    ahead: bool


class Claimer(WorkerLoop):
    """The ``jobrun-claimer`` thread: the only one that claims."""

    def __init__(
        self,
        parts: Parts,
        activity: Activity,
        executor: Executor,
        *,
        primary: Claimer | None = None,
        lane: int = 1,
    ) -> None:
        super().__init__(
            "jobrun-claimer" if primary is None else f"jobrun-claimer-{lane}", parts, activity
        )
        self._queue_names = list(self.config.queues)
        self._executor = executor
        self._ahead = Ahead(self.config, self._leases)
        self._primary = primary
        """The first lane, for the others: it alone listens, looks for lost
        claims and gives the buffer back; they claim beside it while work is
        plentiful (``work``), and sleep when a claim of theirs comes back short."""
        self._slots = self._leases.slot_freed if primary is None else self._leases.watch_slots()
        self._binding_until: dict[str, float] = {} if primary is None else primary._binding_until
        """Limited queue -> until when it binds, for a claim a limit held back
        (shared by the lanes)."""
        self.work: threading.Event = threading.Event() if primary is None else primary.work
        """Set while the first lane's claims come back full: the other lanes claim too."""
        self.waiter: Waiter | None = None
        """Notifications of new jobs (set by the worker's start), or None: polling."""
        # Lost claims: look for them until then.
        self._lost_claims_until = 0.0
        self._next_lost_claim_check = 0.0

    def wake(self) -> None:
        self._slots.set()
        if self.waiter is not None:
            self.waiter.wake()

    def loop(self) -> None:
        failures = 0
        # Claim in batches: with only a few threads free while others still
        # run, wait a moment for more to free up (one claim statement for
        # several jobs); an idle worker claims at once.
        batch = max(1, min(self.config.concurrency // 2, 16))
        activity = self._activity
        held_streak = 0  # claims in a row that a limit held back and got nothing
        while not self.stopping.is_set():
            if self._primary is not None and not self.work.is_set():
                activity.idle()
                self.work.wait(self.config.poll_interval.total_seconds())
                continue
            activity.busy("planning a claim")
            if self._primary is None:
                self._adopt_lost_claims_if_due()
            self._leases.claimer_completes()
            plan = self._claim_plan()
            if not plan:
                activity.idle()
                self._wait_for_room()
                continue
            plan = self._coalesce(plan, batch)
            try:
                drained, held_back, claimed = self._claim_round(plan)
                failures = 0
            except JobrunError as exc:
                activity.idle()
                self._leases.hand_over()
                failures += 1
                self._back_off(exc, failures)
                continue
            except Exception:
                activity.idle()
                self._leases.hand_over()
                self._log.exception("claim loop error")
                self.stopping.wait(1.0)
                continue
            activity.idle()
            held_streak = held_streak + 1 if held_back is not None and not claimed else 0
            if drained:
                self.work.clear()
            elif self._primary is None:
                self.work.set()
            if held_back is not None:
                self._wait_for_limits(held_back, held_streak)
            elif drained and self._primary is None:
                if self._leases.holding():
                    continue  # successes came during the round: complete them, claim again
                self._leases.hand_over()  # the wait ends on new work, not on them
                self._wait_for_work()
        self._leases.hand_over(for_good=self._primary is None)
        if self._primary is None:
            self.give_back_unstarted(self._leases.all_buffered())

    def _wait_for_room(self) -> None:
        """No room to claim: wait for a freed slot (or the poll interval)."""
        if self._leases.holding():
            # A slot freed soon takes them along with its claim; if
            # none frees within a batch window, the completer does.
            window = self.config.complete_flush_interval.total_seconds()
            if not self._slots.wait(window):
                self._leases.hand_over()
        else:
            self._slots.wait(self.config.poll_interval.total_seconds())
        self._slots.clear()

    def _coalesce(self, plan: list[Claim], batch: int) -> list[Claim]:
        """A busy worker with fewer than ``batch`` jobs to claim waits a moment
        (``CLAIM_COALESCE``) for more threads to free, to claim them in one statement."""
        coalesce_until = time.monotonic() + CLAIM_COALESCE
        while (
            sum(c.jobs for c in plan) < batch and self._leases.busy() and not self._leases.holding()
        ):
            left = coalesce_until - time.monotonic()
            if left <= 0:
                break
            self._slots.wait(left)
            self._slots.clear()
            plan = self._claim_plan()
        return plan

    def _claim_round(self, plan: list[Claim]) -> tuple[bool, float | None, int]:
        """One round trip per claim of ``plan``, each completing what the claimer
        holds: (a queue ran dry, seconds until a limit lets more through or
        None, jobs claimed)."""
        drained = False
        held_back: float | None = None
        claimed = 0
        for claim in plan:
            self._activity.busy(f"claiming up to {claim.jobs} job(s) of {claim.queues}")
            asked, jobs = self._exchange(claim)
            claimed += len(jobs)
            if len(jobs) < asked:
                drained = True
                wait = self._held_back_by_limits(claim.queues)
                if wait is not None:
                    held_back = wait if held_back is None else min(held_back, wait)
                    if wait == 0:  # a slot, not a rate window: freed slots count
                        until = time.monotonic() + BINDING_HOLD
                        self._binding_until.update(dict.fromkeys(claim.queues, until))
        return drained, held_back, claimed

    def _exchange(self, claim: Claim) -> tuple[int, list[Job]]:
        """One round trip (Store.exchange): complete what the claimer holds and
        claim, the jobs threads are free for started at once (reserved now:
        the starter takes free threads too), the others buffered; dispatch
        what started. (jobs asked for, jobs claimed). On any error the
        completions go to the completer, which retries them alone."""
        threads = self._leases.take_threads(claim.start)
        # The plan sized the ahead from a reading the other lanes may have
        # changed since: reserved now, within the bound on leases.
        ahead = self._leases.take_ahead(claim.jobs - claim.start) if claim.ahead else 0
        n = min(threads + ahead, validate.MAX_CLAIM_LIMIT)
        finished = self._leases.take(self._queue_names, self.config.complete_batch_size)
        if not n and not finished:
            self._leases.release_threads(threads)
            return 0, []
        jobs = [done.job for done in finished]
        results = {d.job.id: d.result for d in finished if d.result is not None} or None
        self._leases.sent_claim()
        sent = time.monotonic()
        try:
            got = self._outcomes.call(
                "claim",
                lambda answer: len(answer.claimed),
                lambda: self.store.exchange(
                    self.owner,
                    complete=jobs,
                    results=results,
                    queues=claim.queues,
                    limit=n,
                    ttl=self.config.lease_ttl,
                    start_now=threads,
                ),
                tuple(claim.queues),
                completed=len(jobs),
            )
        except BaseException:
            self._leases.claiming(-ahead)
            self._leases.to_completer(finished)
            self._leases.release_threads(threads)
            raise
        self._ahead.round_trip(time.monotonic() - sent)
        fresh = got.claimed
        self._leases.buffer([job for job in fresh if not job.started], asked=ahead)
        if got.completed is not None:
            self._outcomes.account(got.completed, finished)
            self._leases.flushed(finished)
        self._executor.dispatch([job for job in fresh if job.started])
        self._leases.release_threads(threads)
        return n, fresh

    def _back_off(self, exc: JobrunError, failures: int) -> None:
        """A claim failed: note a claim that may have committed, then pause."""
        if isinstance(exc, OutcomeUnknown):
            # It may have committed (now, or when a dead link heals).
            self.claim_may_be_lost()
        pause = DB_RETRY_BACKOFF[min(failures, len(DB_RETRY_BACKOFF)) - 1]
        if isinstance(exc, ConnectionUnavailable):
            pause = 0.0  # it waited its whole bound for a connection already
        outage.of(self.store).failed(exc, "claim")
        self.stopping.wait(pause)

    def _wait_for_limits(self, held_back: float, held_streak: int) -> None:
        """Ready jobs a queue limit held back: no wake-up comes when a slot
        frees elsewhere or the rate window moves on, so claim again by itself:
        when the full rate window opens, or (a slot frees who knows when) soon,
        at once when the completer frees a slot here. Such claims that get
        nothing back off, doubling up to the poll interval, so that workers
        facing a full limit do not poll it 20 times a second."""
        poll = max(self.config.poll_interval.total_seconds(), LIMITED_RECLAIM)
        if held_back > 0:
            pause = min(held_back + 0.001, poll)
        else:
            pause = min(LIMITED_RECLAIM * 2 ** min(max(held_streak - 1, 0), 8), poll)
        self._slots.wait(pause)
        self._slots.clear()

    def _claim_plan(self) -> list[Claim]:
        """What to claim now: per-queue limited queues alone, the others together.

        Free threads first: what the buffer does not fill (the starter runs
        buffered jobs as threads free up) is claimed and started at once;
        the queues without limits also claim ahead into the buffer
        (:class:`Ahead` sizes it). Never more leases than ``concurrency``
        plus the completion backlog allowance (the larger of
        ``concurrency`` and ``complete_batch_size``): results waiting for
        the completer still hold their leases, so a completer slower than
        the handlers (commit callables run one after another) slows
        claiming down instead of letting leased jobs pile up without bound.

        A queue whose global concurrency limit this worker's own leases fill
        (running, buffered, or finished and waiting) is left out: a claim of
        it would get nothing, unless the claimer holds completions of it to
        send along. The completer then flushes at once instead of collecting
        a batch, since the freed slots are what the next claim waits for
        (the limit as the store last read it, at most a second old: a limit
        raised since is seen within that second). Limited queues never claim
        ahead: a buffered job would hold a slot another worker could run.
        Which limited queues bind (their successes ride with the claims) is
        decided here too (:meth:`_binding`).
        """
        limits = self._queue_limits()
        held = self._leases.holdings()
        full = {
            name
            for name, limit in limits.items()
            if limit is not None
            and held.inflight_by_queue.get(name, 0) + held.unflushed_by_queue.get(name, 0) >= limit
            and name not in held.completing
        }
        allowance = max(self.config.concurrency, self.config.complete_batch_size)
        backlog = max(held.unflushed - allowance, 0)
        free = self.config.concurrency - held.inflight - held.reserved - backlog - held.buffered
        self._leases.binding = self._binding(limits, self._slot_limited(), held, free)
        plan: list[Claim] = []
        unlimited: list[str] = []
        for name, limit in self.config.queues.items():
            if name in full:
                continue
            if limit is None and name not in limits:
                unlimited.append(name)
                continue
            room = free if limit is None else min(limit - held.inflight_by_queue[name], free)
            if room > 0:
                plan.append(Claim([name], room, room, ahead=False))
                if limit is not None:  # a global limit may leave threads for the next
                    free -= room
        if unlimited:
            leases = held.inflight + held.buffered + held.unflushed + held.claiming_ahead
            bound = self.config.concurrency + allowance - leases - max(free, 0)
            ahead = min(self._ahead.room(held.buffered + held.claiming_ahead), max(bound, 0))
            if free + ahead > 0:
                plan.append(Claim(unlimited, max(free, 0) + ahead, max(free, 0), ahead=True))
        return plan

    def _binding(
        self,
        limits: Mapping[str, int | None],
        slot_limited: frozenset[str],
        held: Holdings,
        free: int,
    ) -> frozenset[str]:
        """The limited queues whose slots bind now, among those a finished job
        frees slots of (``slot_limited``: not a rate alone): this worker alone
        could fill the global concurrency (its leases of the queue, running or
        waiting for the completer, plus its free threads), or a claim of the
        queue came back short because of a limit within ``BINDING_HOLD``."""
        now = time.monotonic()

        def fills(name: str, limit: int | None) -> bool:
            own = held.inflight_by_queue.get(name, 0) + held.unflushed_by_queue.get(name, 0)
            return limit is not None and own + max(free, 0) >= limit

        return frozenset(
            name
            for name, limit in limits.items()
            if name in slot_limited
            and (fills(name, limit) or self._binding_until.get(name, 0.0) > now)
        )

    def _slot_limited(self) -> frozenset[str]:
        """The worker's queues whose limits a finished job frees slots of (as
        the store last read them; none known when it cannot tell)."""
        try:
            return self.store.slot_limited_queues(self._queue_names)
        except JobrunError as exc:
            self._log.debug("reading the queues' limits failed: %s", exc)
            return frozenset()

    def _queue_limits(self) -> Mapping[str, int | None]:
        """The limited queues among this worker's, each with its global
        concurrency limit (None: none), as the store last read them (none
        known when it cannot tell: the claims then find out)."""
        self._activity.busy("reading the limits of its queues")
        try:
            return self.store.limited_queues(self._queue_names)
        except JobrunError as exc:
            self._log.debug("reading the queues' limits failed: %s", exc)
            return {}

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
        unflushed, running = self._leases.held_in(queues)
        if unflushed:
            self._leases.completions.put(FLUSH_NOW)
            return 0.0
        if running:
            return 0.0
        self._activity.busy(f"asking whether a limit holds back {queues}")
        try:
            return self.store.limits_hold_back(queues)
        except JobrunError as exc:  # then wait for work as usual
            self._log.debug("asking whether a limit holds back %s failed: %s", queues, exc)
            return None

    def _wait_for_work(self) -> None:
        timeout = self.config.poll_interval.total_seconds()
        if self.waiter is None:
            self.stopping.wait(timeout)
            return
        try:
            self.waiter.wait(timeout)
        except Exception:
            self._log.exception("dispatcher wait failed; polling")
            self.stopping.wait(timeout)

    def claim(self, queues: list[str], limit: int) -> list[Job]:
        self._leases.sent_claim()  # the leases it grants start after this
        return self._outcomes.call(
            "claim",
            len,  # the jobs it got
            lambda: self.store.claim(self.owner, queues, limit, self.config.lease_ttl),
            tuple(queues),
        )

    def claim_may_be_lost(self) -> None:
        if self._primary is not None:  # the first lane looks for them
            self._primary.claim_may_be_lost()
            return
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
        self._activity.busy("looking for claims whose reply was lost")
        try:
            self.adopt_lost_claims()
        except JobrunError as exc:
            self._log.info("looking for lost claims failed (%s); trying again", exc)

    def adopt_lost_claims(self) -> list[Job]:
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
        known = self._leases.known()
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
        self._leases.sent_claim()  # the heartbeat below is their lease
        until = self.store.now() + self.config.lease_ttl
        kept = self.store.heartbeat(self.owner, [(job.id, token(job)) for job in lost], until)
        adopted = [job for job in lost if job.id in kept]
        if adopted:
            self._log.warning(
                "adopting %d job(s) leased to this worker by a claim whose reply was lost: %s",
                len(adopted),
                ", ".join(str(job.id) for job in adopted),
            )
            self._outcomes.count("adopted", len(adopted))
            # A lost round may have claimed some ahead, unstarted: they wait
            # in the buffer for the next round to start them.
            self._leases.buffer([job for job in adopted if not job.started])
            self._executor.dispatch([job for job in adopted if job.started])
        for job in lost:
            if job.id not in kept and job.cancel_requested:
                self._outcomes.fail(job, "cancelled (requested while the claim's reply was lost)")
        return adopted
