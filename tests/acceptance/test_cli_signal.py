"""``jobrun signal ID NAME [--payload JSON] [--key K]``: in-process and in a real
subprocess, against the test's database."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from jobrun import cli
from jobrun.client import Client
from jobrun.job.model import EventKind, NewJob
from jobrun.workflow import Workflow
from tests.acceptance.test_cli import (  # noqa: F401 - fixtures
    UNKNOWN_ID,
    Result,
    _isolated_environment,
    assert_one_line_error,
    client,
    dead,
    jobrun,
    run_process,
)


def test_signal_stores_the_payload_once_per_key(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    job = client.enqueue("t.a")
    first = jobrun(
        "signal", str(job.id)[:13], "confirmed", "--payload", '{"ok": true}', "--key", "k"
    )
    assert first.code == 0, first.err
    assert "signal 'confirmed' sent to job" in first.out
    again = jobrun("signal", str(job.id), "confirmed", "--payload", "1", "--key", "k", "--json")
    assert again.code == 0, again.err
    shown = again.json()
    assert shown["sent"] is False and shown["key"] == "k" and shown["job_id"] == str(job.id)
    sent = [e for e in client.events(job.id) if e.kind is EventKind.SIGNAL_SENT]
    assert [e.detail for e in sent] == [{"name": "confirmed", "key": "k", "woke": False}]


def test_signal_refuses_a_missing_job_a_finished_one_and_bad_input(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    assert_one_line_error(jobrun("signal", UNKNOWN_ID, "x"), cli.EXIT_NOT_FOUND)
    finished = dead(client)
    assert_one_line_error(
        jobrun("signal", str(finished.id), "x"), cli.EXIT_INVALID_STATE, "cannot signal"
    )
    job = client.enqueue("t.a")
    assert_one_line_error(
        jobrun("signal", str(job.id), "x", "--payload", "{oops"), cli.EXIT_VALIDATION, "payload"
    )
    assert_one_line_error(jobrun("signal", str(job.id), "x" * 201), cli.EXIT_VALIDATION, "name")
    assert client.events(job.id)[-1].kind is EventKind.ENQUEUED  # nothing written


def test_signal_in_a_subprocess(dsn: str, client: Client) -> None:  # noqa: F811
    job = client.enqueue("t.a")
    result = run_process(dsn, "signal", str(job.id), "go", "--payload", '"now"')
    assert result.code == 0, result.err
    assert f"signal 'go' sent to job {job.id}" in result.out


def test_signal_to_a_workflow_id_and_its_refusal_once_the_workflow_finished(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    wf = Workflow("signup")
    wf.add(NewJob(type="t.a"), name="a")
    run = client.enqueue_workflow(wf)
    first = jobrun("signal", str(run.id), "confirmed", "--payload", '{"ok": true}', "--key", "k")
    assert first.code == 0, first.err
    assert f"signal 'confirmed' sent to workflow {run.id} (key k)" in first.out
    again = jobrun("signal", str(run.id), "confirmed", "--key", "k", "--json")
    assert again.code == 0, again.err
    shown = again.json()
    assert (shown["sent"], shown["job_id"], shown["workflow_id"]) == (False, None, str(run.id))
    assert (
        "was already sent to workflow"
        in jobrun("signal", str(run.id), "confirmed", "--key", "k").out
    )
    client.cancel(run["a"].id)
    assert_one_line_error(
        jobrun("signal", str(run.id), "x"), cli.EXIT_INVALID_STATE, "cannot signal workflow"
    )


def test_signal_to_a_workflow_says_how_many_parked_jobs_it_woke(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    wf = Workflow("review")
    for node in ("legal", "finance"):
        wf.add(NewJob(type="t.a", queue="review"), name=node)
    run = client.enqueue_workflow(wf)
    store = client.store
    for job in store.claim("w", ["review"], 2, dt.timedelta(seconds=30)):
        store.await_step(job, "ok", "approved", 3600.0)
        store.park(job, "ok")
    woke = jobrun("signal", str(run.id), "approved", "--payload", "true")
    assert woke.code == 0, woke.err
    assert f"signal 'approved' sent to workflow {run.id}: 2 jobs were waiting, and run now" in (
        woke.out
    )
