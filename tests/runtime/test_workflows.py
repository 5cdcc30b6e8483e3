"""Workflows through a real worker: results flow from parents to children.

The graph is built with typed tasks (``task.new_job(...)``), enqueued in one
transaction, and run by a Worker in this process against real PostgreSQL;
a child's handler reads its parents' results, loaded with its claim.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import State
from jobrun.postgres.store import Store
from jobrun.worker import JobContext, Registry


def test_an_orders_lines_fan_out_and_their_total_fans_in_through_a_worker(
    store: Store, registry: Registry, make_worker: Any
) -> None:
    @registry.task("order.load")
    def load_order(order_id: int) -> dict[str, Any]:
        return {"order": order_id, "lines": [1, 2, 3]}

    @registry.task("order.price_line")
    def price_line(ctx: JobContext, line: int) -> float:
        order = ctx.parent_results().of(load_order)[0]  # the chain: A's result in B
        return float(line * 10 + order["order"])

    @registry.task("order.total")
    def total(ctx: JobContext, order_id: int) -> dict[str, Any]:
        parents = ctx.parent_results()
        prices = parents.of(price_line)  # list[float], typed by the task
        return {"order": order_id, "total": sum(prices), "lines": sorted(parents)}

    client = jobrun.Client(store)
    wf = jobrun.Workflow("order 7")
    order = wf.add(load_order.new_job(7))
    lines = wf.group([price_line.new_job(n) for n in (1, 2, 3)], after=[order])
    fan_in = wf.add(total.new_job(7), after=lines, name="total")
    run = client.enqueue_workflow(wf)
    assert run.id == wf.id and len(run) == 5
    assert run["total"].state is State.WAITING and run["order.load"].state is State.QUEUED
    assert {j.workflow_id for j in run} == {wf.id}

    make_worker(concurrency=4)
    done = client.wait(fan_in.id, timeout=20)
    assert done.state is State.SUCCEEDED
    assert done.result == {
        "order": 7,
        "total": 3 * 7 + 60.0,
        "lines": ["order.price_line", "order.price_line.1", "order.price_line.2"],
    }
    assert done.workflow_node == "total"


def test_a_chain_runs_in_order_and_a_failure_cancels_the_rest_naming_the_parent(
    store: Store, registry: Registry, make_worker: Any
) -> None:
    ran: list[str] = []

    @registry.task("step.ok")
    def ok(name: str) -> str:
        ran.append(name)
        return name

    @registry.task("step.broken")
    def broken() -> None:
        raise jobrun.PermanentFailure("the card was declined")

    client = jobrun.Client(store)
    wf = jobrun.Workflow("signup")
    _first, bad, after_bad = wf.chain(ok.new_job("a"), broken.new_job(), ok.new_job("c"))
    client.enqueue_workflow(wf)
    make_worker()
    end = client.wait(after_bad.id, timeout=20)
    assert end.state is State.CANCELLED
    assert end.last_error is not None and "step.broken" in end.last_error
    assert str(bad.id) in end.last_error and "dead" in end.last_error
    assert ran == ["a"]


def test_a_cycle_an_unknown_node_and_a_self_edge_are_refused_before_anything_is_written(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    client = jobrun.Client(store)
    cycle = jobrun.Workflow("cycle")
    cycle.add(jobrun.NewJob(type="a"), name="a", after=["c"])
    cycle.add(jobrun.NewJob(type="b"), name="b", after=["a"])
    cycle.add(jobrun.NewJob(type="c"), name="c", after=["b"])
    cycle.add(jobrun.NewJob(type="d"), name="d")
    with pytest.raises(ValidationError, match=r"has a cycle: a -> c -> b -> a|cycle"):
        client.enqueue_workflow(cycle)
    unknown = jobrun.Workflow("unknown")
    unknown.add(jobrun.NewJob(type="a"), after=["nobody"])
    with pytest.raises(ValidationError, match="'nobody', which is no node"):
        client.enqueue_workflow(unknown)
    selfish = jobrun.Workflow("self")
    selfish.add(jobrun.NewJob(type="a"), name="a", after=["a"])
    with pytest.raises(ValidationError, match="cannot wait for itself"):
        client.enqueue_workflow(selfish)
    twice = jobrun.Workflow("twice")
    twice.add(jobrun.NewJob(type="a"), name="x")
    with pytest.raises(ValidationError, match="two nodes are named 'x'"):
        twice.add(jobrun.NewJob(type="b"), name="x")
    with pytest.raises(ValidationError, match="on_parent_failure"):
        twice.add(jobrun.NewJob(type="b"), after=["x"], on_parent_failure="ignore")
    with pytest.raises(ValidationError, match="has no jobs"):
        client.enqueue_workflow(jobrun.Workflow("empty"))
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs), (SELECT count(*) FROM jobrun.workflows)"
    ).fetchone()
    assert row == (0, 0)


def test_a_workflow_enqueued_in_the_callers_transaction_exists_only_if_it_commits(
    store: Store, dsn: str
) -> None:
    client = jobrun.Client(store)
    wf = jobrun.Workflow("in a transaction")
    a = wf.add(jobrun.NewJob(type="a"))
    wf.add(jobrun.NewJob(type="b"), after=[a])
    with psycopg.connect(dsn) as own:
        client.enqueue_workflow(wf, conn=own)
        own.rollback()
    assert client.list() == []
    with psycopg.connect(dsn) as own:
        client.enqueue_workflow(wf, conn=own)
        own.commit()
    assert {j.state for j in client.list()} == {State.WAITING, State.QUEUED}


def test_a_typed_tasks_job_waits_for_a_job_enqueued_before_it(
    store: Store, registry: Registry, make_worker: Any
) -> None:
    @registry.task("seed")
    def seed() -> int:
        return 21

    @registry.task("double")
    def double(ctx: JobContext) -> int:
        return 2 * ctx.parent_results().of(seed)[0]

    client = jobrun.Client(store)
    first = seed.enqueue(client)
    second = client.enqueue_job(double.new_job(), after=[first])
    assert second.state is State.WAITING
    make_worker()
    assert client.wait(second.id, timeout=20).result == 42


def test_the_fan_in_is_woken_by_its_last_parents_commit_not_by_polling(
    store: Store, registry: Registry, make_worker: Any, notifier: Any
) -> None:
    """The workers poll every 30 s; the child, on a queue only the second
    worker serves, starts within a second of its parent's finish on the
    first because the trigger's wake-up reaches the listener."""

    @registry.task("wake.parent")
    def parent() -> int:
        return 1

    @registry.task("wake.child", queue="children")
    def child(ctx: JobContext) -> int:
        return ctx.parent_results().of(parent)[0] + 1

    client = jobrun.Client(store)
    worker_poll = dt.timedelta(seconds=30)
    make_worker(dispatcher=notifier, poll_interval=worker_poll)
    make_worker(dispatcher=notifier, poll_interval=worker_poll, queues={"children": None})
    time.sleep(0.5)  # the workers' first claims (of nothing) are behind them
    wf = jobrun.Workflow("wake")
    first = wf.add(parent.new_job())
    second = wf.add(child.new_job(), after=[first])
    client.enqueue_workflow(wf)
    done = client.wait(second.id, timeout=10)
    assert done.result == 2
    started = store.get(second.id).started_at
    finished = store.get(first.id).finished_at
    assert started is not None and finished is not None
    assert started - finished < dt.timedelta(seconds=1)
    assert store.get(second.id).lease_owner is None and done.queue == "children"


