"""The ``jobrun`` command: run workers, enqueue, inspect and administer jobs.

::

    jobrun --version            (also: python -m jobrun ...)
    jobrun migrate [--sql]
    jobrun worker --app myapp.jobs:registry [--queues emails=4,default] [--concurrency N] ...
    jobrun scheduler [--app MODULE:REGISTRY]
    jobrun enqueue TYPE [PAYLOAD_JSON | --payload-file PATH|-] [--queue Q] [--priority N]
                   [--max-attempts N] [--delay 30s] [--key KEY] [--concurrency-key KEY]
    jobrun get ID
    jobrun list [--queue Q] [--state S] [--type T] [--limit N] [--before ID]   (newest first)
    jobrun list --oldest | --after ID [...]                                   (oldest first)
    jobrun events ID | depth
    jobrun cancel ID | cancel --state S [--queue Q] [--type T]
    jobrun retry ID  | retry --state dead [--queue Q] [--type T]
    jobrun queues pause Q | resume Q | list
    jobrun queues limit Q [CONCURRENCY] [--per-key K] [--rate 100/s]
                        [--no-concurrency] [--no-per-key] [--no-rate]
    jobrun queues unlimit Q
    jobrun purge --older-than 30d
    jobrun schedules add ID CRON TYPE [PAYLOAD_JSON | --payload-file PATH|-] [--tz ZONE]
                         [--replace] [--app MODULE:REGISTRY] ...
    jobrun schedules list | remove ID | pause ID | resume ID
    jobrun demo [...]
    jobrun dashboard [--bind 127.0.0.1:8080] [--read-only]
    jobrun embedded start | status | stop

Global options (``--database-url``, ``--schema``, ``--job-events``,
``--notify-channel``) may be given before or after the subcommand. Without ``--database-url`` the
command reads ``DATABASE_URL``, and without that it starts (or reuses) the
embedded PostgreSQL, saying so on stderr (one line: its URL and where its data
lives). That cluster belongs to the invoking user (``$JOBRUN_EMBEDDED_DIR``, or
a per-user default, see :func:`jobrun.postgres.embedded.default_home`) and
keeps its URL across ``jobrun embedded stop``. Every other setting comes from the
environment (see :mod:`jobrun.config`), overridden by the flags given.

``--schema`` (``JOBRUN_SCHEMA``, default ``jobrun``) is the PostgreSQL schema
every jobrun object lives in; ``jobrun migrate`` creates it, and ``jobrun
migrate --sql`` prints the DDL instead of applying it (no connection made),
for teams that apply DDL through Alembic, Django, Flyway or a review. Every
command but ``migrate`` checks the schema's version once at start and stops
with exit code 8 when it is missing, older or newer than this jobrun.

``jobrun worker`` and ``jobrun scheduler`` log on stderr (see
:mod:`jobrun.worker.logs`): ``--log-level`` (default info), ``--log-format
text|json`` (``JOBRUN_LOG_FORMAT``; json is one object per line, for log
shippers) and ``--log-success debug|info`` (``JOBRUN_LOG_SUCCESS``: the level
of each job's "succeeded" line: info by default, so a person watching sees
every job; debug keeps a busy worker's log to failures). A worker starts with a
banner (version, database, queues, concurrency, job types), then logs one
line per job outcome, each naming the job's id, type and attempt. ``jobrun
get`` shows a job's result (a handler's return value), and its concurrency
key, snoozes and progress when it has them.

``jobrun queues limit`` sets a queue's limits in the database, which every
worker applies to its claims (see :meth:`jobrun.postgres.store.Store.set_queue_limits`
for the guarantees): the limits named replace the queue's, the others are
kept (read, then set: two people changing one queue's limits at the same
instant can lose one change), ``--no-...`` removes one, and it prints the
queue's limits. ``jobrun queues unlimit`` lifts them all; ``jobrun queues
list`` shows each queue's limits with what they hold (jobs leased, jobs
started in the rate window).

Both serve probes and metrics when asked (:mod:`jobrun.observe`):
``--metrics-port`` (``JOBRUN_METRICS_PORT``) serves Prometheus ``/metrics``
and ``/healthz`` and ``/readyz``; ``--health-port`` (``JOBRUN_HEALTH_PORT``)
the probes alone; port 0 takes a free port, and an INFO line at start says
where they are served. ``--tracing otel`` (``JOBRUN_TRACING``) traces
enqueues and jobs with OpenTelemetry, to the TracerProvider the ``--app``
module set up when imported.

``jobrun dashboard`` (``pip install 'jobrun[web]'``) serves the web dashboard
(:mod:`jobrun.web`) on 127.0.0.1:8080 unless told ``--bind HOST:PORT``;
any address but a loopback one needs ``JOBRUN_DASHBOARD_TOKEN``, which every
request must then carry (bearer token, or basic-auth password), or it
refuses to start (exit code 7). ``--read-only`` shows everything and allows
no action (see :mod:`jobrun.web.server`).

Output: tables for people (plain text, no colour codes, when stdout is not a
terminal; as wide as the terminal, or COLUMNS when set, else unlimited in a
pipe: ``jobrun list`` keeps one line per job with its full id, and drops
run_at and last_error when they do not fit), and with ``--json`` (accepted
by every command that is not a long-running process) JSON on stdout: objects
with stable keys, ISO-8601 UTC timestamps and UUIDs as strings; list commands
print an array.

Errors are one line on stderr, ``jobrun: <message>`` (never a password, and
never a traceback but one: at ``--log-level debug``, an ``--app`` that fails
to import shows its traceback above that line, the app's frames without
jobrun's or importlib's), with a distinct exit code:

===== ========================================================================
code  meaning
===== ========================================================================
0     ok
1     any other error
2     usage error (bad arguments)
3     not found (no such job or schedule)
4     conflict: the idempotency key is taken by a different job, or the
      schedule already exists
5     invalid state: the operation does not apply to the job's state
      (retry of a leased job, cancel of a finished one, bulk retry of leased jobs)
6     database unavailable (cannot connect, connection lost, outcome unknown)
7     validation error: bad input or bad configuration
8     the jobrun schema is missing, or at another version than this jobrun
      needs: run ``jobrun migrate`` (or upgrade jobrun when it is newer)
130   interrupted (Ctrl-C during a short command)
128+N ``jobrun worker`` or ``jobrun scheduler`` stopped by signal N before its
      work was done: while starting (importing the app, opening its pools),
      or by a second signal that cut the graceful drain short (143 for
      SIGTERM, 130 for SIGINT; see :mod:`jobrun.worker.stop_signals`). A graceful
      stop (one signal, drained) exits 0.
===== ========================================================================
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import enum
import functools
import importlib
import importlib.metadata
import io
import itertools
import json
import math
import os
import re
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import psycopg
from psycopg_pool import PoolTimeout
from rich.console import Console
from rich.table import Table
from rich.text import Text

from jobrun.client import Client
from jobrun.config import _ENV as _SETTINGS_ENV
from jobrun.config import TRACING_MODES, Settings, parse_duration
from jobrun.job import validate
from jobrun.job.errors import (
    AlreadyExists,
    IdempotencyConflict,
    InvalidState,
    NotFound,
    OutcomeUnknown,
    SchemaMismatch,
    TransientError,
    ValidationError,
)
from jobrun.job.model import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_PRIORITY,
    DEFAULT_QUEUE,
    KEEP,
    MAX_LIMIT,
    Backoff,
    Event,
    Job,
    JSONValue,
    Keep,
    NewJob,
    QueueDepth,
    QueueLimits,
    RateLimit,
    Schedule,
    ScheduleSpec,
    State,
)
from jobrun.job.validate import MAX_PAYLOAD_BYTES, payload_from_json, redact
from jobrun.postgres import dsn, embedded
from jobrun.postgres.pool import conninfo_with
from jobrun.postgres.store import MAX_LIST_LIMIT
from jobrun.postgres.web import MAX_PAGE as WEB_MAX_PAGE
from jobrun.postgres.web import DashboardReads, JobFilter
from jobrun.worker import logs as worker_logs
from jobrun.worker.stop_signals import Interrupted, StopSignals

if TYPE_CHECKING:
    from jobrun.runtime import Runtime
    from jobrun.worker.registry import Registry

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_INVALID_STATE = 5
EXIT_UNAVAILABLE = 6
EXIT_VALIDATION = 7
EXIT_SCHEMA = 8
EXIT_INTERRUPTED = 130
EXIT_SIGNALLED = 128
"""Plus the signal's number: a worker or scheduler stopped by a signal before its work was done."""

