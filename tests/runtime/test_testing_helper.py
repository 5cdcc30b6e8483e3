"""jobrun.testing.run_jobs: a registry's jobs run to completion, synchronously."""

from __future__ import annotations

import datetime as dt
from typing import Any
from unittest.mock import ANY

import pytest

from jobrun import Client
from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, EventKind, Job, State
from jobrun.postgres.store import Store
from jobrun.testing import advance_jobs, assert_enqueued, assert_not_enqueued, run_jobs
from jobrun.worker import JobContext, PermanentFailure, Registry, Snooze


def test_run_jobs_runs_every_runnable_job_through_the_worker_path(store: Store, conn: Any) -> None:
    conn.execute("CREATE TABLE side (job_id uuid)")
    registry = Registry()
    registry.register("ok", lambda ctx, job: None)
    registry.register(
        "tx", lambda ctx, job: lambda c: c.execute("INSERT INTO side VALUES (%s)", [job.id])
    )

    def bad(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("no")

    registry.register("bad", bad)
    client = Client(store)
    ok = client.enqueue("ok")
    tx = client.enqueue("tx")
    dead = client.enqueue("bad")
    later = client.enqueue("flaky.unknown", backoff=Backoff(kind="constant", base=600.0, jitter=0))
    report = run_jobs(client, registry)
    assert report.ran == 4
    assert (report.succeeded, report.failed) == (2, 1)  # the unknown type is released
    assert client.get(ok.id).state is State.SUCCEEDED
    assert client.get(tx.id).state is State.SUCCEEDED
    assert client.get(dead.id).state is State.DEAD
    released = client.get(later.id)  # no handler: given back for later, attempt not counted
    assert (released.state, released.attempts) == (State.QUEUED, 0)
    assert conn.execute("SELECT job_id FROM side").fetchall() == [(tx.id,)]


def test_run_jobs_only_touches_its_queues(store: Store) -> None:
    registry = Registry()
    registry.register("ok", lambda ctx, job: None)
    client = Client(store)
    other = client.enqueue("ok", queue="other")
    assert run_jobs(store, registry, queues=["default"]).ran == 0
    assert run_jobs(store, registry, queues=["other"]).ran == 1
    assert client.get(other.id).state is State.SUCCEEDED


# -- queue=, types=, advance= --------------------------------------------------------


def _counting(registry: Registry, *types: str) -> list[str]:
    ran: list[str] = []
    for name in types:
        registry.register(name, lambda ctx, job: ran.append(job.type))
    return ran


def test_run_jobs_with_types_runs_only_those_and_leaves_the_others_untouched(
    store: Store,
) -> None:
    registry = Registry()
    ran = _counting(registry, "email.send", "report.build")
    registry.register("signup", lambda ctx, job: [Client(store).enqueue("report.build"), None][1])
    client = Client(store)
    email = client.enqueue("email.send")
    report_job = client.enqueue("report.build")
    signup = client.enqueue("signup")
    report = run_jobs(client, registry, types=["email.send", "signup"])
    assert report.ran == 2
    assert ran == ["email.send"]
    assert client.get(email.id).state is State.SUCCEEDED
    assert client.get(signup.id).state is State.SUCCEEDED
    for job in client.list(type="report.build"):  # the one from before, the signup's
        assert (job.state, job.attempts, job.releases) == (State.QUEUED, 0, 0)
        assert [e.kind for e in client.events(job.id)] == [EventKind.ENQUEUED]
    assert len(client.list(type="report.build")) == 2
    assert run_jobs(client, registry, types="report.build").ran == 2
    assert client.get(report_job.id).state is State.SUCCEEDED


def test_run_jobs_with_one_queue_runs_that_queue_only(store: Store) -> None:
    registry = Registry()
    _counting(registry, "ok")
    client = Client(store)
    mine = client.enqueue("ok", queue="emails")
    other = client.enqueue("ok", queue="reports")
    assert run_jobs(client, registry, queue="emails").ran == 1
    assert client.get(mine.id).state is State.SUCCEEDED
    assert client.get(other.id).state is State.QUEUED


def test_a_handler_that_snoozes_once_runs_twice_with_advance(store: Store) -> None:
    registry = Registry()
    calls: list[int] = []

    def once(ctx: JobContext, job: Job) -> str:
        calls.append(job.snoozes)
        if job.snoozes == 0:
            raise Snooze(dt.timedelta(minutes=5))
        return "done"

    registry.register("poll", once)
    client = Client(store)
    job = client.enqueue("poll")
    stuck = run_jobs(client, registry)  # without advance, the snoozed job waits its 5 minutes
    assert (stuck.ran, client.get(job.id).state) == (1, State.QUEUED)
    report = run_jobs(client, registry, advance=dt.timedelta(minutes=10))
    assert (report.ran, report.advanced, report.succeeded) == (1, 1, 1)
    done = client.get(job.id)
    assert (done.state, done.result, done.snoozes) == (State.SUCCEEDED, "done", 1)
    assert calls == [0, 1]
    retried = [e for e in client.events(job.id) if e.kind is EventKind.RETRIED]
    assert len(retried) == 1
    assert retried[0].detail is not None
    assert retried[0].detail["via"] == "run_jobs"
    assert retried[0].detail["from"] == "queued"


def test_advance_runs_delayed_jobs_within_the_horizon_by_the_database_clock(
    store: Store, conn: Any
) -> None:
    registry = Registry()
    _counting(registry, "later")
    client = Client(store)
    soon = client.enqueue("later", delay=dt.timedelta(minutes=30))
    far = client.enqueue("later", delay=dt.timedelta(hours=3))
    report = run_jobs(client, registry, advance=dt.timedelta(hours=1))
    assert (report.ran, report.advanced) == (1, 1)
    assert client.get(soon.id).state is State.SUCCEEDED
    waiting = client.get(far.id)
    assert (waiting.state, waiting.run_at) == (State.QUEUED, far.run_at)
    # Moved to the database's now, not the process's: the row says so.
    (moved_at,) = conn.execute(
        "SELECT e.at FROM jobrun.job_events e WHERE e.job_id = %s AND e.kind = 'retried'",
        [soon.id],
    ).fetchone()
    assert client.get(soon.id).started_at >= moved_at


def test_advance_runs_a_failing_job_through_its_backoff_to_success(store: Store) -> None:
    registry = Registry()

    def flaky(ctx: JobContext, job: Job) -> None:
        if job.attempts < 3:
            raise RuntimeError(f"attempt {job.attempts} fails")

    registry.register("flaky", flaky)
    client = Client(store)
    job = client.enqueue("flaky", backoff=Backoff(kind="constant", base=60.0, jitter=0))
    report = run_jobs(client, registry, advance=dt.timedelta(minutes=2))
    assert (report.ran, report.failed, report.succeeded, report.advanced) == (3, 2, 1, 2)
    assert (client.get(job.id).state, client.get(job.id).attempts) == (State.SUCCEEDED, 3)


def test_advance_keeps_to_the_chosen_types_and_queues(store: Store) -> None:
    registry = Registry()
    _counting(registry, "a", "b")
    client = Client(store)
    a = client.enqueue("a", delay=dt.timedelta(minutes=1))
    b = client.enqueue("b", delay=dt.timedelta(minutes=1))
    other = client.enqueue("a", queue="other", delay=dt.timedelta(minutes=1))
    report = run_jobs(client, registry, queue="default", types="a", advance=dt.timedelta(hours=1))
    assert (report.ran, report.advanced) == (1, 1)
    assert client.get(a.id).state is State.SUCCEEDED
    assert client.get(b.id).run_at == b.run_at
    assert client.get(other.id).run_at == other.run_at


def test_a_handler_that_always_snoozes_stops_at_max_jobs(store: Store) -> None:
    registry = Registry()

    def forever(ctx: JobContext, job: Job) -> None:
        raise Snooze(30)

    registry.register("forever", forever)
    client = Client(store)
    job = client.enqueue("forever")
    report = run_jobs(client, registry, advance=dt.timedelta(minutes=1), max_jobs=5)
    assert report.ran == 5
    assert client.get(job.id).snoozes == 5


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"types": ["nobody.knows"]}, "types"),
        ({"types": []}, "types"),
        ({"queue": "a", "queues": ["b"]}, "queue"),
        ({"advance": dt.timedelta(seconds=-1)}, "advance"),
        ({"advance": 60}, "advance"),
        ({"max_jobs": 0}, "max_jobs"),
    ],
)
def test_run_jobs_refuses_bad_arguments_before_claiming_anything(
    store: Store, options: dict[str, Any], field: str
) -> None:
    registry = Registry()
    _counting(registry, "ok")
    client = Client(store)
    job = client.enqueue("ok", delay=dt.timedelta(seconds=1))
    with pytest.raises(ValidationError) as caught:
        run_jobs(client, registry, **options)
    assert caught.value.field == field
    assert client.get(job.id).run_at == job.run_at


