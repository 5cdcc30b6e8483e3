"""The workflows pages over HTTP against a real database: the list, one workflow's
page with its graph, and the link from a job's page.

A workflow's state and counts are its jobs' (WorkflowState.of); the list is
newest first, filtered by that state and keyset-paged; a node's name is
escaped in the graph and the table alike.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
from starlette.testclient import TestClient

import jobrun
from jobrun.job.model import NewJob, State
from jobrun.job.workflow import WorkflowState
from jobrun.postgres.store import Store
from jobrun.postgres.web import WORKFLOW_SCAN, DashboardReads
from jobrun.web.graph import MAX_PER_LAYER
from jobrun.web.workflows import JOBS_SHOWN
from tests.web.test_app import page
from tests.web.test_app_support import app, client, parse

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)
HOSTILE = '<script>window.__pwned=1</script>"><img src=x onerror="window.__pwned=2">'


def enqueue(
    store: Store, name: str, *, fan_out: int = 2, node: str = "load"
) -> jobrun.EnqueuedWorkflow:
    wf = jobrun.Workflow(name)
    root = wf.add(NewJob(type="wf.load", queue="wf"), name=node)
    lines = wf.group([NewJob(type="wf.line", queue="wf") for _ in range(fan_out)], after=[root])
    wf.add(NewJob(type="wf.total", queue="wf"), after=lines, name="total")
    return jobrun.Client(store).enqueue_workflow(wf)


def run_all(store: Store, *, fail: str | None = None) -> None:
    """Claim and finish every runnable job of queue wf until none is left; jobs of type
    ``fail`` die."""
    while jobs := store.claim("w", ["wf"], 50, TTL):
        for job in jobs:
            if job.type == fail:
                store.fail(job, "boom", None, permanent=True)
            else:
                store.complete(job, result={"ok": True})


def test_the_workflows_list_shows_each_with_its_state_counts_and_time_to_completion(
    store: Store, client: TestClient
) -> None:
    done = enqueue(store, "done")
    run_all(store)
    failed = enqueue(store, "failed")
    run_all(store, fail="wf.load")
    running = enqueue(store, "running")

    doc = page(client, "/workflows")
    assert doc.one("body").attrs["data-page"] == "workflows"
    assert "active" in doc.by_id("nav-workflows").classes
    rows = doc.select("tr", cls="workflow-row")
    assert [r.attrs["data-workflow-id"] for r in rows] == [
        str(running.id),
        str(failed.id),
        str(done.id),
    ]
    by_id = {r.attrs["data-workflow-id"]: r for r in rows}
    assert by_id[str(done.id)].attrs["data-state"] == "succeeded"
    assert by_id[str(failed.id)].attrs["data-state"] == "failed"
    assert by_id[str(running.id)].attrs["data-state"] == "running"
    counts = {
        c.attrs["data-state"]: int(c.attrs["data-count"])
        for c in by_id[str(failed.id)].select("span", cls="count")
    }
    assert counts == {"dead": 1, "cancelled": 3}
    assert by_id[str(done.id)].one("td", cls="duration").select("span")[0].attrs["data-seconds"]
    assert "running" in by_id[str(running.id)].one("td", cls="duration").text
    link = by_id[str(done.id)].one("a", cls="workflow-link")
    assert link.attrs["href"] == f"/workflows/{done.id}" and link.text == "done"

    filtered = page(client, "/workflows?state=failed")
    assert [r.attrs["data-workflow-id"] for r in filtered.select("tr", cls="workflow-row")] == [
        str(failed.id)
    ]
    assert page(client, "/workflows?state=cancelled").has_id("no-workflows")
    assert page(client, "/workflows?state=nonsense", status=400).has_id("error")


def test_the_workflows_list_is_paged_newest_first_and_a_filter_reads_a_bounded_number(
    store: Store, client: TestClient
) -> None:
    reads = DashboardReads(store)
    made = [enqueue(store, f"wf-{i}", fan_out=1).id for i in range(7)]
    seen: list[uuid.UUID] = []
    before = None
    while True:
        got = reads.workflows(before=before, limit=3)
        seen.extend(w.id for w in got.workflows)
        if got.next_before is None:
            break
        before = got.next_before
    assert seen == list(reversed(made))

    nothing = reads.workflows(state=WorkflowState.SUCCEEDED, limit=3)
    assert nothing.workflows == () and nothing.next_before is None and nothing.scanned == 7
    assert WORKFLOW_SCAN >= 100  # a filtered page reads a bounded number of workflows

    doc = page(client, "/workflows?before=" + str(made[4]))
    assert [r.attrs["data-workflow-id"] for r in doc.select("tr", cls="workflow-row")] == [
        str(made[i]) for i in (3, 2, 1, 0)
    ]
    assert doc.has_id("first-page") and not doc.has_id("next-page")


def test_a_workflow_page_draws_its_graph_with_each_job_linked_and_coloured_by_state(
    store: Store, client: TestClient
) -> None:
    run = enqueue(store, "order 7", fan_out=3)
    (root,) = store.claim("w", ["wf"], 1, TTL)
    store.complete(root)

    doc = page(client, f"/workflows/{run.id}")
    assert doc.one("body").attrs["data-page"] == "workflow"
    section = doc.by_id("workflow")
    assert section.attrs["data-state"] == "running" and section.attrs["data-total"] == "5"
    svg = doc.by_id("workflow-graph")
    nodes = {a.attrs["data-job-id"]: a for a in svg.select("a", cls="node")}
    assert set(nodes) == {str(j.id) for j in run}
    load = nodes[str(run["load"].id)]
    assert load.attrs["href"] == f"/jobs/{run['load'].id}"
    assert load.attrs["data-state"] == "succeeded" and "state-succeeded" in load.classes
    assert load.attrs["data-layer"] == "0"
    assert nodes[str(run["total"].id)].attrs["data-layer"] == "2"
    assert nodes[str(run["total"].id)].attrs["data-state"] == "waiting"
    assert {nodes[str(run[n].id)].attrs["data-state"] for n in ("wf.line", "wf.line.1")} == {
        "queued"
    }
    assert len(svg.select("path", cls="edge")) == 6
    table = doc.by_id("workflow-jobs-table")
    assert [r.attrs["data-node"] for r in table.select("tr", cls="job-row")] == [
        "load", "wf.line", "wf.line.1", "wf.line.2", "total"
    ]  # fmt: skip

    assert page(client, f"/workflows/{uuid.uuid4()}", status=404).has_id("error")
    assert page(client, "/workflows/not-a-uuid", status=404).has_id("error")


def test_a_job_of_a_workflow_links_to_its_workflow_and_a_lone_job_does_not(
    store: Store, client: TestClient
) -> None:
    run = enqueue(store, "linked")
    doc = page(client, f"/jobs/{run['total'].id}")
    link = doc.by_id("job-workflow-link")
    assert link.attrs["href"] == f"/workflows/{run.id}"
    assert doc.by_id("job-workflow-node").text == "total"
    alone = store.enqueue(NewJob(type="t"))
    assert not page(client, f"/jobs/{alone.id}").has_id("job-workflow")


def test_workflow_and_node_names_are_escaped_on_the_list_the_graph_and_the_job_page(
    store: Store, client: TestClient
) -> None:
    run = enqueue(store, HOSTILE, node=HOSTILE)
    for path in ("/workflows", f"/workflows/{run.id}", f"/jobs/{run[HOSTILE].id}"):
        body = client.get(path).text
        assert "<script>window" not in body and "<img" not in body, path
        assert "&lt;script&gt;window.__pwned=1&lt;/script&gt;" in body, path
    doc = page(client, f"/workflows/{run.id}")
    assert doc.by_id("workflow-name").text == " ".join(HOSTILE.split())
    names = [t.text for t in doc.by_id("workflow-graph").select("title")]
    assert f"{HOSTILE}: queued" in names


@pytest.mark.parametrize("state", list(State))
def test_every_job_state_has_a_colour_in_the_graphs_stylesheet(
    state: State, client: TestClient
) -> None:
    css = client.get("/static/jobrun.css").text
    assert f"svg.graph .node.state-{state.value} rect" in css


def test_a_large_fan_out_is_drawn_bounded_and_its_table_capped(
    store: Store, client: TestClient
) -> None:
    run = enqueue(store, "big", fan_out=3000)
    got = client.get(f"/workflows/{run.id}")
    assert got.status_code == 200
    assert len(got.text) < 400_000
    doc = parse(got.text)
    svg = doc.by_id("workflow-graph")
    assert svg.attrs["data-jobs"] == "3002" and svg.attrs["data-layers"] == "3"
    more = svg.one("g", cls="more")
    assert more.attrs["data-hidden"] == str(3000 - (MAX_PER_LAYER - 1))
    assert len(svg.select("a", cls="node")) == 2 + MAX_PER_LAYER - 1
    assert doc.by_id("graph-hidden").text.startswith(f"{3000 - (MAX_PER_LAYER - 1)} jobs")
    assert len(doc.by_id("workflow-jobs-table").select("tr", cls="job-row")) == JOBS_SHOWN
    assert doc.has_id("workflow-jobs-more")