PROG = "jobrun"
DASHBOARD_BIND = "127.0.0.1:8080"
DASHBOARD_TOKEN_ENV = "JOBRUN_DASHBOARD_TOKEN"  # noqa: S105 - the variable's name
BULK_PAGE = 500
"""Jobs fetched per page by the bulk ``cancel`` and ``retry``."""
LIST_LIMIT = 100
"""Jobs ``jobrun list`` shows unless told ``--limit``."""
ERROR_WIDTH = 60
"""last_error is cut to this many characters in job tables."""

_ERROR_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    (NotFound, EXIT_NOT_FOUND),
    ((IdempotencyConflict, AlreadyExists), EXIT_CONFLICT),
    (InvalidState, EXIT_INVALID_STATE),
    ((TransientError, OutcomeUnknown, psycopg.OperationalError, PoolTimeout), EXIT_UNAVAILABLE),
    (ValidationError, EXIT_VALIDATION),
    (SchemaMismatch, EXIT_SCHEMA),
)


class CommandError(Exception):
    """A failure the command itself detected, with the exit code to end with.

    ``details`` (a traceback) go on stderr before the one line, at
    ``--log-level debug`` only: the one line stays the message by default.
    """

    def __init__(self, message: str, code: int = EXIT_ERROR, *, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.details = details


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(f"{message} (see '{self.prog} --help')")


# -- entry point --------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``jobrun`` command; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        if extras and getattr(args, "command", None) != "demo":
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        args.extras = extras
        if getattr(args, "func", None) is None:
            parser.error("a command is required")
    except _UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except SystemExit as exc:  # jobrun demo --help
        return exc.code if isinstance(exc.code, int) else EXIT_OK
    except _UsageError as exc:
        return _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    except Interrupted as exc:  # a worker or scheduler stopped by a signal while it started
        return _fail(str(exc), EXIT_SIGNALLED + exc.signum)
    except Exception as exc:  # noqa: BLE001 - the one place every error becomes a line and a code
        message = _message(exc)
        if isinstance(exc, CommandError) and exc.details and hasattr(args, "log_level"):
            if args.log_level == "debug":
                sys.stderr.write(redact(exc.details))
            else:
                message += " (--log-level debug shows where)"
        return _fail(message, exit_code(exc))


def exit_code(exc: BaseException) -> int:
    """The exit code for an error (see the module docstring)."""
    if isinstance(exc, CommandError):
        return exc.code
    for kinds, code in _ERROR_CODES:
        if isinstance(exc, kinds):
            return code
    return EXIT_ERROR


def _message(exc: BaseException) -> str:
    known = isinstance(exc, CommandError) or any(isinstance(exc, k) for k, _ in _ERROR_CODES)
    text = str(exc).strip()
    if not known or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def _fail(message: str, code: int) -> int:
    one_line = " ".join(redact(message).split())
    sys.stderr.write(f"{PROG}: {one_line}\n")
    sys.stderr.flush()
    return code


# -- the parser ---------------------------------------------------------------------------

ENV_VARS: dict[str, str] = {field: var for var, (field, _parse) in _SETTINGS_ENV.items()}
"""The environment variable of each Settings field (jobrun.config's table)."""


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


def _setting_help(text: str, field: str, default: str | None = None) -> str:
    """Help for a flag that overrides a setting: its default and its environment variable."""
    if default is None:
        default = _shown(getattr(_defaults(), field))
    return f"{text} (default: {default}; env {ENV_VARS[field]})"


def _global_options() -> _Parser:
    """Options valid before or after any subcommand (SUPPRESS: absent unless given)."""
    p = _Parser(add_help=False, allow_abbrev=False)
    g = p.add_argument_group("global options")
    g.add_argument(
        "--database-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=_setting_help("PostgreSQL URL", "database_url", "the embedded PostgreSQL"),
    )
    g.add_argument(
        "--pooler",
        choices=("auto", "none", "session", "transaction"),
        type=str.lower,
        default=argparse.SUPPRESS,
        help=_setting_help(
            "what the database URL goes through: a PgBouncer-style pooler in session or "
            "transaction mode, none, or auto (detect; a pooler found counts as transaction)",
            "pooler",
        ),
    )
    g.add_argument(
        "--direct-url",
        metavar="URL",
        default=argparse.SUPPRESS,
        help=_setting_help(
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
        help=_setting_help("the PostgreSQL schema jobrun's tables live in", "schema"),
    )
    g.add_argument(
        "--job-events",
        choices=("all", "terminal"),
        type=str.lower,
        default=argparse.SUPPRESS,
        help=_setting_help("which job events to record: all, or terminal only", "job_events"),
    )
    g.add_argument(
        "--notify-channel",
        metavar="NAME",
        default=argparse.SUPPRESS,
        help=_setting_help("LISTEN/NOTIFY channel", "notify_channel"),
    )
    return p


def _json_option() -> _Parser:
    p = _Parser(add_help=False, allow_abbrev=False)
    p.add_argument("--json", action="store_true", help="print JSON on stdout")
    return p


def build_parser() -> argparse.ArgumentParser:
    common = _global_options()
    as_json = _json_option()
    parser = _Parser(
        prog=PROG,
        description="A durable background-job system on PostgreSQL.",
        parents=[common],
        allow_abbrev=False,
        epilog="exit codes: 0 ok, 1 error, 2 usage, 3 not found, 4 conflict, "
        "5 invalid state, 6 database unavailable, 7 validation, 8 schema missing or "
        "at another version (run jobrun migrate)",
    )
    parser.add_argument(
        "--version", action="version", version=f"{PROG} {version()}", help="print the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    def command(
        group: Any, name: str, func: Callable[[argparse.Namespace], int], help: str, *, json: bool
    ) -> argparse.ArgumentParser:
        parents = [common, as_json] if json else [common]
        p: argparse.ArgumentParser = group.add_parser(
            name, help=help, description=help, parents=parents, allow_abbrev=False
        )
        p.set_defaults(func=func)
        return p

    p = command(sub, "migrate", cmd_migrate, "apply pending schema migrations", json=True)
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the schema's DDL on stdout instead (connects nowhere), "
        "for Alembic, Django, Flyway or a review",
    )

    p = command(sub, "worker", cmd_worker, "run a worker (and a scheduler candidate)", json=False)
    p.add_argument(
        "--app",
        required=True,
        metavar="MODULE:REGISTRY",
        help="the handlers, like myapp.jobs:registry (required)",
    )
    p.add_argument(
        "--queues",
        metavar="SPEC",
        help=_setting_help("the queues to work: a,b, or emails=4,default for limits", "queues"),
    )
    p.add_argument(
        "--concurrency", type=int, metavar="N", help=_setting_help("handler threads", "concurrency")
    )
    p.add_argument("--no-scheduler", action="store_true", help="do not run the scheduler")
    for flag, what in (
        ("lease-ttl", "how long a claim lasts without a heartbeat"),
        ("heartbeat-interval", "how often running jobs' leases are extended"),
        ("poll-interval", "how often to look for jobs when no notification comes"),
        ("shutdown-grace", "on SIGTERM, how long running jobs may finish before cancel"),
    ):
        p.add_argument(
            f"--{flag}", metavar="DURATION", help=_setting_help(what, flag.replace("-", "_"))
        )
    p.add_argument(
        "--commit-timeout",
        metavar="DURATION",
        help=_setting_help("statement timeout when completing a job, or off", "commit_timeout"),
    )
    p.add_argument(
        "--call-timeout",
        metavar="DURATION",
        help=_setting_help("client-side bound of a database call, or off", "call_timeout"),
    )
    p.add_argument(
        "--no-notifications",
        action="store_true",
        help=_setting_help("poll only, no LISTEN/NOTIFY", "notifications", "notifications on"),
    )
    _retention_options(p)
    _observe_options(p)
    _log_option(p)

    p = command(sub, "scheduler", cmd_scheduler, "run the scheduler only", json=False)
    p.add_argument(
        "--app", metavar="MODULE[:REGISTRY]", help="import this module first (for side effects)"
    )
    _retention_options(p)
    _observe_options(p)
    _log_option(p)

    p = command(sub, "enqueue", cmd_enqueue, "enqueue a job; prints its id", json=True)
    p.add_argument("type", metavar="TYPE", help="the job type (a handler's name)")
    _payload_options(p)
    _job_options(p)
    p.add_argument(
        "--delay",
        metavar="DURATION",
        help="run later: 30s, 5m, 2h, 1d or plain seconds like 300 (default: now)",
    )
    p.add_argument("--key", metavar="KEY", help="idempotency key (unique per queue)")
    p.add_argument(
        "--concurrency-key",
        metavar="KEY",
        help="what the queue's per-key limit counts the job under: a tenant, an account "
        "(default: none, only the queue's own limits apply)",
    )

    p = command(sub, "get", cmd_get, "show one job", json=True)
    p.add_argument("id", metavar="ID", help="the job id (as enqueue and list print it)")

    p = command(sub, "list", cmd_list, "list jobs, newest first", json=True)
    _filters(p)
    p.add_argument(
        "--limit",
        type=int,
        default=LIST_LIMIT,
        metavar="N",
        help=f"how many jobs to show (default: {LIST_LIMIT})",
    )
    p.add_argument("--before", metavar="ID", help="the next page: jobs older than this id")
    p.add_argument("--oldest", action="store_true", help="oldest first (pages with --after)")
    p.add_argument("--after", metavar="ID", help="jobs newer than this id, oldest first")

    p = command(sub, "events", cmd_events, "a job's audit trail", json=True)
    p.add_argument("id", metavar="ID", help="the job id")

    command(sub, "depth", cmd_depth, "jobs per queue and state; paused queues", json=True)

    for name, func, what in (
        ("cancel", cmd_cancel, "cancel a job, or every job matching --state"),
        ("retry", cmd_retry, "run a job again now, or every job matching --state"),
    ):
        p = command(sub, name, func, what, json=True)
        p.add_argument(
            "id", metavar="ID", nargs="?", help="the job id (or none, and --state for many)"
        )
        _filters(p)

    queues = sub.add_parser(
        "queues",
        help="pause, resume, limit and list queues",
        parents=[common],
        allow_abbrev=False,
    )
    qsub = queues.add_subparsers(dest="queues_command", metavar="ACTION", required=True)
    for name, func, what in (
        ("pause", cmd_queue_pause, "stop workers claiming from a queue"),
        ("resume", cmd_queue_resume, "let workers claim from a queue again"),
    ):
        p = command(qsub, name, func, what, json=True)
        p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    p = command(
        qsub,
        "limit",
        cmd_queue_limit,
        "set a queue's limits, for every worker: the ones given are replaced, the others "
        "kept; prints the queue's limits",
        json=True,
    )
    p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    p.add_argument(
        "concurrency",
        metavar="CONCURRENCY",
        nargs="?",
        help="at most this many of its jobs running at once, across every worker "
        "(default: unchanged)",
    )
    p.add_argument(
        "--per-key",
        metavar="K",
        help="at most K running at once with the same concurrency key (default: unchanged)",
    )
    p.add_argument(
        "--rate",
        metavar="JOBS/PERIOD",
        help="at most this many started in any window of the period, like 100/s, 10/min, "
        "5/10s, 1000/h (default: unchanged)",
    )
    # dest drop_*: "no_concurrency" would read as the worker's --concurrency setting.
    for flag, what in (
        ("concurrency", "the concurrency limit"),
        ("per-key", "the per-key limit"),
        ("rate", "the rate limit"),
    ):
        p.add_argument(
            f"--no-{flag}",
            dest=f"drop_{flag.replace('-', '_')}",
            action="store_true",
            help=f"remove {what}",
        )
    p = command(qsub, "unlimit", cmd_queue_unlimit, "lift every limit of a queue", json=True)
    p.add_argument("queue", metavar="QUEUE", help="the queue's name")
    command(
        qsub,
        "list",
        cmd_queue_list,
        "known queues: paused or not, their limits and what they hold",
        json=True,
    )

    p = command(sub, "purge", cmd_purge, "delete finished jobs; prints the count", json=True)
    p.add_argument(
        "--older-than",
        required=True,
        metavar="DURATION",
        help="delete jobs finished longer ago than this, like 7d (required)",
    )

    schedules = sub.add_parser(
        "schedules", help="cron schedules", parents=[common], allow_abbrev=False
    )
    ssub = schedules.add_subparsers(dest="schedules_command", metavar="ACTION", required=True)
    p = command(ssub, "add", cmd_schedule_add, "create a schedule", json=True)
    p.add_argument("id", metavar="ID", help="the schedule's id, like nightly-report")
    p.add_argument(
        "cron",
        metavar="CRON",
        help="'minute hour day month weekday' (6 fields: seconds first), "
        "or @hourly, @daily, @weekly, @monthly, @yearly",
    )
    p.add_argument("type", metavar="TYPE", help="the job type each run enqueues")
    _payload_options(p)
    p.add_argument(
        "--tz",
        default="UTC",
        metavar="ZONE",
        help="IANA time zone, like Europe/Paris (default: UTC)",
    )
    _job_options(p)
    p.add_argument("--replace", action="store_true", help="replace the schedule if the id exists")
    p.add_argument(
        "--app",
        metavar="MODULE:REGISTRY",
        help="the handlers: warn when none of them handles TYPE",
    )
    command(ssub, "list", cmd_schedule_list, "list schedules", json=True)
    for name, func, what in (
        ("remove", cmd_schedule_remove, "delete a schedule"),
        ("pause", cmd_schedule_pause, "stop a schedule enqueuing"),
        ("resume", cmd_schedule_resume, "resume a schedule from its next occurrence"),
    ):
        p = command(ssub, name, func, what, json=True)
        p.add_argument("id", metavar="ID", help="the schedule's id")

    # The demo's own options are added by jobrun.demo, imported only when run.
    p = sub.add_parser(
        "demo",
        help="run the demo (jobrun demo --help for its options)",
        parents=[common],
        add_help=False,
        allow_abbrev=False,
    )
    p.set_defaults(func=cmd_demo)

    p = command(
        sub,
        "dashboard",
        cmd_dashboard,
        "serve the web dashboard (needs pip install 'jobrun[web]')",
        json=False,
    )
    p.add_argument(
        "--bind",
        default=DASHBOARD_BIND,
        metavar="HOST:PORT",
        help=f"where to listen, port 0 for any free port (default: {DASHBOARD_BIND}); any "
        f"address but loopback needs {DASHBOARD_TOKEN_ENV}, a token every request must "
        "then carry as bearer token or basic-auth password (once set, it is required on "
        "loopback too)",
    )
    p.add_argument("--read-only", action="store_true", help="show everything, allow no action")

    emb = sub.add_parser(
        "embedded", help="the embedded PostgreSQL", parents=[common], allow_abbrev=False
    )
    esub = emb.add_subparsers(dest="embedded_command", metavar="ACTION", required=True)
    p = command(esub, "start", cmd_embedded_start, "start it (if needed), print its URL", json=True)
    p.add_argument(
        "--url",
        action="store_true",
        help='print only the URL, for export DATABASE_URL="$(jobrun embedded start --url)"',
    )
    command(esub, "status", cmd_embedded_status, "whether it runs, and its URL", json=True)
    command(esub, "stop", cmd_embedded_stop, "stop it", json=True)
    return parser


def _payload_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "payload", metavar="PAYLOAD_JSON", nargs="?", help="the payload as JSON (default: {})"
    )
    p.add_argument(
        "--payload-file",
        metavar="PATH",
        help="read the payload JSON from a file, or '-' for stdin (instead of PAYLOAD_JSON)",
    )


