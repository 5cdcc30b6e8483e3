"""The overview page and the queue actions it carries (pause, resume).

The overview answers "is jobrun healthy right now?" on one screen: every
queue's counts and limits, the throughput of the last hour
(:mod:`jobrun.web.chart`), the leader, the workers holding leases with
their running jobs, and how full PostgreSQL's notification queue is. All of it
comes from one :meth:`~jobrun.postgres.web.DashboardReads.overview` read
(one database clock for the whole page), plus the queues' limits read just
after by the Store.

A limit row the Store refuses to read (a hand-edited table, say) shows as
``#limits-error`` on the page instead of a 400 for the whole overview: the
page people open when something is wrong must not be taken down by what is
wrong. A queue that only has limits (no job, no pause) is listed with zeros,
so that a limit set ahead of the first job is visible.

Pause and resume are here because the overview is where a queue is seen;
each is one Store call, and a paused queue stays marked (``data-paused``)
until resumed.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from jobrun.job.errors import ValidationError
from jobrun.job.model import QueueLimits
from jobrun.postgres.stats import QueueStats
from jobrun.postgres.store import Store
from jobrun.web.chart import throughput_chart
from jobrun.web.dashboard import Dashboard
from jobrun.web.endpoints import back, field
from jobrun.web.format import error_text


def overview(dash: Dashboard, request: Request) -> Response:
    return dash.render(request, "overview.html", _overview_context(dash), here="/")


def overview_live(dash: Dashboard, request: Request) -> Response:
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
        return {}, error_text(exc)


def queue_pause(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    dash.store.pause_queue(field(form, "queue"))
    return back(request, form, "queue-paused")


def queue_resume(dash: Dashboard, request: Request, form: dict[str, str]) -> Response:
    resumed = dash.store.resume_queue(field(form, "queue"))
    return back(request, form, "queue-resumed" if resumed else "queue-not-paused")


__all__ = ["overview", "overview_live", "queue_pause", "queue_resume"]
