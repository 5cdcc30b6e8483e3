"""Why a job is not running: the reasons, named from what the database holds.

"Why isn't my job running?" is the question operators ask most of a queue,
and the answer is spread over several tables: the job's own row (its state,
when it is due), its queue's pause, its queue's limits and the leases that
fill them, the rate window. :func:`explain` turns one snapshot of all of it
(read in one statement, by the database clock: :class:`Snapshot`) into
:class:`Reason`\\ s, each naming what holds the job back, until when when
that is known, and which jobs hold the slots it waits for.

The reasons are listed in the order a claim meets them: a job not queued
is not waiting at all; a queued job not due yet waits for its time; then the
queue's pause, its concurrency, the job's key, the rate window; then the
runnable jobs ahead of it in claim order; then the workers: none live
serving its queue, or none of them with a handler for its type (the worker
registry, seen within each worker's lease TTL as the claim reads it).

This module is pure (no I/O): ``jobrun.postgres.diagnose`` reads the
snapshot, the CLI (``jobrun why``) and the dashboard show the reasons.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid

from jobrun.job.model import State


class Hold(enum.StrEnum):
    """What kind of thing holds a job back (stable: ``--json`` prints it)."""

    FINISHED = "finished"
    RUNNING = "running"
    CANCEL_REQUESTED = "cancel_requested"
    SCHEDULED = "scheduled"
    PAUSED = "paused"
    CONCURRENCY = "concurrency"
    PER_KEY = "per_key"
    RATE = "rate"
    BEHIND = "behind"
    NO_WORKER = "no_worker"
    UNKNOWN_TYPE = "unknown_type"
    PARENTS = "parents"
    NOTHING = "nothing"


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """One thing holding a job back: what, in a sentence, until when if known,
    and the jobs holding the slots it waits for (the first few)."""

    hold: Hold
    text: str
    until: dt.datetime | None = None
    jobs: tuple[uuid.UUID, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Snapshot:
    """What the database holds about a job and its queue, read in one statement."""

    id: uuid.UUID
    state: State
    queue: str
    type: str
    run_at: dt.datetime
    concurrency_key: str | None
    cancel_requested: bool
    lease_owner: str | None
    lease_expires_at: dt.datetime | None
    db_now: dt.datetime
    paused_at: dt.datetime | None
    concurrency_limit: int | None
    per_key_limit: int | None
    rate_limit: int | None
    rate_period_seconds: float | None
    leased_in_queue: int
    queue_holders: tuple[uuid.UUID, ...]
    leased_for_key: int
    key_holders: tuple[uuid.UUID, ...]
    rate_used: int
    rate_frees_at: dt.datetime | None
    ahead: int
    ahead_cap: int
    serving: tuple[str, ...]
    """Live registered workers serving the job's queue (the first few)."""
    knowing: int
    """How many of the live workers serving its queue have a handler for its type."""
    pending_parents: int = 0
    """Its parents not finished yet (a job waiting for others: migration 0016)."""
    waiting_step: str | None = None
    """The durable wait the queued job is parked in (its step), if any."""
    waiting_signal: str | None = None
    """The signal that wait waits for (None: a sleep)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosis:
    """A job, what state it is in, and what holds it back (empty: nothing does)."""

    job_id: uuid.UUID
    state: State
    queue: str
    type: str
    db_now: dt.datetime
    reasons: tuple[Reason, ...]


def explain(s: Snapshot) -> Diagnosis:
    """The reasons ``s``'s job is not running, in the order a claim meets them."""
    return Diagnosis(
        job_id=s.id, state=s.state, queue=s.queue, type=s.type, db_now=s.db_now, reasons=_reasons(s)
    )


