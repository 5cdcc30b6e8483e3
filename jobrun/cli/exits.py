"""How a command ends: its exit code, and the one line it writes on stderr.

A script that runs ``jobrun`` reads two things: the exit code, and (for a
person) the line on stderr. Both are a contract (the table in
:mod:`jobrun.cli`'s docstring), so they are decided here, once: a command
raises (a jobrun error, a psycopg connection error, a :class:`CommandError`
it detected itself, a :class:`UsageError` for arguments that do not go
together) and :func:`jobrun.cli.entry.main` turns the exception into
``jobrun: <message>`` and the code :func:`exit_code` maps it to.

Every line written here goes through :func:`~jobrun.job.validate.redact`
and is folded to one line: an error may quote a database URL, and a
traceback or a multi-line message would break the one-line promise.
"""

from __future__ import annotations

import sys

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
from jobrun.job.validate import redact
from jobrun.postgres.connect import OperationalError, PoolTimeout

PROG = "jobrun"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_INVALID_STATE = 5
EXIT_UNAVAILABLE = 6
EXIT_VALIDATION = 7
EXIT_SCHEMA = 8
EXIT_NOT_CONFIRMED = 9
"""A bulk action was not confirmed: declined at the prompt, or no --yes off a terminal."""
EXIT_INTERRUPTED = 130
EXIT_SIGNALLED = 128
"""Plus the signal's number: a worker or scheduler stopped by a signal before its work was done."""

_ERROR_CODES: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    (NotFound, EXIT_NOT_FOUND),
    ((IdempotencyConflict, AlreadyExists), EXIT_CONFLICT),
    (InvalidState, EXIT_INVALID_STATE),
    ((TransientError, OutcomeUnknown, OperationalError, PoolTimeout), EXIT_UNAVAILABLE),
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


class UsageError(Exception):
    """Arguments that do not go together: exit code 2, like argparse's own errors."""


def exit_code(exc: BaseException) -> int:
    """The exit code for an error (see :mod:`jobrun.cli`)."""
    if isinstance(exc, CommandError):
        return exc.code
    for kinds, code in _ERROR_CODES:
        if isinstance(exc, kinds):
            return code
    return EXIT_ERROR


def message(exc: BaseException) -> str:
    """The error's text; an error jobrun does not know also names its class."""
    known = isinstance(exc, CommandError) or any(isinstance(exc, k) for k, _ in _ERROR_CODES)
    text = str(exc).strip()
    if not known or not text:
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text


def fail(text: str, code: int) -> int:
    """``jobrun: <text>`` on stderr, in one line; returns ``code``."""
    _stderr(f"{PROG}: {' '.join(redact(text).split())}")
    return code


def warn(text: str) -> None:
    """A warning on stderr: the command goes on (and exits 0)."""
    _stderr(f"{PROG}: warning: {' '.join(redact(text).split())}")


def announce(line: str) -> None:
    """What a command did on the side (the embedded fallback), in one line on stderr."""
    _stderr(f"{PROG}: {line}")


def _stderr(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
