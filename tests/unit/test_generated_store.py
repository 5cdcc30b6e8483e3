"""One source for both stores (issue 26): the sync half is generated, and fresh.

plans.py said both stores built their parameters there while only the async
one did; the sync store's enqueue, admin and transactions are now generated
from the asyncio source, so both run the same code on the same plans.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from jobrun.postgres import admin, admin_async, enqueue, enqueue_async, plans
from jobrun.postgres.async_store import AsyncStore
from jobrun.postgres.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_both_stores_build_their_enqueue_parameters_in_plans() -> None:
    for module in (enqueue, enqueue_async):
        assert module.enqueue_args is plans.enqueue_args
        assert module.keyed_insert_args is plans.keyed_insert_args
    for module in (admin, admin_async):
        assert module.list_args is plans.list_args
    assert Store._enqueue_on.__module__ == "jobrun.postgres.enqueue"
    assert AsyncStore._enqueue_on.__module__ == "jobrun.postgres.enqueue_async"
    assert Store.list.__module__ == "jobrun.postgres.admin"
    assert AsyncStore.list.__module__ == "jobrun.postgres.admin_async"


def test_the_generated_sync_modules_are_fresh() -> None:
    tool = ROOT / "tools" / "async_to_sync.py"
    proc = subprocess.run(
        [sys.executable, str(tool), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_kept_enqueue_cursor_sends_enqueue_jobs_parameters_in_its_order() -> None:
    # Store._insert_job executes EnqueueJob itself (a cursor kept on each
    # pooled connection) with enqueue_args' values in order: they must be the
    # generated method's parameters, in the generated method's order.
    import inspect  # noqa: PLC0415

    from jobrun.job.model import NewJob  # noqa: PLC0415
    from jobrun.postgres.events import EventMode  # noqa: PLC0415
    from jobrun.postgres.sqlc import aio  # noqa: PLC0415
    from jobrun.postgres.sqlc import jobs as q  # noqa: PLC0415

    args = plans.enqueue_args(NewJob(type="t"), None, event_mode=EventMode.ALL, channel="c")
    for method in (q.Queries.enqueue_job, aio.AsyncQueries.enqueue_job):
        assert list(inspect.signature(method).parameters)[2:] == list(args)


def test_enqueue_manys_copy_rows_are_in_copy_jobs_column_order() -> None:
    # plans.ManyRows writes CopyJobs' binary rows itself: id, queue, type,
    # payload, then the shared fields, in the order of the generated COPY.
    import dataclasses  # noqa: PLC0415

    from jobrun.postgres.sqlc import events as eq  # noqa: PLC0415
    from jobrun.postgres.sqlc import jobs as q  # noqa: PLC0415

    columns = [f.name for f in dataclasses.fields(q.CopyJobsParams)]
    assert columns == [
        "id",
        "queue",
        "type",
        "payload",
        "priority",
        "max_attempts",
        "backoff",
        "run_at",
        "trace_context",
        "concurrency_key",
    ]
    assert f"({', '.join(columns)})" in q.COPY_JOBS_COPY
    assert q.COPY_JOBS_COPY_TYPES[:4] == ("uuid", "text", "text", "jsonb")
    assert "(job_id, kind, attempt)" in eq.COPY_EVENTS_COPY
    assert eq.COPY_EVENTS_COPY_TYPES == ("uuid", "text", "int4")
