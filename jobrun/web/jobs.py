"""The jobs list, one job's page, and the actions on one job (cancel, retry).

The list is newest first, filtered by queue, state, type, idempotency key
or id prefix, and paged by keyset (``before=<id>``, never OFFSET): a page
stays cheap however deep it is, and a job enqueued while someone reads
cannot shift the next page. A filter no index holds reads a bounded number
of rows per page; :mod:`jobrun.postgres.web` says how ``a#next-page`` then
continues from the oldest row read. The live fragment of the list runs the
same query as the page, so a refresh never shows another set of jobs.

A job's page shows what the Store has on it: its fields, payload and
result, the whole last error, its progress and its timeline of events.
Cancel and retry are the Store's own methods, so they obey its rules: a
queued job is cancelled at once, a running one gets a cancel request its
worker acts on (the notice says which happened), a finished one is left
alone; retry refuses a running job (409). The buttons are only shown where
the state allows them, but the Store decides.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from jobrun.job.model import State
from jobrun.postgres.diagnose import Diagnose
from jobrun.web.bulk import BULK_STATES
from jobrun.web.dashboard import Dashboard
from jobrun.web.endpoints import back, filter_from, filter_query, optional_id, path_id

PAGE_SIZE = 50
"""Jobs per page."""


def jobs(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "jobs.html", _jobs_context(dash, request))


def jobs_live(dash: Dashboard, request: Request) -> Response:
    context = _jobs_context(dash, request)
    return dash.render(request, "jobs_live.html", context, here=context["list_here"])


def _jobs_context(dash: Dashboard, request: Request) -> dict[str, Any]:
    params = request.query_params
    where, form = filter_from(params)
    before = optional_id(params.get("before"), "before")
    page = dash.reads.jobs(where, before=before, limit=PAGE_SIZE)
    query = filter_query(form)
    bulk = []
    if where.state is not None and not dash.read_only:
        bulk = [action for action, states in BULK_STATES.items() if where.state in states]
    return {
        "page": "jobs",
        "jobs": page.jobs,
        "next_before": page.next_before,
        "scanned": page.scanned,
        "page_size": PAGE_SIZE,
        "db_now": page.db_now,
        "filters": form,
        "filter_query": query,
        "before": before,
        "bulk": bulk,
        "list_here": "/jobs" + ("?" + urllib.parse.urlencode(query) if query else ""),
        "live_query": {**query, **({"before": str(before)} if before else {})},
    }


def job(dash: Dashboard, request: Request) -> Response:
    context = _job_context(dash, request)
    return dash.render(request, "job.html", context, here=context["job_here"])


def job_live(dash: Dashboard, request: Request) -> Response:
    context = _job_context(dash, request)
    return dash.render(request, "job_live.html", context, here=context["job_here"])


def _job_context(dash: Dashboard, request: Request) -> dict[str, Any]:
    job_id = path_id(request)
    detail = dash.reads.job(job_id)
    job = detail.job
    error = job.last_error or ""
    # What holds a queued job back (jobrun why): one more read, for queued jobs only.
    why = Diagnose(dash.reads.store).why(job.id) if job.state is State.QUEUED else None
    return {
        "why": why,
        "page": "job",
        "detail": detail,
        "job": job,
        "db_now": detail.db_now,
        "error_summary": error.strip().splitlines()[0] if error.strip() else "",
        "can_cancel": job.state in (State.WAITING, State.QUEUED, State.LEASED)
        and not job.cancel_requested,
        "can_retry": job.state not in (State.LEASED, State.WAITING),
        "job_here": f"/jobs/{job.id}",
    }


def job_cancel(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    job = dash.store.cancel(path_id(request))
    if job.state is State.CANCELLED:
        code = "cancelled"
    elif job.state is State.LEASED and job.cancel_requested:
        code = "cancel-requested"
    else:
        code = "not-cancelled"
    return back(request, form, code)


def job_retry(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.retry(path_id(request))
    return back(request, form, "retried")


__all__ = ["PAGE_SIZE", "job", "job_cancel", "job_live", "job_retry", "jobs", "jobs_live"]