def test_a_chains_next_link_starts_in_the_transaction_that_records_its_parent(
    store: Store, registry: Registry, make_worker: Any, notifier: Any
) -> None:
    """The continuation: a success that releases a job is completed by the
    claimer's next round, whose claim takes the released job in the same
    transaction (no wake-up, no claim of its own): the link's start and its
    parent's finish carry one transaction timestamp."""
    registry.register("link", lambda ctx, job: job.payload["n"])
    client = jobrun.Client(store)
    wf = jobrun.Workflow("continued")
    links = wf.chain(*[jobrun.NewJob(type="link", payload={"n": n}) for n in range(5)])
    client.enqueue_workflow(wf)
    make_worker(dispatcher=notifier, concurrency=2)
    client.wait(links[-1].id, timeout=20)
    jobs = [store.get(link.id) for link in links]
    assert [job.state for job in jobs] == [State.SUCCEEDED] * 5
    for parent, link in itertools.pairwise(jobs):
        assert link.started_at == parent.finished_at


def test_a_workflow_enqueued_again_is_a_replay_and_another_with_its_id_is_refused(
    store: Store,
) -> None:
    client = jobrun.Client(store)
    wf = jobrun.Workflow("retried after a lost reply")
    a = wf.add(jobrun.NewJob(type="a"))
    wf.add(jobrun.NewJob(type="b"), after=[a])
    first = client.enqueue_workflow(wf)
    again = client.enqueue_workflow(wf)
    assert [j.id for j in again] == [j.id for j in first]
    assert len(client.list()) == 2
    other = jobrun.Workflow("another", id=wf.id)
    other.add(jobrun.NewJob(type="c"))
    with pytest.raises(jobrun.AlreadyExists):
        client.enqueue_workflow(other)
    assert len(client.list()) == 2


def test_a_node_of_another_workflow_is_refused_by_its_ref() -> None:
    one, two = jobrun.Workflow("one"), jobrun.Workflow("two")
    ref = one.add(jobrun.NewJob(type="a"))
    two.add(jobrun.NewJob(type="a"))  # the same default name, "a"
    with pytest.raises(ValidationError, match="node of another workflow"):
        two.add(jobrun.NewJob(type="b"), after=[ref])
    two.add(jobrun.NewJob(type="b"), after=[ref.id])  # by id: a job outside, once enqueued