def _job_options(p: argparse.ArgumentParser) -> None:
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


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", metavar="Q", help="only jobs in this queue")
    p.add_argument(
        "--state",
        metavar="S",
        help="only jobs in this state: queued, leased, succeeded, dead, cancelled",
    )
    p.add_argument("--type", metavar="T", help="only jobs of this type")


def _retention_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retention",
        metavar="DURATION",
        help=_setting_help("keep finished jobs this long, or off", "retention"),
    )
    p.add_argument(
        "--events-retention",
        metavar="DURATION",
        help=_setting_help("keep job events this long, or off", "events_retention"),
    )


def _observe_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help=_setting_help(
            "serve Prometheus /metrics (and /healthz, /readyz) on this port, 0 for any free "
            "port; needs pip install 'jobrun[metrics]'",
            "metrics_port",
        ),
    )
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help=_setting_help(
            "serve /healthz and /readyz on this port, 0 for any free port",
            "health_port",
            "off, or the metrics port when that is set",
        ),
    )
    p.add_argument(
        "--observe-host",
        metavar="HOST",
        help=_setting_help("the address the metrics and health server listens on", "observe_host"),
    )
    p.add_argument(
        "--health-stale-after",
        metavar="DURATION",
        help=_setting_help(
            "/healthz fails after this long without a successful claim or heartbeat",
            "health_stale_after",
            "2x the lease TTL, at least 3 poll intervals",
        ),
    )
    p.add_argument(
        "--tracing",
        type=str.lower,
        choices=TRACING_MODES,
        help=_setting_help(
            "otel: OpenTelemetry spans for enqueues and jobs (needs pip install "
            "'jobrun[otel]'; the app sets the TracerProvider up on import)",
            "tracing",
        ),
    )


