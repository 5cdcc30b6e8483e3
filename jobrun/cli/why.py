"""``jobrun why ID``: what holds a job back, named from the database's state.

No peer answers "why isn't my job running?"; the answer is spread over the
job's row, its queue's pause and limits, the leases filling them and the
rate window. The reasons come from :mod:`jobrun.job.why` on one snapshot
read by :class:`jobrun.postgres.diagnose.Diagnose`; this prints them, one
line each, or as JSON. The exit code is 0 whatever the reasons are: the
command answered; a job that does not exist is exit 3 as everywhere.
"""

from __future__ import annotations

import argparse

from jobrun.postgres.diagnose import Diagnose

from .exits import EXIT_OK
from .ids import job_id
from .output import print_json, say
from .parser import Commands
from .settings import open_client


def register(commands: Commands) -> None:
    """Add ``why``."""
    p = commands.add("why", cmd_why, "why a job is not running (what holds it back)", json=True)
    p.add_argument("id", metavar="ID", help="the job id, or its start (a unique prefix)")


def cmd_why(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        diagnosis = Diagnose(client.store).why(job_id(client, args.id))
    if args.json:
        print_json(diagnosis)
        return EXIT_OK
    say(f"job {diagnosis.job_id} ({diagnosis.type}, queue {diagnosis.queue!r}): {diagnosis.state}")
    for reason in diagnosis.reasons:
        say(f"- {reason.text}")
        if reason.jobs:
            say("  held by: " + ", ".join(str(j) for j in reason.jobs))
    return EXIT_OK
