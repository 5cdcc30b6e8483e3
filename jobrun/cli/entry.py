"""The command tree and the one place an error becomes a line and an exit code.

:func:`build_parser` asks each command group to add its commands, in the
order ``jobrun --help`` lists them. :func:`main` parses, runs the command,
and turns whatever it raised into ``jobrun: <message>`` on stderr and the
exit code of :mod:`jobrun.cli.exits`: no command prints its own errors or
picks its own code, so every command keeps the table in :mod:`jobrun.cli`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from jobrun.job.validate import redact
from jobrun.worker.stop_signals import Interrupted

from . import (
    actions,
    completion,
    database,
    extras,
    jobs,
    processes,
    queues,
    schedules,
    signals,
    why,
    workers,
    workflows,
)
from .exits import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SIGNALLED,
    EXIT_USAGE,
    PROG,
    CommandError,
    UsageError,
    exit_code,
    fail,
    message,
)
from .parser import Command, Commands, Parser, global_options, json_option, version


def build_parser() -> argparse.ArgumentParser:
    """The ``jobrun`` command's parser, every command and its flags."""
    common = global_options()
    parser = Parser(
        prog=PROG,
        description="A durable background-job system on PostgreSQL.",
        parents=[common],
        allow_abbrev=False,
        epilog="exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 conflict, "
        "5 invalid state, 6 database unavailable, 7 validation, 8 schema missing or "
        "at another version (run jobrun migrate), 9 bulk action not confirmed",
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands = Commands(group=sub, common=common, as_json=json_option())
    database.register_migrate(commands)
    processes.register(commands)  # worker, scheduler
    jobs.register(commands)  # enqueue, get, list, events, depth
    why.register(commands)
    actions.register(commands)  # cancel, retry
    signals.register(commands)
    workflows.register(commands)
    queues.register(commands)
    workers.register(commands)
    actions.register_purge(commands)
    schedules.register(commands)
    extras.register(commands)  # demo, dashboard
    database.register_embedded(commands)
    completion.register(commands, parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jobrun`` command; returns the exit code (see :mod:`jobrun.cli`)."""
    parser = build_parser()
    try:
        args, unknown = parser.parse_known_args(argv)
        if unknown and getattr(args, "command", None) != "demo":
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.extras = unknown
        if getattr(args, "func", None) is None:
            parser.error("a command is required")
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    func: Command = args.func
    try:
        return func(args)
    except SystemExit as exc:  # jobrun demo --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except UsageError as exc:
        return fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return fail("interrupted", EXIT_INTERRUPTED)
    except Interrupted as exc:  # a worker or scheduler stopped by a signal while it started
        return fail(str(exc), EXIT_SIGNALLED + exc.signum)
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes a line and a code
        text = message(exc)
        if isinstance(exc, CommandError) and exc.details and hasattr(args, "log_level"):
            if args.log_level == "debug":
                sys.stderr.write(redact(exc.details))
            else:
                text += " (--log-level debug shows where)"
        return fail(text, exit_code(exc))
