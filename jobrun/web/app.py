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
uvicorn (see :mod:`jobrun.web.server`). Everything it shows is read through
:class:`jobrun.postgres.web.DashboardReads` (no SQL here) and every action is
the Store's own method, writing its normal events: cancel, retry, bulk
retry/cancel of a filtered set (one Store call per job), pause/resume of a
queue, pause/resume/trigger of a schedule. The pages are plain server-side
templates (Jinja2, autoescaped) with one small script of the package's own,
``static/jobrun.js``, that refreshes the live parts of a page every few
seconds by fetching their fragment; everything works without it, only
without the refresh.

Safety (:mod:`jobrun.web.security`): optional credentials (a token as bearer
or basic-auth password, or a callable), a CSRF token on every POST (403
without or with a wrong one), ``read_only`` hiding every action and refusing
each with 403, a Content-Security-Policy without inline script, and the
database shown as ``user@host:port/dbname`` only (never its password).

Routes (names for ``url_path_for`` in brackets)
------------------------------------------------
===========================  ==================================================
GET  /                       overview [overview]; /live/overview its fragment
GET  /jobs                   jobs, newest first [jobs]; filters queue, state,
                             type, key (idempotency key), id (id prefix);
                             before=<id> is the next page (keyset, no OFFSET);
                             /live/jobs the table's fragment (same query)
GET  /jobs/{id}              one job [job]; /live/jobs/{id} its fragment
POST /jobs/{id}/cancel       [job_cancel]
POST /jobs/{id}/retry        [job_retry]
GET  /bulk/{retry|cancel}    the confirm step of a bulk action on the filters
                             given (same query parameters as /jobs): the
                             count, and the form [bulk_confirm]
POST /bulk/{retry|cancel}    the bulk action [bulk_run]
POST /queues/pause           form field queue [queue_pause]
POST /queues/resume          [queue_resume]
GET  /schedules              [schedules]
POST /schedules/pause        form field id [schedule_pause]
POST /schedules/resume       [schedule_resume]
POST /schedules/trigger      enqueue one run now [schedule_trigger]
GET  /static/...             the stylesheet and the script [static]
===========================  ==================================================

Every POST takes the form fields ``csrf`` (the token in the page) and
``next`` (where to go back to, a path inside the dashboard) and answers 303
to it with ``?notice=<code>`` (and ``n``, ``skipped`` for bulk actions).
Errors are pages too: 400 (bad input), 403 (CSRF, read-only), 404, 409 (the
job's state forbids the action), 503 (database unavailable).

Bulk actions: the confirm step walks the filtered set (a state filter is
required: retry from dead, cancelled or succeeded, cancel of queued or
leased jobs), shows how many jobs match and remembers the newest matching
id; the action then acts on the jobs that still match the filters with an
id up to that one, so jobs enqueued after the confirm step are left alone.
At most :data:`BULK_LIMIT` jobs at a time: a larger set is refused on the
confirm step, asking for narrower filters (or ``jobrun retry --state``).

Element ids, classes and data attributes (stable: the browser tests use them)
------------------------------------------------------------------------------
Every page: ``body[data-page=overview|jobs|job|schedules|bulk|error]``,
``body[data-read-only=true|false]``, nav links ``#nav-overview``,
``#nav-jobs``, ``#nav-schedules``; ``#db-target`` (the password-free
database), ``#read-only-badge`` (read-only only), ``#db-now`` (the database
clock when the page was read, ``data-db-now`` ISO-8601), ``#notice``
(``data-notice`` = the code after an action) and ``#error``
(``data-status``) on an error page. A live region has ``data-refresh-url``
and ``data-refresh-seconds``; the script sets ``data-refresh-count`` (how
many refreshes it applied) and the class ``stale`` when one failed.

