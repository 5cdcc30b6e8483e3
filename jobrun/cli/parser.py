"""The pieces every command's parser is made of, and the readers of the flags they share.

The command stays on argparse: its errors, help and exit codes are a
contract its tests read, and argparse already gives what a CLI library would
(subcommands, choices, help per flag); click or typer would change every
usage message and the help's layout for little less code. :class:`Parser`
bends argparse to the contract: a usage error is one line and exit code 2,
never a usage dump.

Each command group (:mod:`jobrun.cli.jobs`, :mod:`~jobrun.cli.queues`, ...)
adds its own commands through :class:`Commands`, which gives every command
the global options (valid before or after the subcommand) and, unless it is
a long-running process, ``--json``. The flags more than one group takes are
defined here beside their readers: the payload (``enqueue`` and ``schedules
add``), the job options, and the job filters with ``--state``.

A flag that overrides a setting says its default and its environment
variable in its help (:func:`setting_help`), both read from
:mod:`jobrun.config`, so the help cannot drift from the settings.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import enum
import functools
import importlib.metadata
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from jobrun.config import _ENV as _SETTINGS_ENV
from jobrun.config import Settings
from jobrun.job.errors import ValidationError
from jobrun.job.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    JSONValue,
    State,
)
from jobrun.job.validate import MAX_PAYLOAD_BYTES, payload_from_json

from .exits import UsageError

Command = Callable[[argparse.Namespace], int]
"""A command: the parsed arguments in, the exit code out."""

ENV_VARS: dict[str, str] = {field: var for var, (field, _parse) in _SETTINGS_ENV.items()}
"""The environment variable of each Settings field (jobrun.config's table)."""

MAX_PAYLOAD_FILE_BYTES = 4 * MAX_PAYLOAD_BYTES
"""--payload-file reads at most this much: room for indentation around a 1 MiB payload."""


CONNECTION_OPTIONS = frozenset(("database_url", "pooler", "direct_url", "schema"))
"""The global options that say where the database is."""
WRITER_OPTIONS = frozenset(("job_events", "notify_channel"))
"""The global options that matter only to a command that changes jobs or wakes workers."""
WRITERS = frozenset(
    (
        ("worker",),
        ("scheduler",),
        ("enqueue",),
        ("cancel",),
        ("retry",),
        ("signal",),
        ("dashboard",),
        ("demo",),
        ("queues", "resume"),
        ("queues", "limit"),
        ("queues", "unlimit"),
        ("workflows", "cancel"),
        ("workflows", "retry"),
    )
)
"""The commands that record job events or send wake-ups: their help shows WRITER_OPTIONS."""


def hidden_globals(path: tuple[str, ...]) -> frozenset[str]:
    """The global options a command's help leaves out: those that do nothing for it.

    They are still accepted (a script that passes ``--job-events`` to every
    command keeps working); ``jobrun --help`` shows them all.
    """
    if path[:1] in (("embedded",), ("completion",)):
        return CONNECTION_OPTIONS | WRITER_OPTIONS
    return frozenset() if path in WRITERS else WRITER_OPTIONS


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit code 2.

    ``help_hides`` names options (by dest) its help leaves out, though it
    accepts them: the global options irrelevant to the command.
    """

    help_hides: frozenset[str] = frozenset()

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def format_help(self) -> str:
        hidden = [a for a in self._actions if a.dest in self.help_hides]
        if not hidden:
            return super().format_help()
        # Actions are shared with the parents: suppressed only while this help is made.
        saved = [a.help for a in hidden]
        for action in hidden:
            action.help = argparse.SUPPRESS
        try:
            return super().format_help()
        finally:
            for action, text in zip(hidden, saved, strict=True):
                action.help = text


@dataclasses.dataclass(frozen=True)
class Commands:
    """Where a group of commands is added: ``jobrun``'s own, or ``jobrun queues``'s."""

    group: Any  # argparse's _SubParsersAction
    common: Parser
    """The global options, a parent of every command."""
    as_json: Parser
    """``--json``, a parent of every command that is not a long-running process."""
    path: tuple[str, ...] = ()
    """The command words before this group's: ``("queues",)`` for ``jobrun queues ...``."""

    def add(self, name: str, func: Command, help: str, *, json: bool) -> argparse.ArgumentParser:
        """A command running ``func``, with the global options and (``json``) --json."""
        parents = [self.common, self.as_json] if json else [self.common]
        p: argparse.ArgumentParser = self.group.add_parser(
            name, help=help, description=help, parents=parents, allow_abbrev=False
        )
        if isinstance(p, Parser):
            p.help_hides = hidden_globals((*self.path, name))
        p.set_defaults(func=func)
        return p

    def nest(self, name: str, help: str) -> Commands:
        """A command with actions of its own (``jobrun queues pause``): add them to the result."""
        p = self.group.add_parser(name, help=help, parents=[self.common], allow_abbrev=False)
        if isinstance(p, Parser):
            p.help_hides = hidden_globals((*self.path, name))
        group = p.add_subparsers(
            dest=f"{name}_command", metavar="ACTION", required=True, parser_class=Parser
        )
        return dataclasses.replace(self, group=group, path=(*self.path, name))


def version() -> str:
    """The installed distribution's version, or ``jobrun.__version__`` in a source tree."""
    try:
        return importlib.metadata.version("jobrun")
    except importlib.metadata.PackageNotFoundError:
        import jobrun  # noqa: PLC0415 - already imported (this module lives in it)

        return jobrun.__version__


def _shown(value: object) -> str:
    """A Settings default as a user types it: 30s, 7d, off, emails=4,default."""
    if value is None or value is False:
        return "off"
    if value is True:
        return "on"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, dt.timedelta):
        ms = round(value.total_seconds() * 1000)
        for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
            if ms % size == 0:
                return f"{ms // size}{unit}"
        return f"{ms}ms"
    if isinstance(value, dict):
        return ",".join(k if v is None else f"{k}={v}" for k, v in value.items())
    return str(value)


