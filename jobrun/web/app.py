"""The dashboard: an ASGI app (Starlette) to see and steer jobrun in a browser.

::

    from jobrun.web import create_app

    app = create_app(client)                 # a jobrun.Client, a Store, Settings or a DSN
    app = create_app(client, read_only=True, auth="a-long-random-token")

    # inside your own ASGI app, under a prefix (links, forms and cookies follow it):
    from starlette.routing import Mount
    starlette_app.routes.append(Mount("/admin/jobs", app=create_app(client)))
    fastapi_app.mount("/admin/jobs", create_app(client))

    # a WSGI host (Flask, Django) mounts jobrun.web.wsgi.create_wsgi_app(client) the same way

``jobrun dashboard [--bind 127.0.0.1:8080] [--read-only]`` serves it with
uvicorn (see :mod:`jobrun.web.server`). The dashboard is a window on the
Store, not a second implementation of it: every read goes through
:class:`jobrun.postgres.web.DashboardReads` (no SQL in this package) and
every action is the Store's own method, writing its normal events. The
pages are plain server-side templates (Jinja2, autoescaped) with one small
script, ``static/jobrun.js``, that refreshes their live parts every few
seconds; everything works without it, only without the refresh.

This module assembles the app: the route table below, the error pages
(400 bad input, 403 CSRF or read-only, 404, 409 a state that forbids the
action, 503 database unavailable) and the safety wiring of
:mod:`jobrun.web.security` (credentials, allowed hosts, CSRF, headers).
The handlers live by page in :mod:`~jobrun.web.overview`,
:mod:`~jobrun.web.jobs`, :mod:`~jobrun.web.bulk`,
:mod:`~jobrun.web.schedules`, :mod:`~jobrun.web.workers` and
:mod:`~jobrun.web.workflows`; what they share in
:mod:`~jobrun.web.dashboard` (the Store, rendering) and
:mod:`~jobrun.web.endpoints` (forms, redirects); how values are written in
:mod:`~jobrun.web.format`, :mod:`~jobrun.web.chart` and
:mod:`~jobrun.web.graph`. The element ids and classes the pages promise
(the browser tests use them) are listed in ``docs/dashboard.md``.

===========================  ==================================================
GET  /                       overview [overview]; /live/overview its fragment
GET  /jobs                   jobs, newest first [jobs]; filters queue, state,
                             type, key (idempotency key), id (id prefix);
                             before=<id> the next page; /live/jobs the
                             table's fragment (same query)
GET  /jobs/{id}              one job [job]; /live/jobs/{id} its fragment
POST /jobs/{id}/cancel       [job_cancel]
POST /jobs/{id}/retry        [job_retry]
GET  /bulk/{retry|cancel}    the confirm step of a bulk action on the /jobs
                             filters given [bulk_confirm]
POST /bulk/{retry|cancel}    the bulk action [bulk_run]
POST /queues/pause           form field queue [queue_pause]
POST /queues/resume          [queue_resume]
GET  /schedules              [schedules]
POST /schedules/pause        form field id [schedule_pause]
POST /schedules/resume       [schedule_resume]
POST /schedules/trigger      enqueue one run now [schedule_trigger]
GET  /workers                every registered worker, idle ones too [workers]
GET  /workflows              workflows, newest first [workflows]; filter state
                             (running, succeeded, failed, cancelled);
                             before=<id> the next page
GET  /workflows/{id}         one workflow: its graph and jobs [workflow]
GET  /static/...             the stylesheet and the script [static]
===========================  ==================================================

(Route names for ``url_path_for`` in brackets.) Every POST takes ``csrf``
and ``next`` and answers 303 to ``next`` with ``?notice=<code>`` (see
:mod:`jobrun.web.endpoints`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobrun.job.errors import (
    DatabaseError,
    InvalidState,
    NotFound,
    OutcomeUnknown,
    SchemaMismatch,
    TransientError,
    ValidationError,
)
from jobrun.web import bulk, jobs, overview, schedules, workers, workflows
from jobrun.web.bulk import BULK_LIMIT, BULK_STATES
from jobrun.web.chart import Bar, Chart, throughput_chart
from jobrun.web.dashboard import CONNECTION_WAIT, HERE, NOTICES, Dashboard, Source
from jobrun.web.endpoints import (
    MAX_FORM_BYTES,
    FormHandler,
    Handler,
    action,
    filter_from,
    page,
)
from jobrun.web.format import (
    error_text,
    format_age,
    format_percent,
    format_when,
    pretty_json,
    rate_window,
    short_id,
)
from jobrun.web.jobs import PAGE_SIZE
from jobrun.web.security import Authorizer, Guard, authorizer

REFRESH_SECONDS = 5.0
"""Seconds between two refreshes of a page's live parts, unless told otherwise."""