def _observe_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The observability flags but --tracing, as Settings overrides (None: not given)."""
    return {
        "metrics_port": args.metrics_port,
        "health_port": args.health_port,
        "observe_host": args.observe_host,
        "health_stale_after": _optional_duration(args.health_stale_after, "--health-stale-after"),
    }


def _with_tracing(settings: Settings, args: argparse.Namespace) -> Settings:
    """``--tracing`` applied: not through settings_from, where the string "off" means None."""
    if args.tracing is None:
        return settings
    return dataclasses.replace(settings, tracing=args.tracing)


def _log_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=("debug", "info", "warning", "error"),
        help="stderr log level (default: info)",
    )
    p.add_argument(
        "--log-format",
        type=str.lower,
        choices=worker_logs.LOG_FORMATS,
        help="stderr log lines: text for people, json (one object per line) for log "
        f"shippers (default: text; env {LOG_FORMAT_ENV})",
    )
    p.add_argument(
        "--log-success",
        type=str.lower,
        choices=tuple(worker_logs.SUCCESS_LEVELS),
        help="the level of each job's 'succeeded' line: debug (shown with --log-level "
        f"debug) or info (default: info; env {LOG_SUCCESS_ENV})",
    )


# -- settings, database, output -----------------------------------------------------------


def _optional_duration(text: str | None, flag: str) -> dt.timedelta | None:
    if text is None:
        return None
    return parse_duration(text, flag)


def _is_off(text: str | None) -> bool:
    return text is not None and text.strip().lower() in ("off", "none", "forever")


def settings_from(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings.from_env(os.environ) with the flags that were given applied.

    ``overrides`` hold parsed flag values (None: not given). A string value
    ``"off"`` for an optional duration switches it off (from_env cannot take
    None as an override, so that is applied afterwards).
    """
    switched_off: dict[str, Any] = {
        k: None for k, v in overrides.items() if isinstance(v, str) and _is_off(v)
    }
    given = {k: v for k, v in overrides.items() if k not in switched_off}
    settings = Settings.from_env(
        os.environ,
        database_url=getattr(args, "database_url", None),
        pooler=getattr(args, "pooler", None),
        direct_url=getattr(args, "direct_url", None),
        job_events=getattr(args, "job_events", None),
        notify_channel=getattr(args, "notify_channel", None),
        schema=getattr(args, "schema", None),
        **given,
    )
    if switched_off:
        settings = dataclasses.replace(settings, **switched_off)
    return settings


def database_url(settings: Settings) -> str:
    """The flag, DATABASE_URL, or the embedded PostgreSQL; checked for syntax."""
    from jobrun.runtime import resolve_database_url  # noqa: PLC0415 - heavy, not for every command

    try:
        url = resolve_database_url(settings, say=_announce)
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    conninfo_with(url)  # ValidationError for an unparseable string, without the password
    for secret in dsn.secrets(url):  # masked in every log line from now on
        if secret not in _LOG_SECRETS:
            _LOG_SECRETS.append(secret)
    return dsn.normalize(url)  # SQLAlchemy's postgresql+psycopg:// and kin, as libpq reads them


def _announce(line: str) -> None:
    """The embedded fallback's line on stderr: a command says what it did, in one line."""
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()


@contextlib.contextmanager
def open_client(args: argparse.Namespace) -> Iterator[Client]:
    """A client on the settings and flags, its schema version checked (SchemaMismatch: exit 8)."""
    settings = settings_from(args)
    url = database_url(settings)
    with Client.connect(
        url, settings=settings, pool_size=1, application_name="jobrun-cli"
    ) as client:
        yield client


