"""The worker's console: job fields on log records, a text and a JSON format.

Every log record about one job (the worker's outcome lines and whatever a
handler logs through ``ctx.logger``) carries the job's fields as ``extra``::

    job_id  job_type  attempt  max_attempts  queue

and an outcome line adds ``outcome`` (succeeded, failed, dead, cancelled,
lease_lost, released, snoozed, waiting), ``duration_ms`` (the handler's run
time), ``next_run_at`` (a failed, released, snoozed or waiting job's next run,
ISO 8601 UTC)
and ``error``. A record that is not about a job has none of them.

Two formats, both through the redactor (a handler's error or log line may
quote a connection string: no password is ever printed):

- ``text`` (the default): one line per record, the job first when there is one::

      2025-01-31 10:00:00,123 INFO jobrun.worker: job 0194b7c2-...-9e1f email.send
      attempt 1/25: succeeded in 12 ms

  (one line, cut here), a traceback, when attached, on the lines after it;
- ``json``: one JSON object per line (for log shippers): ``ts``, ``level``,
  ``logger``, ``message``, the job fields, any other ``extra`` given, and
  ``traceback`` (one string) when there is one. Every string is redacted
  before it is encoded, so the line stays valid JSON, and the line is ASCII
  (``\\u`` escapes), so no console encoding can refuse it.

The standard :mod:`logging` module is enough for both: no dependency.
Successes are logged at DEBUG unless configured otherwise
(:func:`set_success_level`, ``jobrun worker --log-success info``): a busy
worker's console is not one line per job unless asked for, and a level that
is off costs one ``isEnabledFor`` check per batch of completions.
"""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import logging
import sys
from collections.abc import Iterable
from typing import Any

from jobrun._version import __version__
from jobrun.job.errors import ValidationError
from jobrun.job.model import Job
from jobrun.job.redaction import MASK, RedactingFormatter, redact

JOB_FIELDS = ("job_id", "job_type", "attempt", "max_attempts", "queue")
"""The fields every log record of a job carries."""

LOG_FORMATS = ("text", "json")
SUCCESS_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(job)s%(message)s"
"""The default console format; ``%(job)s`` is the job prefix (empty on other records)."""

_success_level = logging.DEBUG

# The attributes every LogRecord has: anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "job"}
# Extra fields that hold validated names (a UUID, a job type, a queue, an owner id).
_IDENTIFIERS = frozenset({"job_id", "job_type", "queue", "owner", "outcome"})


def set_success_level(level: int | str) -> None:
    """The level of a success line for workers started from now on (DEBUG or INFO)."""
    global _success_level  # noqa: PLW0603 - a process-wide logging preference, as logging's own
    _success_level = success_level(level)


def success_level(level: int | str | None = None) -> int:
    """``level`` checked (``"debug"``, ``"info"`` or a logging level), or the process default."""
    if level is None:
        return _success_level
    if isinstance(level, str):
        try:
            return SUCCESS_LEVELS[level.strip().lower()]
        except KeyError:
            raise ValidationError(
                "log_success", f"{level!r}: expected one of {', '.join(SUCCESS_LEVELS)}"
            ) from None
    if isinstance(level, bool) or not isinstance(level, int) or level < 0:
        raise ValidationError("log_success", "must be a logging level (logging.DEBUG or INFO)")
    return level


def job_fields(job: Job) -> dict[str, Any]:
    """The ``extra`` of a record about ``job``."""
    return {
        "job_id": str(job.id),
        "job_type": job.type,
        "attempt": job.attempts,
        "max_attempts": job.max_attempts,
        "queue": job.queue,
    }


def job_prefix(record: logging.LogRecord) -> str:
    """``job <id> <type> attempt a/m: `` for a record of a job, else ``""``."""
    fields = record.__dict__
    job_id = fields.get("job_id")
    if job_id is None:
        return ""
    attempt = fields.get("attempt")
    most = fields.get("max_attempts")
    of = f"/{most}" if most is not None else ""
    kind = fields.get("job_type")
    return f"job {job_id}{'' if kind is None else ' ' + str(kind)} attempt {attempt}{of}: "


class TextFormatter(RedactingFormatter):
    """The console's text lines: the job prefix, then the message; redacted."""

    def __init__(self, fmt: str | None = TEXT_FORMAT, *, known: Iterable[str] = ()) -> None:
        super().__init__(fmt, known=known)

    def format(self, record: logging.LogRecord) -> str:
        record.job = job_prefix(record)
        return super().format(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring); every string redacted.

    ``known`` (the DSN's secrets, as for :class:`RedactingFormatter`) is read
    at each record.
    """

    def __init__(self, *, known: Iterable[str] = ()) -> None:
        super().__init__()
        self.known = known

    def format(self, record: logging.LogRecord) -> str:
        known = list(self.known)
        ts = dt.datetime.fromtimestamp(record.created, dt.UTC)
        out: dict[str, Any] = {
            "ts": ts.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage(), known),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD or key.startswith("_"):
                continue
            if key in _IDENTIFIERS and isinstance(value, str):
                # Validated names (no '@', '=' or quotes): no password form fits in
                # them, so only the known secrets are masked (no regex scan).
                out[key] = _mask_known(value, known)
            else:
                out[key] = _redacted(value, known)
        if record.exc_info:
            out["traceback"] = redact(self.formatException(record.exc_info), known)
        elif record.exc_text:
            out["traceback"] = redact(record.exc_text, known)
        if record.stack_info:
            out["stack"] = redact(self.formatStack(record.stack_info), known)
        return json.dumps(out, default=lambda v: redact(str(v), known))


def _mask_known(text: str, known: list[str]) -> str:
    for secret in known:
        if secret and secret in text:
            text = text.replace(secret, MASK)
    return text


def _redacted(value: Any, known: list[str]) -> Any:
    if isinstance(value, str):
        return redact(value, known)
    if isinstance(value, dict):
        return {str(k): _redacted(v, known) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v, known) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value), known)


def formatter(log_format: str, *, known: Iterable[str] = ()) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` or ``json``)."""
    if log_format == "json":
        return JsonFormatter(known=known)
    if log_format == "text":
        return TextFormatter(known=known)
    raise ValidationError("log_format", f"{log_format!r}: expected one of {', '.join(LOG_FORMATS)}")


def configure(
    *,
    level: str | int = "info",
    log_format: str = "text",
    success: str | int | None = None,
    known: Iterable[str] = (),
) -> None:
    """Log to stderr in ``log_format`` at ``level`` (what ``jobrun worker`` does).

    ``success`` sets the level of success lines (:func:`set_success_level`).
    Replaces the root logger's handlers, like ``logging.basicConfig(force=True)``.
    """
    fmt = formatter(log_format, known=known)
    if success is not None:
        set_success_level(success)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(fmt)
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )


def version() -> str:
    """The installed jobrun's version (the source tree's ``__version__`` otherwise)."""
    try:
        return importlib.metadata.version("jobrun")
    except importlib.metadata.PackageNotFoundError:
        return __version__
