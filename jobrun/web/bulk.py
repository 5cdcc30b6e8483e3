"""Bulk retry and cancel: one action over a filtered set of jobs, in two steps.

A person filters the jobs page, follows "retry all" or "cancel all", sees
how many jobs that is, and confirms. Two steps because the set is a query,
not a selection: the count is what makes the click deliberate.

The confirm step (:func:`confirm`, a GET) walks the filtered set, counts it
and remembers the newest matching id (``upto``, a hidden field of the
form). The action (:func:`run`, a POST) then acts on the jobs that still
match the filters with an id up to that one, so jobs enqueued after the
confirm step are left alone, and one that changed state meanwhile is
counted as skipped rather than failing the rest.

A state filter is required and must be one the action applies to
(:data:`BULK_STATES`): retrying queued jobs or cancelling dead ones is
meaningless. Each job is its own Store call (``retry`` or ``cancel``),
writing its own events as a single action would, so a bulk action leaves
the same history as many clicks. At most :data:`BULK_LIMIT` jobs at a time:
a larger set is refused on the confirm step, asking for narrower filters
(or ``jobrun retry --state``), which bounds how long one request holds a
thread.
"""

from __future__ import annotations

import urllib.parse
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from jobrun.job.errors import InvalidState, NotFound, ValidationError
from jobrun.job.model import Job, State
from jobrun.postgres.store import Store
from jobrun.web.dashboard import Dashboard
from jobrun.web.endpoints import READ_ONLY, back, filter_from, filter_query, optional_id

BULK_LIMIT = 10_000
"""The most jobs one bulk action acts on."""

BULK_STATES: dict[str, tuple[State, ...]] = {
    "retry": (State.DEAD, State.CANCELLED, State.SUCCEEDED),
    "cancel": (State.WAITING, State.QUEUED, State.LEASED),
}
"""The states each bulk action applies to (the filter's state must be one)."""


def _plan(action: str, params: Mapping[str, str]) -> dict[str, Any]:
    """The filters of a bulk action, refused unless their state is one it applies to."""
    if action not in BULK_STATES:
        raise HTTPException(404, f"no bulk action {action!r}: retry or cancel")
    where, form = filter_from(params)
    allowed = BULK_STATES[action]
    if where.state not in allowed:
        names = ", ".join(s.value for s in allowed)
        raise ValidationError("state", f"a bulk {action} needs a state filter: {names}")
    return {"action": action, "where": where, "filters": form}


def confirm(dash: Dashboard, request: Request) -> Response:
    """The confirm step: how many jobs match (up to one past the limit) and the newest."""
    if dash.read_only:
        raise HTTPException(403, READ_ONLY)
    plan = _plan(request.path_params["action"], request.query_params)
    count = 0
    newest: uuid.UUID | None = None
    for job in dash.reads.matching(plan["where"]):
        if newest is None:
            newest = job.id
        count += 1
        if count > BULK_LIMIT:
            break
    query = filter_query(plan["filters"])
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


def run(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    """The action on the jobs that still match, up to the newest the confirm step saw."""
    action = request.path_params["action"]
    plan = _plan(action, form)
    upto = optional_id(form.get("upto"), "upto")
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
    return back(request, form, code, n=done, skipped=skipped)


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


__all__ = ["BULK_LIMIT", "BULK_STATES", "confirm", "run"]
