"""What every page of the dashboard shares: the Store, the templates, the request's place.

A :class:`Dashboard` is made once per app by :func:`jobrun.web.create_app`
and handed to every handler (it is also ``app.state.dashboard``). It holds
the two things a handler needs beyond its request: the Store with its
:class:`~jobrun.postgres.web.DashboardReads` (every read the pages make;
no SQL lives in this package) and :meth:`Dashboard.render`, which fills in
what every template expects besides the page's own context.

The Store is opened lazily when the app was given Settings or a URL: an
app can be created (and mounted) at import time while the database is
still away, and the first request then opens a small pool of its own that
waits :data:`CONNECTION_WAIT` for a connection, so that a page answers 503
with the reason quickly instead of hanging for a worker's 30 s. A Client or
a Store given is used as it is and never closed here.

The dashboard can be mounted under any prefix (``root_path``): every link
goes through :func:`url_helper` and every redirect through
:func:`root_path`, so nothing in the templates or handlers writes an
absolute path. The CSRF cookie is set by :meth:`Dashboard.render` on the
first page a browser gets, scoped to that prefix (see
:mod:`jobrun.web.security` for why a cookie and an HMAC).
"""

from __future__ import annotations

import contextlib
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.model import State
from jobrun.postgres import dsn
from jobrun.postgres.leader import election_name, leader_lock_name
from jobrun.postgres.lock import LOCK_LEADER, lock_key
from jobrun.postgres.store import Store
from jobrun.postgres.web import DashboardReads
from jobrun.web.format import FILTERS
from jobrun.web.security import CSRF_COOKIE, CSRF_FIELD, Authorizer, Csrf

HERE = Path(__file__).resolve().parent
CONNECTION_WAIT = 1.5
"""Seconds a request waits for a connection of the dashboard's own pool: while the
database is away, a page answers 503 (the reason on it) after that, not after the
30 s of a worker's pool."""

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
"""What each ``?notice=`` code says; any other code shows nothing, so that a link
cannot put words of its own on a page."""

Source = Store | Client | Settings | str
"""What :func:`jobrun.web.create_app` reads from."""


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
        self.env.filters.update(FILTERS)

    def _use(self, store: Store) -> None:

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
        """``template`` with ``context`` over what every page expects (links, the CSRF
        token, the notice, the options); ``here`` is where the page's forms return to."""
        nonce = request.cookies.get(CSRF_COOKIE)
        fresh = not nonce or len(nonce) > 64
        if fresh:
            nonce = self.csrf.new_nonce()
        assert nonce is not None
        root = root_path(request)
        base: dict[str, Any] = {
            "request": request,
            "url": url_helper(request),
            "read_only": self.read_only,
            "csrf_field": CSRF_FIELD,
            "csrf_token": self.csrf.token(nonce),
            "here": here if here is not None else here_of(request),
            "database": self.database,
            "refresh_seconds": self.refresh_seconds,
            "notice": notice_of(request),
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


# -- the request's place -------------------------------------------------------------------


def root_path(request: Request) -> str:
    """The prefix the dashboard is mounted under (``""`` at the root), no trailing slash."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def here_of(request: Request) -> str:
    """The request's path inside the dashboard, with its query."""
    root = root_path(request)
    path = request.url.path
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    query = request.url.query
    return path + ("?" + query if query else "")


def url_helper(request: Request) -> Callable[..., str]:
    """The templates' ``url(name, query, **params)``: a route's path under the prefix."""
    root = root_path(request)
    router = request.app.router if hasattr(request.app, "router") else request.app

    def url(name: str, query: Mapping[str, object] | None = None, **params: Any) -> str:
        path = root + str(router.url_path_for(name, **params))
        if query:
            items = {k: str(v) for k, v in query.items() if v not in (None, "")}
            if items:
                path += "?" + urllib.parse.urlencode(items)
        return path

    return url


def notice_of(request: Request) -> dict[str, str] | None:
    """The notice an action's redirect asked for: code, text (counts checked) and job id."""
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


__all__ = [
    "CONNECTION_WAIT",
    "NOTICES",
    "Dashboard",
    "Source",
    "here_of",
    "notice_of",
    "root_path",
    "url_helper",
]
