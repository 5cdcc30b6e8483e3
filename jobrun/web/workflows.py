"""The workflows list and one workflow's page: its graph and its jobs.

A workflow has no state of its own: the list shows the one
:class:`~jobrun.job.workflow.WorkflowState` derives from its jobs' (the
rule the CLI and the metrics use too), its jobs by state, when it was
created and, once no job of it can run, how long it took. The list is
newest first, paged by keyset (``before=<workflow id>``); a state filter
reads a bounded number of workflows per page (see
:meth:`jobrun.postgres.web.DashboardReads.workflows`), as the jobs list does.

A workflow's page draws its graph (:mod:`jobrun.web.graph`: inline SVG,
each box a link to its job's page) above the table of its jobs, in the
order they were enqueued, at most :data:`JOBS_SHOWN` rows (the graph
counts them all). Both pages are read-only: cancelling or retrying a
workflow is the Store's to do first (``jobrun workflows``).
"""

from __future__ import annotations

import uuid
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from jobrun.job.errors import ValidationError
from jobrun.job.workflow import WorkflowState
from jobrun.web.dashboard import Dashboard, url_helper
from jobrun.web.endpoints import optional_id
from jobrun.web.graph import Vertex, layout, render_svg

PAGE_SIZE = 50
"""Workflows per page of the list."""
JOBS_SHOWN = 500
"""Rows of a workflow's jobs table (its graph and counts cover every job)."""


def workflows(dash: Dashboard, request: Request) -> Response:
    params = request.query_params
    text = (params.get("state") or "").strip().lower()
    state: WorkflowState | None = None
    if text:
        try:
            state = WorkflowState(text)
        except ValueError:
            raise ValidationError("state", f"unknown workflow state {text!r}") from None
    before = optional_id(params.get("before"), "before")
    page = dash.reads.workflows(state=state, before=before, limit=PAGE_SIZE)
    query = {"state": state.value} if state is not None else {}
    return dash.render(
        request,
        "workflows.html",
        {
            "page": "workflows",
            "workflows": page.workflows,
            "next_before": page.next_before,
            "scanned": page.scanned,
            "page_size": PAGE_SIZE,
            "db_now": page.db_now,
            "state": state.value if state is not None else "",
            "workflow_states": [s.value for s in WorkflowState],
            "filter_query": query,
            "before": before,
        },
    )


def workflow(dash: Dashboard, request: Request) -> Response:
    try:
        workflow_id = uuid.UUID(str(request.path_params["workflow_id"]))
    except ValueError:
        raise HTTPException(404, "no such workflow: the id is not a UUID") from None
    detail = dash.reads.workflow(workflow_id)
    url = url_helper(request)
    graph = layout([Vertex(j.id, j.node, j.state) for j in detail.jobs], detail.edges)
    svg = render_svg(graph, lambda job_id: url("job", job_id=job_id))
    context: dict[str, Any] = {
        "page": "workflow",
        "detail": detail,
        "workflow": detail.summary,
        "jobs": detail.jobs[:JOBS_SHOWN],
        "jobs_shown": JOBS_SHOWN,
        "graph": graph,
        "svg": svg,
        "db_now": detail.db_now,
    }
    return dash.render(request, "workflow.html", context, here=f"/workflows/{workflow_id}")


__all__ = ["JOBS_SHOWN", "PAGE_SIZE", "workflow", "workflows"]
