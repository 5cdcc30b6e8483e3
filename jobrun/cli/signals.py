"""``jobrun signal ID NAME``: send a signal to a job (docs/signals.md).

The job's ``ctx.wait_for_signal(NAME, ...)`` receives ``--payload`` (any
JSON value; null without one), whether its wait has begun or not; a job
parked in that wait runs again at once. ``--key`` makes the send idempotent
(a script run twice sends once: the second run says "already sent"). A job
that is not there exits 3, a finished one 5, a bad name, key or payload 7,
each before anything is written.
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
        "signal", cmd_signal, "send a signal (a name and a JSON payload) to a job", json=True
    )
    p.add_argument("id", metavar="ID", help="the job id or its start, a unique prefix")
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
    if not sent.sent:
        text = f"signal {sent.name!r} with key {sent.key!r} was already sent to job {sent.job_id}"
    elif sent.woke:
        text = f"signal {sent.name!r} sent to job {sent.job_id}: it was waiting, and runs now"
    else:
        text = f"signal {sent.name!r} sent to job {sent.job_id} (key {sent.key})"
    report(args, sent, text)
    return EXIT_OK
