"""Input checks shared by every public entry point.

Each check raises :class:`~jobrun.job.errors.ValidationError` naming the
field, before any SQL runs, so bad input never leaves a row, an event or a
notification behind. The limits are documented here and in the README.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from typing import Any

from jobrun.job import redaction as _redaction
from jobrun.job.errors import ValidationError

QUEUE_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
"""Queue names travel as NOTIFY payloads and appear in logs and metric labels:
lower-case ASCII letters, digits, ``_``, ``.``, ``-``; 1 to 63 characters."""

JOB_TYPE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
"""Job types: ASCII letters, digits, ``_ . : / -``; 1 to 128 characters."""

MIN_PRIORITY = -32768
MAX_PRIORITY = 32767
"""Priorities are small integers; lower runs first."""

MAX_ATTEMPTS_LIMIT = 1000
MAX_PAYLOAD_BYTES = 1024 * 1024
"""Serialised payload size cap (1 MiB): jobs carry references, not documents."""
MAX_PAYLOAD_DEPTH = 64
MAX_IDEMPOTENCY_KEY_BYTES = 255
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600
"""Ten years: far enough for any schedule, small enough to stay inside timestamptz."""
MAX_CLAIM_LIMIT = 1000
MAX_ERROR_CHARS = 8192
"""Stored error text is truncated to this many characters."""


def _is_int(value: object) -> bool:
    # bool is an int subclass; True as max_attempts is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


# Names seen valid before: most enqueues reuse a handful of queues and types,
# so the regular expression runs once per name, not once per job.
_valid_names: set[tuple[str, str]] = set()
_VALID_NAMES_CAP = 10_000


def _remember(kind: str, value: str) -> None:
    if len(_valid_names) < _VALID_NAMES_CAP:
        _valid_names.add((kind, value))


def queue_name(value: object, field: str = "queue") -> str:
    if type(value) is str and ("q", value) in _valid_names:
        return value
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a str, not {type(value).__name__}")
    if not QUEUE_NAME_PATTERN.fullmatch(value):
        raise ValidationError(
            field,
            f"{value!r} is not a valid queue name (1-63 characters of a-z 0-9 _ . -, "
            "starting with a letter or digit)",
        )
    _remember("q", value)
    return value


def job_type(value: object, field: str = "type") -> str:
    if type(value) is str and ("t", value) in _valid_names:
        return value
    if not isinstance(value, str):
        raise ValidationError(field, f"must be a str, not {type(value).__name__}")
    if not JOB_TYPE_PATTERN.fullmatch(value):
        raise ValidationError(
            field,
            f"{value!r} is not a valid job type (1-128 characters of A-Z a-z 0-9 _ . : / -)",
        )
    _remember("t", value)
    return value


def priority(value: object) -> int:
    if not _is_int(value):
        raise ValidationError("priority", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise ValidationError("priority", f"must be between {MIN_PRIORITY} and {MAX_PRIORITY}")
    return value


def max_attempts(value: object) -> int:
    if not _is_int(value):
        raise ValidationError("max_attempts", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValidationError("max_attempts", f"must be between 1 and {MAX_ATTEMPTS_LIMIT}")
    return value


def aware_datetime(field: str, value: object) -> dt.datetime:
    if not isinstance(value, dt.datetime):
        raise ValidationError(field, f"must be a datetime, not {type(value).__name__}")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "must be timezone-aware (naive datetimes are ambiguous)")
    return value


def delay(value: object, field: str = "delay") -> dt.timedelta:
    if not isinstance(value, dt.timedelta):
        raise ValidationError(field, f"must be a timedelta, not {type(value).__name__}")
    seconds = value.total_seconds()
    if seconds < 0:
        raise ValidationError(field, "must not be negative")
    if seconds > MAX_DELAY_SECONDS:
        raise ValidationError(field, f"must be at most {MAX_DELAY_SECONDS} s")
    return value


def positive_duration(field: str, value: object) -> dt.timedelta:
    if not isinstance(value, dt.timedelta):
        raise ValidationError(field, f"must be a timedelta, not {type(value).__name__}")
    if value <= dt.timedelta(0):
        raise ValidationError(field, "must be positive")
    if value.total_seconds() > MAX_DELAY_SECONDS:
        raise ValidationError(field, f"must be at most {MAX_DELAY_SECONDS} s")
    return value


def idempotency_key(value: object) -> str:
    if not isinstance(value, str):
        raise ValidationError("idempotency_key", f"must be a str, not {type(value).__name__}")
    if not value:
        raise ValidationError("idempotency_key", "must not be empty")
    if "\x00" in value:
        raise ValidationError("idempotency_key", "must not contain NUL")
    if len(value.encode()) > MAX_IDEMPOTENCY_KEY_BYTES:
        raise ValidationError(
            "idempotency_key", f"must be at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes of UTF-8"
        )
    return value


def claim_limit(value: object) -> int:
    if not _is_int(value):
        raise ValidationError("limit", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 1 <= value <= MAX_CLAIM_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_CLAIM_LIMIT}")
    return value


def batch_limit(value: object, cap: int = 100_000) -> int:
    if not _is_int(value):
        raise ValidationError("limit", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 1 <= value <= cap:
        raise ValidationError("limit", f"must be between 1 and {cap}")
    return value


def owner(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > 200 or "\x00" in value:
        raise ValidationError("owner", "must be a non-empty str of at most 200 characters")
    return value


def payload(value: object) -> tuple[Any, str]:
    """Check that ``value`` is a JSON object jsonb will accept; return it and its JSON text.

    The text is what gets stored, so the payload is serialised once. Tuples
    become lists (as JSON has it), and the returned value says so. Rejected:
    anything json cannot encode, NaN and infinities (jsonb refuses them),
    non-string keys (JSON would silently turn them into strings), ``\\u0000``
    anywhere (jsonb refuses it), nesting deeper than MAX_PAYLOAD_DEPTH and a
    serialised size over MAX_PAYLOAD_BYTES.
    """
    if not isinstance(value, dict):
        raise ValidationError(
            "payload", f"must be a dict (a JSON object), not {type(value).__name__}"
        )
    had_tuple = _check_tree(value)
    try:
        text = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:  # pragma: no cover - _check_tree catches these first
        raise ValidationError("payload", f"is not JSON-serialisable: {exc}") from None
    # UTF-8 takes at most 4 bytes a character: encode only when it matters.
    too_big = len(text) > MAX_PAYLOAD_BYTES or (
        len(text) > MAX_PAYLOAD_BYTES // 4 and len(text.encode()) > MAX_PAYLOAD_BYTES
    )
    if too_big:
        raise ValidationError("payload", f"is larger than {MAX_PAYLOAD_BYTES} bytes as JSON")
    return (json.loads(text) if had_tuple else value), text


def _check_tree(root: dict[Any, Any]) -> bool:
    """Iterative (no RecursionError on hostile nesting) check of a JSON tree, no copy.

    Returns whether a tuple was seen. A cycle shows up as nesting past
    MAX_PAYLOAD_DEPTH; the node budget stops a small DAG of shared references
    from standing for a huge document.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    budget = MAX_PAYLOAD_BYTES
    had_tuple = False
    while stack:
        node, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise ValidationError("payload", f"is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        budget -= len(node)
        if budget < 0:
            raise ValidationError("payload", f"is larger than {MAX_PAYLOAD_BYTES} bytes as JSON")
        if isinstance(node, dict):
            for key, item in node.items():
                if type(key) is not str and not isinstance(key, str):
                    raise ValidationError(
                        "payload",
                        f"has a key of type {type(key).__name__}; JSON keys are strings",
                    )
                if "\x00" in key:
                    raise ValidationError("payload", "has a key containing NUL (\\u0000)")
                if _check_value(item, stack, depth):
                    had_tuple = True
        else:
            for item in node:
                if _check_value(item, stack, depth):
                    had_tuple = True
    return had_tuple


def _check_value(item: object, stack: list[tuple[Any, int]], depth: int) -> bool:
    kind = type(item)
    if kind is str:
        if "\x00" in item:  # type: ignore[operator]
            raise ValidationError("payload", "contains NUL (\\u0000), which jsonb refuses")
    elif kind is int or kind is bool or item is None:
        pass
    elif kind is float:
        if not math.isfinite(item):  # type: ignore[arg-type]
            raise ValidationError("payload", f"contains {item}, which JSON cannot carry")
    elif kind is dict or kind is list:
        stack.append((item, depth + 1))
    elif kind is tuple:
        stack.append((item, depth + 1))
        return True
    elif isinstance(item, dict | list):  # subclasses (OrderedDict, ...)
        stack.append((item, depth + 1))
    elif isinstance(item, tuple):
        stack.append((item, depth + 1))
        return True
    elif isinstance(item, bool | int | float | str):  # IntEnum, StrEnum, ...
        return _check_value(_scalar_base(item), stack, depth)
    else:
        raise ValidationError("payload", f"contains a {type(item).__name__}, which is not JSON")
    return False


def _scalar_base(item: bool | int | float | str) -> object:
    for base in (bool, int, float, str):
        if isinstance(item, base):
            return base(item)
    raise AssertionError(item)  # pragma: no cover


def redact(text: str) -> str:
    """``text`` with every password in it masked: :func:`jobrun.job.redaction.redact`."""
    return _redaction.redact(text)


_ERROR_SCAN_CHARS = 4 * MAX_ERROR_CHARS
"""Only this much of an error text is redacted, then cut: a huge text costs no more."""


def error_text(value: str) -> str:
    """Error text as stored: passwords redacted, NULs removed (text refuses them), truncated.

    A handler's error may quote a connection string (its own DATABASE_URL):
    the password must reach neither ``last_error`` nor ``job_events``.
    """
    text = _redaction.redact(value[:_ERROR_SCAN_CHARS]).replace("\x00", "\\0")
    if len(text) > MAX_ERROR_CHARS or len(value) > _ERROR_SCAN_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ... [truncated]"
    return text