Overview: ``#overview-live`` (the live region); ``table#queues`` with one
``tr.queue-row`` per queue: ``data-queue``, ``data-ready``,
``data-scheduled``, ``data-leased``, ``data-dead``,
``data-oldest-ready-seconds``, ``data-paused=true|false``,
``data-limited=true|false`` and, for a limited queue, ``data-limit-leased``
and ``data-started-in-window`` (what its limits hold, read by
``Store.all_queue_limits`` just after the rest) with ``data-concurrency``,
``data-per-key``, ``data-rate`` (like ``100/s``) for the limits it has; cells
``td.ready``, ``td.scheduled``, ``td.leased``, ``td.dead`` (a link to the
queue's dead jobs), ``td.oldest-ready``, ``td.paused``, ``td.limits`` (with
``span.limit-concurrency``, ``span.limit-per-key``, ``span.limit-rate``, each
of class ``full`` once reached); a limited queue without jobs is listed
with zeros; ``#limits-error`` when the limits could not be read; actions
``form.queue-pause`` / ``button.pause-queue`` and ``form.queue-resume`` /
``button.resume-queue``. ``#no-queues`` when there are none. Throughput:
``svg#throughput`` (``data-succeeded-total``, ``data-failed-total``) with
one ``g.minute`` per minute (``data-minute`` ISO, ``data-succeeded``,
``data-failed``) holding ``rect.bar-succeeded`` and ``rect.bar-failed``.
Leader: ``#leader`` with ``data-leader=present|none`` and, when present,
``data-pid`` (a session holding the leader lock) or ``data-holder`` and
``data-term`` (the holder of the lease row, behind a transaction pooler).
Workers: ``table#workers`` with ``tr.worker-row``
(``data-owner``, ``data-running``, ``data-expired=true|false``) and, in it,
``li.running-job`` (``data-job-id``, a link ``a.job-link``, and
``span.progress-percent`` with ``data-progress`` once it reported progress); ``#no-workers``
when none holds a lease. ``#notify-usage`` (``data-usage``, 0 to 1).

Jobs: ``form#job-filters`` with ``#filter-queue``, ``#filter-state`` (a
select: any, queued, leased, succeeded, dead, cancelled), ``#filter-type``,
``#filter-key``, ``#filter-id`` and ``#filter-apply``; ``#jobs-live``;
``table#jobs`` with ``tr.job-row`` (``data-job-id``, ``data-state``,
``data-queue``, ``data-type``) and ``a.job-link`` in it; ``#no-jobs`` when
the page is empty; ``a#next-page`` (older jobs: ``before=`` the last id
shown, or, when a filter no index holds ran out of its bounded scan before
the page filled, the oldest id it read: see :mod:`jobrun.postgres.web`) and
``a#first-page`` (when not on the first page);
``a#bulk-retry`` and ``a#bulk-cancel`` (with a state filter they apply to,
not read-only).

Bulk confirm: ``#bulk`` (``data-action``, ``data-count``), ``#bulk-count``,
``form#bulk-form`` with ``button#bulk-submit``; ``#bulk-nothing`` (no job
matches) or ``#bulk-too-many`` instead of the form.

Job: ``#job`` (``data-job-id``, ``data-state``, ``data-attempts``,
``data-cancel-requested``), ``#job-live``, ``#job-state``,
``#job-queue``, ``#job-type``, ``#job-attempts``, ``#job-lease-owner``,
``#job-lease-expires``, ``#job-run-at``, ``#job-key``, and only when the job
has them ``#job-progress`` (``data-progress``, a fraction; a ``progress``
element and the percentage), ``#job-progress-message``, ``#job-progress-at``,
``#job-snoozes``, ``#job-concurrency-key``; ``pre#job-payload``,
``pre#job-result``, ``#job-last-error`` (``pre``, the whole text with its
traceback) and ``#job-error-summary`` (its first line), ``#job-effect``
(``data-recorded=true|false``, ``data-scope``, ``data-key``);
``ol#job-timeline`` with ``li.event`` (``data-kind``, ``data-attempt``,
``data-at``); ``form#job-retry`` / ``button#retry-job`` and
``form#job-cancel`` / ``button#cancel-job`` (only where the state allows).