def to_json(value: Any) -> Any:
    """A JSON-ready copy: dataclasses as objects (field order), UTC ISO timestamps, UUID strings."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Backoff):
        return value.to_json()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(to_json(value), indent=2, ensure_ascii=False) + "\n")


def _say(text: str) -> None:
    sys.stdout.write(text + "\n")


PIPE_WIDTH = 1000
"""Columns of a table when stdout is not a terminal and COLUMNS is not set: no wrapping."""


def output_width() -> int:
    """The columns tables fit in: the terminal's (COLUMNS first, as rich reads it).

    When stdout is not a terminal: COLUMNS when set, else :data:`PIPE_WIDTH`.
    """
    if sys.stdout.isatty():
        return console().width
    columns = os.environ.get("COLUMNS", "").strip()
    return int(columns) if columns.isdigit() and int(columns) > 0 else PIPE_WIDTH


def console() -> Console:
    """Rich on stdout; plain text (no colour, no wrapping at 80 columns) when not a terminal."""
    out = sys.stdout
    tty = out.isatty()
    return Console(
        file=out,
        color_system="auto" if tty else None,
        force_terminal=tty,
        width=None if tty else output_width(),
        highlight=False,
        markup=False,
        emoji=False,
    )


def _print_table(table: Table) -> None:
    """A table on stdout; when not a terminal, plain lines without trailing blanks."""
    if sys.stdout.isatty():
        console().print(table)
        return
    buffer = io.StringIO()
    Console(
        file=buffer,
        color_system=None,
        force_terminal=False,
        width=output_width(),
        highlight=False,
        markup=False,
        emoji=False,
    ).print(table)
    sys.stdout.write("".join(line.rstrip() + "\n" for line in buffer.getvalue().splitlines()))


def _jobs(count: int) -> str:
    return f"{count} job" if count == 1 else f"{count} jobs"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return ""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _compact(value: JSONValue) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _cut(text: str | None, width: int = ERROR_WIDTH) -> str:
    if not text:
        return ""
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def _table(*columns: str, caption: str | None = None) -> Table:
    table = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1),  # two spaces between columns: 80 columns go further
        header_style="bold",
        caption=caption,
        caption_justify="left",
    )
    for name in columns:
        table.add_column(name, no_wrap=name in ("id", "run_at", "at", "next_run_at"))
    return table


def _row(table: Table, *cells: object) -> None:
    table.add_row(*(Text("" if c is None else str(c)) for c in cells))


JOB_COLUMNS = ("id", "queue", "type", "state", "attempts", "run_at", "last_error")
_REQUIRED_JOB_COLUMNS = 5
"""id, queue, type, state and attempts are always shown; run_at and last_error when they fit."""
_MIN_NAME_WIDTH = 8
"""queue and type are cut (with an ellipsis) to no fewer columns than this."""
_MIN_ERROR_WIDTH = 12


def _jobs_table(jobs: Sequence[Job], width: int) -> Table:
    """One line per job within ``width`` columns, the full id first (for ``jobrun get``).

    queue, type, state and attempts always come next (queue and type cut with an
    ellipsis when the names are long); run_at and then last_error when room is left.
    """
    rows = [
        (
            str(job.id),
            job.queue,
            job.type,
            "cancelling" if job.cancel_requested and job.state == State.LEASED else str(job.state),
            f"{job.attempts}/{job.max_attempts}",
            _when(job.run_at),
            _cut(job.last_error),
        )
        for job in jobs
    ]
    gap = 2
    headers = list(JOB_COLUMNS)
    widths = [max([len(name), *(len(row[i]) for row in rows)]) for i, name in enumerate(headers)]
    shown = list(range(_REQUIRED_JOB_COLUMNS))

    def used() -> int:
        return sum(widths[i] for i in shown) + gap * (len(shown) - 1)

    queue, type_, attempts = 1, 2, 4
    if used() > width:  # first a shorter header: the counts are narrower than "attempts"
        headers[attempts] = "tries"
        widths[attempts] = max([len("tries"), *(len(row[attempts]) for row in rows)])
    while used() > width:  # cut the longer of queue and type, one column at a time
        longer = queue if widths[queue] >= widths[type_] else type_
        if widths[longer] <= _MIN_NAME_WIDTH:
            break  # a terminal this narrow wraps whatever is shown
        widths[longer] -= 1
    run_at, last_error = 5, 6
    if used() + gap + widths[run_at] <= width:
        shown.append(run_at)
    room = width - used() - gap
    if any(row[last_error] for row in rows) and room >= _MIN_ERROR_WIDTH:
        widths[last_error] = min(widths[last_error], room)
        shown.append(last_error)

    table = Table(
        box=None, show_edge=False, pad_edge=False, padding=(0, gap // 2), header_style="bold"
    )
    for i in shown:
        table.add_column(headers[i], width=widths[i], no_wrap=True, overflow="ellipsis")
    for row in rows:
        table.add_row(*(Text(row[i]) for i in shown))
    return table


def _job_details(job: Job) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    b = job.backoff
    rows: list[tuple[str, object]] = [
        ("id", job.id),
        ("queue", job.queue),
        ("type", job.type),
        ("state", job.state),
        ("attempts", f"{job.attempts} of {job.max_attempts}"),
        *([("snoozes", job.snoozes)] if job.snoozes else []),
        *([("progress", progress_text(job))] if job.progress is not None else []),
        ("priority", job.priority),
        ("payload", _compact(job.payload)),
        ("result", "" if job.result is None else _compact(job.result)),
        ("run_at", _when(job.run_at)),
        ("idempotency_key", job.idempotency_key or ""),
        *([("concurrency_key", job.concurrency_key)] if job.concurrency_key is not None else []),
        ("cancel_requested", "yes" if job.cancel_requested else "no"),
        ("lease_owner", job.lease_owner or ""),
        ("lease_expires_at", _when(job.lease_expires_at)),
        ("last_error", job.last_error or ""),
        ("backoff", f"{b.kind} base={b.base}s factor={b.factor} max={b.max_delay}s"),
        ("created_at", _when(job.created_at)),
        ("updated_at", _when(job.updated_at)),
        ("finished_at", _when(job.finished_at)),
    ]
    for key, value in rows:
        grid.add_row(Text(key), Text(str(value)))
    return grid


def percent(fraction: float) -> str:
    """A fraction done as people read it: 40%, 99.9% (never 100% before it is 1)."""
    tenths = math.floor(fraction * 1000 + 1e-9)
    return f"{tenths // 10}%" if tenths % 10 == 0 else f"{tenths / 10:.1f}%"


def progress_text(job: Job) -> str:
    """``40% at 2026-12-01T15:20:00Z: chunk 4 of 10`` (empty without progress)."""
    if job.progress is None:
        return ""
    text = percent(job.progress)
    if job.progress_at is not None:
        text += f" at {_when(job.progress_at)}"
    if job.progress_message:
        text += f": {' '.join(job.progress_message.split())}"
    return text


MAX_PAYLOAD_FILE_BYTES = 4 * MAX_PAYLOAD_BYTES
"""--payload-file reads at most this much: room for indentation around a 1 MiB payload."""


def _parse_payload(args: argparse.Namespace) -> JSONValue:
    """PAYLOAD_JSON or --payload-file, parsed; the rules are validate.payload's (run by NewJob)."""
    if args.payload_file is not None:
        if args.payload is not None:
            raise _UsageError("give the payload as PAYLOAD_JSON or --payload-file, not both")
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


def _parse_state(text: str) -> State:
    try:
        return State(text.strip().lower())
    except ValueError:
        names = ", ".join(s.value for s in State)
        raise ValidationError("--state", f"unknown state {text!r} (one of {names})") from None


