"""``jobrun workflows list|get|cancel|retry``: workflows as a unit (docs/workflows.md).

``list`` shows the newest workflows first with their jobs counted by state,
a page at a time (``--before ID`` for the next page, as ``jobrun list``
pages), filtered by ``--state`` (running, succeeded, failed, cancelled) and
``--name``. ``get ID`` shows one workflow and its jobs parents first, each
with its state and its parents' node names: the graph read top down.

``cancel ID`` and ``retry ID`` act on every job of a workflow in one
transaction, so they are guarded as ``jobrun cancel --state`` is
(:mod:`jobrun.cli.confirm`): the jobs they would change are counted first,
``--dry-run`` shows that and changes nothing, ``--yes`` acts, a terminal is
asked, and anything else is refused (exit 9). Exit codes as ``jobrun
cancel`` and ``retry`` of one job: an unknown workflow exits 3, a workflow
the action does not apply to exits 5 (nothing left to cancel: every job has
finished; nothing to retry: no job is dead or cancelled), a bad id 7.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from rich.table import Table

from jobrun.job import validate
from jobrun.job.model import State
from jobrun.job.workflow import (
    WorkflowGraph,
    WorkflowState,
    WorkflowSummary,
    node_name,
    workflow_state,
)
from jobrun.postgres.plans import MAX_LIST_LIMIT

from .confirm import confirmed, guard_options
from .exits import EXIT_INVALID_STATE, EXIT_OK, CommandError
from .ids import whole_or_prefix, workflow_id
from .output import (
    count_jobs,
    cut,
    output_width,
    print_json,
    print_table,
    report,
    row,
    say,
    table,
    to_json,
    when,
)
from .parser import Commands
from .settings import open_client

LIST_LIMIT = 50
"""Workflows ``jobrun workflows list`` shows unless told ``--limit``."""

_RUNNING = (State.WAITING, State.QUEUED, State.LEASED)


def register(commands: Commands) -> None:
    """Add ``workflows`` and its actions."""
    flows = commands.nest("workflows", "list, show, cancel and retry workflows")
    p = flows.add("list", cmd_list, "list workflows, newest first", json=True)
    p.add_argument(
        "--state",
        metavar="STATE",
        help="only workflows in this state: " + ", ".join(s.value for s in WorkflowState),
    )
    p.add_argument("--name", metavar="NAME", help="only workflows of this name")
    p.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT,
        metavar="N",
        help=f"how many workflows to show (default: {LIST_LIMIT})",
    )
    p.add_argument(
        "--before",
        metavar="ID",
        help="the next page: workflows older than this id (or its start, a unique prefix)",
    )

    p = flows.add("get", cmd_get, "show a workflow and its jobs, parents first", json=True)
    p.add_argument("id", metavar="ID", help="the workflow id, or its start (a unique prefix)")

    for name, func, what in (
        ("cancel", cmd_cancel, "cancel every job of a workflow that has not finished"),
        ("retry", cmd_retry, "run a workflow's dead and cancelled jobs again"),
    ):
        p = flows.add(name, func, what, json=True)
        p.add_argument("id", metavar="ID", help="the workflow id, or its start (a unique prefix)")
        guard_options(p)


def cmd_list(args: argparse.Namespace) -> int:
    # Every check before the database is opened (exit 7 for a bad value).
    state = None if args.state is None else workflow_state(args.state.strip().lower())
    if args.before is not None:
        whole_or_prefix(args.before, "--before", "workflow")
    name = None if args.name is None else node_name(args.name, "--name")
    validate.batch_limit(args.limit, MAX_LIST_LIMIT - 1)  # one more is read: is there a next page?
    with open_client(args) as client:
        before = None if args.before is None else workflow_id(client, args.before, "--before")
        found = client.workflows(state=state, name=name, before=before, limit=args.limit + 1)
    more = len(found) > args.limit
    flows = found[: args.limit]
    if args.json:
        print_json(flows)
        return EXIT_OK
    if not flows:
        say("no workflows")
        return EXIT_OK
    headers = (
        "id", "name", "state", "jobs", "running", "succeeded", "dead", "cancelled",
        "created_at", "finished_at",
    )  # fmt: skip
    cells = [
        (
            str(flow.id),
            cut(flow.name, 40),
            str(flow.state),
            str(flow.total),
            str(sum(flow.jobs.get(s, 0) for s in _RUNNING)),
            str(flow.jobs.get(State.SUCCEEDED, 0)),
            str(flow.jobs.get(State.DEAD, 0)),
            str(flow.jobs.get(State.CANCELLED, 0)),
            when(flow.created_at),
            when(flow.finished_at),
        )
        for flow in flows
    ]
    grid = _fitted(headers, cells, required=3)
    print_table(grid)
    older = f"; older: --before {flows[-1].id}" if more else ""
    count = f"{len(flows)} workflow" + ("" if len(flows) == 1 else "s")
    say(f"{count}, newest first{older}")
    return EXIT_OK


def _head(flow: WorkflowSummary) -> str:
    """``workflow ID 'name': failed, 6 jobs (3 succeeded, 1 dead, 2 cancelled)``."""
    counts = ", ".join(f"{n} {s}" for s, n in flow.jobs.items() if n)
    return f"workflow {flow.id} {flow.name!r}: {flow.state}, {count_jobs(flow.total)}" + (
        f" ({counts})" if counts else ""
    )


def cmd_get(args: argparse.Namespace) -> int:
    whole_or_prefix(args.id, "ID", "workflow")
    with open_client(args) as client:
        ident = workflow_id(client, args.id)
        flow = client.workflow(ident)
    if args.json:
        print_json(flow)
        return EXIT_OK
    say(_head(flow.summary))
    finished = f", finished {when(flow.summary.finished_at)}" if flow.summary.finished_at else ""
    say(f"created {when(flow.summary.created_at)}{finished}")
    print_table(_nodes_table(flow))
    return EXIT_OK


def _nodes_table(flow: WorkflowGraph) -> Table:
    """The jobs parents first: node, state, parents (by node name), then what fits."""
    names = {n.id: n.node for n in flow.nodes}
    headers = (
        "node", "state", "parents", "attempts", "id", "type", "queue", "finished_at",
        "last_error",
    )  # fmt: skip
    cells = [
        (
            n.node,
            str(n.state),
            ", ".join(names[p] for p in n.parents),
            str(n.attempts),
            str(n.id),
            n.type,
            n.queue,
            when(n.finished_at),
            cut(n.last_error),
        )
        for n in flow.nodes
    ]
    return _fitted(headers, cells, required=3)


def _fitted(headers: Sequence[str], cells: Sequence[Sequence[str]], *, required: int) -> Table:
    """A table of the first ``required`` columns, then each next one while the row still
    fits the output's width at its natural width (a pipe without COLUMNS gets them all)."""
    gap = 2
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    room = output_width()
    shown = list(range(min(required, len(headers))))
    used = sum(widths[i] for i in shown) + gap * (len(shown) - 1)
    for i in range(len(shown), len(headers)):
        if used + gap + widths[i] > room:
            break
        shown.append(i)
        used += gap + widths[i]
    grid = table(*(headers[i] for i in shown))
    for r in cells:
        row(grid, *(r[i] for i in shown))
    return grid