@functools.cache
def _defaults() -> Settings:
    return Settings()


def setting_help(text: str, field: str, default: str | None = None) -> str:
    """Help for a flag that overrides a setting: its default and its environment variable."""
    if default is None:
        default = _shown(getattr(_defaults(), field))
    return f"{text} (default: {default}; env {ENV_VARS[field]})"


def global_options() -> Parser:
    """Options valid before or after any subcommand (SUPPRESS: absent unless given)."""
    p = Parser(add_help=False, allow_abbrev=False)
    g = p.add_argument_group("global options")
    g.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=setting_help("PostgreSQL URL", "database_url", "the embedded PostgreSQL"),
    )
    g.add_argument(
        "--pooler",
        choices=("auto", "none", "session", "transaction"),
        type=str.lower,
        default=argparse.SUPPRESS,
        help=setting_help(
            "what the database URL goes through: a PgBouncer-style pooler in session or "
            "transaction mode, none, or auto (detect; a pooler found counts as transaction)",
            "pooler",
        ),
    )
    g.add_argument(
        "--direct-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=setting_help(
            "a URL to PostgreSQL itself, not the pooler, for LISTEN, the leader's lock and "
            "migrations",
            "direct_url",
            "none",
        ),
    )
    g.add_argument(
        "--schema",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=setting_help("the PostgreSQL schema jobrun's tables live in", "schema"),
    )
    g.add_argument(
        "--job-events",
        choices=("all", "terminal"),
        type=str.lower,
        default=argparse.SUPPRESS,
        help=setting_help("which job events to record: all, or terminal only", "job_events"),
    )
    g.add_argument(
        "--notify-channel",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=setting_help("LISTEN/NOTIFY channel", "notify_channel"),
    )
    return p


def json_option() -> Parser:
    """``--json``, as a parent parser."""
    p = Parser(add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    return p


# -- flags more than one group takes, and their readers -----------------------------------


def payload_options(p: argparse.ArgumentParser) -> None:
    """PAYLOAD_JSON or --payload-file (read by :func:`parse_payload`)."""
    p.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="the payload as JSON (default: {})"
    )
    p.add_argument(
        "--payload-file",
        metavar="PATH",
        help="read the payload JSON from a file, or '-' for stdin (instead of PAYLOAD_JSON)",
    )


def parse_payload(args: argparse.Namespace) -> JSONValue:
    """PAYLOAD_JSON or --payload-file, parsed; the rules are validate.payload's (run by NewJob)."""
    if args.payload_file is not None:
        if args.payload is not None:
            raise UsageError("give the payload as PAYLOAD_JSON or --payload-file, not both")
        return payload_from_json(_read_payload_file(args.payload_file))
    if args.payload is None:
        return {}
    return payload_from_json(args.payload)


def _read_payload_file(path: str) -> bytes:
    limit = MAX_PAYLOAD_FILE_BYTES
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
    except OSError as exc:
        raise ValidationError("--payload-file", f"cannot read {path!r}: {exc.strerror}") from None
    if len(data) > limit:
        raise ValidationError(
            "payload", f"{'stdin' if path == '-' else repr(path)} holds more than {limit} bytes"
        )
    return data


def job_options(p: argparse.ArgumentParser) -> None:
    """--queue, --priority and --max-attempts of a new job (or of a schedule's jobs)."""
    p.add_argument(
        "--queue", default=DEFAULT_QUEUE, metavar="Q", help=f"the queue (default: {DEFAULT_QUEUE})"
    )
    p.add_argument(
        "--priority",
        type=int,
        default=DEFAULT_PRIORITY,
        metavar="N",
        help=f"lower runs first (default: {DEFAULT_PRIORITY})",
    )
    p.add_argument(
        "--max-attempts",
        type=int,
        default=DEFAULT_MAX_ATTEMPTS,
        metavar="N",
        help=f"attempts before the job is dead (default: {DEFAULT_MAX_ATTEMPTS})",
    )


def job_filters(p: argparse.ArgumentParser) -> None:
    """--queue, --state (read by :func:`parse_state`) and --type, which select jobs."""
    p.add_argument("--queue", metavar="Q", help="only jobs in this queue")
    p.add_argument(
        "--state",
        metavar="S",
        help="only jobs in this state: queued, leased, succeeded, dead, cancelled",
    )
    p.add_argument("--type", metavar="T", help="only jobs of this type")


def parse_state(text: str) -> State:
    """A --state as typed: any case, surrounding blanks ignored."""
    try:
        return State(text.strip().lower())
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise ValidationError("--state", f"unknown state {text!r} (one of {names})") from None