# -- assert_enqueued ------------------------------------------------------------------


def test_assert_enqueued_matches_type_payload_queue_and_count(store: Store) -> None:
    client = Client(store)
    client.enqueue("email.send", {"to": "a@example.com", "n": 1})
    client.enqueue("email.send", {"to": "b@example.com", "n": 2}, queue="emails")
    assert len(assert_enqueued(client, "email.send", count=2)) == 2
    [job] = assert_enqueued(client, "email.send", payload={"to": "b@example.com", "n": ANY})
    assert job.queue == "emails"
    assert_enqueued(store, "email.send", queue="emails", count=1)
    assert_enqueued(client, "email.send", state="queued", count=2)
    assert_not_enqueued(client, "sms.send")
    assert_not_enqueued(client, "email.send", payload={"to": "c@example.com"})


def test_assert_enqueued_failure_lists_what_was_enqueued(store: Store) -> None:
    client = Client(store)
    with pytest.raises(AssertionError, match="nothing was enqueued"):
        assert_enqueued(client, "email.send")
    client.enqueue("email.send", {"to": "a@example.com"})
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(client, "email.send", payload={"to": "b@example.com"})
    assert str(caught.value) == (
        "expected at least one job of type 'email.send' with payload {'to': 'b@example.com'},"
        " found 0\nenqueued (1):\n"
        "  email.send queue=default state=queued payload={'to': 'a@example.com'}"
    )
    with pytest.raises(AssertionError, match=r"expected 2 jobs of type 'email\.send', found 1"):
        assert_enqueued(client, "email.send", count=2)
    with pytest.raises(AssertionError, match=r"expected no job of type 'email\.send', found 1"):
        assert_not_enqueued(client, "email.send")


def test_advance_jobs_moves_due_jobs_without_running_them(store: Store) -> None:
    client = Client(store)
    soon = client.enqueue("a", delay=dt.timedelta(minutes=5), queue="q")
    client.enqueue("b", delay=dt.timedelta(minutes=5), queue="q")
    client.enqueue("a", delay=dt.timedelta(minutes=5), queue="other")
    assert advance_jobs(client, dt.timedelta(minutes=10), queues=["q"], types="a") == 1
    moved = client.get(soon.id)
    assert (moved.state, moved.attempts) == (State.QUEUED, 0)
    assert moved.run_at <= store.now()
    with pytest.raises(ValidationError):
        advance_jobs(client, dt.timedelta(minutes=-1))
