"""The guard of a bulk action: the count first, then a prompt, ``--dry-run`` or ``--yes``.

``jobrun retry --state succeeded --type email.send`` once re-sent three
emails without a word; the dashboard confirms a bulk action, and the
command now does too. Every bulk form (``retry``/``cancel --state``,
``purge``) counts what it matches before it changes anything, then:

- ``--dry-run`` prints the count and a sample and changes nothing (exit 0);
- ``--yes`` acts without asking (scripts, cron);
- on a terminal (stdin a tty) it asks ``... [y/N]`` on stderr, and acts
  only on ``y`` or ``yes``;
- otherwise it refuses, exit code 9 (:data:`EXIT_NOT_CONFIRMED`), rather
  than act silently from a script that never said so.

Nothing matched is not an error: the command says so and exits 0.
"""

from __future__ import annotations

import argparse
import sys

from .exits import EXIT_NOT_CONFIRMED, CommandError


def guard_options(p: argparse.ArgumentParser) -> None:
    """--dry-run and --yes, for a command that may act on many jobs."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show how many jobs match (and a sample); change nothing",
    )
    p.add_argument(
        "-y",
        "--yes",
        action="store_true",
        help="act without asking (needed when stdin is not a terminal)",
    )


def confirmed(args: argparse.Namespace, question: str) -> None:
    """Return when the action may go ahead; CommandError (exit 9) when it may not.

    ``question`` says what would be done, with the count: ``retry 3 jobs``.
    """
    if args.yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(
            f"not confirmed: would {question}; stdin is not a terminal, so pass --yes to "
            "go ahead (or --dry-run to look first)",
            EXIT_NOT_CONFIRMED,
        )
    sys.stderr.write(f"{question}? [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    if answer not in ("y", "yes"):
        raise CommandError("not confirmed: nothing changed", EXIT_NOT_CONFIRMED)
