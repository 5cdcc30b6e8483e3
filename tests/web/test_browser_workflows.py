"""A workflow in a real Chromium (issue 29, item 7): its graph drawn, coloured, clickable.

The server-rendered pages are tested in tests/web/test_app_workflows.py and
the layout in test_graph.py; here a person's view: a workflow run by a real
worker, one of its jobs failing, is reached from the nav; its graph renders
as SVG under the dashboard's Content-Security-Policy (boxes laid out, each
filled with its state's colour from the stylesheet, a hostile node name
shown as text and never run), a box leads to its job's page and the job's
page back to the workflow.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

import jobrun
from jobrun.job.model import NewJob
from jobrun.postgres.store import Store
from jobrun.web import create_app
from jobrun.worker import PermanentFailure, Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for
from tests.web.browser import Browser, browser, chromium, screenshots_dir, serve

__all__ = ["browser", "chromium", "screenshots_dir"]  # fixtures, imported for pytest

HOSTILE = "<img src=x onerror=window.__pwned=1>"


@pytest.fixture
def dashboard(store: Store) -> Iterator[str]:
    with serve(create_app(store, refresh_seconds=1)) as base:
        yield base


def test_a_workflows_graph_renders_coloured_by_state_and_links_both_ways(
    browser: Browser, dashboard: str, store: Store
) -> None:
    registry = Registry()
    registry.register("wf.ok", lambda ctx, job: None)

    def broken(ctx: Any, job: Any) -> None:
        raise PermanentFailure("no stock")

    registry.register("wf.broken", broken)
    wf = jobrun.Workflow("order 7")
    root = wf.add(NewJob(type="wf.ok", queue="wf"), name=HOSTILE)
    lines = wf.group([NewJob(type="wf.ok", queue="wf") for _ in range(3)], after=[root])
    bad = wf.add(NewJob(type="wf.broken", queue="wf"), after=[root], name="reserve")
    total = wf.add(NewJob(type="wf.ok", queue="wf"), after=[*lines, bad], name="total")
    run = jobrun.Client(store).enqueue_workflow(wf)
    worker = Worker(store, registry, WorkerConfig(**{**FAST, "queues": {"wf": None}}))
    worker.start()
    try:
        wait_for(lambda: store.get(total.id).state.terminal, timeout=15)
    finally:
        worker.stop(timeout=5)

    browser.open(dashboard + "/")
    browser.click_through("#nav-workflows")
    assert browser.attr("body", "data-page") == "workflows"
    row = f'tr.workflow-row[data-workflow-id="{run.id}"]'
    assert browser.attr(row, "data-state") == "failed"
    browser.click_through(f"{row} a.workflow-link")
    assert browser.attr("body", "data-page") == "workflow"
    assert browser.text("#workflow-state") == "failed"

    boxes = browser.js(
        """
        return Array.from(document.querySelectorAll('#workflow-graph a.node')).map(a => {
          const r = a.querySelector('rect').getBoundingClientRect();
          return {state: a.dataset.state, layer: +a.dataset.layer, x: r.x, y: r.y,
                  w: r.width, h: r.height,
                  fill: getComputedStyle(a.querySelector('rect')).fill,
                  text: a.querySelector('text').textContent};
        });
        """
    )
    assert len(boxes) == 6
    assert all(b["w"] > 100 and b["h"] > 20 for b in boxes)
    fills = {b["state"]: b["fill"] for b in boxes}
    assert set(fills) == {"succeeded", "dead", "cancelled"}
    assert len(set(fills.values())) == 3  # each state its own colour, from the stylesheet
    by_layer = sorted(boxes, key=lambda b: b["layer"])
    assert by_layer[0]["text"] == HOSTILE[:21] + "…" and by_layer[0]["layer"] == 0
    assert by_layer[-1]["layer"] == 2 and by_layer[-1]["state"] == "cancelled"
    assert all(a["x"] < b["x"] for a, b in itertools.pairwise(by_layer)
               if a["layer"] < b["layer"])  # fmt: skip
    assert browser.count("#workflow-graph path.edge") == 8
    assert browser.pwned() is None
    assert browser.console_errors() == []
    browser.screenshot("workflow")

    browser.click_through(f'#workflow-graph a.node[data-job-id="{bad.id}"]')
    assert browser.attr("body", "data-page") == "job"
    assert browser.attr("#job", "data-state") == "dead"
    browser.click_through("#job-workflow-link")
    assert browser.attr("#workflow", "data-workflow-id") == str(run.id)
