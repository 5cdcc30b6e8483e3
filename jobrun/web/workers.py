"""The workers page: every registered worker, idle ones included.

Read from the registry each worker keeps of itself (``jobrun.workers``, see
:mod:`jobrun.job.workers`), not from the lease owners, so a worker with
nothing to do is listed too: host, pid, version, queues, concurrency, the
job types it runs, when it started and was last seen (the database clock),
the leases it holds, and whether its scheduler is the leader. A worker not
seen within its lease TTL is shown gone until it is pruned.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from jobrun.postgres.leader import leader_election
from jobrun.web.dashboard import Dashboard


def workers(dash: Dashboard, request: Request) -> Response:
    listed = dash.store.workers(leader_election(dash.store.schema))
    db_now = listed[0].db_now if listed else dash.store.now()
    return dash.render(
        request,
        "workers.html",
        {"page": "workers", "db_now": db_now, "workers": listed},
        here="/workers",
    )


__all__ = ["workers"]
