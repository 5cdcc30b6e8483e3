"""The workflow reads of the dashboard and the metrics are cheap on a big jobs table.

On a table of many finished jobs outside any workflow and a few thousand
workflows (ANALYZEd), no workflow statement of db/query/web.sql or
db/query/stats.sql reads ``jobs`` by a sequential scan, in the custom plan
nor in the generic one: a workflow's jobs are found through
``jobrun.workflow_jobs`` (migration 0024: its primary key leads with
``workflow_id``) and the workflows along ``workflows_created_idx``
(migration 0018), never by a sequential scan.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import psycopg
import pytest

from bench.plan import scans
from jobrun.job.model import DEFAULT_BACKOFF
from jobrun.postgres.sqlc import stats as sq
from jobrun.postgres.sqlc import web as wq
from jobrun.postgres.sqlc import workflows as fq
from jobrun.postgres.store import Store
from jobrun.postgres.web import MAX_EDGES_READ, DashboardReads
from tests.web.test_web_queries import explain, explain_generic, seq_scans

SEED = """
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at)
SELECT gen_random_uuid(), 'a', 't', '{}', %(backoff)s, 'succeeded', 1,
       now() - g * interval '1 s'
FROM generate_series(1, 100000) g;
INSERT INTO jobrun.workflows (id, name, created_at)
SELECT ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'wf ' || g,
       now() - g * interval '10 s'
FROM generate_series(1, 3000) g;
INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts, finished_at,
                         workflow_id, workflow_node, pending_parents)
SELECT gen_random_uuid(), 'a', 't', '{}', %(backoff)s,
       CASE WHEN n = 5 AND g %% 3 = 0 THEN 'waiting' ELSE 'succeeded' END::jobrun.job_state, 1,
       CASE WHEN n = 5 AND g %% 3 = 0 THEN NULL ELSE now() - g * interval '5 s' END,
       ('00000000-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid, 'n' || n,
       CASE WHEN n = 5 AND g %% 3 = 0 THEN 1 ELSE 0 END
FROM generate_series(1, 3000) g, generate_series(1, 5) n;
INSERT INTO jobrun.workflow_jobs (workflow_id, job_id)
SELECT workflow_id, id FROM jobrun.jobs WHERE workflow_id IS NOT NULL;
INSERT INTO jobrun.job_dependencies (child_id, parent_id, done)
SELECT c.id, p.id, p.state = 'succeeded'
FROM jobrun.jobs c JOIN jobrun.jobs p
  ON p.workflow_id = c.workflow_id AND p.workflow_node = 'n1' AND c.workflow_node <> 'n1'
"""

SOME = uuid.UUID("00000000-0000-4000-8000-000000000064")


@pytest.fixture
def big(admin_dsn: str) -> Any:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        params = {"backoff": json.dumps(DEFAULT_BACKOFF.to_json())}
        for statement in SEED.split(";"):
            if statement.strip():
                conn.execute(statement, params)
        for table in ("jobs", "workflows", "workflow_jobs", "job_dependencies"):
            conn.execute(f"VACUUM ANALYZE jobrun.{table}")
        yield conn


STATEMENTS: dict[str, tuple[str, tuple[Any, ...]]] = {
    # WebWorkflowsPage: (before, max_rows); ClusterRecentWorkflows: (window_seconds, max_rows)
    "workflows-first": (wq.WEB_WORKFLOWS_PAGE, (None, 51)),
    "workflows-deep": (wq.WEB_WORKFLOWS_PAGE, (SOME, 51)),
    # One workflow's page: the store's reads (workflows.sql), bounded or not.
    "workflow": (fq.GET_WORKFLOW, (SOME,)),
    "workflow-jobs": (fq.WORKFLOW_NODES, (SOME, 100_000)),
    "workflow-jobs-all": (fq.WORKFLOW_NODES, (SOME, None)),
    "workflow-edges": (fq.WORKFLOW_EDGES, (SOME, MAX_EDGES_READ)),
    "workflow-edges-all": (fq.WORKFLOW_EDGES, (SOME, None)),
    "recent-workflows": (sq.CLUSTER_RECENT_WORKFLOWS, (3600.0, 10_001)),
}


def test_no_workflow_read_scans_jobs_sequentially(big: psycopg.Connection[Any]) -> None:
    for name, (statement, params) in STATEMENTS.items():
        for mode, plan in (
            ("custom", explain(big, statement, params)),
            ("generic", explain_generic(big, statement, params)),
        ):
            found = [f"{s.node} {s.relation} {s.index}" for s in scans(plan)]
            assert seq_scans(plan) == [], (name, mode, found)
            if name != "workflow":
                on_jobs = {s.index for s in scans(plan) if s.relation == "jobs"}
                assert None not in on_jobs, (name, mode, found)
                members = {s.index for s in scans(plan)} & {"workflow_jobs_pkey"}
                assert members or "workflows_created_idx" in {s.index for s in scans(plan)}, (
                    name,
                    mode,
                    found,
                )
            walked = [s for s in scans(plan) if s.relation in ("workflows", "workflow_jobs")]
            assert all(s.node != "Seq Scan" for s in walked), (name, mode, found)


def _members_scanned(plan: Any) -> set[str]:
    return {s.node for s in scans(plan) if s.relation == "workflow_jobs"}


def test_the_plan_check_sees_a_seq_scan_without_the_index(big: psycopg.Connection[Any]) -> None:
    """Not vacuous: without workflow_jobs' primary key, a workflow's jobs are a seq scan."""
    assert "Seq Scan" not in _members_scanned(explain(big, *STATEMENTS["workflow-jobs"]))
    with big.transaction(force_rollback=True):
        big.execute("ALTER TABLE jobrun.workflow_jobs DROP CONSTRAINT workflow_jobs_pkey")
        assert "Seq Scan" in _members_scanned(explain(big, *STATEMENTS["workflow-jobs"]))


def test_the_reads_match_plain_sql_on_the_big_table(
    big: psycopg.Connection[Any], store: Store
) -> None:
    reads = DashboardReads(store)
    page = reads.workflows(limit=50)
    newest = [r[0] for r in big.execute(
        "SELECT id FROM jobrun.workflows ORDER BY created_at DESC, id DESC LIMIT 50"
    ).fetchall()]  # fmt: skip
    assert [w.id for w in page.workflows] == newest
    assert all(w.total == 5 for w in page.workflows)
    detail = reads.workflow(SOME)
    assert [j.id for j in detail.jobs] == sorted(j.id for j in detail.jobs)  # enqueue order
    assert {j.node for j in detail.jobs} == {f"n{i}" for i in range(1, 6)}
    assert len(detail.edges) == 4
    by_id = {j.id: j.node for j in detail.jobs}
    assert {(by_id[p], by_id[c]) for p, c in detail.edges} == {("n1", f"n{i}") for i in range(2, 6)}
