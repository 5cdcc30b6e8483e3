"""From a request to a handler and back: the plumbing every route shares.

A handler in :mod:`jobrun.web.overview`, :mod:`jobrun.web.jobs`,
:mod:`jobrun.web.bulk` or :mod:`jobrun.web.schedules` is a plain function
of the :class:`~jobrun.web.dashboard.Dashboard` and the request (and, for an
action, the form), calling the blocking Store. :func:`page` and
:func:`action` turn one into a Starlette endpoint that runs it on the thread
pool, so the event loop never waits on the database.

:func:`action` is where every POST is refused before it reaches its handler:
403 in read-only mode or without the page's CSRF token, 413 past
:data:`MAX_FORM_BYTES`, 415 for anything but a urlencoded form. The form is
read by hand (not ``request.form()``) so that its size is bounded and the
dashboard needs no multipart parser. The first value of a repeated field
wins.

Every action answers with :func:`back`: a 303 to the form's ``next`` with
``?notice=<code>``, which the page then shows (see
:data:`jobrun.web.dashboard.NOTICES`). ``next`` must be a path inside the
dashboard (:func:`safe_next`), or the redirect goes to the overview: a form
cannot send a browser to another site.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Awaitable, Callable, Mapping

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from jobrun.job.errors import ValidationError
from jobrun.job.model import State
from jobrun.postgres.web import JobFilter
from jobrun.web.dashboard import Dashboard, root_path
from jobrun.web.security import CSRF_COOKIE, CSRF_FIELD

MAX_FORM_BYTES = 64 * 1024
READ_ONLY = "this dashboard is read-only: actions are switched off"

Handler = Callable[[Dashboard, Request], Response]
FormHandler = Callable[[Dashboard, Request, dict[str, str]], Response]


def page(dash: Dashboard, fn: Handler) -> Callable[[Request], Awaitable[Response]]:
    """A GET endpoint running ``fn`` (Store calls: blocking) on the thread pool."""

    async def endpoint(request: Request) -> Response:
        return await run_in_threadpool(fn, dash, request)

    return endpoint


def action(dash: Dashboard, fn: FormHandler) -> Callable[[Request], Awaitable[Response]]:
    """A POST endpoint: refused in read-only mode and without the page's CSRF token."""

    async def endpoint(request: Request) -> Response:
        if dash.read_only:
            raise HTTPException(403, READ_ONLY)
        body = await read_body(request)
        form = parse_form(request, body)
        if not dash.csrf.valid(request.cookies.get(CSRF_COOKIE), form.get(CSRF_FIELD)):
            raise HTTPException(
                403, "the form's CSRF token is missing or wrong: reload the page and try again"
            )
        return await run_in_threadpool(fn, dash, request, form)

    return endpoint


async def read_body(request: Request) -> bytes:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_FORM_BYTES:
            raise HTTPException(413, "the form is too large")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_form(request: Request, body: bytes) -> dict[str, str]:
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


def field(form: Mapping[str, str], name: str) -> str:
    """A required form field, trimmed; ValidationError (a 400 page) when empty."""
    value = form.get(name, "").strip()
    if not value:
        raise ValidationError(name, "is required")
    return value


def back(request: Request, form: Mapping[str, str], code: str, **extra: object) -> Response:
    """303 to the form's ``next`` (a path inside the dashboard), with the notice."""
    target = form.get("next", "")
    if not safe_next(target):
        target = "/"
    parts = urllib.parse.urlsplit(target)
    query = [
        (k, v)
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        if k not in ("notice", "n", "skipped", "job")
    ]
    query.append(("notice", code))
    query.extend((k, str(v)) for k, v in extra.items())
    url = root_path(request) + parts.path + "?" + urllib.parse.urlencode(query)
    return RedirectResponse(url, status_code=303)


def safe_next(target: str) -> bool:
    """A path of this dashboard: starts with one slash, no scheme, host or backslash."""
    return (
        target.startswith("/")
        and not target.startswith("//")
        and "\\" not in target
        and not any(ord(c) < 0x20 for c in target)
    )


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


def filter_query(form: Mapping[str, str]) -> dict[str, str]:
    """The filters given, as query parameters (the empty ones left out)."""
    return {k: v for k, v in form.items() if v}


def optional_id(text: str | None, name: str) -> uuid.UUID | None:
    """A job id in a parameter or field, None when absent; ValidationError when not a UUID."""
    if not text or not text.strip():
        return None
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ValidationError(name, "is not a job id (a UUID)") from None


def path_id(request: Request) -> uuid.UUID:
    """The job id in the path; a 404 page when it is not a UUID (no such job can exist)."""
    try:
        return uuid.UUID(str(request.path_params["job_id"]))
    except ValueError:
        raise HTTPException(404, "no such job: the id is not a UUID") from None


__all__ = [
    "MAX_FORM_BYTES",
    "READ_ONLY",
    "FormHandler",
    "Handler",
    "action",
    "back",
    "field",
    "filter_from",
    "filter_query",
    "optional_id",
    "page",
    "path_id",
    "safe_next",
]
