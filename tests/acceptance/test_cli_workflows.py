"""``jobrun workflows list|get|cancel|retry``: in-process against the test's
database, and once in a real subprocess."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from jobrun import EnqueuedWorkflow, Workflow, WorkflowState, cli
from jobrun.client import Client
from jobrun.job.model import NewJob, State
from tests.acceptance.test_cli import (  # noqa: F401 - fixtures
    UNKNOWN_ID,
    Result,
    _isolated_environment,
    assert_one_line_error,
    client,
    jobrun,
    run_process,
)

TTL = dt.timedelta(seconds=30)


def _order(c: Client, name: str = "order 42") -> EnqueuedWorkflow:
    """load -> price, price.1 -> total."""
    flow = Workflow(name)
    load = flow.add(NewJob(type="load", queue="q.load"))
    prices = flow.group([NewJob(type="price", queue="q.price") for _ in range(2)], after=[load])
    flow.add(NewJob(type="total", queue="q.total"), after=prices, name="total")
    return c.enqueue_workflow(flow)


def _finish(c: Client, queue: str, *, fail: bool = False) -> None:
    (job,) = c.store.claim("w", [queue], 1, TTL)
    if fail:
        c.store.fail(job, "boom", None, permanent=True)
    else:
        c.store.complete(job, result=1)


def test_list_and_get_show_workflows_newest_first_and_the_graph_parents_first(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    old = _order(client, "old")
    _finish(client, "q.load", fail=True)
    new = _order(client, "new")

    listed = jobrun("workflows", "list")
    assert listed.code == 0, listed.err
    lines = listed.out.splitlines()
    assert lines[0].split()[:4] == ["id", "name", "state", "jobs"]
    assert lines[1].split()[:4] == [str(new.id), "new", "running", "4"]
    assert lines[2].split()[:4] == [str(old.id), "old", "failed", "4"]
    assert lines[-1] == "2 workflows, newest first"
    page = jobrun("workflows", "list", "--limit", "1")
    assert page.out.splitlines()[-1] == f"1 workflow, newest first; older: --before {new.id}"
    rest = jobrun("workflows", "list", "--before", str(new.id), "--json").json()
    assert [w["id"] for w in rest] == [str(old.id)]
    assert rest[0]["jobs"] == {
        "waiting": 0,
        "queued": 0,
        "leased": 0,
        "succeeded": 0,
        "dead": 1,
        "cancelled": 3,
    }
    failed = jobrun("workflows", "list", "--state", "FAILED", "--json").json()
    assert [w["name"] for w in failed] == ["old"]
    assert jobrun("workflows", "list", "--name", "none").out == "no workflows\n"

    shown = jobrun("workflows", "get", str(old.id))
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert lines[0] == (f"workflow {old.id} 'old': failed, 4 jobs (1 dead, 3 cancelled)")
    rows = [line.split()[:4] for line in lines[3:]]
    assert rows[0] == ["load", "dead", "1", str(old["load"].id)]  # no parents
    assert [r[0] for r in rows] == ["load", "price", "price.1", "total"]
    assert [r[1] for r in rows] == ["dead", "cancelled", "cancelled", "cancelled"]
    assert lines[-1].split()[2:4] == ["price,", "price.1"]  # total's parents, by node name
    graph = jobrun("workflows", "get", str(old.id), "--json").json()
    assert graph["summary"]["name"] == "old"
    assert [n["node"] for n in graph["nodes"]] == ["load", "price", "price.1", "total"]
    assert len(graph["edges"]) == 4


def test_cancel_and_retry_are_guarded_and_act_on_the_whole_workflow(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    flow = _order(client)
    ident = str(flow.id)
    _finish(client, "q.load")
    (running,) = client.store.claim("w", ["q.price"], 1, TTL)

    dry = jobrun("workflows", "cancel", ident, "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out == (
        f"would cancel 3 jobs of workflow {ident} 'order 42' (1 running: cancel requested);"
        " nothing changed (--dry-run)\n"
    )
    refused = jobrun("workflows", "cancel", ident)  # stdin is no terminal: --yes needed
    assert_one_line_error(refused, cli.EXIT_NOT_CONFIRMED, "--yes")
    assert client.get(flow["total"].id).state is State.WAITING

    done = jobrun("workflows", "cancel", ident, "--yes", "--json")
    assert done.code == 0, done.err
    assert done.json() == {
        "id": ident,
        "cancelled": 2,
        "cancel_requested": 1,
        "finished": 1,
    }
    assert client.get(running.id).cancel_requested
    client.store.complete(running, result=1)  # its worker ends it: cancelled
    assert_one_line_error(
        jobrun("workflows", "cancel", ident, "--yes"), cli.EXIT_INVALID_STATE, "has finished"
    )

    again = jobrun("workflows", "retry", ident, "--yes")
    assert again.code == 0, again.err
    assert again.out == (
        f"retried 3 jobs of workflow {ident}: 2 queued now, 1 waiting for a retried parent\n"
    )
    assert client.get(flow["load"].id).state is State.SUCCEEDED  # never run again
    _finish(client, "q.price")
    _finish(client, "q.price")
    _finish(client, "q.total")
    assert_one_line_error(
        jobrun("workflows", "retry", ident, "--yes"), cli.EXIT_INVALID_STATE, "nothing to retry"
    )
    assert client.workflow(flow.id).state is WorkflowState.SUCCEEDED


def test_workflow_commands_refuse_unknown_ids_and_bad_input(
    jobrun: Callable[..., Result],  # noqa: F811
) -> None:
    for action in ("get", "cancel", "retry"):
        assert_one_line_error(jobrun("workflows", action, UNKNOWN_ID), cli.EXIT_NOT_FOUND)
        assert_one_line_error(
            jobrun("workflows", action, "nope"), cli.EXIT_VALIDATION, "workflow id"
        )
    assert_one_line_error(jobrun("workflows", "list", "--state", "dead"), cli.EXIT_VALIDATION)
    assert_one_line_error(jobrun("workflows", "list", "--limit", "0"), cli.EXIT_VALIDATION)
    assert_one_line_error(jobrun("workflows", "list", "--name", ""), cli.EXIT_VALIDATION, "--name")
    assert_one_line_error(jobrun("workflows", "list", "--before", UNKNOWN_ID), cli.EXIT_NOT_FOUND)
    assert_one_line_error(jobrun("workflows"), cli.EXIT_USAGE)


def test_workflow_commands_take_the_start_of_an_id_as_job_commands_do(
    jobrun: Callable[..., Result],  # noqa: F811
    client: Client,  # noqa: F811
) -> None:
    first, second = _order(client, "first"), _order(client, "second")
    # The shortest starts that tell the two apart, and one that does not.
    a, b = str(first.id), str(second.id)
    common = next(i for i in range(len(a)) if a[i] != b[i])
    got = jobrun("workflows", "get", a[: common + 1], "--json")
    assert got.code == 0, got.err
    assert got.json()["summary"]["id"] == a
    assert (
        jobrun("workflows", "get", b[: common + 1].upper(), "--json").json()["summary"]["id"] == b
    )
    older = jobrun("workflows", "list", "--before", b[: common + 1], "--json").json()
    assert [w["id"] for w in older] == [a]  # the page after the second: the first
    # A start that no workflow has: not found (exit 3), as for a job.
    free = next(d for d in "0123456789abcdef" if not (a.startswith(d) or b.startswith(d)))
    assert_one_line_error(jobrun("workflows", "cancel", free + "0"), cli.EXIT_NOT_FOUND)
    cancelled = jobrun("workflows", "cancel", a[: common + 1], "--yes")
    assert cancelled.code == 0, cancelled.err
    assert client.workflow(first.id).state is WorkflowState.CANCELLED
    # Workflows until two ids start alike (at most 17 for 16 hex digits):
    # that start names several, a validation error that asks for more.
    made = [first, second]
    while len({str(f.id)[0] for f in made}) == len(made):
        made.append(_order(client, f"more {len(made)}"))
    starts = [str(f.id)[0] for f in made]
    shared = next(d for d in starts if starts.count(d) > 1)
    assert_one_line_error(
        jobrun("workflows", "get", shared), cli.EXIT_VALIDATION, "several workflow ids"
    )


def test_workflows_list_in_a_subprocess(dsn: str, client: Client) -> None:  # noqa: F811
    flow = _order(client, "sub")
    result = run_process(dsn, "workflows", "list", "--json")
    assert result.code == 0, result.err
    assert '"name": "sub"' in result.out and str(flow.id) in result.out
