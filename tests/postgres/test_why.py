"""``Diagnose.why``: each reason a queued job is held back, named from the
database's own state (db/query/why.sql read through the real claim's
tables), and nothing named when nothing holds it."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import NotFound
from jobrun.job.model import State
from jobrun.job.why import Hold
from jobrun.job.workers import WorkerInfo
from jobrun.postgres.diagnose import AHEAD_CAP, Diagnose
from jobrun.postgres.store import Store
from tests.postgres.conftest import TTL, new_job


def _holds(store: Store, job_id: uuid.UUID) -> list[Hold]:
    return [r.hold for r in Diagnose(store).why(job_id).reasons]


def _serve(store: Store, worker: str = "w-serving", types: tuple[str, ...] = ("test.job",)) -> None:
    """A live worker in the registry, serving queue q with handlers for ``types``."""
    store.register_worker(
        WorkerInfo(
            id=worker,
            host="h",
            pid=1,
            version="0",
            queues=("q",),
            concurrency=4,
            types=types,
            lease_ttl=dt.timedelta(seconds=30),
        )
    )


@pytest.fixture(autouse=True)
def _a_live_worker_serves_q(request: pytest.FixtureRequest, store: Store) -> None:
    if "no_worker" not in request.node.name:
        _serve(store)


def test_a_due_job_first_in_line_with_a_live_worker_is_held_by_nothing(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    diagnosis = Diagnose(store).why(job.id)
    assert diagnosis.state is State.QUEUED
    assert [r.hold for r in diagnosis.reasons] == [Hold.NOTHING]
    assert "w-serving" in diagnosis.reasons[0].text


def test_a_queue_no_worker_serves_is_named_no_worker(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    (reason,) = Diagnose(store).why(job.id).reasons
    assert reason.hold is Hold.NO_WORKER
    assert "jobrun worker --queues q" in reason.text


def test_a_worker_not_seen_within_its_lease_ttl_serves_no_worker(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    _serve(store, "w-gone")
    conn.execute("UPDATE jobrun.workers SET last_seen_at = now() - interval '1 minute'")
    conn.commit()
    job = store.enqueue(new_job(queue="q"))
    assert _holds(store, job.id) == [Hold.NO_WORKER]


def test_a_type_no_live_worker_of_its_queue_runs_is_named(store: Store) -> None:
    job = store.enqueue(new_job(queue="q", type="reports.build"))
    (reason,) = Diagnose(store).why(job.id).reasons
    assert reason.hold is Hold.UNKNOWN_TYPE
    assert "'reports.build'" in reason.text and "w-serving" in reason.text
    _serve(store, "w-reports", types=("reports.build",))
    assert _holds(store, job.id) == [Hold.NOTHING]


def test_a_paused_queue_without_workers_names_both_no_worker(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    store.pause_queue("q")
    assert _holds(store, job.id) == [Hold.PAUSED, Hold.NO_WORKER]


def test_a_job_due_later_names_when(store: Store) -> None:
    job = store.enqueue(new_job(queue="q", delay=dt.timedelta(minutes=5)))
    (reason,) = Diagnose(store).why(job.id).reasons
    assert reason.hold is Hold.SCHEDULED
    assert reason.until == job.run_at
    assert "5m" in reason.text or "4m" in reason.text


def test_a_paused_queue_is_named(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    store.pause_queue("q")
    assert _holds(store, job.id) == [Hold.PAUSED]
    store.resume_queue("q")
    assert _holds(store, job.id) == [Hold.NOTHING]


def test_a_full_concurrency_limit_names_the_jobs_holding_its_slots(store: Store) -> None:
    store.set_queue_limits("q", concurrency=2)
    store.enqueue_batch([new_job(queue="q") for _ in range(3)])
    holding = store.claim("w1", ["q"], 5, TTL)
    assert len(holding) == 2
    (waiting,) = store.list(state=State.QUEUED, queue="q")
    (reason,) = Diagnose(store).why(waiting.id).reasons
    assert reason.hold is Hold.CONCURRENCY
    assert "2 of 2" in reason.text
    assert sorted(reason.jobs) == sorted(j.id for j in holding)


def test_a_full_key_limit_names_the_key_and_its_holders(store: Store) -> None:
    store.set_queue_limits("q", per_key=1)
    first = store.enqueue(new_job(queue="q", concurrency_key="acme"))
    second = store.enqueue(new_job(queue="q", concurrency_key="acme"))
    other = store.enqueue(new_job(queue="q", concurrency_key="globex"))
    (held,) = store.claim("w1", ["q"], 1, TTL)
    assert held.id == first.id
    (reason,) = Diagnose(store).why(second.id).reasons
    assert reason.hold is Hold.PER_KEY
    assert "'acme'" in reason.text and reason.jobs == (first.id,)
    assert Hold.PER_KEY not in _holds(store, other.id)


def test_a_used_up_rate_window_says_until_when(store: Store) -> None:
    store.set_queue_limits("q", rate="2/1h")
    store.enqueue_batch([new_job(queue="q") for _ in range(3)])
    started = store.claim("w1", ["q"], 5, TTL)
    assert len(started) == 2
    (waiting,) = store.list(state=State.QUEUED, queue="q")
    (reason,) = Diagnose(store).why(waiting.id).reasons
    assert reason.hold is Hold.RATE
    assert "2 of 2" in reason.text
    assert reason.until is not None
    now = Diagnose(store).why(waiting.id).db_now
    assert dt.timedelta(minutes=59) < reason.until - now <= dt.timedelta(hours=1)


def test_jobs_ahead_in_claim_order_are_counted(store: Store) -> None:
    store.enqueue_batch([new_job(queue="q", priority=1) for _ in range(3)])
    last = store.enqueue(new_job(queue="q", priority=5))
    (reason,) = Diagnose(store).why(last.id).reasons
    assert reason.hold is Hold.BEHIND
    assert reason.text.startswith("3 runnable job(s)")


def test_the_count_ahead_is_bounded(store: Store) -> None:
    store.enqueue_batch([new_job(queue="q", priority=0) for _ in range(AHEAD_CAP + 5)])
    last = store.enqueue(new_job(queue="q", priority=9))
    (reason,) = Diagnose(store).why(last.id).reasons
    assert reason.text.startswith(f"at least {AHEAD_CAP:,}")


def test_several_reasons_are_all_named_in_claim_order(store: Store) -> None:
    job = store.enqueue(new_job(queue="q", delay=dt.timedelta(hours=1)))
    store.pause_queue("q")
    assert _holds(store, job.id) == [Hold.SCHEDULED, Hold.PAUSED]


def test_a_running_job_is_said_to_run_and_a_finished_one_to_be_done(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    (claimed,) = store.claim("w1", ["q"], 1, TTL)
    (reason,) = Diagnose(store).why(job.id).reasons
    assert reason.hold is Hold.RUNNING and "w1" in reason.text
    store.complete(claimed)
    (reason,) = Diagnose(store).why(job.id).reasons
    assert reason.hold is Hold.FINISHED and "succeeded" in reason.text


def test_a_cancel_requested_of_a_running_job_is_named(store: Store) -> None:
    job = store.enqueue(new_job(queue="q"))
    store.claim("w1", ["q"], 1, TTL)
    store.cancel(job.id)
    assert _holds(store, job.id) == [Hold.RUNNING, Hold.CANCEL_REQUESTED]


def test_an_unknown_job_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        Diagnose(store).why(uuid.uuid4())


def test_the_diagnosis_reads_jobs_through_indexes_only(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue_batch([new_job(queue="q") for _ in range(20_000)])
    conn.execute("UPDATE jobrun.jobs SET state = 'succeeded', finished_at = now(), attempts = 1")
    conn.execute("ANALYZE jobrun.jobs")
    conn.commit()
    store.set_queue_limits("q", concurrency=1, per_key=1, rate="5/1m")
    job = store.enqueue(new_job(queue="q", concurrency_key="k"))
    from jobrun.postgres.sqlc.why import WHY_JOB  # noqa: PLC0415

    sql = WHY_JOB.replace("$1", "5").replace("$2", "10000").replace("$3", f"'{job.id}'::uuid")
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {sql}"))
    assert "Seq Scan on jobs" not in plan, plan


def test_a_job_parked_in_a_durable_wait_names_the_wait(store: Store) -> None:
    store.enqueue(new_job())
    (job,) = store.claim("w", ["default"], 1, TTL)
    store.await_step(job, "confirm", "email.confirmed", 3600.0)
    store.park(job, "confirm")
    (reason,) = [r for r in Diagnose(store).why(job.id).reasons if r.hold is Hold.SCHEDULED]
    assert "it waits for signal 'email.confirmed' (step 'confirm')" in reason.text
    assert "at once when the signal is sent" in reason.text