Schedules: ``table#schedules`` with ``tr.schedule-row`` (``data-schedule-id``,
``data-paused``) and cells ``td.cron``, ``td.timezone``, ``td.next-run``,
``td.last-fired``, ``td.paused``; ``button.pause-schedule``,
``button.resume-schedule``, ``button.trigger-schedule`` (each in a form of the
same class without ``button.``: ``form.pause-schedule`` ...);
``#no-schedules`` when none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import math
import secrets
import threading
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.errors import (
    DatabaseError,
    InvalidState,
    NotFound,
    OutcomeUnknown,
    SchemaMismatch,
    TransientError,
    ValidationError,
)
from jobrun.job.model import Job, QueueLimits, RateLimit, State
from jobrun.job.validate import redact
from jobrun.postgres import dsn
from jobrun.postgres.leader import election_name
from jobrun.postgres.lock import LOCK_LEADER, lock_key
from jobrun.postgres.stats import QueueStats
from jobrun.postgres.store import Store
from jobrun.postgres.web import DashboardReads, JobFilter, Minute
from jobrun.web.security import CSRF_COOKIE, CSRF_FIELD, Authorizer, Csrf, Guard, authorizer

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
"""Jobs per page."""
BULK_LIMIT = 10_000
"""The most jobs one bulk action acts on."""
MAX_FORM_BYTES = 64 * 1024
REFRESH_SECONDS = 5.0
CONNECTION_WAIT = 1.5
"""Seconds a request waits for a connection of the dashboard's own pool: while the
database is away, a page answers 503 (the reason on it) after that, not after the
30 s of a worker's pool."""

BULK_STATES: dict[str, tuple[State, ...]] = {
    "retry": (State.DEAD, State.CANCELLED, State.SUCCEEDED),
    "cancel": (State.QUEUED, State.LEASED),
}
"""The states each bulk action applies to (the filter's state must be one)."""

NOTICES: dict[str, str] = {
    "cancelled": "Job cancelled.",
    "cancel-requested": "The job is running: cancel requested (its worker stops it).",
    "not-cancelled": "The job had already finished: nothing to cancel.",
    "retried": "Job queued to run now.",
    "bulk-retried": "Retried {n} jobs.",
    "bulk-cancelled": "Cancelled {n} jobs (running ones: cancel requested).",
    "queue-paused": "Queue paused: workers claim nothing from it until it is resumed.",
    "queue-resumed": "Queue resumed.",
    "queue-not-paused": "The queue was not paused.",
    "schedule-paused": "Schedule paused.",
    "schedule-resumed": "Schedule resumed from its next occurrence.",
    "schedule-triggered": "One run of the schedule enqueued now.",
}

Source = Store | Client | Settings | str


# -- the dashboard's state -----------------------------------------------------------------


