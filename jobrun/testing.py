"""Helpers for applications' own test suites.

::

    from jobrun.testing import assert_enqueued, run_jobs

    def test_signup_sends_a_welcome_email(client, registry):
        signup(client, "a@example.com")              # enqueues email.send
        assert_enqueued(client, "email.send", payload={"to": "a@example.com"})
        report = run_jobs(client, registry)          # runs it here, now, for real
        assert report.succeeded == 1

``run_jobs`` runs the queued, runnable jobs of a registry to completion,
synchronously, in the calling thread, against a real database, through the
same code path as a worker (claims, leases, commit callables, failures and
their backoff). It works every queue unless given ``queue=``/``queues=``,
jobs that the handlers enqueue meanwhile (in any queue) included: a test that
enqueues to ``queue="emails"`` needs no knowledge of how its workers are
deployed. ``types=`` runs only jobs of those types (the others stay queued,
untouched). A job due later (a delayed enqueue, a snooze, a retry's backoff)
is left queued, unless ``advance=`` says how far ahead to look: the jobs due
within that much of the *database's* clock are brought forward to now (a job
parked in a durable wait with its wait's deadline: a sleep is then over, a
signal wait times out; the
process's clock is never faked; see :mod:`jobrun.postgres.testing`), and
again once those ran, so a handler that snoozes once runs twice. The jobs of paused
queues stay queued (a worker would not claim them either).

``assert_enqueued`` and ``assert_not_enqueued`` read the jobs table and fail
with a message that lists what was enqueued; ``enqueued_jobs`` returns them.
The pytest plugin (:mod:`jobrun.pytest_plugin`) gives each test a migrated
database of its own, so "what was enqueued" means "in this test".

``import jobrun`` makes it reachable as ``jobrun.testing.run_jobs`` too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from jobrun.client import Client
from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, JSONValue, State
from jobrun.job.ports import Store
from jobrun.postgres import testing as pg_testing
from jobrun.postgres.store import Store as PostgresStore
from jobrun.worker.registry import Registry
from jobrun.worker.worker import Worker, WorkerConfig, parse_queues

__all__ = [
    "RunReport",
    "advance_jobs",
    "assert_enqueued",
    "assert_not_enqueued",
    "enqueued_jobs",
    "run_jobs",
]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunReport:
    """What :func:`run_jobs` did: how many jobs it ran, and how each attempt ended.

    ``advanced`` counts the jobs brought forward by ``advance=`` (a job
    snoozed twice counts twice).
    """

    ran: int
    succeeded: int
    failed: int
    cancelled: int
    lease_lost: int
    advanced: int = 0


def run_jobs(
    target: Client | Store,
    registry: Registry,
    *,
    queue: str | None = None,
    queues: Sequence[str] | None = None,
    types: str | Sequence[str] | None = None,
    advance: dt.timedelta | None = None,
    max_jobs: int = 10_000,
) -> RunReport:
    """Run the runnable jobs of ``queue``/``queues`` (default: every queue) until none is left.

    Without a queue, the queues come from the store's depth (those with
    ready jobs), read again after each pass, so that a job enqueued by a
    handler into a queue that was empty at first runs too. ``types`` (one
    type or several, each with a handler in ``registry``) runs only jobs of
    those types. ``advance`` (a timedelta) first makes the jobs due within
    that much of the database's now due now, and again once those ran, until
    no job is left, so that what a handler snoozes or fails into a retry
    within the horizon runs too. At most ``max_jobs`` jobs run, over every queue together (a
    handler that always snoozes stops there).

    Bad arguments raise ValidationError before anything is claimed.
    """
    store = target.store if isinstance(target, Client) else target
    fixed, chosen = _check(store, registry, queue, queues, types, advance, max_jobs)
    totals = dict.fromkeys(("succeeded", "failed", "cancelled", "lease_lost"), 0)
    ran = advanced = 0
    # With types, one job per pass: the jobs to hold back are read again
    # between two claims (a handler may have enqueued more). With advance, a
    # pass drains what is ready, and the next one advances what the handlers
    # snoozed or failed into a retry meanwhile.
    stepwise = chosen is not None
    with _held_back(store, chosen) as hold:
        while ran < max_jobs:
            if advance is not None:
                assert isinstance(store, PostgresStore)
                names = None if fixed is None else list(fixed)
                advanced += pg_testing.advance_due(store, advance, queues=names, types=chosen)
            names_now = fixed if fixed is not None else _ready_queues(store)
            if not names_now:
                break
            hold(list(names_now))
            worker = Worker(store, registry, WorkerConfig(queues=names_now, concurrency=1))
            ran_now = worker.drain(max_jobs=1 if stepwise else max_jobs - ran)
            ran += ran_now
            for key in totals:
                totals[key] += worker.stats[key]
            if ran_now == 0 or (fixed is not None and not stepwise and advance is None):
                break
    return RunReport(ran=ran, advanced=advanced, **totals)


def _check(  # noqa: PLR0917 (one private call site, the arguments of run_jobs in order)
    store: Store,
    registry: Registry,
    queue: str | None,
    queues: Sequence[str] | None,
    types: str | Sequence[str] | None,
    advance: dt.timedelta | None,
    max_jobs: int,
) -> tuple[dict[str, int | None] | None, list[str] | None]:
    """The queues (None: whichever have ready jobs) and types (None: all) to run."""
    if queue is not None and queues is not None:
        raise ValidationError("queue", "give queue= or queues=, not both")
    fixed: dict[str, int | None] | None = None
    if queue is not None:
        fixed = {validate.queue_name(queue, "queue"): None}
    elif queues is not None:
        fixed = parse_queues(queues)
        if not fixed:
            raise ValidationError("queues", "must name at least one queue")
    chosen = None
    if types is not None:
        chosen = [types] if isinstance(types, str) else list(types)
        if not chosen:
            raise ValidationError("types", "must name at least one job type")
        for name in chosen:
            validate.job_type(name, "types")
            if name not in registry:
                raise ValidationError(
                    "types",
                    f"{name!r} has no handler in the registry (it has: "
                    f"{', '.join(sorted(registry.types)) or 'none'})",
                )
    if advance is not None and (not isinstance(advance, dt.timedelta) or advance.days < 0):
        raise ValidationError("advance", "must be a datetime.timedelta of zero or more")
    if isinstance(max_jobs, bool) or not isinstance(max_jobs, int) or max_jobs < 1:
        raise ValidationError("max_jobs", "must be a positive int")
    if (chosen is not None or advance is not None) and not isinstance(store, PostgresStore):
        raise ValidationError(
            "target", "types= and advance= need jobrun's PostgreSQL store (a Client's)"
        )
    return fixed, chosen


@contextlib.contextmanager
def _held_back(store: Store, types: list[str] | None) -> Iterator[Callable[[list[str]], int]]:
    if types is None:
        yield lambda queues: 0
        return
    assert isinstance(store, PostgresStore)
    with pg_testing.holding_back(store, types) as hold:
        yield hold


def advance_jobs(
    target: Client | Store,
    by: dt.timedelta,
    *,
    queues: Sequence[str] | None = None,
    types: str | Sequence[str] | None = None,
) -> int:
    """Make the queued jobs due within ``by`` of the database's now due now; how many moved.

    What ``run_jobs(advance=...)`` does before each pass, on its own: for a
    test with a worker running (the pytest plugin's ``jobrun_worker``), which
    is woken and takes them at once. Only the jobs of ``queues`` and
    ``types`` (default: all); each gets a "retried" event.
    """
    store = target.store if isinstance(target, Client) else target
    if not isinstance(store, PostgresStore):
        raise ValidationError("target", "advance_jobs needs jobrun's PostgreSQL store (a Client's)")
    names = None if queues is None else list(parse_queues(queues))
    chosen = None if types is None else [types] if isinstance(types, str) else list(types)
    for name in chosen or ():
        validate.job_type(name, "types")
    return pg_testing.advance_due(store, by, queues=names, types=chosen)


def _ready_queues(store: Store) -> dict[str, int | None]:
    """Every queue with a job runnable now (names as stored: never parsed as a spec)."""
    return dict.fromkeys(sorted(d.queue for d in store.depth() if d.ready > 0))


# -- what was enqueued --------------------------------------------------------------

_UNSET: Any = object()
_LISTED = 20  # jobs a failure message lists (the rest are counted)


def enqueued_jobs(
    target: Client | Store,
    type: str | None = None,
    *,
    payload: JSONValue = _UNSET,
    queue: str | None = None,
    state: State | str | None = None,
) -> list[Job]:
    """The jobs stored (whatever their state unless ``state``), oldest first, that match.

    ``payload`` is compared with ``==``: ``unittest.mock.ANY`` stands for
    any value inside it.
    """
    store = target.store if isinstance(target, Client) else target
    try:
        wanted = None if state is None else State(state)
    except ValueError:
        raise ValidationError("state", f"unknown state {state!r}") from None
    found: list[Job] = []
    after = None
    while True:
        page = store.list(queue=queue, state=wanted, type=type, after=after, limit=1000)
        found.extend(page)
        if len(page) < 1000:
            break
        after = page[-1].id
    if payload is _UNSET:
        return found
    return [job for job in found if job.payload == payload]


def assert_enqueued(
    target: Client | Store,
    type: str,
    *,
    payload: JSONValue = _UNSET,
    queue: str | None = None,
    state: State | str | None = None,
    count: int | None = None,
) -> list[Job]:
    """Fail unless a job of ``type`` (with this payload, queue, state) is stored.

    With ``count``, exactly that many must match. Returns the matching jobs.
    The failure message lists the jobs that were enqueued, to see at once
    a wrong payload or queue.
    """
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise ValidationError("count", "must be an int of zero or more")
    matching = enqueued_jobs(target, type, payload=payload, queue=queue, state=state)
    if (count is None and matching) or (count is not None and len(matching) == count):
        return matching
    wanted = "at least one job" if count is None else f"{count} job{'s' * (count != 1)}"
    raise AssertionError(
        f"expected {wanted} {_described(type, payload, queue, state)}, "
        f"found {len(matching)}\n{_listing(target)}"
    )


def assert_not_enqueued(
    target: Client | Store,
    type: str,
    *,
    payload: JSONValue = _UNSET,
    queue: str | None = None,
    state: State | str | None = None,
) -> None:
    """Fail if a job of ``type`` (with this payload, queue, state) is stored."""
    matching = enqueued_jobs(target, type, payload=payload, queue=queue, state=state)
    if matching:
        raise AssertionError(
            f"expected no job {_described(type, payload, queue, state)}, "
            f"found {len(matching)}\n{_listing(target)}"
        )


def _described(type: str, payload: JSONValue, queue: str | None, state: object) -> str:
    parts = [f"of type {type!r}"]
    if payload is not _UNSET:
        parts.append(f"with payload {payload!r}")
    if queue is not None:
        parts.append(f"in queue {queue!r}")
    if state is not None:
        parts.append(f"in state {str(state)!r}")
    return " ".join(parts)


def _listing(target: Client | Store) -> str:
    jobs = enqueued_jobs(target)
    if not jobs:
        return "nothing was enqueued"
    lines = [f"enqueued ({len(jobs)}):"]
    lines += [
        f"  {job.type} queue={job.queue} state={job.state} payload={job.payload!r}"
        for job in jobs[:_LISTED]
    ]
    if len(jobs) > _LISTED:
        lines.append(f"  ... and {len(jobs) - _LISTED} more")
    return "\n".join(lines)
