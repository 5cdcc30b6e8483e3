"""``jobrun signal ID NAME``: send a signal to a job or a workflow (docs/signals.md).

The job's ``ctx.wait_for_signal(NAME, ...)`` receives ``--payload`` (any
JSON value; null without one), whether its wait has begun or not; a job
parked in that wait runs again at once. ID may be a workflow's id (whole):
every job of the workflow that waits for NAME, now or later, receives the
signal once, and those parked in that wait run again at once. ``--key``
makes the send idempotent (a script run twice sends once: the second run
says "already sent"). An id that is no job's nor workflow's exits 3, a
finished job (workflow) 5, a bad name, key or payload 7, each before
anything is written.
"""

from __future__ import annotations

import argparse

from jobrun.job.validate import payload_from_json

from .exits import EXIT_OK
from .ids import job_id
from .output import report
from .parser import Commands
from .settings import open_client


def register(commands: Commands) -> None:
    """Add ``signal``."""
    p = commands.add(
        "signal",
        cmd_signal,
        "send a signal (a name and a JSON payload) to a job or a workflow",
        json=True,
    )
    p.add_argument(
        "id", metavar="ID", help="the job id or its start (a unique prefix), or a workflow's id"
    )
    p.add_argument("name", metavar="NAME", help="the signal's name, as the job waits for it")
    p.add_argument("--payload", metavar="JSON", help="the payload, any JSON value (default: null)")
    p.add_argument(
        "--key",
        metavar="KEY",
        help="an idempotency key: the same job, name and key again sends nothing "
        "(default: a new key, every send is a signal of its own)",
    )


def cmd_signal(args: argparse.Namespace) -> int:
    payload = None if args.payload is None else payload_from_json(args.payload)
    with open_client(args) as client:
        sent = client.signal(job_id(client, args.id), args.name, payload, key=args.key)
    to = f"job {sent.job_id}" if sent.workflow_id is None else f"workflow {sent.workflow_id}"
    if not sent.sent:
        text = f"signal {sent.name!r} with key {sent.key!r} was already sent to {to}"
    elif sent.workflow_id is not None and sent.woken:
        waiting = "1 job was" if len(sent.woken) == 1 else f"{len(sent.woken)} jobs were"
        text = f"signal {sent.name!r} sent to {to}: {waiting} waiting, and run now"
    elif sent.woke:
        text = f"signal {sent.name!r} sent to {to}: it was waiting, and runs now"
    else:
        text = f"signal {sent.name!r} sent to {to} (key {sent.key})"
    report(args, sent, text)
    return EXIT_OK
