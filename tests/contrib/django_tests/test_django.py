"""Django (psycopg 3 backend): jobs join ``atomic()`` blocks, and the ``django.tasks`` backend.

A small Django project lives in tests/contrib/django_project (settings,
one model, a few tasks). This process sets it up once and points its
databases at each test's own; the worker is ``manage.py jobrun_worker`` in
a real subprocess, stopped with SIGTERM.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone
from jrtest_shop.models import Order
from jrtest_shop.tasks import add, charge, record_order, send_receipt, which_attempt
from psycopg import sql

import jobrun
from jobrun.client import Client
from jobrun.contrib.django import JobrunBackend, enqueue
from jobrun.contrib.django._tasks import Task, TaskResultDoesNotExist, TaskResultStatus
from jobrun.job.model import Backoff, NewJob, State
from jobrun.postgres.store import Store
from jobrun.worker import Registry, Worker
from tests.acceptance.conftest import FAST_ENV
from tests.contrib.conftest import job_types
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[3]
PROJECT = Path(__file__).resolve().parents[1] / "django_project"
NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)


def order_numbers(conn: psycopg.Connection[Any]) -> list[int]:
    return [r[0] for r in conn.execute("SELECT number FROM jrtest_shop_order ORDER BY number")]


# -- client.enqueue(..., conn=django.db.connection) ----------------------------------------


def test_a_job_enqueued_on_djangos_connection_commits_with_the_atomic_block(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    with transaction.atomic():
        Order.objects.create(number=1, cents=100)
        job = client.enqueue("invoice.record", {"order": 1}, conn=connection)
        assert job_types(conn) == []  # not visible before the commit
    assert order_numbers(conn) == [1]
    assert job_types(conn) == ["invoice.record"]
    assert client.get(job.id).payload == {"order": 1}


def test_an_atomic_block_that_raises_keeps_neither_the_row_nor_the_job(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(number=1, cents=100)
        client.enqueue("invoice.record", {"order": 1}, conn=connection)
        raise RuntimeError("payment declined")
    assert order_numbers(conn) == []
    assert job_types(conn) == []


def test_a_job_enqueued_first_in_an_atomic_block_rolls_back_with_it(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:
    # atomic() sends nothing to the server: the enqueue is the transaction's first statement.

    with pytest.raises(RuntimeError), transaction.atomic():
        client.enqueue("invoice.record", conn=connection)
        raise RuntimeError("rolled back")
    assert job_types(conn) == []
    with transaction.atomic():
        client.enqueue("invoice.record", conn=connection)
    assert job_types(conn) == ["invoice.record"]


def test_a_nested_atomic_block_that_rolls_back_removes_only_its_job(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    with transaction.atomic():
        Order.objects.create(number=1, cents=100)
        client.enqueue("kept", conn=connection)
        with pytest.raises(RuntimeError), transaction.atomic():
            Order.objects.create(number=2, cents=200)
            client.enqueue("dropped", conn=connection)
            raise RuntimeError("only the savepoint")
        client.enqueue("kept.after", conn=connection)
    assert order_numbers(conn) == [1]
    assert job_types(conn) == ["kept", "kept.after"]


def test_outside_atomic_django_autocommits_and_so_does_the_enqueue(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    client.enqueue("at.once", conn=connection)
    assert job_types(conn) == ["at.once"]


def test_a_batch_enqueued_in_an_atomic_block_follows_it(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    batch = [NewJob(type="batch", payload={"n": n}) for n in range(3)]
    with pytest.raises(RuntimeError), transaction.atomic():
        client.enqueue_batch(batch, conn=connection)
        raise RuntimeError("rolled back")
    assert job_types(conn) == []
    with transaction.atomic():
        client.enqueue_batch([*batch, NewJob(type="keyed", idempotency_key="k")], conn=connection)
    assert job_types(conn) == ["batch", "batch", "batch", "keyed"]


def test_an_idempotent_replay_on_djangos_connection_reads_the_stored_job_back(
    django_db: None, client: Client
) -> None:
    # Django loads jsonb as text on its connections: the stored job still reads as JSON.

    with transaction.atomic():
        first = client.enqueue("t", {"n": [1, 2]}, idempotency_key="k", conn=connection)
        again = client.enqueue("t", {"n": [1, 2]}, idempotency_key="k", conn=connection)
        with pytest.raises(jobrun.IdempotencyConflict):
            client.enqueue("t", {"n": 3}, idempotency_key="k", conn=connection)
    assert again.id == first.id
    assert again.payload == {"n": [1, 2]}
    assert again.created_at.tzinfo is not None


def test_djangos_json_loading_is_given_back_after_an_enqueue(
    django_db: None, client: Client
) -> None:

    client.enqueue("t", conn=connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT '{\"a\": 1}'::jsonb")
        assert cursor.fetchone() == ('{"a": 1}',)  # Django's own loader: text


def test_a_transaction_django_marked_for_rollback_refuses_the_enqueue(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    with transaction.atomic():
        Order.objects.create(number=1, cents=100)
        try:
            with transaction.atomic(savepoint=False):
                Order.objects.create(number=1, cents=100)  # a duplicate: the block is broken
        except Exception:  # caught, as careless code would
            pass
        with pytest.raises(TransactionManagementError):
            client.enqueue("t", conn=connection)
        transaction.set_rollback(True)
    assert job_types(conn) == []


# -- a commit callable writing a Django model's table ---------------------------------------


def test_a_commit_callable_writes_a_django_models_row_on_completes_connection_once(
    django_db: None,
    store: Store,
    registry: Registry,
    make_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    # Django cannot adopt the connection Complete lends, so the commit
    # callable writes on it with SQL named after the model (docs/stacks.md).

    table = sql.Identifier(Order._meta.db_table)
    number, cents = (sql.Identifier(Order._meta.get_field(f).column) for f in ("number", "cents"))
    attempts: list[int] = []

    @registry.handler("order.record")
    def record(
        ctx: jobrun.JobContext, job: jobrun.Job
    ) -> Callable[[psycopg.Connection[Any]], None]:
        attempts.append(job.attempts)

        def commit(c: psycopg.Connection[Any]) -> None:
            c.execute(
                sql.SQL("INSERT INTO {} ({}, {}) VALUES (%s, %s)").format(table, number, cents),
                [job.payload["number"], job.payload["cents"]],
            )
            if job.attempts == 1:
                raise RuntimeError("the first commit fails after its write")

        return commit

    client = Client(store)
    job = client.enqueue("order.record", {"number": 7, "cents": 1999}, backoff=NO_WAIT)
    again = client.enqueue(
        "order.record", {"number": 7, "cents": 1999}, backoff=NO_WAIT, idempotency_key=str(job.id)
    )
    make_worker()
    for j in (job, again):
        wait_for(lambda j=j: client.get(j.id).state is State.SUCCEEDED)
    assert order_numbers(conn) == [7]  # the failed commit left nothing; the shared key ran once
    assert Order.objects.get(number=7).cents == 1999
    assert sorted(attempts) == [1, 1, 2, 2]  # both ran twice; one commit applied


# -- the django.tasks backend ------------------------------------------------------------


def test_a_task_enqueued_inside_an_atomic_block_that_rolls_back_leaves_no_job(
    django_db: None, conn: psycopg.Connection[Any]
) -> None:

    with pytest.raises(RuntimeError), transaction.atomic():
        add.enqueue(2, 3)
        raise RuntimeError("rolled back")
    assert job_types(conn) == []


def test_a_task_enqueued_inside_an_atomic_block_that_commits_is_a_ready_job(
    django_db: None, client: Client, conn: psycopg.Connection[Any]
) -> None:

    with transaction.atomic():
        result = add.enqueue(2, 3)
        assert job_types(conn) == []
    assert job_types(conn) == ["django.task"]
    job = client.get(result.id)
    assert job.payload == {
        "task": "jrtest_shop.tasks.add",
        "args": [2, 3],
        "kwargs": {},
        "priority": 0,
        "backend": "default",
    }
    assert (job.queue, job.priority, job.max_attempts) == ("default", 0, 2)
    assert result.status == TaskResultStatus.READY
    fetched = add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert (fetched.args, fetched.kwargs) == ([2, 3], {})
    assert fetched.enqueued_at == job.created_at


def test_a_tasks_queue_priority_and_run_after_become_the_jobs(
    django_db: None, client: Client
) -> None:

    later = timezone.now() + dt.timedelta(hours=1)
    urgent = send_receipt.using(priority=100).enqueue("a@example.com", order=7)
    deferred = send_receipt.using(priority=-100, run_after=later).enqueue("b@example.com", order=8)
    plain = send_receipt.enqueue("c@example.com", order=9)
    jobs = [client.get(r.id) for r in (urgent, deferred, plain)]
    assert [j.queue for j in jobs] == ["emails"] * 3
    assert [j.priority for j in jobs] == [-100, 100, -10]  # higher in Django: lower in jobrun
    assert jobs[1].run_at == later
    assert send_receipt.get_result(deferred.id).task.priority == -100


def test_jobrun_options_per_call_give_an_idempotent_task(django_db: None, client: Client) -> None:

    first = enqueue(add, (2, 3), idempotency_key="sum-2-3", concurrency_key="t1", max_attempts=9)
    again = enqueue(add, (2, 3), idempotency_key="sum-2-3", concurrency_key="t1", max_attempts=9)
    assert again.id == first.id
    job = client.get(first.id)
    assert (job.idempotency_key, job.concurrency_key, job.max_attempts) == ("sum-2-3", "t1", 9)
    with pytest.raises(jobrun.IdempotencyConflict):
        enqueue(add, (2, 4), idempotency_key="sum-2-3")


def test_a_result_id_that_is_no_task_does_not_exist(django_db: None, client: Client) -> None:

    other = client.enqueue("not.a.django.task")
    for result_id in ("nonsense", str(other.id), "01a23268-d276-7ac8-ba89-a2cd98a04026"):
        with pytest.raises(TaskResultDoesNotExist):
            add.get_result(result_id)


def test_an_unknown_backend_option_is_refused_when_the_backend_is_made() -> None:

    with pytest.raises(ImproperlyConfigured, match="idempotency_key"):
        JobrunBackend("x", {"OPTIONS": {"idempotency_key": "k"}})
    with pytest.raises(ImproperlyConfigured, match="max_attempts"):
        JobrunBackend("x", {"OPTIONS": {"max_attempts": 0}})


async def ping() -> None:
    pass


def test_an_async_task_is_refused_by_the_backend() -> None:
    with pytest.raises(Exception, match="async"):
        Task(func=ping, backend="default")


@pytest.fixture
def jobrun_worker(
    django_db: None, dsn: str, tmp_path: Path
) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []
    log = tmp_path / "worker.log"

    def start() -> subprocess.Popen[str]:
        env = {**os.environ, **FAST_ENV, "JRTEST_DATABASE_URL": dsn, "PYTHONPATH": str(ROOT)}
        env.pop("DJANGO_SETTINGS_MODULE", None)
        env.pop("DATABASE_URL", None)
        with open(log, "w") as out:
            proc = subprocess.Popen(
                [sys.executable, "manage.py", "jobrun_worker", "--", "--concurrency", "2"],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=PROJECT,
            )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    print(log.read_text(errors="replace"))


@pytest.mark.slow
def test_the_management_command_runs_tasks_and_get_result_shows_their_outcome(
    jobrun_worker: Callable[[], subprocess.Popen[str]], conn: psycopg.Connection[Any]
) -> None:

    results = {
        "add": add.enqueue(2, 3),
        "charge": charge.enqueue(7),
        "send": send_receipt.enqueue("ada@example.com", order=7),
        "attempt": which_attempt.enqueue(),
        "order": record_order.enqueue(41, 500),
    }
    worker = jobrun_worker()
    for result in results.values():
        wait_for(lambda r=result: (r.refresh(), r.is_finished)[1], timeout=60)
    assert results["add"].status == TaskResultStatus.SUCCESSFUL
    assert results["add"].return_value == 5
    assert add.get_result(results["add"].id).return_value == 5
    assert results["send"].return_value == {"sent_to": "ada@example.com", "order": 7}
    assert results["attempt"].return_value == 1
    assert Order.objects.get(pk=results["order"].return_value).number == 41

    failed = charge.get_result(results["charge"].id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.attempts == 2  # the backend's max_attempts
    assert failed.errors[-1].exception_class_path == "jrtest_shop.tasks.Declined"
    assert "card declined for order 7" in failed.errors[-1].traceback
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    done = results["add"]
    assert done.started_at is not None and done.finished_at is not None
    assert done.enqueued_at <= done.started_at <= done.finished_at

    worker.send_signal(signal.SIGTERM)
    assert worker.wait(30) == 0