def create_app(
    source: Source,
    *,
    read_only: bool = False,
    auth: str | Authorizer | None = None,
    refresh_seconds: float = REFRESH_SECONDS,
    csrf_secret: bytes | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard as a Starlette app, mountable under any prefix.

    ``source``: a :class:`jobrun.Client` or a Store (used as they are, never
    closed here), or :class:`jobrun.Settings` or a database URL (a pool of
    the dashboard's own, opened on the first request and closed when the
    app's lifespan ends, or by ``app.state.dashboard.close()`` when mounted
    where no lifespan reaches it). ``auth``: a token every request must carry
    (bearer, or basic-auth password; at least 16 characters), a callable
    deciding from the request, or None to trust whoever reaches the app.
    ``read_only`` hides and refuses every action. ``csrf_secret``: the key
    of the CSRF tokens (random per app by default; give one to share tokens
    between the processes behind one address). ``allowed_hosts``: the only
    host names (or addresses) a request's Host header may name, any other is
    refused 400 (see :mod:`jobrun.web.security`); None accepts any.
    """
    if isinstance(refresh_seconds, bool) or not isinstance(refresh_seconds, int | float):
        raise ValidationError("refresh_seconds", "must be a number of seconds")
    if not 1 <= refresh_seconds <= 3600:
        raise ValidationError("refresh_seconds", "must be between 1 and 3600")
    dash = Dashboard(
        source,
        read_only=bool(read_only),
        check=authorizer(auth),
        refresh_seconds=float(refresh_seconds),
        csrf_secret=csrf_secret,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await run_in_threadpool(dash.close)

    def get(path: str, handler: Handler, name: str) -> Route:
        return Route(path, page(dash, handler), name=name)

    def post(path: str, handler: FormHandler, name: str) -> Route:
        return Route(path, action(dash, handler), methods=["POST"], name=name)

    routes = [
        get("/", overview.overview, "overview"),
        get("/live/overview", overview.overview_live, "overview_live"),
        get("/jobs", jobs.jobs, "jobs"),
        get("/live/jobs", jobs.jobs_live, "jobs_live"),
        get("/jobs/{job_id}", jobs.job, "job"),
        get("/live/jobs/{job_id}", jobs.job_live, "job_live"),
        post("/jobs/{job_id}/cancel", jobs.job_cancel, "job_cancel"),
        post("/jobs/{job_id}/retry", jobs.job_retry, "job_retry"),
        get("/bulk/{action}", bulk.confirm, "bulk_confirm"),
        post("/bulk/{action}", bulk.run, "bulk_run"),
        post("/queues/pause", overview.queue_pause, "queue_pause"),
        post("/queues/resume", overview.queue_resume, "queue_resume"),
        get("/schedules", schedules.schedules, "schedules"),
        post("/schedules/pause", schedules.schedule_pause, "schedule_pause"),
        post("/schedules/resume", schedules.schedule_resume, "schedule_resume"),
        post("/schedules/trigger", schedules.schedule_trigger, "schedule_trigger"),
        get("/workers", workers.workers, "workers"),
        get("/workflows", workflows.workflows, "workflows"),
        get("/workflows/{workflow_id}", workflows.workflow, "workflow"),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]

    def failure(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def handle(request: Request, exc: Exception) -> Response:
            return error_page(dash, request, status, error_text(exc))

        return handle

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_page(dash, request, exc.status_code, exc.detail)

    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            HTTPException: http_error,
            ValidationError: failure(400),
            NotFound: failure(404),
            InvalidState: failure(409),
            SchemaMismatch: failure(503),
            TransientError: failure(503),
            OutcomeUnknown: failure(503),
            DatabaseError: failure(503),
        },
    )
    app.state.dashboard = dash
    hosts = (
        None if allowed_hosts is None else frozenset(h.strip("[]").lower() for h in allowed_hosts)
    )
    app.add_middleware(Guard, check=dash.check, allowed_hosts=hosts)
    return app


def error_page(dash: Dashboard, request: Request, status: int, message: str) -> Response:
    """The error as a page of the dashboard, or as a bare one when rendering fails too."""
    try:
        return dash.render(
            request,
            "error.html",
            {"page": "error", "status": status, "message": message, "db_now": None},
            status_code=status,
        )
    except Exception:  # noqa: BLE001 - the database itself may be why: a plain page then
        return HTMLResponse(
            f'<!doctype html><title>{status}</title><p id="error" data-status="{status}">'
            f"{Markup.escape(message)}</p>",
            status_code=status,
        )


__all__ = [
    "BULK_LIMIT",
    "BULK_STATES",
    "CONNECTION_WAIT",
    "MAX_FORM_BYTES",
    "NOTICES",
    "PAGE_SIZE",
    "REFRESH_SECONDS",
    "Bar",
    "Chart",
    "Dashboard",
    "Source",
    "create_app",
    "error_page",
    "filter_from",
    "format_age",
    "format_percent",
    "format_when",
    "pretty_json",
    "rate_window",
    "short_id",
    "throughput_chart",
]
