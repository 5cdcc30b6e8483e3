"""The schedules page and its actions: pause, resume, trigger one run now.

Each action is one Store call (``pause_schedule``, ``resume_schedule``,
``trigger_schedule``): the dashboard adds no rule of its own. A resumed
schedule fires from its next occurrence, never catching up on what it
missed while paused; a triggered run leaves the schedule as it was.

Trigger carries a nonce, fresh in every rendering of the page: the Store
enqueues one run per (schedule, nonce), so a form posted twice (a double
click, a request retried) enqueues one run, while a click on a freshly
loaded page enqueues another, as a person would expect.
"""

from __future__ import annotations

import secrets

from starlette.requests import Request
from starlette.responses import Response

from jobrun.web.dashboard import Dashboard
from jobrun.web.endpoints import back, field


def schedules(dash: Dashboard, request: Request) -> Response:
    now, listed = dash.reads.schedules()
    return dash.render(
        request,
        "schedules.html",
        {
            "page": "schedules",
            "db_now": now,
            "schedules": listed,
            "trigger_nonce": secrets.token_hex(8),
        },
        here="/schedules",
    )


def schedule_pause(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.pause_schedule(field(form, "id"))
    return back(request, form, "schedule-paused")


def schedule_resume(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.resume_schedule(field(form, "id"))
    return back(request, form, "schedule-resumed")


def schedule_trigger(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    nonce = form.get("nonce", "").strip() or None
    job = dash.store.trigger_schedule(field(form, "id"), nonce=nonce)
    return back(request, form, "schedule-triggered", job=str(job.id))


__all__ = ["schedule_pause", "schedule_resume", "schedule_trigger", "schedules"]
