"""The ``jobrun`` command: run workers, enqueue, inspect and administer jobs.

::

    jobrun --version            (also: python -m jobrun ...)
    jobrun migrate [--sql]
    jobrun worker --app myapp.jobs:registry [--queues emails=4,default] [--concurrency N] ...
    jobrun scheduler [--app MODULE:REGISTRY]
    jobrun enqueue TYPE [PAYLOAD_JSON | --payload-file PATH|-] [--queue Q] [--priority N]
                   [--max-attempts N] [--delay 1h30m] [--key KEY] [--concurrency-key KEY]
    jobrun enqueue --batch FILE|- [--queue Q] [...]       (JSON lines, one COPY, all or nothing)
    jobrun get ID                                          (ID: whole, or a unique prefix)
    jobrun list [--queue Q] [--state S] [--type T] [--limit N] [--before ID]   (newest first)
    jobrun list --oldest | --after ID [...]                                   (oldest first)
    jobrun events ID | depth
    jobrun cancel ID | cancel --state S [--queue Q] [--type T] [--dry-run | --yes]
    jobrun retry ID  | retry --state dead [--queue Q] [--type T] [--dry-run | --yes]
    jobrun workflows list [--state S] [--name N] [--limit N] [--before ID]   (newest first)
    jobrun workflows get ID | cancel ID | retry ID [--dry-run | --yes]
    jobrun queues pause Q | resume Q | list
    jobrun queues limit Q [CONCURRENCY] [--per-key K] [--rate 100/s]
                        [--no-concurrency] [--no-per-key] [--no-rate]
    jobrun queues unlimit Q
    jobrun purge --older-than 30d [--dry-run | --yes]
    jobrun schedules add ID CRON TYPE [PAYLOAD_JSON | --payload-file PATH|-] [--tz ZONE]
                         [--replace] [--app MODULE:REGISTRY] ...
    jobrun schedules list | remove ID | pause ID | resume ID
    jobrun demo [...]
    jobrun dashboard [--bind 127.0.0.1:8080] [--read-only]
    jobrun embedded start | status | stop
    jobrun completion bash | zsh

Global options (``--database-url``, ``--schema``, ``--job-events``,
``--notify-channel``, ...) may be given before or after the subcommand; every
other setting comes from the environment (see :mod:`jobrun.config`),
overridden by the flags given. Without ``--database-url`` or
``DATABASE_URL`` a command uses the embedded PostgreSQL and says so on stderr.

This package is the command, a module per command group: :mod:`.jobs`
(enqueue and read), :mod:`.actions` (cancel, retry, purge), :mod:`.workflows`, :mod:`.queues`,
:mod:`.schedules`, :mod:`.processes` (worker, scheduler), :mod:`.database`
(migrate, embedded), :mod:`.extras` (dashboard, demo). What they share is
written once: the parser's pieces (:mod:`.parser`), settings and the client
(:mod:`.settings`), stdout (:mod:`.output`, :mod:`.views`) and how a command
ends (:mod:`.exits`); :mod:`.entry` builds the tree and runs it. Output is a
table or a line for people, JSON with ``--json`` (every command that is not a
long-running process).

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
3     not found (no such job, workflow or schedule)
4     conflict: the idempotency key is taken by a different job, or the
      schedule already exists
5     invalid state: the operation does not apply to the job's state
      (retry of a leased job, cancel of a finished one, bulk retry of leased jobs,
      cancel of a finished workflow, retry of one with nothing dead or cancelled)
6     database unavailable (cannot connect, connection lost, outcome unknown)
7     validation error: bad input or bad configuration
8     the jobrun schema is missing, or at another version than this jobrun
      needs: run ``jobrun migrate`` (or upgrade jobrun when it is newer)
9     not confirmed: a bulk ``retry``, ``cancel`` or ``purge`` (or a
      ``workflows cancel`` or ``retry``) was declined at
      its prompt, or ran off a terminal without ``--yes`` (nothing changed)
130   interrupted (Ctrl-C during a short command)
128+N ``jobrun worker`` or ``jobrun scheduler`` stopped by signal N before its
      work was done: while starting (importing the app, opening its pools),
      or by a second signal that cut the graceful drain short (143 for
      SIGTERM, 130 for SIGINT; see :mod:`jobrun.worker.stop_signals`). A graceful
      stop (one signal, drained) exits 0.
===== ========================================================================
"""

from __future__ import annotations

from .apps import app_traceback, load_app
from .entry import build_parser, main
from .exits import (
    EXIT_CONFLICT,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_INVALID_STATE,
    EXIT_NOT_CONFIRMED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_SCHEMA,
    EXIT_SIGNALLED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    EXIT_VALIDATION,
    PROG,
    CommandError,
    exit_code,
)
from .jobs import newest_jobs
from .output import console, output_width, to_json
from .parser import version
from .settings import database_url, open_client, settings_from
from .views import event_lines, percent, progress_text

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_INVALID_STATE",
    "EXIT_NOT_CONFIRMED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_SCHEMA",
    "EXIT_SIGNALLED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "EXIT_VALIDATION",
    "PROG",
    "CommandError",
    "app_traceback",
    "build_parser",
    "console",
    "database_url",
    "event_lines",
    "exit_code",
    "load_app",
    "main",
    "newest_jobs",
    "open_client",
    "output_width",
    "percent",
    "progress_text",
    "settings_from",
    "to_json",
    "version",
]
