"""Operating a workflow: list, get, cancel, retry, and the purge of its row.

Against real PostgreSQL (migrations 0016 and 0018). A retry puts a
workflow's edges back so that the trigger of migration 0016 releases the
retried jobs in order; these tests run the workflows to their end through
the Store's own claim and completion, as a worker would.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid
from typing import Any

import psycopg
import pytest

import jobrun
from bench.plan import explain_claim
from jobrun.job.errors import NotFound, ValidationError
from jobrun.job.model import DEFAULT_BACKOFF, Job, NewJob, State
from jobrun.job.workflow import WorkflowState, retry_plan
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL

OWNER = "w1"


def claim_one(store: Store, queue: str = "default") -> Job:
    (job,) = store.claim(OWNER, [queue], 1, TTL)
    return job


def run(store: Store, job_id: uuid.UUID, *, fail: bool = False, result: Any = None) -> Job:
    """Claim ``job_id`` (the next of its queue) and complete it, or fail it for good."""
    queue = store.get(job_id).queue
    got = claim_one(store, queue)
    assert got.id == job_id, (store.get(job_id), got)
    if fail:
        return store.fail(got, "boom", None, permanent=True)
    return store.complete(got, result=result)


def fan_in(client: jobrun.Client, name: str = "orders") -> jobrun.EnqueuedWorkflow:
    """load -> price, price.1, price.2 -> total -> mail: each node on a queue of its own."""
    flow = jobrun.Workflow(name)
    load = flow.add(NewJob(type="load", queue="q.load"), name="load")
    prices = [
        flow.add(NewJob(type="price", queue=f"q.price{i}"), name=f"price{i}", after=[load])
        for i in range(3)
    ]
    total = flow.add(NewJob(type="total", queue="q.total"), name="total", after=prices)
    flow.add(NewJob(type="mail", queue="q.mail"), name="mail", after=[total])
    return client.enqueue_workflow(flow)


def states(store: Store, wf: jobrun.EnqueuedWorkflow) -> dict[str, State]:
    return {name: store.get(job.id).state for name, job in wf.jobs.items()}


def test_a_retry_after_a_failed_fan_in_parent_reruns_only_the_failed_path(store: Store) -> None:
    client = jobrun.Client(store)
    wf = fan_in(client)
    run(store, wf["load"].id, result=1)
    run(store, wf["price0"].id, result=10)
    failing = claim_one(store, "q.price1")
    step = store.record_step(failing, "fetch", {"rate": 2})  # a durable step that succeeded
    store.fail(failing, "boom", None, permanent=True)
    run(store, wf["price2"].id, result=30)
    assert states(store, wf) == {
        "load": State.SUCCEEDED,
        "price0": State.SUCCEEDED,
        "price1": State.DEAD,
        "price2": State.SUCCEEDED,
        "total": State.CANCELLED,
        "mail": State.CANCELLED,
    }
    assert store.workflow(wf.id).state is WorkflowState.FAILED

    retried = client.retry_workflow(wf.id)
    assert (retried.queued, retried.waiting, retried.kept, retried.retried) == (1, 2, 3, 3)
    assert states(store, wf) == {
        "load": State.SUCCEEDED,
        "price0": State.SUCCEEDED,
        "price1": State.QUEUED,
        "price2": State.SUCCEEDED,
        "total": State.WAITING,
        "mail": State.WAITING,
    }
    assert store.get(wf["total"].id).pending_parents == 1
    assert store.get(wf["mail"].id).pending_parents == 1
    assert store.get(wf["price1"].id).attempts == 0
    assert store.workflow(wf.id).state is WorkflowState.RUNNING
    kinds = [(str(e.kind), e.detail) for e in store.events(wf["total"].id)]
    assert kinds[-1] == ("retried", {"from": "cancelled", "workflow": str(wf.id)})

    again = claim_one(store, "q.price1")  # only the failed path is claimable
    assert store.claim(OWNER, ["q.load", "q.price0", "q.price2", "q.total", "q.mail"], 9, TTL) == []
    assert store.load_steps(again)["fetch"].value == step.value  # its step is kept
    store.complete(again, result=20)
    total = claim_one(store, "q.total")
    assert total.parent_results is not None
    assert sorted(total.parent_results.of("price")) == [10, 20, 30]
    store.complete(total, result=60)
    run(store, wf["mail"].id)
    graph = store.workflow(wf.id)
    assert graph.state is WorkflowState.SUCCEEDED
    assert graph.summary.finished_at is not None
    assert graph["load"].attempts == 1  # the succeeded ones never ran again


def test_a_retry_of_a_retried_parent_that_fails_again_cancels_its_children_again(
    store: Store,
) -> None:
    client = jobrun.Client(store)
    wf = fan_in(client)
    run(store, wf["load"].id, fail=True)
    assert set(states(store, wf).values()) == {State.DEAD, State.CANCELLED}
    assert client.retry_workflow(wf.id).retried == 6
    assert states(store, wf)["load"] is State.QUEUED
    assert {s for n, s in states(store, wf).items() if n != "load"} == {State.WAITING}
    run(store, wf["load"].id, fail=True)  # the trigger cascades as the first time
    assert store.workflow(wf.id).summary.jobs[State.CANCELLED] == 5
    assert client.retry_workflow(wf.id).queued == 1


def test_a_child_still_waiting_waits_again_for_its_retried_parent(store: Store) -> None:
    client = jobrun.Client(store)
    flow = jobrun.Workflow("run anyway")
    a = flow.add(NewJob(type="a", queue="qa"), name="a")
    c = flow.add(NewJob(type="c", queue="qc"), name="c")
    flow.add(NewJob(type="b", queue="qb"), name="b", after=[a, c], on_parent_failure="run")
    wf = client.enqueue_workflow(flow)
    run(store, wf["a"].id, fail=True)
    assert store.get(wf["b"].id).pending_parents == 1  # a counted; c still runs
    retried = client.retry_workflow(wf.id)
    assert (retried.queued, retried.waiting, retried.kept) == (1, 0, 2)
    assert store.get(wf["b"].id).pending_parents == 2  # b counts a again
    run(store, wf["c"].id)
    assert store.get(wf["b"].id).state is State.WAITING
    run(store, wf["a"].id, result="second")
    b = claim_one(store, "qb")
    assert b.parent_results is not None and b.parent_results["a"].result == "second"


def test_a_retry_leaves_a_succeeded_workflow_and_running_jobs_alone(store: Store) -> None:
    client = jobrun.Client(store)
    flow = jobrun.Workflow("pair")
    a = flow.add(NewJob(type="a", queue="qa"))
    flow.add(NewJob(type="b", queue="qb"), after=[a])
    wf = client.enqueue_workflow(flow)
    claim_one(store, "qa")  # a runs; b waits for it
    nothing = client.retry_workflow(wf.id)
    assert (nothing.retried, nothing.kept) == (0, 2)
    assert states(store, wf) == {"a": State.LEASED, "b": State.WAITING}


def test_cancelling_a_running_workflow_stops_every_job_that_has_not_finished(
    store: Store,
) -> None:
    client = jobrun.Client(store)
    wf = fan_in(client)
    run(store, wf["load"].id)
    running = claim_one(store, "q.price0")
    outside = client.enqueue("report", after=[wf["mail"].id], on_parent_failure="run")
    watched = store.watch(wf["total"].id)
    assert watched.state is State.WAITING

    done = client.cancel_workflow(wf.id)
    assert (done.cancelled, done.cancel_requested, done.finished) == (4, 1, 1)
    assert states(store, wf) == {
        "load": State.SUCCEEDED,
        "price0": State.LEASED,
        "price1": State.CANCELLED,
        "price2": State.CANCELLED,
        "total": State.CANCELLED,
        "mail": State.CANCELLED,
    }
    assert store.get(running.id).cancel_requested
    # The running job's worker is told by its heartbeat, and its end is a cancel.
    assert store.heartbeat(OWNER, [(running.id, running.lease_token)], store.now() + TTL) == set()
    assert store.complete(running, result=1).state is State.CANCELLED
    assert store.workflow(wf.id).state is WorkflowState.CANCELLED
    # A job outside the workflow waiting for one of its jobs follows its policy.
    assert store.get(outside.id).state is State.QUEUED
    kinds = [(str(e.kind), e.detail) for e in store.events(wf["price1"].id)]
    assert kinds[-1] == ("cancelled", {"via": "cancel", "workflow": str(wf.id)})
    kinds = [str(e.kind) for e in store.events(running.id)]
    assert "cancel_requested" in kinds

    again = client.cancel_workflow(wf.id)  # nothing left to cancel
    assert (again.cancelled, again.cancel_requested, again.finished) == (0, 0, 6)
    # And a cancelled workflow's retry runs every cancelled job again, in order.
    retried = client.retry_workflow(wf.id)
    assert (retried.queued, retried.waiting, retried.kept) == (3, 2, 1)
    for name in ("price0", "price1", "price2", "total", "mail"):
        run(store, wf[name].id)
    assert store.workflow(wf.id).state is WorkflowState.SUCCEEDED


def test_the_list_is_newest_first_filtered_and_paged(store: Store) -> None:
    client = jobrun.Client(store)
    first = fan_in(client, "orders")
    run(store, first["load"].id, fail=True)
    flow = jobrun.Workflow("single")
    flow.add(NewJob(type="one", queue="q1"))
    second = client.enqueue_workflow(flow)
    run(store, second["one"].id)
    third = fan_in(client, "orders")

    listed = client.workflows()
    assert [w.id for w in listed] == [third.id, second.id, first.id]
    assert [w.state for w in listed] == [
        WorkflowState.RUNNING,
        WorkflowState.SUCCEEDED,
        WorkflowState.FAILED,
    ]
    assert listed[0].jobs[State.QUEUED] == 1 and listed[0].jobs[State.WAITING] == 5
    assert listed[0].total == 6 and listed[0].finished_at is None
    assert listed[2].jobs[State.DEAD] == 1 and listed[2].jobs[State.CANCELLED] == 5
    assert listed[1].finished_at == store.get(second["one"].id).finished_at
    assert [w.id for w in client.workflows(state="failed")] == [first.id]
    assert [w.id for w in client.workflows(state=WorkflowState.SUCCEEDED)] == [second.id]
    assert client.workflows(state="cancelled") == []
    assert [w.id for w in client.workflows(name="orders")] == [third.id, first.id]
    page = client.workflows(limit=2)
    assert [w.id for w in page] == [third.id, second.id]
    rest = client.workflows(limit=2, before=str(page[-1].id))
    assert [w.id for w in rest] == [first.id]
    with pytest.raises(NotFound):
        client.workflows(before=uuid.uuid4())
    for bad in ({"state": "dead"}, {"limit": 0}, {"name": ""}, {"before": "nope"}):
        with pytest.raises(ValidationError):
            client.workflows(**bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="queue"):
        client.workflows(queue="q")  # type: ignore[call-arg]


def test_get_has_the_nodes_parents_first_with_their_edges(store: Store) -> None:
    client = jobrun.Client(store)
    before = client.enqueue("outside")
    flow = jobrun.Workflow("diamond")
    a = flow.add(NewJob(type="a"), name="a", after=[before.id])
    b = flow.add(NewJob(type="b"), name="b", after=[a])
    c = flow.add(NewJob(type="c"), name="c", after=[a])
    flow.add(NewJob(type="d"), name="d", after=[c, b])
    wf = client.enqueue_workflow(flow)
    graph = client.workflow(str(wf.id))
    assert graph.id == wf.id and graph.summary.name == "diamond"
    assert [n.node for n in graph.nodes] == ["a", "b", "c", "d"]
    assert graph["a"].parents == ()  # its parent outside the workflow is not drawn
    assert graph["d"].parents == tuple(sorted([wf["b"].id, wf["c"].id]))
    assert set(graph.edges) == {
        (wf["a"].id, wf["b"].id),
        (wf["a"].id, wf["c"].id),
        (wf["b"].id, wf["d"].id),
        (wf["c"].id, wf["d"].id),
    }
    assert graph["a"].state is State.WAITING and graph["a"].queue == "default"
    assert graph.summary.jobs[State.WAITING] == 4 and graph.state is WorkflowState.RUNNING
    with pytest.raises(NotFound):
        client.workflow(uuid.uuid4())
    for call in (client.workflow, client.cancel_workflow, client.retry_workflow):
        with pytest.raises(ValidationError, match="workflow_id"):
            call("not an id")
        with pytest.raises(NotFound):
            call(uuid.uuid4())
    with pytest.raises(ValidationError, match="workflow_id"):
        store.workflow("not an id")  # type: ignore[arg-type]


def test_the_retry_plan_reopens_only_edges_from_retried_parents() -> None:
    a, b, c, d, out = (uuid.UUID(int=i) for i in range(1, 6))
    plan = retry_plan(
        {a: State.SUCCEEDED, b: State.DEAD, c: State.CANCELLED, d: State.WAITING},
        [(b, a, True), (c, b, True), (c, out, False), (d, b, True), (d, a, True)],
    )
    assert dict(plan.retried) == {b: 0, c: 2}
    assert plan.reopened == ((c, b), (d, b))
    assert dict(plan.rewait) == {d: 1}


def test_purge_deletes_a_workflows_row_with_its_last_jobs(store: Store, conn: Any) -> None:
    client = jobrun.Client(store)
    done = jobrun.Workflow("done")
    done.chain(NewJob(type="a", queue="qa"), NewJob(type="b", queue="qb"))
    finished = client.enqueue_workflow(done)
    run(store, finished["a"].id)
    half = jobrun.Workflow("half")
    half.chain(NewJob(type="c", queue="qc"), NewJob(type="d", queue="qd"))
    running = client.enqueue_workflow(half)
    run(store, running["c"].id)  # d is queued: not purged, and neither is its workflow
    store.purge(dt.timedelta(0), 1)  # a: its workflow keeps b
    assert {w.id for w in client.workflows()} == {finished.id, running.id}
    run(store, finished["b"].id)
    assert client.purge(dt.timedelta(0)) == 2
    assert [w.id for w in client.workflows()] == [running.id]
    with pytest.raises(NotFound):
        client.workflow(finished.id)
    assert [n.node for n in client.workflow(running.id).nodes] == ["d"]
    rows = conn.execute("SELECT id FROM jobrun.workflows").fetchall()
    assert rows == [(running.id,)]


def test_two_purges_sharing_a_workflows_last_jobs_leave_no_row(
    store: Store, conn: Any, dsn: str
) -> None:
    # Purge A deletes one of the workflow's two finished jobs and has not
    # committed; purge B, the store's, takes the other. Each alone sees the
    # other's job still there; B waits for A (LockPurges) and then sees
    # none left, so the workflow's row goes with B.
    client = jobrun.Client(store)
    flow = jobrun.Workflow("pair")
    flow.group([NewJob(type="a", queue="qa"), NewJob(type="b", queue="qb")])
    pair = client.enqueue_workflow(flow)
    for job in pair:
        run(store, job.id)
    with psycopg.connect(dsn) as a:
        a.execute("SELECT pg_advisory_xact_lock(6975330, 4)")  # as LockPurges
        purged = a.execute(
            "WITH victim AS (SELECT id FROM jobrun.jobs WHERE workflow_id = %s"
            " ORDER BY finished_at LIMIT 1 FOR UPDATE),"
            " member AS (DELETE FROM jobrun.workflow_jobs WHERE job_id = (SELECT id FROM victim))"
            " DELETE FROM jobrun.jobs WHERE id = (SELECT id FROM victim) RETURNING id",
            (pair.id,),
        ).fetchall()
        assert len(purged) == 1
        got: list[int] = []
        b = threading.Thread(target=lambda: got.append(store.purge(dt.timedelta(0), 1)))
        b.start()
        b.join(0.5)
        assert b.is_alive()  # waiting for purge A
        a.commit()
        b.join(30)
    assert got == [1]
    assert conn.execute("SELECT count(*) FROM jobrun.jobs").fetchone() == (0,)
    assert conn.execute("SELECT id FROM jobrun.workflows").fetchall() == []


def test_the_claim_plan_stays_on_its_index_beside_the_workflow_index(admin_dsn: str) -> None:
    # The superuser's: explain_claim loads auto_explain.
    with psycopg.connect(admin_dsn, autocommit=True) as c:
        c.execute(
            "INSERT INTO jobrun.workflows (id, name) SELECT gen_random_uuid(), 'w' "
            "FROM generate_series(1, 100)"
        )
        c.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, finished_at,"
            " workflow_id, workflow_node)"
            " SELECT gen_random_uuid(), 'default', 't', '{}', %s,"
            " CASE WHEN g %% 10 = 0 THEN 'queued' ELSE 'succeeded' END::jobrun.job_state,"
            " CASE WHEN g %% 10 = 0 THEN NULL ELSE now() END,"
            " (SELECT id FROM jobrun.workflows ORDER BY id OFFSET g %% 100 LIMIT 1), 'n' || g"
            " FROM generate_series(1, 20000) g",
            (json.dumps(DEFAULT_BACKOFF.to_json()),),
        )
        c.execute(
            "INSERT INTO jobrun.workflow_jobs (workflow_id, job_id)"
            " SELECT workflow_id, id FROM jobrun.jobs WHERE workflow_id IS NOT NULL"
        )
        c.execute("VACUUM ANALYZE jobrun.jobs, jobrun.workflow_jobs")
        for generic in (False, True):
            plan = explain_claim(c, ["default"], 10, generic=generic)
            assert plan.uses_claim_index, plan.summary()
            assert not any(s.relation == "workflow_jobs" for s in plan.scans), plan.summary()
            assert plan.seq_scans_on_jobs == 0, plan.summary()
        row = c.execute(
            "EXPLAIN (FORMAT JSON) SELECT count(*) FROM jobrun.workflow_jobs WHERE workflow_id = "
            "(SELECT id FROM jobrun.workflows LIMIT 1)"
        ).fetchone()
        assert row is not None and "workflow_jobs_pkey" in json.dumps(row[0])


def test_a_retry_waits_for_an_outside_parent_finishing_and_strands_no_job(
    store: Store, dsn: str
) -> None:
    # The retried job's parent outside the workflow finishes in a transaction
    # still open when the retry starts: its trigger already passed the job
    # (cancelled then) and marked the edge done. Were that parent not locked
    # by the retry, the retry would read the edge as not done and leave the
    # job waiting for a parent that will never finish again.
    client = jobrun.Client(store)
    parent = client.enqueue("outside", queue="qp")
    flow = jobrun.Workflow("after an outside job")
    flow.add(NewJob(type="j", queue="qj"), name="j", after=[parent.id])
    wf = client.enqueue_workflow(flow)
    assert client.cancel_workflow(wf.id).cancelled == 1
    with psycopg.connect(dsn) as other:
        other.execute(
            "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s",
            (parent.id,),
        )
        outcome: list[Any] = []
        retrying = threading.Thread(target=lambda: outcome.append(client.retry_workflow(wf.id)))
        retrying.start()
        retrying.join(0.5)
        assert retrying.is_alive()  # it waits for the parent's lock
        other.commit()
    retrying.join(10)
    assert outcome and outcome[0].queued == 1
    job = store.get(wf["j"].id)
    assert (job.state, job.pending_parents) == (State.QUEUED, 0)
