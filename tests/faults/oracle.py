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
   burns exactly one attempt, and every lease is closed by one of
   ``reaped``/``retrying``/``succeeded``/``dead``/``cancelled``; no closing
   event arrives without an open lease (a spurious event); a job whose trail
   ends with an open lease is leased, and vice versa. From the side log the
   handlers write (``tests/faults/app.py``): no claim (lease token) was run
   twice, and with ``runs_exactly_once`` every job ran exactly once.
4. **No duplicate (scope, key) in processed_effects.**
"""

from __future__ import annotations

import collections
import dataclasses
import json
import uuid
from collections.abc import Iterable
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
_CLOSING = {"reaped", "retrying", "succeeded", "dead", "cancelled"}
_STATES = {"queued", "leased", "succeeded", "dead", "cancelled"}


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
    attempts = 0
    previous = ""
    for event_id, kind, attempt, detail in trail:
        via = detail.get("via") if isinstance(detail, dict) else None
        where = f"job {job_id} event {event_id} ({kind}, attempt {attempt})"
        if kind == "claimed":
            if open_lease:
                problems.append(f"overlapping leases: {where} while a lease was open")
            if attempt != attempts + 1:
                problems.append(f"{where}: a claim must burn exactly one attempt (was {attempts})")
            open_lease, attempts = True, attempt
        elif kind in _CLOSING:
            if open_lease:
                open_lease = False
            elif kind in ("dead", "cancelled") and via == "reaper" and previous == "reaped":
                pass  # the terminal row that follows a terminal reaper verdict
            elif kind == "cancelled" and via == "cancel":
                pass  # a queued job cancelled by an operator
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