# -- commands: schema and processes -------------------------------------------------------


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the migrations (never checking the version first: this is the fix), or print them."""
    from jobrun.postgres.migrate import migrate, migration_sql  # noqa: PLC0415 - yoyo is slow

    settings = settings_from(args)
    if args.sql:
        if args.json:
            raise _UsageError("migrate: --sql prints SQL, not JSON: give one of --sql and --json")
        sys.stdout.write(migration_sql(settings.schema))
        return EXIT_OK
    url = database_url(settings)
    pooler = settings.pooler
    if settings.direct_url:
        # DDL and the migration lock need a session: never through a transaction pooler.
        url, pooler = dsn.normalize(settings.direct_url), "none"
    applied = migrate(url, schema=settings.schema, pooler=pooler)
    if args.json:
        _print_json({"applied": applied})
    elif applied:
        for ident in applied:
            _say(f"applied {ident}")
    else:
        _say("up to date")
    return EXIT_OK


_LOG_SECRETS: list[str] = []
"""The secrets of the DSN in use, masked in every log line (see database_url)."""


LOG_FORMAT_ENV = "JOBRUN_LOG_FORMAT"
LOG_SUCCESS_ENV = "JOBRUN_LOG_SUCCESS"


def _log_choice(flag: str | None, env: str, choices: Sequence[str], default: str) -> str:
    """A logging option: the flag, else the environment variable (checked), else the default."""
    if flag is not None:
        return flag
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return default
    if text not in choices:
        raise ValidationError(env, f"{text!r}: expected one of {', '.join(choices)}")
    return text


def _configure_logging(
    level: str, log_format: str | None = None, success: str | None = None
) -> None:
    """Log lines on stderr, each through the redactor (a handler's error may quote a DSN).

    ``text`` (job id, type and attempt first on a job's lines) or ``json`` (one
    object per line), see :mod:`jobrun.worker.logs`; ``success`` is the level
    of the succeeded lines.
    """
    worker_logs.configure(
        level=level,
        log_format=_log_choice(log_format, LOG_FORMAT_ENV, worker_logs.LOG_FORMATS, "text"),
        success=_log_choice(success, LOG_SUCCESS_ENV, tuple(worker_logs.SUCCESS_LEVELS), "info"),
        known=_LOG_SECRETS,
    )


def load_app(spec: str, *, need_registry: bool = True) -> Any:
    """Import MODULE of ``MODULE:ATTR`` (the current directory first on sys.path) and return ATTR.

    With ``need_registry``, ATTR is required and must be a jobrun Registry.
    """
    from jobrun.worker.registry import Registry  # noqa: PLC0415

    module_name, _, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or (need_registry and not attr):
        raise ValidationError(
            "--app", f"{spec!r} is not MODULE:REGISTRY (like myapp.jobs:registry)"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ValidationError(
                "--app", f"no module named {module_name!r} (looked in {cwd} and sys.path)"
            ) from None
        raise CommandError(
            f"importing {module_name} failed: {exc}", details=app_traceback(exc)
        ) from None
    except Exception as exc:  # noqa: BLE001 - the application's own import error, reported
        raise CommandError(
            f"importing {module_name} failed: {type(exc).__name__}: {exc}",
            details=app_traceback(exc),
        ) from None
    if not attr:
        return None
    missing_attr = object()
    value = getattr(module, attr, missing_attr)
    if value is missing_attr:
        raise ValidationError("--app", f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(value, Registry):
        raise ValidationError(
            "--app", f"{module_name}:{attr} is a {type(value).__name__}, not a jobrun Registry"
        )
    return value


_IMPORT_MACHINERY = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # jobrun
    os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep,
)


def app_traceback(exc: BaseException) -> str:
    """The traceback of an app's import error, with the app's frames only.

    jobrun's and importlib's frames are the way into the app, the same for
    every app, and hide where it failed; they are left out (also between
    the app's own modules). Frames of the libraries the app called are kept.
    """
    shown = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [shown]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if not _import_machinery(frame.filename)]
        )
        todo.extend(p for p in (part.__cause__, part.__context__) if p is not None)
        todo.extend(part.exceptions or ())
    return "".join(shown.format())


def _import_machinery(filename: str) -> bool:
    if filename.startswith("<frozen importlib"):
        return True
    return os.path.abspath(filename).startswith(_IMPORT_MACHINERY)


def cmd_worker(args: argparse.Namespace) -> int:
    with StopSignals() as signals:  # first: a signal while it starts stops it there
        _worker_runtime(args).run()
    return _stopped(signals)


def _worker_runtime(args: argparse.Namespace) -> Runtime:
    from jobrun.runtime import Runtime  # noqa: PLC0415
    from jobrun.worker.worker import parse_queues  # noqa: PLC0415

    registry = load_app(args.app)
    settings = settings_from(
        args,
        queues=None if args.queues is None else parse_queues(args.queues),
        concurrency=args.concurrency,
        lease_ttl=_optional_duration(args.lease_ttl, "--lease-ttl"),
        heartbeat_interval=_optional_duration(args.heartbeat_interval, "--heartbeat-interval"),
        poll_interval=_optional_duration(args.poll_interval, "--poll-interval"),
        shutdown_grace=_optional_duration(args.shutdown_grace, "--shutdown-grace"),
        notifications=False if args.no_notifications else None,
        **_off_or_duration(args, "commit_timeout", "call_timeout", "retention", "events_retention"),
        **_observe_settings(args),
    )
    settings = _with_tracing(settings, args)
    _configure_logging(args.log_level, args.log_format, args.log_success)
    url = database_url(settings)
    return Runtime(settings, registry, database_url=url, scheduler=not args.no_scheduler)


def cmd_scheduler(args: argparse.Namespace) -> int:
    with StopSignals() as signals:  # first: a signal while it starts stops it there
        _scheduler_runtime(args).run()
    return _stopped(signals)


def _scheduler_runtime(args: argparse.Namespace) -> Runtime:
    from jobrun.runtime import Runtime  # noqa: PLC0415

    if args.app:
        load_app(args.app, need_registry=False)
    settings = settings_from(
        args,
        **_off_or_duration(args, "retention", "events_retention"),
        **_observe_settings(args),
    )
    settings = _with_tracing(settings, args)
    _configure_logging(args.log_level, args.log_format, args.log_success)
    url = database_url(settings)
    return Runtime(settings, None, database_url=url, worker=False)


def _stopped(signals: StopSignals) -> int:
    """A process's exit code once run() returned: 0 drained, 128 + the signal that cut it short."""
    return EXIT_OK if signals.forced_by is None else EXIT_SIGNALLED + signals.forced_by


def _off_or_duration(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """Optional-duration flags: 'off' stays a string (see settings_from), else a timedelta."""
    values: dict[str, Any] = {}
    for name in names:
        text: str | None = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        values[name] = text if _is_off(text) else _optional_duration(text, flag)
    return values


# -- commands: jobs -----------------------------------------------------------------------


def cmd_enqueue(args: argparse.Namespace) -> int:
    # Every check runs here, before the database is even opened.
    new = NewJob(
        type=args.type,
        payload=_parse_payload(args),
        queue=args.queue,
        priority=args.priority,
        max_attempts=args.max_attempts,
        delay=_optional_duration(args.delay, "--delay"),
        idempotency_key=args.key,
        concurrency_key=args.concurrency_key,
    )
    with open_client(args) as client:
        job = client.enqueue_job(new)
    if args.json:
        _print_json(job)
    else:
        _say(str(job.id))
    return EXIT_OK


def cmd_get(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        job = client.get(args.id)
    if args.json:
        _print_json(job)
    else:
        _print_table(_job_details(job))
    return EXIT_OK


def newest_jobs(
    client: Client, filters: dict[str, Any], count: int, before: uuid.UUID | None = None
) -> list[Job]:
    """The ``count`` matching jobs with the highest ids (below ``before``), newest first.

    The dashboard's read side walks the primary key downwards a page per round
    trip; reading stops once ``count`` jobs are in hand.
    """
    if before is not None and before.int == 0:
        return []
    upto = None if before is None else uuid.UUID(int=before.int - 1)
    where = JobFilter(
        queue=filters.get("queue"), state=filters.get("state"), type=filters.get("type")
    )
    page = max(1, min(count, WEB_MAX_PAGE))
    matching = DashboardReads(client.store).matching(where, upto=upto, page=page)
    return list(itertools.islice(matching, count))


def _job_id(text: str, flag: str) -> uuid.UUID:
    try:
        return uuid.UUID(text.strip())
    except ValueError:
        raise ValidationError(flag, f"{text!r} is not a job id (a UUID)") from None


def cmd_list(args: argparse.Namespace) -> int:
    state = None if args.state is None else _parse_state(args.state)
    oldest_first = args.oldest or args.after is not None
    if oldest_first and args.before is not None:
        raise _UsageError("list: --before pages newest first, --after and --oldest oldest first")
    validate.batch_limit(args.limit, MAX_LIST_LIMIT)
    filters: dict[str, Any] = {"queue": args.queue, "state": state, "type": args.type}
    with open_client(args) as client:
        if oldest_first:
            jobs = client.list(**filters, after=args.after, limit=args.limit)
            more = len(jobs) == args.limit
        else:
            before = None if args.before is None else _job_id(args.before, "--before")
            jobs = newest_jobs(client, filters, args.limit + 1, before)
            more = len(jobs) > args.limit
            jobs = jobs[: args.limit]
    if args.json:
        _print_json(jobs)
    elif not jobs:
        _say("no jobs")
    else:
        _print_table(_jobs_table(jobs, output_width()))
        if oldest_first:
            _say(_jobs(len(jobs)) + (f"; more may follow: --after {jobs[-1].id}" if more else ""))
        else:
            older = f"; older: --before {jobs[-1].id}" if more else ""
            _say(f"{_jobs(len(jobs))}, newest first{older}")
    return EXIT_OK


def cmd_events(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.get(args.id)  # NotFound for an unknown job, not an empty trail
        events: list[Event] = client.events(args.id)
    if args.json:
        _print_json(events)
    elif not events:
        _say("no events")
    else:
        for line in event_lines(events, output_width()):
            _say(line)
    return EXIT_OK


def event_lines(events: Sequence[Event], width: int) -> list[str]:
    """One line per event: time, kind, attempt, and the detail in words, cut to ``width``."""
    kinds = max(len(str(e.kind)) for e in events)
    attempts = max(len(f"attempt {e.attempt}") for e in events)
    lines = []
    for e in events:
        attempt = f"attempt {e.attempt}" if e.attempt else ""
        line = f"{_when(e.at)}  {e.kind!s:<{kinds}}  {attempt:<{attempts}}  {_summary(e.detail)}"
        line = line.rstrip()
        lines.append(line if len(line) <= width else line[: width - 1] + "…")
    return lines


def _summary(detail: JSONValue) -> str:
    """An event's detail in words: ``effect=applied``, ``permanent error: boom``."""
    if detail in (None, {}, []):
        return ""
    if not isinstance(detail, dict):
        return _compact(detail)
    words = []
    for key, value in sorted(detail.items()):
        if key == "error" or value is False or value is None:
            continue
        words.append(key if value is True else f"{key}={_word(value)}")
    if detail.get("error"):
        words.append(f"error: {_word(detail['error'])}")
    return " ".join(words)


def _word(value: JSONValue) -> str:
    return " ".join(value.split()) if isinstance(value, str) else _compact(value)


def _depth_rows(client: Client) -> list[dict[str, Any]]:
    depths: dict[str, QueueDepth] = {d.queue: d for d in client.depth()}
    paused = set(client.paused_queues())
    rows = []
    for name in sorted(set(depths) | paused):
        d = depths.get(name) or QueueDepth(queue=name, ready=0, scheduled=0, leased=0, dead=0)
        rows.append({**to_json(d), "paused": name in paused})
    return rows


def cmd_depth(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        rows = _depth_rows(client)
    if args.json:
        _print_json(rows)
    elif not rows:
        _say("no queued, leased or dead jobs")
    else:
        table = _table("queue", "ready", "scheduled", "leased", "dead", "paused")
        for r in rows:
            paused = "paused" if r["paused"] else ""
            _row(table, r["queue"], r["ready"], r["scheduled"], r["leased"], r["dead"], paused)
        _print_table(table)
    return EXIT_OK


def _single_or_bulk(args: argparse.Namespace) -> State | None:
    """The bulk --state, or None for the single ID form; usage errors for mixes."""
    verb = args.command
    if args.id is not None:
        if args.state is not None or args.queue is not None or args.type is not None:
            raise _UsageError(
                f"{verb}: give a job ID or --state (with --queue/--type filters), not both"
            )
        return None
    if args.state is None:
        if args.queue is not None or args.type is not None:
            raise _UsageError(f"{verb}: --queue and --type filter a bulk --state {verb}")
        raise _UsageError(f"{verb}: give a job ID, or --state for a bulk {verb}")
    return _parse_state(args.state)


def _matching(client: Client, state: State, queue: str | None, type_: str | None) -> Iterator[Job]:
    """Every job matching the filters, a page at a time (acting on each before the next page)."""
    after: uuid.UUID | None = None
    while True:
        page = client.list(queue=queue, state=state, type=type_, after=after, limit=BULK_PAGE)
        yield from page
        if len(page) < BULK_PAGE:
            return
        after = page[-1].id


def cmd_cancel(args: argparse.Namespace) -> int:
    state = _single_or_bulk(args)
    if state is None:
        with open_client(args) as client:
            job = client.cancel(args.id)
        if job.state in (State.SUCCEEDED, State.DEAD):
            raise InvalidState(job.id, str(job.state), "cancel")
        if args.json:
            _print_json(job)
        elif job.state == State.CANCELLED:
            _say(f"job {job.id} cancelled")
        else:
            _say(f"job {job.id} is running: cancel requested (its worker stops it)")
        return EXIT_OK

    if state.terminal:
        raise CommandError(
            f"cannot cancel {state} jobs: only queued or leased jobs can be cancelled",
            EXIT_INVALID_STATE,
        )
    cancelled = requested = skipped = 0
    with open_client(args) as client:
        for job in _matching(client, state, args.queue, args.type):
            try:
                done = client.cancel(job.id)
            except NotFound:
                skipped += 1
                continue
            if done.state == State.CANCELLED:
                cancelled += 1
            elif done.state == State.LEASED and done.cancel_requested:
                requested += 1
            else:
                skipped += 1
    if args.json:
        _print_json({"cancelled": cancelled, "cancel_requested": requested, "skipped": skipped})
    else:
        text = f"cancelled {_jobs(cancelled + requested)}"
        if requested:
            text += f" ({requested} running: cancel requested)"
        if skipped:
            text += f"; {skipped} changed state meanwhile and were left alone"
        _say(text)
    return EXIT_OK


def cmd_retry(args: argparse.Namespace) -> int:
    state = _single_or_bulk(args)
    if state is None:
        with open_client(args) as client:
            job = client.retry(args.id)
        if args.json:
            _print_json(job)
        else:
            _say(f"job {job.id} queued to run now")
        return EXIT_OK

    if state == State.LEASED:
        raise CommandError(
            "cannot retry leased jobs: they are running (cancel them, or let the reaper "
            "requeue them when their lease expires)",
            EXIT_INVALID_STATE,
        )
    retried = skipped = 0
    with open_client(args) as client:
        for job in _matching(client, state, args.queue, args.type):
            try:
                client.retry(job.id)
            except (NotFound, InvalidState):
                skipped += 1
            else:
                retried += 1
    if args.json:
        _print_json({"retried": retried, "skipped": skipped})
    else:
        text = f"retried {_jobs(retried)}"
        if skipped:
            text += f"; {skipped} changed state meanwhile and were left alone"
        _say(text)
    return EXIT_OK


def cmd_purge(args: argparse.Namespace) -> int:
    older_than = parse_duration(args.older_than, "--older-than")
    with open_client(args) as client:
        count = client.purge(older_than)
    if args.json:
        _print_json({"purged": count})
    else:
        _say(f"purged {_jobs(count)}")
    return EXIT_OK


# -- commands: queues ---------------------------------------------------------------------


def cmd_queue_pause(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.pause_queue(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "paused": True})
    else:
        _say(f"queue {args.queue} paused")
    return EXIT_OK


def cmd_queue_resume(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        was_paused = client.resume_queue(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "paused": False, "was_paused": was_paused})
    elif was_paused:
        _say(f"queue {args.queue} resumed")
    else:
        _say(f"queue {args.queue} was not paused")
    return EXIT_OK


_DIGITS = re.compile(r"[0-9]+")


def _limit_arg(text: str | None, field: str) -> int | None:
    """A limit as typed (None: not given), checked before anything is sent."""
    if text is None:
        return None
    value = text.strip()
    if _DIGITS.fullmatch(value) and len(value) <= len(str(MAX_LIMIT)):
        number = int(value)
        if 1 <= number <= MAX_LIMIT:
            return number
    raise ValidationError(field, f"must be a whole number from 1 to {MAX_LIMIT:,}, not {text!r}")


def _limits_json(limits: QueueLimits) -> dict[str, Any]:
    """A queue's limits for --json: the QueueLimits fields but the queue's name."""
    out: dict[str, Any] = to_json(limits)
    out.pop("queue")
    return out


def _merged_limits(args: argparse.Namespace) -> tuple[QueueLimits, set[str]]:
    """The limits the command line names (checked), and the ones it removes."""
    if args.concurrency is not None and args.drop_concurrency:
        raise _UsageError("queues limit: give CONCURRENCY or --no-concurrency, not both")
    if args.per_key is not None and args.drop_per_key:
        raise _UsageError("queues limit: give --per-key or --no-per-key, not both")
    if args.rate is not None and args.drop_rate:
        raise _UsageError("queues limit: give --rate or --no-rate, not both")
    given = QueueLimits(
        queue=args.queue,
        concurrency=_limit_arg(args.concurrency, "concurrency"),
        per_key=_limit_arg(args.per_key, "--per-key"),
        rate=None if args.rate is None else RateLimit.parse(args.rate),
    )
    dropped = {
        name
        for name, drop in (
            ("concurrency", args.drop_concurrency),
            ("per_key", args.drop_per_key),
            ("rate", args.drop_rate),
        )
        if drop
    }
    named = {n for n in ("concurrency", "per_key", "rate") if getattr(given, n) is not None}
    if not named and not dropped:
        raise _UsageError(
            "queues limit: give CONCURRENCY, --per-key or --rate (or --no-concurrency, "
            "--no-per-key, --no-rate); jobrun queues list shows the limits"
        )
    return given, dropped


_T = TypeVar("_T")


def _change(given: _T | None, dropped: bool) -> _T | Keep | None:
    """A limit's change: removed, set to the one given, or kept."""
    if dropped:
        return None
    return KEEP if given is None else given


def cmd_queue_limit(args: argparse.Namespace) -> int:
    # Every check runs here, before the database is even opened.
    given, dropped = _merged_limits(args)
    queue = given.queue
    with open_client(args) as client:
        # One change in the database: the limits not named stay, even when
        # another operator changes them at the same moment.
        limits = client.change_queue_limits(
            queue,
            concurrency=_change(given.concurrency, "concurrency" in dropped),
            per_key=_change(given.per_key, "per_key" in dropped),
            rate=_change(given.rate, "rate" in dropped),
        )
    if args.json:
        _print_json(limits)
    else:
        _say(f"queue {queue}: {limits.describe()}")
    return EXIT_OK


def cmd_queue_unlimit(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        had_limits = client.clear_queue_limits(args.queue)
    if args.json:
        _print_json({"queue": args.queue, "limits": None, "had_limits": had_limits})
    elif had_limits:
        _say(f"queue {args.queue}: limits lifted")
    else:
        _say(f"queue {args.queue} had no limits")
    return EXIT_OK


def _queue_rows(client: Client) -> list[dict[str, Any]]:
    """Every known queue (with jobs, paused, or limited): paused, leased, its limits."""
    depths: dict[str, QueueDepth] = {d.queue: d for d in client.depth()}
    paused = set(client.paused_queues())
    limits = {lim.queue: lim for lim in client.all_queue_limits()}
    rows = []
    for name in sorted(set(depths) | paused | set(limits)):
        lim = limits.get(name)
        depth = depths.get(name)
        leased = lim.leased if lim is not None else depth.leased if depth is not None else 0
        rows.append(
            {
                "queue": name,
                "paused": name in paused,
                "leased": leased,
                "limits": None if lim is None else _limits_json(lim),
                "_limits": lim,
            }
        )
    return rows


def cmd_queue_list(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        rows = _queue_rows(client)
    if args.json:
        _print_json([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows])
    elif not rows:
        _say("no queues")
    else:
        table = _table("queue", "paused", "limits", "leased", "started")
        for r in rows:
            lim: QueueLimits | None = r["_limits"]
            leased = str(r["leased"])
            started = ""
            if lim is not None and lim.concurrency is not None:
                leased += f"/{lim.concurrency}"
            if lim is not None and lim.rate is not None:
                started = f"{lim.started_in_window}/{lim.rate.limit}"
            limits = "" if lim is None else lim.describe()
            _row(table, r["queue"], "paused" if r["paused"] else "", limits, leased, started)
        _print_table(table)
    return EXIT_OK


# -- commands: schedules ------------------------------------------------------------------


def _schedule_out(args: argparse.Namespace, schedule: Schedule, what: str) -> None:
    if args.json:
        _print_json(schedule)
    elif schedule.paused:
        _say(f"schedule {schedule.id} {what} (paused)")
    else:
        _say(f"schedule {schedule.id} {what}; next run at {_when(schedule.next_run_at)}")


def cmd_schedule_add(args: argparse.Namespace) -> int:
    spec = ScheduleSpec(
        id=args.id,
        cron=args.cron,
        type=args.type,
        payload=_parse_payload(args),
        timezone=args.tz,
        queue=args.queue,
        priority=args.priority,
        max_attempts=args.max_attempts,
    )
    registry: Registry | None = None if args.app is None else load_app(args.app)
    with open_client(args) as client:
        if args.replace:
            schedule = client.upsert_schedule(spec)
        else:
            try:
                schedule = client.create_schedule(spec)
            except AlreadyExists:
                raise CommandError(
                    f"schedule {spec.id!r} already exists: add --replace to replace it "
                    f"(or remove it first: jobrun schedules remove {spec.id})",
                    EXIT_CONFLICT,
                ) from None
    _schedule_out(args, schedule, "saved" if args.replace else "created")
    if registry is not None and spec.type not in registry:
        known = ", ".join(registry.types[:10]) or "none"
        _warn(
            f"no handler in {args.app} handles type {spec.type!r} (it handles: {known}); "
            "its jobs will wait for a worker that does"
        )
    return EXIT_OK


def _warn(message: str) -> None:
    """A warning on stderr: the command goes on (and exits 0)."""
    sys.stderr.write(f"{PROG}: warning: {' '.join(redact(message).split())}\n")
    sys.stderr.flush()


def cmd_schedule_list(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedules = client.list_schedules()
    if args.json:
        _print_json(schedules)
    elif not schedules:
        _say("no schedules")
    else:
        table = _table("id", "cron", "timezone", "queue", "type", "next_run_at", "paused")
        for s in schedules:
            paused = "paused" if s.paused else ""
            _row(table, s.id, s.cron, s.timezone, s.queue, s.type, _when(s.next_run_at), paused)
        _print_table(table)
    return EXIT_OK


def cmd_schedule_remove(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        client.delete_schedule(args.id)
    if args.json:
        _print_json({"id": args.id, "removed": True})
    else:
        _say(f"schedule {args.id} removed")
    return EXIT_OK


def cmd_schedule_pause(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedule = client.pause_schedule(args.id)
    _schedule_out(args, schedule, "paused")
    return EXIT_OK


def cmd_schedule_resume(args: argparse.Namespace) -> int:
    with open_client(args) as client:
        schedule = client.resume_schedule(args.id)
    _schedule_out(args, schedule, "resumed")
    return EXIT_OK


# -- commands: demo, embedded -------------------------------------------------------------


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        demo = importlib.import_module("jobrun.demo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("jobrun.demo", None):
            raise
        raise CommandError("the demo is not available in this version of jobrun") from None
    parser = _Parser(
        prog=f"{PROG} demo",
        description="Run the jobrun demo.",
        parents=[_global_options()],
        allow_abbrev=False,
    )
    demo.add_arguments(parser)
    demo_args = parser.parse_args(args.extras, namespace=args)
    url = database_url(settings_from(demo_args))
    return int(demo.run(demo_args, url))


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401, PLC0415 - the extra's server, checked before anything

        from jobrun.web import create_app, server  # noqa: PLC0415 - the optional extra
        from jobrun.web.app import CONNECTION_WAIT  # noqa: PLC0415
    except ImportError as exc:
        raise CommandError(
            f"the dashboard needs pip install 'jobrun[web]' ({exc.name} is missing)",
            EXIT_VALIDATION,
        ) from None
    host, port = server.parse_bind(args.bind)
    token = os.environ.get(DASHBOARD_TOKEN_ENV) or None
    server.check_exposure(host, token)  # before any connection: a refusal costs nothing
    settings = settings_from(args)
    url = database_url(settings)
    with Client.connect(
        url,
        settings=settings,
        pool_size=4,
        application_name="jobrun-dashboard",
        pool_timeout=CONNECTION_WAIT,
    ) as client:
        sock = server.listen(host, port)
        app = create_app(
            client,
            read_only=args.read_only,
            auth=token,
            allowed_hosts=server.allowed_hosts(host, token),
        )
        notes = [f"database {dsn.describe(url)}"]
        if args.read_only:
            notes.append("read-only")
        if token:
            notes.append(f"{DASHBOARD_TOKEN_ENV} required")
        server.serve(app, sock, describe=", ".join(notes))
    return EXIT_OK


def cmd_embedded_start(args: argparse.Namespace) -> int:
    try:
        cluster, started = embedded.ensure_embedded(embedded.default_home())
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    url = cluster.url(embedded.EMBEDDED_DATABASE)
    if args.url:
        _say(url)
    elif args.json:
        _print_json({"started": started, "url": url, "datadir": str(cluster.datadir)})
    else:
        _say(f"{'started' if started else 'already running'} at {url} (data in {cluster.datadir})")
    return EXIT_OK


def cmd_embedded_status(args: argparse.Namespace) -> int:
    try:
        status = embedded.embedded_status(embedded.default_home())
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}") from None
    datadir = status.datadir
    if args.json:
        _print_json(
            {
                "running": status.running,
                "url": status.url if status.running else None,
                "datadir": str(datadir),
                "initialised": status.initialised,
            }
        )
    elif status.running:
        _say(f"running at {status.url} (data in {datadir})")
    elif status.initialised:
        again = f"; it starts again at {status.url}" if status.url else ""
        _say(f"not running (data in {datadir}{again})")
    else:
        _say(f"not running (no cluster created yet in {datadir})")
    return EXIT_OK


def cmd_embedded_stop(args: argparse.Namespace) -> int:
    home = embedded.default_home()
    try:
        stopped = embedded.stop_embedded(home)
    except embedded.ClusterError as exc:
        raise CommandError(f"cannot stop the embedded PostgreSQL: {exc}") from None
    datadir = home / "data"
    if args.json:
        _print_json({"stopped": stopped, "datadir": str(datadir)})
    elif stopped:
        _say(f"stopped the embedded PostgreSQL (data and port kept in {home})")
    else:
        _say("the embedded PostgreSQL is not running")
    return EXIT_OK
