"""The asyncio twin of workflows: AsyncClient.enqueue_workflow and enqueue(after=...).

Against real PostgreSQL; the other side (claims, completions) is the sync
Store, as in test_async_client.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun import AsyncClient, NewJob, State
from jobrun.job.errors import ValidationError
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL

Aio = Callable[[Awaitable[Any]], Any]


def test_an_async_workflow_is_enqueued_in_one_transaction_and_released_by_its_parent(
    aio: Aio, aclient: AsyncClient, store: Store
) -> None:
    wf = jobrun.Workflow("async")
    a = wf.add(NewJob(type="a", queue="qa"))
    b = wf.add(NewJob(type="b", queue="qb"), after=[a])
    run = aio(aclient.enqueue_workflow(wf))
    assert [j.state for j in run] == [State.QUEUED, State.WAITING]
    (claimed,) = store.claim("w", ["qa"], 1, TTL)
    store.complete(claimed, result=41)
    (child,) = store.claim("w", ["qb"], 1, TTL)
    assert child.id == b.id and child.parent_results is not None
    assert child.parent_results["a"].result == 41


def test_async_enqueue_after_a_job_and_a_missing_parent(aio: Aio, aclient: AsyncClient) -> None:
    parent = aio(aclient.enqueue("a"))
    child = aio(aclient.enqueue("b", after=[parent.id], on_parent_failure="run"))
    assert child.state is State.WAITING and child.pending_parents == 1
    with pytest.raises(ValidationError, match="does not exist"):
        aio(aclient.enqueue("b", after=["00000000-0000-7000-8000-000000000000"]))
    with pytest.raises(ValidationError, match="cycle"):
        wf = jobrun.Workflow("loop")
        wf.add(NewJob(type="a"), name="a", after=["b"])
        wf.add(NewJob(type="b"), name="b", after=["a"])
        aio(aclient.enqueue_workflow(wf))
    assert len(aio(aclient.list())) == 2


def test_an_async_workflow_in_the_callers_rolled_back_transaction_leaves_nothing(
    aio: Aio, aclient: AsyncClient, dsn: str
) -> None:
    async def rolled_back() -> None:
        async with await psycopg.AsyncConnection.connect(dsn) as own:
            wf = jobrun.Workflow("rolled back")
            wf.chain(NewJob(type="a"), NewJob(type="b"))
            await aclient.enqueue_workflow(wf, conn=own)
            await own.rollback()

    aio(rolled_back())
    assert aio(aclient.list()) == []
