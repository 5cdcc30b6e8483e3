"""Dependencies between jobs: waiting, release by the last parent, failure policies.

Against real PostgreSQL (migration 0016). A child is released, or cancelled,
by the trigger on jobs in the transaction of its parent's terminal
transition, whichever path takes it there; these tests take each path.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job, NewJob, State
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, counts

OWNER = "w1"


def claim(store: Store, queue: str = "default", n: int = 10) -> list[Job]:
    return store.claim(OWNER, [queue], n, TTL)


def claim_one(store: Store, queue: str = "default") -> Job:
    (job,) = claim(store, queue, 1)
    return job


def run_to_success(store: Store, job_id: uuid.UUID, result: Any = None) -> Job:
    """Claim the job (it must be the next of its queue) and complete it."""
    job = store.get(job_id)
    got = claim_one(store, job.queue)
    assert got.id == job_id
    return store.complete(got, result=result)


def state(store: Store, job_id: uuid.UUID) -> State:
    return store.get(job_id).state


def events(store: Store, job_id: uuid.UUID) -> list[tuple[str, Any]]:
    return [(str(e.kind), e.detail) for e in store.events(job_id)]


def test_a_child_waits_outside_the_claim_and_is_queued_by_its_last_parents_success(
    store: Store,
) -> None:
    client = jobrun.Client(store)
    a = client.enqueue("step", {"n": 1}, queue="q1")
    b = client.enqueue("step", {"n": 2}, queue="q2")
    child = client.enqueue("fan.in", after=[a, b.id], queue="q3")
    assert child.state is State.WAITING and child.pending_parents == 2
    assert claim(store, "q3") == []  # not claimable while it waits

    run_to_success(store, a.id, {"a": 1})
    assert store.get(child.id).pending_parents == 1
    assert state(store, child.id) is State.WAITING
    run_to_success(store, b.id, [2])

    released = claim_one(store, "q3")
    assert released.id == child.id
    assert released.parent_results is not None
    assert released.parent_results[a.id].result == {"a": 1}
    assert released.parent_results[str(b.id)].result == [2]
    assert all(p.ok for p in released.parent_results.values())
    assert (
        "released",
        {"via": "dependency", "parent": str(b.id), "parent_state": "succeeded"},
    ) in (events(store, child.id))


def test_two_parents_finishing_at_the_same_instant_release_the_child_exactly_once(
    store: Store, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    """Two transactions, each finishing one parent: the first holds its
    transaction open until the second is seen waiting on the child's row
    (its trigger's lock), then commits; the second then reads the first's
    counter, not its own snapshot's, and is the one that releases."""
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qa")
    b = client.enqueue("step", queue="qb")
    child = client.enqueue("fan.in", after=[a, b], queue="qc")
    ja, jb = claim_one(store, "qa"), claim_one(store, "qb")
    first_updated = threading.Event()
    second_pid: list[int] = []
    errors: list[BaseException] = []

    def finish(job: Job, first: bool) -> None:
        try:
            with psycopg.connect(dsn) as c:
                if not first:
                    assert first_updated.wait(10)
                    second_pid.append(c.info.backend_pid)
                store_sql = (
                    "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now(),"
                    " lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL"
                    " WHERE id = %s"
                )
                c.execute(store_sql, [job.id])
                if first:
                    first_updated.set()
                    deadline = time.monotonic() + 10
                    while time.monotonic() < deadline:  # until the second waits on a lock
                        row = conn.execute(
                            "SELECT count(*) FROM pg_stat_activity"
                            " WHERE pid = ANY(%s) AND wait_event_type = 'Lock'",
                            [second_pid],
                        ).fetchone()
                        if row and row[0]:
                            break
                        time.sleep(0.01)
                    else:
                        raise AssertionError("the second transaction never waited")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [
        threading.Thread(target=finish, args=(ja, True)),
        threading.Thread(target=finish, args=(jb, False)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert not errors
    stored = store.get(child.id)
    assert stored.state is State.QUEUED and stored.pending_parents == 0
    released = [k for k, _ in events(store, child.id) if k == "released"]
    assert released == ["released"]
    assert claim_one(store, "qc").id == child.id


def test_parents_committing_together_under_concurrency_release_every_child_once(
    store: Store, dsn: str
) -> None:
    """Many children sharing two parents, the parents finished by two
    connections at once, each holding its transaction open until both ran
    their UPDATE (the second waits on the first's child rows)."""
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qa")
    b = client.enqueue("step", queue="qb")
    children = [client.enqueue("fan.in", after=[a, b], queue="qc") for _ in range(20)]
    ja, jb = claim_one(store, "qa"), claim_one(store, "qb")
    started = threading.Barrier(2, timeout=10)

    def finish(job: Job) -> None:
        with psycopg.connect(dsn) as conn:
            started.wait()
            conn.execute(
                "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now(),"
                " lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL WHERE id = %s",
                [job.id],
            )

    threads = [threading.Thread(target=finish, args=(j,)) for j in (ja, jb)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    for c in children:
        stored = store.get(c.id)
        assert (stored.state, stored.pending_parents) == (State.QUEUED, 0)
    assert len(claim(store, "qc", 100)) == 20


def test_parents_finished_by_one_statement_release_their_child_once(store: Store) -> None:
    """Migration 0020: the trigger runs once per statement. Two parents of one
    child, a third of another, finished by one complete_many: each child is
    counted once per parent and released once, its event naming the first
    parent by id."""
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qp")
    b = client.enqueue("step", queue="qp")
    c = client.enqueue("step", queue="qp")
    both = client.enqueue("fan.in", after=[a, b], queue="qc")
    one = client.enqueue("fan.in", after=[c], queue="qc")
    claimed = claim(store, "qp", 3)
    assert {j.id for j in claimed} == {a.id, b.id, c.id}
    store.complete_many(claimed)
    for child in (both, one):
        stored = store.get(child.id)
        assert (stored.state, stored.pending_parents) == (State.QUEUED, 0)
    released = [d for k, d in events(store, both.id) if k == "released"]
    assert released == [
        {"via": "dependency", "parent": str(min(a.id, b.id)), "parent_state": "succeeded"}
    ]
    assert len(claim(store, "qc", 10)) == 2


def _fan_out_finished_by_one_statement(
    store: Store, conn: psycopg.Connection[Any], children: int, stats: str
) -> tuple[Job, Any]:
    """A fan-out of ``children`` (queue qw) into one fan-in (qf), its children
    claimed and finished by one UPDATE: (the fan-in, the row ``stats`` reads in
    that UPDATE's transaction)."""
    flow = jobrun.Workflow("wide")
    group = flow.group([NewJob(type="step", queue="qw") for _ in range(children)])
    flow.add(NewJob(type="fan.in", queue="qf"), after=group, name="fan-in")
    fan_in = jobrun.Client(store).enqueue_workflow(flow)["fan-in"]
    ids = [j.id for j in claim(store, "qw", children)]
    assert len(ids) == children
    with conn.transaction():
        conn.execute(
            "UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now(), lease_owner = NULL,"
            " lease_token = NULL, lease_expires_at = NULL WHERE id = ANY(%s)",
            [ids],
        )
        row = conn.execute(stats).fetchone()
    return fan_in, row


def test_a_fan_ins_row_is_updated_once_per_statement_finishing_its_parents(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    """A batch of a fan-out's children finishing in one statement decrements
    the fan-in's counter once, by the batch's size (one new row version, not
    one per child)."""
    fan_in, row = _fan_out_finished_by_one_statement(
        store,
        conn,
        50,
        "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = 'jobrun.jobs'::regclass",
    )
    # The 50 children, and the fan-in once (released), not once per child.
    assert row == (51,)
    assert store.get(fan_in.id).state is State.QUEUED


@pytest.mark.parametrize("path", ["fail", "reap", "cancel_queued", "cancel_leased", "release"])
def test_every_terminal_path_of_a_failed_parent_cancels_the_child_naming_it(
    store: Store, path: str
) -> None:
    client = jobrun.Client(store)
    parent = client.enqueue("step", queue="qp", max_attempts=1)
    child = client.enqueue("child", after=[parent], queue="qc")
    if path == "cancel_queued":
        client.cancel(parent.id)
    else:
        job = claim_one(store, "qp")
        if path == "fail":
            store.fail(job, "boom", None)
        elif path == "reap":
            store.reap_expired(store.now() + dt.timedelta(hours=1), 10)
        elif path == "cancel_leased":
            client.cancel(parent.id)
            store.complete(job)  # cancel wins: it ends cancelled
        else:
            client.cancel(parent.id)
            store.release(job, dt.timedelta(seconds=1), "not mine")
    assert store.get(parent.id).state.terminal
    stored = store.get(child.id)
    assert stored.state is State.CANCELLED
    assert stored.finished_at is not None
    assert stored.last_error is not None and str(parent.id) in stored.last_error
    assert any(k == "cancelled" and d["via"] == "dependency" for k, d in events(store, child.id))


def test_a_cancelled_child_cancels_its_own_children_in_cascade(store: Store) -> None:
    """A chain of 1,000 (the cascade is a loop, not nested triggers), and a
    grandchild with policy 'run' that runs once the cascade reached it."""
    client = jobrun.Client(store)
    root = client.enqueue("step", queue="q")
    wf = jobrun.Workflow("a long chain")
    first = wf.add(jobrun.NewJob(type="step", queue="q"), after=[root])
    chain = wf.chain(first, *[jobrun.NewJob(type="step", queue="q") for _ in range(999)])
    survivor = wf.add(
        jobrun.NewJob(type="report", queue="r"), after=[chain[2]], on_parent_failure="run"
    )
    run = client.enqueue_workflow(wf)
    client.cancel(root.id)
    assert {state(store, ref.id) for ref in chain} == {State.CANCELLED}
    last = store.get(chain[-1].id)
    assert last.last_error is not None and str(chain[-2].id) in last.last_error
    assert state(store, survivor.id) is State.QUEUED
    got = claim_one(store, "r")
    assert got.parent_results is not None and got.parent_results.failed[0].id == chain[2].id
    assert len(run) == 1001


def test_run_anyway_sees_the_failure_in_its_parents_results(store: Store) -> None:
    client = jobrun.Client(store)
    good = client.enqueue("step", queue="qp")
    bad = client.enqueue("step", queue="qp", max_attempts=1)
    child = client.enqueue("report", after=[good, bad], on_parent_failure="run", queue="qc")
    for job in claim(store, "qp"):
        if job.id == good.id:
            store.complete(job, result="fine")
        else:
            store.fail(job, "it broke", None)
    got = claim_one(store, "qc")
    assert got.id == child.id and got.parent_results is not None
    assert [p.id for p in got.parent_results.failed] == [bad.id]
    assert got.parent_results[bad.id].state is State.DEAD
    assert got.parent_results[bad.id].error == "it broke"
    assert got.parent_results.result(str(good.id)) == "fine"


def test_a_child_of_parents_already_finished_counts_them_at_enqueue(store: Store) -> None:
    client = jobrun.Client(store)
    done = client.enqueue("step", queue="qp")
    run_to_success(store, done.id, 7)
    ready = client.enqueue("child", after=[done], queue="qc")
    assert ready.state is State.QUEUED and ready.pending_parents == 0
    assert claim_one(store, "qc").parent_results[done.id].result == 7  # type: ignore[index]

    dead = client.enqueue("step", queue="qp", max_attempts=1)
    store.fail(claim_one(store, "qp"), "no", None)
    cancelled = client.enqueue("child", after=[dead, done], queue="qc")
    assert cancelled.state is State.CANCELLED and str(dead.id) in (cancelled.last_error or "")
    runs = client.enqueue("child", after=[dead], queue="qc", on_parent_failure="run")
    assert runs.state is State.QUEUED


def test_a_parent_that_does_not_exist_is_refused_and_nothing_is_written(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    client = jobrun.Client(store)
    real = client.enqueue("step")
    before = counts(conn)
    with pytest.raises(ValidationError, match="does not exist") as caught:
        client.enqueue("child", after=[real, uuid.uuid4()])
    assert caught.value.field == "after"
    assert counts(conn) == before
    assert store.get(real.id).state is State.QUEUED


def test_a_parent_retried_and_finishing_again_counts_once(store: Store) -> None:
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qa")
    b = client.enqueue("step", queue="qb")
    child = client.enqueue("child", after=[a, b], queue="qc")
    run_to_success(store, a.id)
    client.retry(a.id)
    run_to_success(store, a.id)
    assert store.get(child.id).pending_parents == 1
    assert state(store, child.id) is State.WAITING


def test_a_finished_parents_row_updated_again_counts_once(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    # The trigger hands on every finished parent of a statement (migration
    # 0023), finished before or not: its edges, done, keep it from counting
    # twice, whatever updates its row later (a dead one set dead again too).
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qa")
    b = client.enqueue("step", queue="qb")
    child = client.enqueue("child", after=[a, b], queue="qc")
    run_to_success(store, a.id)
    for _ in range(2):
        conn.execute("UPDATE jobrun.jobs SET updated_at = now() WHERE id = %s", [a.id])
        conn.execute("UPDATE jobrun.jobs SET state = state WHERE id IN (%s, %s)", [a.id, b.id])
    assert store.get(child.id).pending_parents == 1
    assert state(store, child.id) is State.WAITING
    run_to_success(store, b.id)
    assert state(store, child.id) is State.QUEUED
    released = [e for e in store.events(child.id) if e.kind == "released"]
    assert len(released) == 1


def test_a_waiting_job_cancels_but_does_not_retry(store: Store) -> None:
    client = jobrun.Client(store)
    a = client.enqueue("step")
    child = client.enqueue("child", after=[a])
    with pytest.raises(jobrun.InvalidState):
        client.retry(child.id)
    assert client.cancel(child.id).state is State.CANCELLED


def test_purge_takes_a_childs_edges_with_it(store: Store, conn: psycopg.Connection[Any]) -> None:
    client = jobrun.Client(store)
    a = client.enqueue("step", queue="qa")
    child = client.enqueue("child", after=[a], queue="qc")
    run_to_success(store, a.id)
    run_to_success(store, child.id)
    conn.execute("UPDATE jobrun.jobs SET finished_at = finished_at - interval '2 days'")
    assert store.purge(dt.timedelta(days=1), 100) == 2
    row = conn.execute("SELECT count(*) FROM jobrun.job_dependencies").fetchone()
    assert row == (0,)


def test_a_plain_job_claims_with_no_parent_results(store: Store) -> None:
    jobrun.Client(store).enqueue("plain")
    assert claim_one(store).parent_results is None


def test_new_job_is_needed_for_a_workflow_node() -> None:
    wf = jobrun.Workflow("w")
    with pytest.raises(ValidationError):
        wf.add({"type": "x"})  # type: ignore[arg-type]
    wf.add(NewJob(type="x"))


def test_dependencies_work_in_a_schema_of_another_name(empty_dsn: str, pg_server: Any) -> None:
    """The trigger's functions read the tables of the schema they were migrated into."""
    from jobrun.postgres.migrate import migrate  # noqa: PLC0415
    from jobrun.postgres.pool import open_pool  # noqa: PLC0415

    migrate(empty_dsn, schema="acme_jobs")
    pool = open_pool(empty_dsn, max_size=3)
    try:
        store = Store(pool, schema="acme_jobs")
        client = jobrun.Client(store)
        parent = client.enqueue("step", queue="qa")
        child = client.enqueue("child", after=[parent], queue="qb")
        store.complete(claim_one(store, "qa"), result={"ok": True})
        got = claim_one(store, "qb")
        assert got.id == child.id and got.parent_results is not None
        assert got.parent_results[parent.id].result == {"ok": True}
    finally:
        pool.close()
    with psycopg.connect(empty_dsn) as c:
        assert c.execute("SELECT count(*) FROM acme_jobs.job_dependencies").fetchone() == (1,)


def test_a_released_child_wakes_its_queue_when_the_parent_commits(store: Store, dsn: str) -> None:
    client = jobrun.Client(store)
    parent = client.enqueue("step", queue="qa")
    client.enqueue("child", after=[parent], queue="qb")
    job = claim_one(store, "qa")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute("LISTEN jobrun_jobs")
        store.complete(job)
        woken = [n.payload for n in listener.notifies(timeout=1, stop_after=1)]
    assert woken == ["qb"]


def test_why_says_a_waiting_job_waits_for_its_parents(store: Store) -> None:
    from jobrun.job.why import Hold  # noqa: PLC0415
    from jobrun.postgres.diagnose import Diagnose  # noqa: PLC0415

    client = jobrun.Client(store)
    a, b = client.enqueue("step"), client.enqueue("step")
    child = client.enqueue("child", after=[a, b])
    (reason,) = Diagnose(store).why(child.id).reasons
    assert reason.hold is Hold.PARENTS
    assert "2 of its parents have not finished" in reason.text


def test_a_finished_parents_edges_are_marked_done_without_new_index_entries(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    """Migration 0022: job_dependencies leaves half of each page free, so an
    edge's one update (done) stays on its page, a HOT update: no entry in the
    primary key or the parent index. Filled pages (fillfactor 100) made
    nearly every one a new index entry in both."""
    fan_in, row = _fan_out_finished_by_one_statement(
        store,
        conn,
        1000,
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
        " WHERE relid = 'jobrun.job_dependencies'::regclass",
    )
    assert row == (1000, 1000)
    assert store.get(fan_in.id).state is State.QUEUED


@pytest.mark.parametrize("limited", [False, True])
def test_a_claim_says_how_few_parents_its_jobs_dependents_still_wait_for(
    store: Store, limited: bool
) -> None:
    # The worker records a success at once when it may release a dependent
    # soon (a chain's next link), in a batch when it is one of many parents.
    if limited:
        store.set_queue_limits("default", concurrency=100)
    client = jobrun.Client(store)
    link = client.enqueue("step")
    parents = [client.enqueue("part") for _ in range(3)]
    client.enqueue("next", after=[link], queue="later")
    client.enqueue("fan.in", after=parents, queue="later")
    plain = client.enqueue("plain")
    got = {job.id: job for job in claim(store, n=2)}
    assert got[link.id].dependents_pending == 1
    (first_parent,) = [got[p.id] for p in parents if p.id in got]
    assert first_parent.dependents_pending == 3
    store.complete(first_parent)
    got = {job.id: job for job in claim(store)}
    assert [got[p.id].dependents_pending for p in parents if p.id in got] == [2, 2]
    assert got[plain.id].dependents_pending is None
