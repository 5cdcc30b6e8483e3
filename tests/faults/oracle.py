"""The oracle checked after every fault scenario.

Four properties, on a database reached through a superuser DSN:

1. **None lost.** Every job the test enqueued (and saw acknowledged) has a
   row in a known state: terminal, queued, or leased with its whole lease
   (a lease that expires is requeued by the reaper). Jobs whose enqueue had an
   unknown outcome may be missing, never duplicated; every idempotency key the
   test used is held by at most one row. With ``settled``, no job is leased.
2. **Every transactional effect written exactly once.** The commit callables
   of ``tx.*`` handlers insert a row into ``effects``: no (scope, key) has two
   rows, every row matches a ``processed_effects`` ledger row and vice versa
   (for the ``job:tx.*`` scopes), and every succeeded ``tx.*`` job has its
   effect.
3. **No two leases of one job overlapped.** Replaying each job's
   ``job_events`` in order: a ``claimed`` never arrives while a lease is open,
   burns exactly one attempt (none when it did not start the job, its detail
   ``{"started": false}``: the attempt then counts when the job starts, so
   the event closing such a lease has one attempt more, or none when it
   never started: a ``reaped`` with ``"started": false``, a ``released``),
   and every lease is closed by one of ``reaped``/``retrying``/``succeeded``/
   ``dead``/``cancelled``/``released``/``snoozed``; no closing
   event arrives without an open lease (a spurious event); a job whose trail
   ends with an open lease is leased, and vice versa. From the side log the
   handlers write (``tests/faults/app.py``): no claim (lease token) was run
   twice, and with ``runs_exactly_once`` every job ran exactly once.
4. **No duplicate (scope, key) in processed_effects.**
5. **No job stranded by its parents** (workflows, migration 0016). No job is
   ``waiting`` with every parent finished, nor with a pending-parent count
   other than its edges not counted yet; no edge of a finished parent is left
   uncounted; a child is released (its ``released`` event ``via`` the
   dependency) at most once.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg

from jobrun.job.model import Job, NewJob

EFFECTS_DDL = """
CREATE TABLE IF NOT EXISTS effects (
    scope   text        NOT NULL,
    key     text        NOT NULL,
    job_id  uuid        NOT NULL,
    attempt integer     NOT NULL,
    token   uuid,
    pid     integer     NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

TX_SCOPE_PREFIX = "job:tx."
_CLOSING = {"reaped", "retrying", "succeeded", "dead", "cancelled", "released", "snoozed"}
_STATES = {"waiting", "queued", "leased", "succeeded", "dead", "cancelled"}


@dataclasses.dataclass
class Target:
    """One database the oracle checks, and what the test told it."""

    url: str
    log_dir: Path | None = None
    enqueued: set[uuid.UUID] = dataclasses.field(default_factory=set)
    maybe: set[uuid.UUID] = dataclasses.field(default_factory=set)
    settled: bool = False
    runs_exactly_once: bool = False
    lease_events: bool = True
    """False when the jobs were written with JOB_EVENTS=terminal (no claimed events)."""
    verified: bool = False


def _ids(jobs: Iterable[Job | NewJob | uuid.UUID]) -> set[uuid.UUID]:
    return {j if isinstance(j, uuid.UUID) else j.id for j in jobs}


class Oracle:
    """Collects what a test enqueued, then checks the four properties (see the module doc)."""

    def __init__(self, default_url: str, log_dir: Path | None) -> None:
        self.default_url = default_url
        self.log_dir = log_dir
        self.targets: dict[str, Target] = {}
        self.watch(default_url)

    def watch(self, url: str, **options: Any) -> Target:
        target = self.targets.get(url)
        if target is None:
            target = self.targets[url] = Target(url=url, log_dir=self.log_dir)
        for name, value in options.items():
            setattr(target, name, value)
        return target

    def enqueued(self, jobs: Iterable[Job | NewJob | uuid.UUID], url: str | None = None) -> None:
        """Jobs the database acknowledged: each must exist at the end."""
        self.watch(url or self.default_url).enqueued |= _ids(jobs)

    def maybe(self, jobs: Iterable[Job | NewJob | uuid.UUID], url: str | None = None) -> None:
        """Jobs whose enqueue ended in OutcomeUnknown: present once or absent."""
        self.watch(url or self.default_url).maybe |= _ids(jobs)

    def verify(self, url: str | None = None) -> None:
        """Check one database now (tests on throwaway clusters call this before the end)."""
        target = self.watch(url or self.default_url)
        problems = check(target)
        target.verified = True
        if problems:
            shown = "\n  ".join(problems[:40])
            more = f"\n  ... and {len(problems) - 40} more" if len(problems) > 40 else ""
            raise AssertionError(
                f"oracle: {len(problems)} violation(s) in {target.url}:\n  {shown}{more}"
            )

    def verify_all(self) -> None:
        for url, target in self.targets.items():
            if not target.verified:
                self.verify(url)


def check(target: Target) -> list[str]:
    with psycopg.connect(target.url, autocommit=True, connect_timeout=10) as conn:
        # A role-wide or database-wide setting a scenario left behind must not fail the oracle.
        conn.execute(
            "SET statement_timeout = 0; SET idle_in_transaction_session_timeout = 0;"
            " SET default_transaction_read_only = off"
        )
        jobs = {
            r[0]: r
            for r in conn.execute(
                "SELECT id, state::text, attempts, type, queue, idempotency_key,"
                " lease_owner, lease_token, lease_expires_at FROM jobrun.jobs"
            ).fetchall()
        }
        problems = _check_accounted(conn, target, jobs)
        problems += _check_effects(conn, jobs)
        if target.lease_events:
            problems += _check_leases(conn, jobs)
        problems += _check_ledger(conn)
        problems += _check_dependencies(conn)
    problems += _check_side_log(target, jobs)
    return problems


def _check_accounted(
    conn: psycopg.Connection[Any], target: Target, jobs: dict[uuid.UUID, Any]
) -> list[str]:
    problems = []
    for job_id in sorted(target.enqueued - target.maybe):
        if job_id not in jobs:
            problems.append(f"lost: job {job_id} was enqueued and has no row")
    for job_id, row in jobs.items():
        state = row[1]
        if state not in _STATES:
            problems.append(f"job {job_id} is in unknown state {state!r}")
        if state == "leased" and (row[6] is None or row[7] is None or row[8] is None):
            problems.append(f"job {job_id} is leased without a whole lease")
        if state == "leased" and target.settled:
            problems.append(f"job {job_id} is still leased (owner {row[6]}) in a settled run")
    duplicates = conn.execute(
        "SELECT queue, idempotency_key, count(*) FROM jobrun.jobs WHERE idempotency_key IS NOT NULL"
        " GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    problems += [f"key ({q}, {k}) is held by {n} jobs" for q, k, n in duplicates]
    return problems


def _check_effects(conn: psycopg.Connection[Any], jobs: dict[uuid.UUID, Any]) -> list[str]:
    if conn.execute("SELECT to_regclass('effects')").fetchone() == (None,):
        return []
    problems = []
    effects = collections.Counter(
        (r[0], r[1]) for r in conn.execute("SELECT scope, key FROM effects").fetchall()
    )
    for (scope, key), n in sorted(effects.items()):
        if n > 1:
            problems.append(f"effect ({scope}, {key}) written {n} times")
    ledger = {
        (r[0], r[1])
        for r in conn.execute(
            "SELECT scope, key FROM jobrun.processed_effects WHERE starts_with(scope, %s)",
            [TX_SCOPE_PREFIX],
        ).fetchall()
    }
    for scope, key in sorted(set(effects) - ledger):
        problems.append(f"effect ({scope}, {key}) has no ledger row (written outside Complete)")
    for scope, key in sorted(ledger - set(effects)):
        problems.append(f"ledger row ({scope}, {key}) has no effect (its callable never ran)")
    for job_id, row in jobs.items():
        if row[1] == "succeeded" and row[3].startswith("tx."):
            key = ("job:" + row[3], row[5] or str(job_id))
            if key not in ledger:
                problems.append(f"succeeded job {job_id} has no effect {key}")
    return problems


def _check_leases(conn: psycopg.Connection[Any], jobs: dict[uuid.UUID, Any]) -> list[str]:
    problems: list[str] = []
    trails: dict[uuid.UUID, list[tuple[int, str, int, Any]]] = collections.defaultdict(list)
    for job_id, event_id, kind, attempt, detail in conn.execute(
        "SELECT job_id, id, kind, attempt, detail FROM jobrun.job_events ORDER BY job_id, id"
    ):
        trails[job_id].append((event_id, kind, attempt, detail))
    for job_id, trail in trails.items():
        row = jobs.get(job_id)
        if row is None:
            continue  # purged
        problems += _replay(job_id, trail, row)
    return problems


def _replay(job_id: uuid.UUID, trail: list[tuple[int, str, int, Any]], row: Any) -> list[str]:
    problems = []
    open_lease = False
    unstarted = False  # the open lease's claim did not start the job
    attempts = 0
    previous = ""
    for event_id, kind, attempt, detail in trail:
        via = detail.get("via") if isinstance(detail, dict) else None
        started = detail.get("started") if isinstance(detail, dict) else None
        where = f"job {job_id} event {event_id} ({kind}, attempt {attempt})"
        if kind == "claimed":
            if open_lease:
                problems.append(f"overlapping leases: {where} while a lease was open")
            unstarted = started is False
            if attempt != attempts + (0 if unstarted else 1):
                problems.append(
                    f"{where}: a claim must burn exactly one attempt, none when it does not "
                    f"start the job (was {attempts})"
                )
            open_lease, attempts = True, attempt
        elif kind in _CLOSING:
            if open_lease and unstarted:
                never = kind == "released" or (kind == "reaped" and started is False)
                if attempt not in ((attempts,) if never else (attempts, attempts + 1)):
                    problems.append(
                        f"{where}: a lease claimed unstarted closes with {attempts} attempt(s)"
                        f"{'' if never else ' or one more (its start)'}"
                    )
                attempts = attempt
            if kind in ("released", "snoozed"):
                attempts = attempt  # the attempt given back
            if open_lease:
                open_lease = False
            elif kind in ("dead", "cancelled") and via == "reaper" and previous == "reaped":
                pass  # the terminal row that follows a terminal reaper verdict
            elif kind == "cancelled" and via == "cancel":
                pass  # a queued job cancelled by an operator
            elif kind in ("released", "cancelled") and via == "dependency":
                pass  # a waiting job its last parent queued, or its failed parent cancelled
            else:
                problems.append(f"spurious event: {where} without an open lease")
        elif kind == "retried":
            if open_lease:
                problems.append(f"{where}: retried while leased")
            attempts = attempt
        elif kind == "cancel_requested" and not open_lease:
            problems.append(f"{where}: cancel requested without a lease")
        previous = kind
    leased = row[1] == "leased"
    if leased != open_lease:
        problems.append(
            f"job {job_id} is {row[1]} but its events leave the lease "
            f"{'open' if open_lease else 'closed'}"
        )
    if attempts != row[2]:
        problems.append(f"job {job_id} has attempts {row[2]} but its claims add up to {attempts}")
    return problems


def _check_ledger(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT scope, key, count(*) FROM jobrun.processed_effects"
        " GROUP BY 1, 2 HAVING count(*) > 1"
    ).fetchall()
    return [f"processed_effects ({s}, {k}) appears {n} times" for s, k, n in rows]


STRANDED = """
SELECT c.id, c.state::text, c.pending_parents,
       count(*) FILTER (WHERE NOT d.done) AS uncounted,
       count(*) FILTER (WHERE p.state IN ('succeeded', 'dead', 'cancelled')) AS finished,
       count(*) AS parents
FROM jobrun.jobs AS c
JOIN jobrun.job_dependencies AS d ON d.child_id = c.id
LEFT JOIN jobrun.jobs AS p ON p.id = d.parent_id
GROUP BY c.id
HAVING (c.state = 'waiting' AND count(*) FILTER (WHERE p.state IN ('succeeded', 'dead',
        'cancelled') OR p.id IS NULL) = count(*))
    OR (c.state = 'waiting' AND c.pending_parents <> count(*) FILTER (WHERE NOT d.done))
    OR count(*) FILTER (WHERE NOT d.done AND p.state IN ('succeeded', 'dead', 'cancelled')) > 0
"""


def _check_dependencies(conn: psycopg.Connection[Any]) -> list[str]:
    if conn.execute("SELECT to_regclass('jobrun.job_dependencies')").fetchone() == (None,):
        return []
    problems = [
        f"job {job_id} is {state} with pending_parents {pending}: {uncounted} edge(s) not"
        f" counted, {finished} of its {parents} parent(s) finished (stranded or miscounted)"
        for job_id, state, pending, uncounted, finished, parents in conn.execute(STRANDED)
    ]
    released = conn.execute(
        "SELECT job_id, count(*) FROM jobrun.job_events WHERE kind = 'released'"
        " AND detail->>'via' = 'dependency' GROUP BY 1 HAVING count(*) > 1"
    ).fetchall()
    problems += [f"job {job_id} was released by its parents {n} times" for job_id, n in released]
    return problems


def side_log_records(log_dir: Path | None) -> list[dict[str, Any]]:
    """Every record the handlers wrote under ``log_dir`` (see tests/faults/app.py)."""
    if log_dir is None or not log_dir.is_dir():
        return []
    records = []
    for path in sorted(log_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a line cut by kill -9
    return records


def _check_side_log(target: Target, jobs: dict[uuid.UUID, Any]) -> list[str]:
    records = [r for r in side_log_records(target.log_dir) if uuid.UUID(r["job"]) in jobs]
    problems = []
    starts = collections.Counter((r["job"], r["token"]) for r in records if r["event"] == "start")
    for (job, token), n in sorted(starts.items()):
        if n > 1:
            problems.append(f"claim {token} of job {job} was run {n} times")
    if target.runs_exactly_once:
        per_job = collections.Counter(r["job"] for r in records if r["event"] == "start")
        for job_id, row in jobs.items():
            n = per_job.get(str(job_id), 0)
            if n != 1:
                problems.append(f"job {job_id} ({row[1]}) ran {n} times, not exactly once")
    return problems


# -- flow control: no limit overshot ----------------------------------------------------
#
# Three independent checks of the queue limits (issue 14), each told the limits
# by the test rather than read from jobrun.queue_limits, so that each can be
# checked against a run whose limits were never set (it must then fail):
#
# - in the database, at every claim: a trigger on jobs counts the queue's and
#   the key's leases afresh (a plpgsql statement in READ COMMITTED takes a new
#   snapshot: every claim committed before, and this claim's own rows) and
#   records any count above its limit in public.limit_violations;
# - from outside, all the time: :class:`LeaseSampler` reads the committed
#   leases per queue and key every few milliseconds on a connection of its own;
# - the rate: :func:`busiest_window` counts the ``claimed`` events (their
#   ``at`` is the claim's statement_timestamp(), the clock the limit uses) in
#   every window of the period that ends at a claim.
#
# :func:`most_running` adds the application's view: the handler runs in
# progress at once, from the side log (a run lies inside its lease).

LIMIT_ORACLE_DDL = """
CREATE TABLE IF NOT EXISTS public.limit_expected (
    queue       text PRIMARY KEY,
    concurrency integer,
    per_key     integer
);
CREATE TABLE IF NOT EXISTS public.limit_violations (
    queue   text        NOT NULL,
    key     text,
    seen    integer     NOT NULL,
    allowed integer     NOT NULL,
    job_id  uuid        NOT NULL,
    at      timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE OR REPLACE FUNCTION public.check_limits() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE lim public.limit_expected; n int;
BEGIN
  SELECT * INTO lim FROM public.limit_expected WHERE queue = NEW.queue;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF lim.concurrency IS NOT NULL THEN
    SELECT count(*) INTO n FROM jobrun.jobs WHERE state = 'leased' AND queue = NEW.queue;
    IF n > lim.concurrency THEN
      INSERT INTO public.limit_violations (queue, seen, allowed, job_id)
      VALUES (NEW.queue, n, lim.concurrency, NEW.id);
    END IF;
  END IF;
  IF lim.per_key IS NOT NULL AND NEW.concurrency_key IS NOT NULL THEN
    SELECT count(*) INTO n FROM jobrun.jobs
    WHERE state = 'leased' AND queue = NEW.queue AND concurrency_key = NEW.concurrency_key;
    IF n > lim.per_key THEN
      INSERT INTO public.limit_violations (queue, key, seen, allowed, job_id)
      VALUES (NEW.queue, NEW.concurrency_key, n, lim.per_key, NEW.id);
    END IF;
  END IF;
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS check_limits ON jobrun.jobs;
CREATE TRIGGER check_limits AFTER UPDATE OF state ON jobrun.jobs
FOR EACH ROW WHEN (NEW.state = 'leased' AND OLD.state <> 'leased')
EXECUTE FUNCTION public.check_limits();
"""


@dataclasses.dataclass(frozen=True)
class ExpectedLimits:
    """The limits a test set on a queue, as the limit oracles check them."""

    concurrency: int | None = None
    per_key: int | None = None


def install_limit_oracle(
    conn: psycopg.Connection[Any], expected: dict[str, ExpectedLimits]
) -> None:
    """The claim-time trigger on ``jobrun.jobs``, checking ``expected`` (needs a superuser)."""
    conn.execute(LIMIT_ORACLE_DDL)
    for queue, lim in expected.items():
        conn.execute(
            "INSERT INTO public.limit_expected (queue, concurrency, per_key) VALUES (%s, %s, %s)"
            " ON CONFLICT (queue) DO UPDATE SET concurrency = EXCLUDED.concurrency,"
            " per_key = EXCLUDED.per_key",
            [queue, lim.concurrency, lim.per_key],
        )


def limit_violations(conn: psycopg.Connection[Any]) -> list[str]:
    """What the trigger recorded: every claim that left a queue or key above its limit."""
    rows = conn.execute(
        "SELECT queue, key, seen, allowed, job_id, at FROM public.limit_violations ORDER BY at"
    ).fetchall()
    return [
        f"claim of job {job} left {queue}"
        + (f" key {key}" if key is not None else "")
        + f" with {seen} leases (limit {allowed}) at {at}"
        for queue, key, seen, allowed, job, at in rows
    ]


LEASES_NOW = """
SELECT queue, concurrency_key, count(*)::int FROM jobrun.jobs
WHERE state = 'leased' AND queue = ANY(%s) GROUP BY queue, concurrency_key
"""


class LeaseSampler:
    """A thread reading the leases per queue and key every ``interval`` seconds.

    Each sample is one statement (one snapshot of what has committed), on a
    connection of its own, reconnecting when the server goes away. Keeps the
    peaks per queue and per key and every sample above ``expected``.
    """

    def __init__(
        self, url: str, expected: dict[str, ExpectedLimits], interval: float = 0.005
    ) -> None:
        self.url = url
        self.expected = expected
        self.interval = interval
        self.samples = 0
        self.unreachable = 0
        self.peak: collections.Counter[str] = collections.Counter()
        """The most leases seen at once per queue."""
        self.peak_per_key: collections.Counter[str] = collections.Counter()
        """The most leases seen at once for one key, per queue."""
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-sampler", daemon=True)

    def __enter__(self) -> LeaseSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        queues = list(self.expected)
        while not self._stop.is_set():
            try:
                with psycopg.connect(self.url, autocommit=True, connect_timeout=3) as conn:
                    while not self._stop.is_set():
                        self._sample(conn.execute(LEASES_NOW, [queues]).fetchall())
                        self._stop.wait(self.interval)
            except psycopg.OperationalError:
                self.unreachable += 1  # a restart: sample again once it is back
                self._stop.wait(0.05)

    def _sample(self, rows: list[tuple[str, str | None, int]]) -> None:
        self.samples += 1
        stamp = time.time()
        totals: collections.Counter[str] = collections.Counter()
        for queue, key, n in rows:
            totals[queue] += n
            lim = self.expected[queue]
            if key is None:
                continue
            self.peak_per_key[queue] = max(self.peak_per_key[queue], n)
            if lim.per_key is not None and n > lim.per_key:
                self.violations.append(
                    f"sample {self.samples} at {stamp:.3f}: {queue} key {key} has {n} leases"
                    f" (limit {lim.per_key})"
                )
        for queue, n in totals.items():
            self.peak[queue] = max(self.peak[queue], n)
            lim = self.expected[queue]
            if lim.concurrency is not None and n > lim.concurrency:
                self.violations.append(
                    f"sample {self.samples} at {stamp:.3f}: {queue} has {n} leases"
                    f" (limit {lim.concurrency})"
                )


def busiest_window(conn: psycopg.Connection[Any], queue: str, period: dt.timedelta) -> int:
    """The most claims of ``queue``'s jobs in any window of ``period`` (by the
    ``claimed`` events' ``at``, the claim's statement_timestamp()): every window
    (t - period, t] that ends at a claim, ties included."""
    row = conn.execute(
        "SELECT COALESCE(max(n), 0) FROM ("
        "  SELECT count(*) OVER (ORDER BY e.at RANGE BETWEEN %s::interval PRECEDING"
        "                        AND CURRENT ROW) AS n"
        "  FROM jobrun.job_events e JOIN jobrun.jobs j ON j.id = e.job_id"
        "  WHERE e.kind = 'claimed' AND j.queue = %s) AS w",
        [period - dt.timedelta(microseconds=1), queue],
    ).fetchone()
    assert row is not None
    return int(row[0])


def most_running(
    records: list[dict[str, Any]], group: Callable[[dict[str, Any]], Any]
) -> collections.Counter[Any]:
    """The most handler runs in progress at once per ``group(record)`` (None: left
    out), from the side log's ``start`` and ``end`` records of one claim (its
    lease token). A run without an end (its process was killed) is left out."""
    starts = {(r["job"], r["token"]): r for r in records if r["event"] == "start"}
    edges: list[tuple[float, int, Any]] = []
    for r in records:
        if r["event"] != "end":
            continue
        start = starts.get((r["job"], r["token"]))
        if start is None or group(start) is None:
            continue
        edges.append((start["t"], 1, group(start)))
        edges.append((r["t"], -1, group(start)))
    running: collections.Counter[Any] = collections.Counter()
    peak: collections.Counter[Any] = collections.Counter()
    for _, step, key in sorted(edges, key=lambda e: (e[0], e[1])):  # ends first at a tie
        running[key] += step
        peak[key] = max(peak[key], running[key])
    return peak