class Dashboard:
    """What the app's routes share: the Store (opened on first use for Settings or a DSN),
    its reads, the options and the templates. ``app.state.dashboard`` is this object."""

    def __init__(
        self,
        source: Source,
        *,
        read_only: bool,
        check: Authorizer | None,
        refresh_seconds: float,
        csrf_secret: bytes | None,
    ) -> None:
        self.read_only = read_only
        self.check = check
        self.refresh_seconds = refresh_seconds
        self.csrf = Csrf(csrf_secret)
        self._source = source
        self._client: Client | None = None
        self._store: Store | None = None
        self._reads: DashboardReads | None = None
        self._lock = threading.Lock()
        if isinstance(source, Client):
            self._use(source.store)
        elif isinstance(source, Store):
            self._use(source)
        elif not isinstance(source, Settings | str):
            raise TypeError(
                "create_app needs a jobrun.Client, a Store, Settings or a database URL, "
                f"not {type(source).__name__}"
            )
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.filters.update(
            age=format_age,
            when=format_when,
            pretty=pretty_json,
            short=short_id,
            percent=format_percent,
            window=rate_window,
        )

    def _use(self, store: Store) -> None:
        from jobrun.runtime import leader_lock_name  # noqa: PLC0415 - the runtime is heavy

        self._store = store
        name = leader_lock_name(store.schema)
        self._reads = DashboardReads(
            store, leader_key=lock_key(LOCK_LEADER, name), election=election_name(name)
        )

    @property
    def store(self) -> Store:
        if self._store is None:
            with self._lock:
                if self._store is None:
                    settings = self._source
                    url: str | None = None
                    if isinstance(settings, str):
                        url, settings = settings, Settings.from_env()
                    assert isinstance(settings, Settings)
                    self._client = Client.connect(
                        url,
                        settings=settings,
                        pool_size=2,
                        application_name="jobrun-dashboard",
                        pool_timeout=CONNECTION_WAIT,
                    )
                    self._use(self._client.store)
        assert self._store is not None
        return self._store

    @property
    def reads(self) -> DashboardReads:
        self.store  # noqa: B018 - opens the pool on first use
        assert self._reads is not None
        return self._reads

    @property
    def database(self) -> str:
        """Where the Store points, without secrets (read from its pool's conninfo)."""
        if self._store is None:  # not opened yet (or failed to): never connect just for this
            source = self._source
            url = source if isinstance(source, str) else getattr(source, "database_url", None)
            return dsn.describe(url) if url else "the embedded PostgreSQL"
        conninfo = self._store.pool.conninfo
        if not isinstance(conninfo, str):  # a callable making each connection's own
            return "the database of the Store's pool"
        return dsn.describe(conninfo)

    def close(self) -> None:
        """Close the pool this dashboard opened (a Store or Client given stays open)."""
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
                self._store = None
                self._reads = None

    # -- rendering --------------------------------------------------------------------

    def render(
        self,
        request: Request,
        template: str,
        context: Mapping[str, Any],
        *,
        status_code: int = 200,
        here: str | None = None,
    ) -> HTMLResponse:
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = not nonce or len(nonce) > 64
        if fresh:
            nonce = self.csrf.new_nonce()
        assert nonce is not None
        root = _root_path(request)
        base: dict[str, Any] = {
            "request": request,
            "url": _url_helper(request),
            "read_only": self.read_only,
            "csrf_field": CSRF_FIELD,
            "csrf_token": self.csrf.token(nonce),
            "here": here if here is not None else _here(request),
            "database": self.database,
            "refresh_seconds": self.refresh_seconds,
            "notice": _notice(request),
            "states": [s.value for s in State],
            "page": "",
        }
        base.update(context)
        html = self.env.get_template(template).render(base)
        response = HTMLResponse(html, status_code=status_code)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                nonce,
                path=root or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response