def cmd_cancel(args: argparse.Namespace) -> int:
    whole_or_prefix(args.id, "ID", "workflow")
    with open_client(args) as client:
        ident = workflow_id(client, args.id)
        flow = client.workflow(ident)
        stop = [n for n in flow.nodes if n.state in _RUNNING]
        if not stop:
            raise CommandError(
                f"cannot cancel workflow {ident}: it has finished ({flow.state})",
                EXIT_INVALID_STATE,
            )
        running = sum(1 for n in stop if n.state is State.LEASED)
        what = f"cancel {count_jobs(len(stop))} of workflow {ident} {flow.summary.name!r}" + (
            f" ({running} running: cancel requested)" if running else ""
        )
        if args.dry_run:
            value = {"matched": len(stop), "running": running, "workflow": flow.summary}
            report(args, value, f"would {what}; nothing changed (--dry-run)")
            return EXIT_OK
        confirmed(args, what)
        done = client.cancel_workflow(ident)
    text = f"cancelled {count_jobs(done.cancelled + done.cancel_requested)} of workflow {ident}"
    if done.cancel_requested:
        text += f" ({done.cancel_requested} running: cancel requested, their workers stop them)"
    report(args, done, text)
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    whole_or_prefix(args.id, "ID", "workflow")
    with open_client(args) as client:
        ident = workflow_id(client, args.id)
        flow = client.workflow(ident)
        again = [n for n in flow.nodes if n.state in (State.DEAD, State.CANCELLED)]
        if not again:
            raise CommandError(
                f"nothing to retry in workflow {ident}: it is {flow.state}, "
                "and none of its jobs is dead or cancelled",
                EXIT_INVALID_STATE,
            )
        what = f"retry {count_jobs(len(again))} of workflow {ident} {flow.summary.name!r}"
        if args.dry_run:
            value = {"matched": len(again), "workflow": flow.summary}
            report(args, value, f"would {what}; nothing changed (--dry-run)")
            return EXIT_OK
        confirmed(args, what)
        done = client.retry_workflow(ident)
    text = f"retried {count_jobs(done.retried)} of workflow {ident}: {done.queued} queued now"
    if done.waiting:
        text += f", {done.waiting} waiting for a retried parent"
    report(args, {**to_json(done), "retried": done.retried}, text)
    return EXIT_OK
