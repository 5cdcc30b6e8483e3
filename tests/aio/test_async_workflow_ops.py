"""The asyncio twin of operating a workflow: AsyncClient.workflows, workflow,
cancel_workflow and retry_workflow, against real PostgreSQL (the claims and
completions are the sync Store's, as in test_async_client.py)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import jobrun
from jobrun import AsyncClient, NewJob, State, WorkflowState
from jobrun.job.errors import NotFound, ValidationError
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL

Aio = Callable[[Awaitable[Any]], Any]


def test_an_async_client_lists_reads_cancels_and_retries_a_workflow(
    aio: Aio, aclient: AsyncClient, store: Store
) -> None:
    flow = jobrun.Workflow("async ops")
    a = flow.add(NewJob(type="a", queue="qa"), name="a")
    flow.add(NewJob(type="b", queue="qb"), name="b", after=[a])
    run = aio(aclient.enqueue_workflow(flow))

    (listed,) = aio(aclient.workflows(state="running"))
    assert listed.id == run.id and listed.jobs[State.WAITING] == 1
    graph = aio(aclient.workflow(str(run.id)))
    assert [n.node for n in graph.nodes] == ["a", "b"] and graph["b"].parents == (a.id,)

    (claimed,) = store.claim("w", ["qa"], 1, TTL)
    done = aio(aclient.cancel_workflow(run.id))
    assert (done.cancelled, done.cancel_requested, done.finished) == (1, 1, 0)
    store.complete(claimed, result=1)  # cancel requested: it ends cancelled
    assert aio(aclient.workflow(run.id)).state is WorkflowState.CANCELLED

    retried = aio(aclient.retry_workflow(run.id))
    assert (retried.queued, retried.waiting) == (1, 1)
    (again,) = store.claim("w", ["qa"], 1, TTL)
    store.complete(again, result=2)
    (child,) = store.claim("w", ["qb"], 1, TTL)
    assert child.parent_results is not None and child.parent_results["a"].result == 2
    store.complete(child)
    assert aio(aclient.workflows(state="succeeded"))[0].id == run.id


def test_an_async_client_refuses_bad_input_and_unknown_workflows(
    aio: Aio, aclient: AsyncClient
) -> None:
    for call in (aclient.workflow, aclient.cancel_workflow, aclient.retry_workflow):
        with pytest.raises(ValidationError, match="workflow_id"):
            aio(call("nope"))
        with pytest.raises(NotFound):
            aio(call(uuid.uuid4()))
    with pytest.raises(ValidationError, match="state"):
        aio(aclient.workflows(state="dead"))
    with pytest.raises(NotFound):
        aio(aclient.workflows(before=uuid.uuid4()))
    assert aio(aclient.workflows()) == []