# -- the app -------------------------------------------------------------------------------


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

    routes = [
        Route("/", _page(dash, _overview), name="overview"),
        Route("/live/overview", _page(dash, _overview_live), name="overview_live"),
        Route("/jobs", _page(dash, _jobs), name="jobs"),
        Route("/live/jobs", _page(dash, _jobs_live), name="jobs_live"),
        Route("/jobs/{job_id}", _page(dash, _job), name="job"),
        Route("/live/jobs/{job_id}", _page(dash, _job_live), name="job_live"),
        Route(
            "/jobs/{job_id}/cancel", _action(dash, _job_cancel), methods=["POST"], name="job_cancel"
        ),
        Route(
            "/jobs/{job_id}/retry", _action(dash, _job_retry), methods=["POST"], name="job_retry"
        ),
        Route("/bulk/{action}", _page(dash, _bulk_confirm), name="bulk_confirm"),
        Route("/bulk/{action}", _action(dash, _bulk_run), methods=["POST"], name="bulk_run"),
        Route("/queues/pause", _action(dash, _queue_pause), methods=["POST"], name="queue_pause"),
        Route(
            "/queues/resume", _action(dash, _queue_resume), methods=["POST"], name="queue_resume"
        ),
        Route("/schedules", _page(dash, _schedules), name="schedules"),
        Route(
            "/schedules/pause",
            _action(dash, _schedule_pause),
            methods=["POST"],
            name="schedule_pause",
        ),
        Route(
            "/schedules/resume",
            _action(dash, _schedule_resume),
            methods=["POST"],
            name="schedule_resume",
        ),
        Route(
            "/schedules/trigger",
            _action(dash, _schedule_trigger),
            methods=["POST"],
            name="schedule_trigger",
        ),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]

    def failure(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
        async def handle(request: Request, exc: Exception) -> Response:
            return _error_page(dash, request, status, _error_text(exc))

        return handle

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return _error_page(dash, request, exc.status_code, exc.detail)

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


Handler = Callable[[Dashboard, Request], Response]
FormHandler = Callable[[Dashboard, Request, dict[str, str]], Response]


def _page(dash: Dashboard, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A GET endpoint running ``fn`` (Store calls: blocking) on the thread pool."""

    async def endpoint(request: Request) -> Response:
        return await run_in_threadpool(fn, dash, request)

    return endpoint


def _action(dash: Dashboard, fn: FormHandler) -> Callable[[Request], Awaitable[Response]]:
    """A POST endpoint: refused in read-only mode and without the page's CSRF token."""

    async def endpoint(request: Request) -> Response:
        if dash.read_only:
            raise HTTPException(403, "this dashboard is read-only: actions are switched off")
        body = await _read_body(request)
        form = _parse_form(request, body)
        if not dash.csrf.valid(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)):
            raise HTTPException(
                403, "the form's CSRF token is missing or wrong: reload the page and try again"
            )
        return await run_in_threadpool(fn, dash, request, form)

    return endpoint


async def _read_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise HTTPException(413, "the form is too large")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse_form(request: Request, body: bytes) -> dict[str, str]:
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise HTTPException(415, "actions take a form (application/x-www-form-urlencoded)")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the form is not UTF-8") from None
    form: dict[str, str] = {}
    for name, value in urllib.parse.parse_qsl(text, keep_blank_values=True):
        form.setdefault(name, value)
    return form


# -- pages ---------------------------------------------------------------------------------


def _overview(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview.html", _overview_context(dash), here="/")


def _overview_live(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview_live.html", _overview_context(dash), here="/")


def _overview_context(dash: Dashboard) -> dict[str, Any]:
    data = dash.reads.overview()
    limits, limits_error = _queue_limits(dash.store)
    queues = list(data.cluster.queues)
    shown = {q.queue for q in queues}
    # A limited queue with no job and no pause is a queue all the same: listed with zeros.
    queues.extend(
        QueueStats(
            queue=name,
            ready=0,
            scheduled=0,
            leased=0,
            dead=0,
            oldest_ready_seconds=0.0,
            paused=False,
        )
        for name in sorted(set(limits) - shown)
    )
    queues.sort(key=lambda q: q.queue)
    return {
        "page": "overview",
        "data": data,
        "queues": queues,
        "limits": limits,
        "limits_error": limits_error,
        "db_now": data.db_now,
        "chart": throughput_chart(data.throughput),
    }


def _queue_limits(store: Store) -> tuple[dict[str, QueueLimits], str]:
    """Every limited queue's limits (the Store's read, just after the overview's own),
    or none and why: a row the Store refuses to read must not take the page down."""
    try:
        return {lim.queue: lim for lim in store.all_queue_limits()}, ""
    except ValidationError as exc:
        return {}, _error_text(exc)


def _jobs(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "jobs.html", _jobs_context(dash, request))


def _jobs_live(dash: Dashboard, request: Request) -> Response:
    context = _jobs_context(dash, request)
    return dash.render(request, "jobs_live.html", context, here=context["list_here"])


def _jobs_context(dash: Dashboard, request: Request) -> dict[str, Any]:
    params = request.query_params
    where, form = filter_from(params)
    before = _optional_id(params.get("before"), "before")
    page = dash.reads.jobs(where, before=before, limit=PAGE_SIZE)
    query = _filter_query(form)
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


def _job(dash: Dashboard, request: Request) -> Response:
    context = _job_context(dash, request)
    return dash.render(request, "job.html", context, here=context["job_here"])


def _job_live(dash: Dashboard, request: Request) -> Response:
    context = _job_context(dash, request)
    return dash.render(request, "job_live.html", context, here=context["job_here"])


def _job_context(dash: Dashboard, request: Request) -> dict[str, Any]:
    job_id = _path_id(request)
    detail = dash.reads.job(job_id)
    job = detail.job
    error = job.last_error or ""
    return {
        "page": "job",
        "detail": detail,
        "job": job,
        "db_now": detail.db_now,
        "error_summary": error.strip().splitlines()[0] if error.strip() else "",
        "can_cancel": job.state in (State.QUEUED, State.LEASED) and not job.cancel_requested,
        "can_retry": job.state is not State.LEASED,
        "job_here": f"/jobs/{job.id}",
    }


def _schedules(dash: Dashboard, request: Request) -> Response:
    now, schedules = dash.reads.schedules()
    return dash.render(
        request,
        "schedules.html",
        {
            "page": "schedules",
            "db_now": now,
            "schedules": schedules,
            "trigger_nonce": secrets.token_hex(8),
        },
        here="/schedules",
    )


def _bulk_plan(dash: Dashboard, action: str, params: Mapping[str, str]) -> dict[str, Any]:
    if action not in BULK_STATES:
        raise HTTPException(404, f"no bulk action {action!r}: retry or cancel")
    where, form = filter_from(params)
    allowed = BULK_STATES[action]
    if where.state not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise ValidationError("state", f"a bulk {action} needs a state filter: {names}")
    return {"action": action, "where": where, "filters": form}


def _bulk_confirm(dash: Dashboard, request: Request) -> Response:
    if dash.read_only:
        raise HTTPException(403, "this dashboard is read-only: actions are switched off")
    plan = _bulk_plan(dash, request.path_params["action"], request.query_params)
    count = 0
    newest: uuid.UUID | None = None
    for job in dash.reads.matching(plan["where"]):
        if newest is None:
            newest = job.id
        count += 1
        if count > BULK_LIMIT:
            break
    query = _filter_query(plan["filters"])
    return dash.render(
        request,
        "bulk.html",
        {
            **plan,
            "page": "bulk",
            "count": count,
            "too_many": count > BULK_LIMIT,
            "limit": BULK_LIMIT,
            "upto": "" if newest is None else str(newest),
            "filter_query": query,
            "db_now": None,
        },
        here="/jobs?" + urllib.parse.urlencode(query),
    )


# -- actions -------------------------------------------------------------------------------


def _job_cancel(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    job = dash.store.cancel(_path_id(request))
    if job.state is State.CANCELLED:
        code = "cancelled"
    elif job.state is State.LEASED and job.cancel_requested:
        code = "cancel-requested"
    else:
        code = "not-cancelled"
    return _back(request, form, code)


def _job_retry(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.retry(_path_id(request))
    return _back(request, form, "retried")


def _bulk_run(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    action = request.path_params["action"]
    plan = _bulk_plan(dash, action, form)
    upto = _optional_id(form.get("upto"), "upto")
    done = skipped = 0
    if upto is not None:
        for job in dash.reads.matching(plan["where"], upto=upto):
            if done + skipped >= BULK_LIMIT:
                break
            if _act(dash.store, action, job):
                done += 1
            else:
                skipped += 1
    code = "bulk-retried" if action == "retry" else "bulk-cancelled"
    return _back(request, form, code, n=done, skipped=skipped)


def _act(store: Store, action: str, job: Job) -> bool:
    """One job of a bulk action, through the Store; False when it no longer applied."""
    try:
        if action == "retry":
            store.retry(job.id)
            return True
        done = store.cancel(job.id)
    except (NotFound, InvalidState):
        return False
    return done.state is State.CANCELLED or (done.state is State.LEASED and done.cancel_requested)


def _queue_pause(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.pause_queue(_field(form, "queue"))
    return _back(request, form, "queue-paused")


def _queue_resume(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    resumed = dash.store.resume_queue(_field(form, "queue"))
    return _back(request, form, "queue-resumed" if resumed else "queue-not-paused")


def _schedule_pause(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.pause_schedule(_field(form, "id"))
    return _back(request, form, "schedule-paused")


def _schedule_resume(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.resume_schedule(_field(form, "id"))
    return _back(request, form, "schedule-resumed")


def _schedule_trigger(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    nonce = form.get("nonce", "").strip() or None
    job = dash.store.trigger_schedule(_field(form, "id"), nonce=nonce)
    return _back(request, form, "schedule-triggered", job=str(job.id))


def _field(form: Mapping[str, str], name: str) -> str:
    value = form.get(name, "").strip()
    if not value:
        raise ValidationError(name, "is required")
    return value


def _back(request: Request, form: Mapping[str, str], code: str, **extra: object) -> Response:
    """303 to the form's ``next`` (a path inside the dashboard), with the notice."""
    target = form.get("next", "")
    if not _safe_next(target):
        target = "/"
    parts = urllib.parse.urlsplit(target)
    query = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("notice", "n", "skipped", "job")
    ]
    query.append(("notice", code))
    query.extend((k, str(v)) for k, v in extra.items())
    url = _root_path(request) + parts.path + "?" + urllib.parse.urlencode(query)
    return RedirectResponse(url, status_code=303)


def _safe_next(target: str) -> bool:
    """A path of this dashboard: starts with one slash, no scheme, host or backslash."""
    return (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and not any(ord(c) < 0x20 for c in target)
    )


# -- helpers -------------------------------------------------------------------------------


def filter_from(params: Mapping[str, str]) -> tuple[JobFilter, dict[str, str]]:
    """The jobs filter in query parameters (or a form), and the values as given (trimmed)."""
    form = {
        name: (params.get(name) or "").strip() for name in ("queue", "state", "type", "key", "id")
    }
    state: State | None = None
    if form["state"]:
        try:
            state = State(form["state"].lower())
        except ValueError:
            raise ValidationError("state", f"unknown state {form['state']!r}") from None
    where = JobFilter(
        queue=form["queue"] or None,
        state=state,
        type=form["type"] or None,
        idempotency_key=form["key"] or None,
        id_prefix=form["id"] or None,
    )
    return where, form


def _filter_query(form: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in form.items() if v}


def _optional_id(text: str | None, field: str) -> uuid.UUID | None:
    if not text or not text.strip():
        return None
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ValidationError(field, "is not a job id (a UUID)") from None


def _path_id(request: Request) -> uuid.UUID:
    try:
        return uuid.UUID(str(request.path_params["job_id"]))
    except ValueError:
        raise HTTPException(404, "no such job: the id is not a UUID") from None


def _root_path(request: Request) -> str:
    return str(request.scope.get("root_path", "")).rstrip("/")


def _here(request: Request) -> str:
    """The request's path inside the dashboard, with its query."""
    root = _root_path(request)
    path = request.url.path
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    query = request.url.query
    return path + ("?" + query if query else "")


def _url_helper(request: Request) -> Callable[..., str]:
    root = _root_path(request)
    router = request.app.router if hasattr(request.app, "router") else request.app

    def url(name: str, query: Mapping[str, object] | None = None, **params: Any) -> str:
        path = root + str(router.url_path_for(name, **params))
        if query:
            items = {k: str(v) for k, v in query.items() if v not in (None, "")}
            if items:
                path += "?" + urllib.parse.urlencode(items)
        return path

    return url


def _notice(request: Request) -> dict[str, str] | None:
    code = request.query_params.get("notice")
    if code not in NOTICES:
        return None
    counts = {}
    for name in ("n", "skipped"):
        value = request.query_params.get(name, "0")
        counts[name] = str(int(value)) if value.isdigit() and len(value) < 10 else "0"
    text = NOTICES[code].format(**counts)
    if counts["skipped"] != "0":
        text += f" {counts['skipped']} no longer matched and were left alone."
    job = request.query_params.get("job")
    notice = {"code": code, "text": text, "job": ""}
    if job:
        with contextlib.suppress(ValueError):
            notice["job"] = str(uuid.UUID(job))
    return notice


def _error_text(exc: BaseException) -> str:
    return redact(str(exc).strip() or type(exc).__name__)


def _error_page(dash: Dashboard, request: Request, status: int, message: str) -> Response:
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


# -- formatting ----------------------------------------------------------------------------


def format_age(seconds: float | dt.timedelta | None) -> str:
    """A duration for people: 42s, 3m 5s, 2h 10m, 4d 3h."""
    if seconds is None:
        return ""
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    if not math.isfinite(seconds):
        return ""
    total = int(abs(seconds))
    sign = "-" if seconds < 0 else ""
    if total < 60:
        return f"{sign}{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{sign}{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d {hours}h"


def format_when(value: dt.datetime | None, now: dt.datetime | None = None) -> Markup:
    """A ``<time>`` element: UTC to the second, and how long ago (or until) by ``now``."""
    if value is None:
        return Markup('<span class="never">never</span>')
    utc = value.astimezone(dt.UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%SZ")
    relative = ""
    if now is not None:
        delta = (utc - now).total_seconds()
        relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(-delta)} ago"
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        utc.isoformat(), relative or text, text if not relative else f"{text} ({relative})"
    )


def format_percent(fraction: float) -> str:
    """A fraction done as people read it: 40%, 99.9% (never 100% before it is 1)."""
    tenths = math.floor(fraction * 1000 + 1e-9)
    return f"{tenths // 10}%" if tenths % 10 == 0 else f"{tenths / 10:.1f}%"


def rate_window(rate: RateLimit) -> str:
    """A rate limit's window as people read it: 1 s, 10 s, 1 min, 500 ms."""
    period = str(rate).split("/", 1)[1]  # s, 10s, min, 500ms
    unit = period.lstrip("0123456789.")
    return f"{period[: len(period) - len(unit)] or '1'} {unit}"


def pretty_json(value: object) -> str:
    """A JSON value as indented text (escaped by the template like any string)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


def short_id(value: uuid.UUID | str) -> str:
    return str(value)[:13]


@dataclasses.dataclass(frozen=True, slots=True)
class Bar:
    minute: dt.datetime
    succeeded: int
    failed: int
    x: float
    succeeded_y: float
    succeeded_height: float
    failed_y: float
    failed_height: float


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    bars: tuple[Bar, ...]
    width: int
    height: int
    bar_width: float
    peak: int
    succeeded_total: int
    failed_total: int


CHART_WIDTH = 600
CHART_HEIGHT = 120


def throughput_chart(minutes: Sequence[Minute]) -> Chart:
    """Stacked bars (succeeded below, failed above) scaled to the busiest minute."""
    peak = max((m.succeeded + m.failed for m in minutes), default=0)
    slot = CHART_WIDTH / max(len(minutes), 1)
    scale = (CHART_HEIGHT - 2) / peak if peak else 0.0
    bars = []
    for i, m in enumerate(minutes):
        ok_h = m.succeeded * scale
        bad_h = m.failed * scale
        bars.append(
            Bar(
                minute=m.minute,
                succeeded=m.succeeded,
                failed=m.failed,
                x=round(i * slot + 1, 2),
                succeeded_y=round(CHART_HEIGHT - ok_h, 2),
                succeeded_height=round(ok_h, 2),
                failed_y=round(CHART_HEIGHT - ok_h - bad_h, 2),
                failed_height=round(bad_h, 2),
            )
        )
    return Chart(
        bars=tuple(bars),
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bar_width=round(max(slot - 2, 1), 2),
        peak=peak,
        succeeded_total=sum(m.succeeded for m in minutes),
        failed_total=sum(m.failed for m in minutes),
    )


__all__ = ["BULK_LIMIT", "PAGE_SIZE", "Dashboard", "create_app", "filter_from"]