def _reasons(s: Snapshot) -> tuple[Reason, ...]:
    if s.state.terminal:
        return (Reason(Hold.FINISHED, f"it has finished: {s.state.value}"),)
    if s.state is State.LEASED:
        owner = s.lease_owner or "a worker"
        running = Reason(
            Hold.RUNNING,
            f"it is running: leased by {owner} until {_at(s.lease_expires_at)} "
            "(renewed while it runs)",
            until=s.lease_expires_at,
        )
        if not s.cancel_requested:
            return (running,)
        stopping = "a cancel was requested: its worker stops it at its next heartbeat"
        return (running, Reason(Hold.CANCEL_REQUESTED, stopping))
    if s.state is State.WAITING:
        count = (
            f"{s.pending_parents} of its parents have"
            if s.pending_parents != 1
            else ("1 of its parents has")
        )
        return (
            Reason(
                Hold.PARENTS,
                f"it waits for other jobs: {count} not finished yet (it is queued when "
                "the last one finishes; jobrun events shows each release)",
            ),
        )
    reasons: list[Reason] = []
    if s.run_at > s.db_now:
        due = f"due at {_at(s.run_at)} ({_span(s.run_at - s.db_now)} from now)"
        if s.waiting_step is None:
            text = f"it is not due yet: {due}"
        elif s.waiting_signal is None:
            text = f"it sleeps (durable sleep {s.waiting_step!r}): {due}"
        else:
            text = (
                f"it waits for signal {s.waiting_signal!r} (step {s.waiting_step!r}): {due} "
                "when it times out, at once when the signal is sent"
            )
        reasons.append(Reason(Hold.SCHEDULED, text, until=s.run_at))
    if s.paused_at is not None:
        reasons.append(
            Reason(Hold.PAUSED, f"its queue {s.queue!r} is paused (since {_at(s.paused_at)})")
        )
    if s.concurrency_limit is not None and s.leased_in_queue >= s.concurrency_limit:
        reasons.append(
            Reason(
                Hold.CONCURRENCY,
                f"its queue {s.queue!r} is at its concurrency limit: "
                f"{s.leased_in_queue} of {s.concurrency_limit} slots held by leased jobs",
                jobs=s.queue_holders,
            )
        )
    if (
        s.per_key_limit is not None
        and s.concurrency_key is not None
        and s.leased_for_key >= s.per_key_limit
    ):
        reasons.append(
            Reason(
                Hold.PER_KEY,
                f"its concurrency key {s.concurrency_key!r} is at its limit: "
                f"{s.leased_for_key} of {s.per_key_limit} slots held by leased jobs",
                jobs=s.key_holders,
            )
        )
    if s.rate_limit is not None and s.rate_used >= s.rate_limit:
        period = dt.timedelta(seconds=s.rate_period_seconds or 0)
        until = f" until {_at(s.rate_frees_at)}" if s.rate_frees_at is not None else ""
        reasons.append(
            Reason(
                Hold.RATE,
                f"its queue {s.queue!r} has used its rate limit "
                f"({s.rate_used} of {s.rate_limit} per {_span(period)}){until}",
                until=s.rate_frees_at,
            )
        )
    if s.ahead and s.run_at <= s.db_now:
        many = f"at least {s.ahead:,}" if s.ahead >= s.ahead_cap else f"{s.ahead:,}"
        reasons.append(
            Reason(
                Hold.BEHIND,
                f"{many} runnable job(s) of queue {s.queue!r} come before it "
                "(claimed by priority, then due time)",
            )
        )
    if not s.serving:
        reasons.append(
            Reason(
                Hold.NO_WORKER,
                f"no live worker serves queue {s.queue!r} (none registered has been seen "
                f"within its lease TTL): start one with `jobrun worker --queues {s.queue}`",
            )
        )
    elif not s.knowing:
        reasons.append(
            Reason(
                Hold.UNKNOWN_TYPE,
                f"no live worker serving queue {s.queue!r} has a handler for {s.type!r}: "
                f"they claim it and put it back for later (a rollout not done, a handler "
                f"missing); serving it: {', '.join(s.serving)}",
            )
        )
    if not reasons:
        reasons.append(
            Reason(
                Hold.NOTHING,
                "nothing holds it back (due, first in line, its queue neither paused nor at "
                f"a limit, served by {', '.join(s.serving)}): it is claimed within a poll "
                "interval, or at once on the notification of its enqueue",
            )
        )
    return tuple(reasons)


def _at(when: dt.datetime | None) -> str:
    return "?" if when is None else when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _span(d: dt.timedelta) -> str:
    """A duration as a person reads it: 45s, 5m 10s, 2h 3m, 3d 4h."""
    total = max(int(d.total_seconds() + 0.5), 0)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, seconds = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "m"), (seconds, "s")]
    shown = [f"{n}{unit}" for n, unit in parts if n]
    return " ".join(shown[:2]) if shown else "0s"
