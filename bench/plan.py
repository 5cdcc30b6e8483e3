"""EXPLAIN of the claim statement: which scans it does on ``jobs``.

The SQL is the generated ``jobrun.postgres.sqlc.jobs.CLAIM_JOBS``, run twice
in a transaction that is rolled back: with the parameters bound (the custom
plan a fresh statement gets) and as a generic plan (``plan_cache_mode =
force_generic_plan`` on a PREPAREd copy: the plan a server may switch to once
psycopg has prepared the statement). Since migration 0021 the claim's work
is in the function ``jobrun.claim_jobs``, whose body an EXPLAIN of the
calling statement does not show; so the plans are read from ``auto_explain``
(nested statements included, sent back as notices): the caller's and the
body's, exactly as they ran. No plan may read ``jobs`` by a sequential scan.
``auto_explain`` is loaded with ``LOAD``: the connection must be a
superuser's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import sql

from jobrun.postgres.sqlc.jobs import CLAIM_JOBS, CLAIM_LIMITED_JOBS

INDEX_SCANS = frozenset({"Index Scan", "Index Only Scan", "Bitmap Index Scan"})


@dataclasses.dataclass(frozen=True)
class Scan:
    node: str
    relation: str | None
    index: str | None


@dataclasses.dataclass(frozen=True)
class ClaimPlan:
    mode: str
    """"custom" or "generic"."""
    scans: tuple[Scan, ...]
    plan: Any

    def on(self, relation: str) -> list[Scan]:
        """Scans of ``relation`` (a Bitmap Index Scan counts through its index name)."""
        return [
            s
            for s in self.scans
            if (s.relation == relation and s.node not in ("CTE Scan", "Subquery Scan"))
            or (s.node == "Bitmap Index Scan" and (s.index or "").startswith(relation + "_"))
        ]

    @property
    def seq_scans_on_jobs(self) -> int:
        return sum(1 for s in self.on("jobs") if s.node == "Seq Scan")

    @property
    def uses_claim_index(self) -> bool:
        return any(s.node in INDEX_SCANS and s.index == "jobs_claim_idx" for s in self.on("jobs"))

    def summary(self) -> list[str]:
        return [
            f"{s.node} on {s.relation or '?'}" + (f" using {s.index}" if s.index else "")
            for s in self.scans
        ]


def _walk(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _walk(child)


def scans(plan: Any) -> tuple[Scan, ...]:
    """Every scan node in an ``EXPLAIN (FORMAT JSON)`` result, CTEs and subplans included."""
    if isinstance(plan, str):
        plan = json.loads(plan)
    root = plan[0]["Plan"]
    found = []
    for node in _walk(root):
        kind = node.get("Node Type", "")
        if "Scan" in kind:
            found.append(
                Scan(
                    kind,
                    node.get("Relation Name") or node.get("CTE Name") or node.get("Alias"),
                    node.get("Index Name"),
                )
            )
    return tuple(found)


AUTO_EXPLAIN = (
    "LOAD 'auto_explain'",
    "SET LOCAL auto_explain.log_min_duration = 0",
    "SET LOCAL auto_explain.log_nested_statements = on",
    "SET LOCAL auto_explain.log_format = json",
    "SET LOCAL auto_explain.log_level = notice",
    "SET LOCAL client_min_messages = notice",
)


def logged_plans(notices: Sequence[str]) -> list[Any]:
    """The plans in ``auto_explain``'s notices, in the order they ran, as EXPLAIN's JSON.

    A notice reads ``duration: ... ms  plan:`` and then one JSON object (the
    statement's text and its plan); it is returned as the one-element list
    ``EXPLAIN (FORMAT JSON)`` gives, so :func:`scans` reads either.
    """
    plans = []
    for message in notices:
        head, brace, body = message.partition("{")
        if brace and "plan:" in head:
            plans.append([json.loads(brace + body)])
    return plans


def explain_claim(
    conn: psycopg.Connection[Any],
    queues: Sequence[str],
    limit: int = 10,
    *,
    generic: bool = False,
    statement: str = CLAIM_JOBS,
    setup: Sequence[str] = (),
) -> ClaimPlan:
    """The plans of a claim of ``limit`` jobs from ``queues``, run and rolled back.

    ``statement`` is the claim to run (the lock-free CLAIM_JOBS, or
    CLAIM_LIMITED_JOBS after ``setup`` has named the locked queues), in a
    transaction that is rolled back, after the ``setup`` statements: nothing
    is claimed. The scans are those of every plan that ran for it, the
    statement's own and those of the functions it called (``plan`` lists
    them).
    """
    # Every job it claims starts at once (start = limit): the common path.
    # In the order of the statements' placeholders ($1, $2, ...): the owner
    # comes early, read by the type-aware filter (the worker's known types).
    owner = "bench-explain"
    params: tuple[Any, ...] = (list(queues), owner, limit, limit, 30.0, True)
    types = "text[], text, bigint, bigint, float8, boolean"
    if statement == CLAIM_LIMITED_JOBS:  # its commit_async comes second (True: a claim alone)
        params = (list(queues), True, limit, owner, limit, 30.0, True)
        types = "text[], boolean, bigint, text, bigint, float8, boolean"
    notices: list[str] = []

    def heard(diag: psycopg.errors.Diagnostic) -> None:
        notices.append(diag.message_primary or "")

    # The notices are heard until the rollback: a statement's plan is logged
    # when its portal closes, which may be at the next statement or the end.
    conn.add_notice_handler(heard)
    try:
        with conn.transaction(force_rollback=True):
            for line in setup:
                conn.execute(line)
            for line in AUTO_EXPLAIN:
                conn.execute(line)
            notices.clear()  # from here on, only the claim's own plans
            if not generic:
                with psycopg.RawCursor(conn) as cur:
                    cur.execute(statement, params)
            else:
                name = "bench_claim_generic"
                conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                conn.execute(
                    sql.SQL("PREPARE {} (" + types + ") AS ").format(sql.Identifier(name))
                    + sql.SQL(statement)
                )
                # EXECUTE takes no bind parameters: its arguments go in as literals.
                with psycopg.ClientCursor(conn) as ccur:
                    ccur.execute(
                        sql.SQL("EXECUTE {} (" + ", ".join(["%s"] * len(params)) + ")").format(
                            sql.Identifier(name)
                        ),
                        params,
                    )
                conn.execute(sql.SQL("DEALLOCATE {}").format(sql.Identifier(name)))
    finally:
        conn.remove_notice_handler(heard)
    plans = logged_plans(notices)
    assert plans, "auto_explain logged no plan: is it installed with the server?"
    found = tuple(s for plan in plans for s in scans(plan))
    return ClaimPlan("generic" if generic else "custom", found, plans)
