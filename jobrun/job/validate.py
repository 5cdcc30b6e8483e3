"""Input checks shared by every public entry point.

Each check raises :class:`~jobrun.job.errors.ValidationError` naming the
field, before any SQL runs, so bad input never leaves a row, an event or a
notification behind. The limits are documented here and in the README.

Text fields (queue, type, idempotency key, owner, schedule id, cron, time
zone, every string of a payload) must be text PostgreSQL can store: no NUL
(``\\u0000``) and no lone surrogate (``"\\ud800"``; that is what invalid
UTF-8 on the command line becomes under Python's ``surrogateescape``).
A ``str`` subclass is checked, and kept, as the plain ``str`` value it
really carries (what json and psycopg send): its own ``__str__``,
``__contains__`` or ``encode`` are never called.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Iterator
from typing import Any

from jobrun.job import redaction as _redaction
from jobrun.job.errors import ValidationError

QUEUE_NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
"""Queue names travel as NOTIFY payloads and appear in logs and metric labels:
lower-case ASCII letters, digits, ``_``, ``.``, ``-``; 1 to 63 characters."""

JOB_TYPE_PATTERN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:/-]{0,127}")
"""Job types: ASCII letters, digits, ``_ . : / -``; 1 to 128 characters."""

SCHEDULE_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,100}")
"""Schedule ids: no ``:``, so the key ``sched:<id>:<next_run>`` cannot be ambiguous."""

MIN_PRIORITY = -32768
MAX_PRIORITY = 32767
"""Priorities are small integers; lower runs first."""

MAX_ATTEMPTS_LIMIT = 1000
MAX_PAYLOAD_BYTES = 1024 * 1024
"""Serialised payload size cap (1 MiB of UTF-8): jobs carry references, not documents."""
MAX_PAYLOAD_DEPTH = 64
MAX_PAYLOAD_INT_DIGITS = 4300
"""Integers in a payload have at most 4300 decimal digits (``abs(n) < 10**4300``).

jsonb numbers are PostgreSQL ``numeric``, which takes up to 131072 digits
before the point; the tighter bound is Python's: by default it refuses to
convert an int of more than 4300 digits to or from text
(``sys.int_info.default_max_str_digits``, the CVE-2020-10735 guard), so a
longer one could be stored but not read back by a worker running with the
default. The bound is checked by comparing ints, whatever this process's own
``sys.set_int_max_str_digits``. (Floats and Decimals: floats must be finite;
``Decimal`` is refused, convert it to ``str`` or ``float`` yourself.)"""
MAX_IDEMPOTENCY_KEY_BYTES = 255
MAX_OWNER_CHARS = 200
MAX_DELAY_SECONDS = 10 * 365 * 24 * 3600
"""Ten years: far enough for any schedule, small enough to stay inside timestamptz."""
MAX_CLAIM_LIMIT = 1000
MAX_ERROR_CHARS = 8192
"""Stored error text is truncated to this many characters."""

_INT_BOUND = 10**MAX_PAYLOAD_INT_DIGITS
_NEG_INT_BOUND = -_INT_BOUND
_TOO_MANY_DIGITS = (
    f"contains an integer of more than {MAX_PAYLOAD_INT_DIGITS} digits "
    "(Python cannot read it back as JSON by default); send it as a string"
)


def _is_int(value: object) -> bool:
    # bool is an int subclass; True as max_attempts is a bug, not a 1.
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: str, limit: int = 80) -> str:
    """``repr`` for a message, cut short (surrogates and NULs come out escaped)."""
    return repr(value) if len(value) <= limit else repr(value[:limit]) + "..."


def plain_str(field: str, value: object) -> str:
    """``value`` as a plain ``str``; a subclass becomes the value it really carries.

    ``str.__str__`` of a subclass copies the underlying characters without
    calling anything the subclass overrides.
    """
    if type(value) is str:
        return value
    if isinstance(value, str):
        return str.__str__(value)
    raise ValidationError(field, f"must be a str, not {type(value).__name__}")


def _surrogate(field: str, text: str, exc: UnicodeEncodeError) -> ValidationError:
    where = "" if field == "payload" else f" at character {exc.start}"
    return ValidationError(
        field,
        f"contains a lone surrogate ({text[exc.start]!r}{where}), which is not Unicode "
        "text: invalid UTF-8 from the command line or a file?",
    )


def utf8_size(field: str, text: str) -> int:
    """The length in bytes of plain ``text`` as UTF-8; a lone surrogate is a ValidationError."""
    if text.isascii():  # O(1) in CPython: the common case costs no encode
        return len(text)
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise _surrogate(field, text, exc) from None


def text(field: str, value: object) -> str:
    """A str PostgreSQL can store as text: no NUL, no lone surrogate. Returns a plain str."""
    value = plain_str(field, value)
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL (\\u0000)")
    utf8_size(field, value)
    return value


# Names seen valid before: most enqueues reuse a handful of queues and types,
# so the regular expression runs once per name, not once per job.
_valid_names: set[tuple[str, str]] = set()
_VALID_NAMES_CAP = 10_000


def _remember(kind: str, value: str) -> None:
    if len(_valid_names) < _VALID_NAMES_CAP:
        _valid_names.add((kind, value))


# The patterns are ASCII-only: they refuse NUL and surrogates by themselves.


def queue_name(value: object, field: str = "queue") -> str:
    """A valid queue name, as a plain str."""
    if type(value) is str and ("q", value) in _valid_names:
        return value
    value = plain_str(field, value)
    if not QUEUE_NAME_PATTERN.fullmatch(value):
        raise ValidationError(
            field,
            f"{_show(value)} is not a valid queue name (1-63 characters of a-z 0-9 _ . -, "
            "starting with a letter or digit)",
        )
    _remember("q", value)
    return value


def job_type(value: object, field: str = "type") -> str:
    """A valid job type, as a plain str."""
    if type(value) is str and ("t", value) in _valid_names:
        return value
    value = plain_str(field, value)
    if not JOB_TYPE_PATTERN.fullmatch(value):
        raise ValidationError(
            field,
            f"{_show(value)} is not a valid job type (1-128 characters of A-Z a-z 0-9 _ . : / -)",
        )
    _remember("t", value)
    return value


def schedule_id(value: object, field: str = "id") -> str:
    """A valid schedule id, as a plain str."""
    value = plain_str(field, value)
    if not SCHEDULE_ID_PATTERN.fullmatch(value):
        raise ValidationError(
            field, f"{_show(value)} is not a valid schedule id (1-100 of A-Z a-z 0-9 _ . -)"
        )
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
    """A valid idempotency key, as a plain str."""
    field = "idempotency_key"
    value = plain_str(field, value)
    if not value:
        raise ValidationError(field, "must not be empty")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL (\\u0000)")
    if utf8_size(field, value) > MAX_IDEMPOTENCY_KEY_BYTES:
        raise ValidationError(field, f"must be at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes of UTF-8")
    return value


def concurrency_key(value: object) -> str:
    """A valid concurrency key (a tenant, an account: the jobs a per-key limit
    holds to that many at once), as a plain str."""
    field = "concurrency_key"
    value = plain_str(field, value)
    if not value:
        raise ValidationError(field, "must not be empty (leave it None for no key)")
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL (\\u0000)")
    if utf8_size(field, value) > MAX_IDEMPOTENCY_KEY_BYTES:
        raise ValidationError(field, f"must be at most {MAX_IDEMPOTENCY_KEY_BYTES} bytes of UTF-8")
    return value


MAX_PROGRESS_MESSAGE = 1000
"""Characters of a progress message kept (longer ones are refused)."""


def progress(value: object) -> float:
    """A fraction done, from 0 to 1 (an int 0 or 1 too)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(
            "progress", f"must be a number from 0 to 1, not {type(value).__name__}"
        )
    number = float(value)
    if not 0.0 <= number <= 1.0:  # NaN fails this too
        raise ValidationError("progress", f"must be a fraction from 0 to 1, not {value!r}")
    return number


def progress_message(value: object) -> str:
    field = "message"
    value = plain_str(field, value)
    if "\x00" in value:
        raise ValidationError(field, "must not contain NUL (\\u0000)")
    if len(value) > MAX_PROGRESS_MESSAGE:
        raise ValidationError(field, f"must be at most {MAX_PROGRESS_MESSAGE} characters")
    return value


def claim_limit(value: object) -> int:
    if not _is_int(value):
        raise ValidationError("limit", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 1 <= value <= MAX_CLAIM_LIMIT:
        raise ValidationError("limit", f"must be between 1 and {MAX_CLAIM_LIMIT}")
    return value


def claim_start(value: object, limit: int) -> int:
    """How many of a claim's jobs start at once: None is all of them (``limit``)."""
    if value is None:
        return limit
    if not _is_int(value):
        raise ValidationError("start", f"must be an int or None, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 0 <= value <= limit:
        raise ValidationError("start", f"must be between 0 and the limit ({limit})")
    return value


def batch_limit(value: object, cap: int = 100_000) -> int:
    if not _is_int(value):
        raise ValidationError("limit", f"must be an int, not {type(value).__name__}")
    assert isinstance(value, int)
    if not 1 <= value <= cap:
        raise ValidationError("limit", f"must be between 1 and {cap}")
    return value


def owner(value: object) -> str:
    """A worker's lease owner name, as a plain str."""
    message = f"must be a non-empty str of at most {MAX_OWNER_CHARS} characters"
    if not isinstance(value, str):
        raise ValidationError("owner", message)
    value = text("owner", value)
    if not value or len(value) > MAX_OWNER_CHARS:
        raise ValidationError("owner", message)
    return value


def payload(value: object) -> tuple[Any, str]:
    """Check that ``value`` is a JSON object jsonb will accept; return it and its JSON text.

    The text is what gets stored, so the payload is serialised once. Accepted:
    dict (str keys), list, str, int, float, bool, None, and their subclasses
    and tuples, which are converted (the returned value is then a plain copy:
    tuples become lists, an ``IntEnum`` its int, a ``str`` subclass the value
    it carries). Rejected: anything else (bytes, sets, ``Decimal``,
    datetimes...), NaN and infinities (jsonb refuses them), non-string keys
    (JSON would silently turn them into strings), ``\\u0000`` and lone
    surrogates anywhere (jsonb and UTF-8 refuse them), integers of more than
    MAX_PAYLOAD_INT_DIGITS digits, nesting deeper than MAX_PAYLOAD_DEPTH and
    a serialised size over MAX_PAYLOAD_BYTES.
    """
    if type(value) is not dict:
        if not isinstance(value, dict):
            raise ValidationError(
                "payload", f"must be a dict (a JSON object), not {type(value).__name__}"
            )
        value = _plain_copy(value)
    if not _check_tree(value):
        value = _plain_copy(value)
        if not _check_tree(value):  # pragma: no cover - a plain copy is all plain
            raise AssertionError("payload copy is not plain")
    try:
        text = _encode_json(value)
    except ValueError as exc:  # an int past this process's int->str limit
        _check_ints(value)
        raise ValidationError("payload", f"is not JSON-serialisable: {exc}") from None
    # The text stands for checks of every value at once. An int of more
    # digits than the text has characters cannot be in it; the JSON encoder
    # escapes NUL as \u0000; UTF-8 refuses lone surrogates.
    if len(text) > MAX_PAYLOAD_INT_DIGITS:
        _check_ints(value)
    if utf8_size("payload", text) > MAX_PAYLOAD_BYTES:
        raise _too_large()
    if "\\u0000" in text:  # or a string that spells it with a backslash: look closer
        _check_no_nul(value)
    return value, text


def payloads(values: Iterable[object], start: int = 0) -> Iterator[tuple[Any, str]]:
    """:func:`payload` for each payload of a batch (None counts as ``{}``, as in an
    enqueue), lazily; a bad one is a ValidationError naming its position,
    ``payloads[i]`` counted from ``start``."""
    for at, value in enumerate(values, start):
        try:
            yield payload({} if value is None else value)
        except ValidationError as exc:
            raise ValidationError(f"payloads[{at}]", exc.message) from None


# One encoder for every payload (json.dumps with options builds one per call).
# No circular-reference bookkeeping: _check_tree bounds the depth, so no
# cycle reaches it.
_ENCODER = json.JSONEncoder(
    allow_nan=False, separators=(",", ":"), ensure_ascii=False, check_circular=False
)
_c_encoder: Any = None
_c_make_encoder: Any = getattr(json.encoder, "c_make_encoder", None)
if _c_make_encoder is not None:  # CPython's C encoder
    # JSONEncoder.encode makes this C object anew for every call, which for
    # a small payload costs as much as the encoding itself: made once here,
    # with the encoder's own settings, it is what encode() would run.
    _c_encoder = _c_make_encoder(
        None,  # markers: no circular check
        _ENCODER.default,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )


def _encode_json(value: dict[str, Any]) -> str:
    """The JSON text of a checked payload (a dict), as ``_ENCODER.encode`` makes it."""
    if _c_encoder is None:  # pragma: no cover - CPython has the C encoder
        return _ENCODER.encode(value)
    return "".join(_c_encoder(value, 0))


MAX_RESULT_BYTES = MAX_PAYLOAD_BYTES
"""A handler's result is held to a payload's limits (1 MiB of JSON, same depth)."""

_RESULT_PREFIX = '{"result":'


@dataclasses.dataclass(frozen=True, slots=True)
class CheckedResult:
    """A handler's return value checked and serialised once, on its own thread.

    The worker checks a result where the handler ran (so a value that cannot
    be stored fails that attempt alone) and carries this to the completer,
    which stores ``text`` as it is: a large result is walked and encoded
    once, and what is stored is the value as the handler returned it.
    """

    value: object
    """The value itself, for the hooks."""
    text: str
    """Its JSON, as stored."""


def checked_result(value: object) -> CheckedResult | None:
    """``value`` checked as a result (see :func:`result`); None for None."""
    text = result(value)
    return None if text is None else CheckedResult(value, text)


def result(value: object) -> str | None:
    """A handler's return value as the JSON text to store; None for None.

    Any JSON value (not only an object), checked by the payload's rules (one
    validator): a ValidationError naming ``result`` otherwise. A
    :class:`CheckedResult` is its text, not checked again.
    """
    if value is None:
        return None
    if isinstance(value, CheckedResult):
        return value.text
    try:
        _, text = payload({"result": value})
    except ValidationError as exc:
        raise ValidationError("result", exc.message.replace("payload", "result")) from None
    assert text.startswith(_RESULT_PREFIX) and text.endswith("}")
    return text[len(_RESULT_PREFIX) : -1]


def payload_from_json(text: str | bytes) -> Any:
    """Parse JSON text given for a payload (the CLI's); every problem is a ValidationError.

    Only parses: the value still goes through :func:`payload`, the one set of
    rules. Integers are bounded here already (before Python converts their
    digits), and hostile nesting is a ValidationError, not a RecursionError.
    """
    if isinstance(text, bytes | bytearray):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise ValidationError(
                "payload", f"is not valid UTF-8 (byte {exc.start}: {exc.reason})"
            ) from None
    else:
        text = plain_str("payload", text)
    try:
        return json.loads(text, parse_int=_json_int)
    except json.JSONDecodeError as exc:
        raise ValidationError(
            "payload", f"is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from None
    except RecursionError:
        raise ValidationError(
            "payload", f"is nested deeper than {MAX_PAYLOAD_DEPTH} levels"
        ) from None
    except ValidationError:  # from _json_int
        raise
    except ValueError as exc:  # a lower sys.set_int_max_str_digits in this process
        raise ValidationError("payload", f"is not valid JSON: {exc}") from None


def _json_int(digits: str) -> int:
    if len(digits) - digits.startswith("-") > MAX_PAYLOAD_INT_DIGITS:
        raise ValidationError("payload", _TOO_MANY_DIGITS)
    return int(digits)


def _check_tree(root: dict[Any, Any]) -> bool:
    """Iterative (no RecursionError on hostile nesting) check of a JSON tree, no copy.

    Returns False when it meets a value that is JSON only once converted (a
    tuple, a subclass): the caller then checks a plain copy instead. A cycle
    shows up as nesting past MAX_PAYLOAD_DEPTH; the node budget stops a small
    DAG of shared references from standing for a huge document.

    The budget is a lower bound of the JSON text's size, counted as the walk
    goes: a byte per entry, a byte per character of every key and string
    (UTF-8 and escapes only add). Once it is spent the payload is refused
    then and there, so a payload far over the limit is never serialised (a
    50 MB string would otherwise be copied twice before being refused).
    Strings and ints are not read: :func:`payload` checks them on the text.
    """
    stack: list[tuple[Any, int]] = [(root, 1)]
    budget = MAX_PAYLOAD_BYTES
    while stack:
        node, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise ValidationError("payload", f"is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        budget -= len(node)
        if budget < 0:
            raise _too_large()
        if type(node) is dict:
            for key in node:
                if type(key) is not str:
                    if isinstance(key, str):
                        return False
                    raise _bad_key(key)
            budget -= sum(map(len, node))
            items = node.values()
        else:
            items = node
        for item in items:
            kind = type(item)
            if kind is str:
                budget -= len(item)
                continue
            if kind is int or kind is bool or item is None:
                continue
            if kind is dict or kind is list:
                stack.append((item, depth + 1))
            elif kind is float:
                if not math.isfinite(item):
                    raise ValidationError("payload", f"contains {item}, which JSON cannot carry")
            elif isinstance(item, dict | list | tuple | str | int | float):
                return False
            else:
                raise _not_json(item)
        if budget < 0:
            raise _too_large()
    return True


def _plain_copy(root: dict[Any, Any]) -> dict[str, Any]:
    """A copy of a JSON tree made of plain dict, list, str, int, float, bool and None.

    Each subclass is read through its base type's own code (``dict.items``,
    ``list.copy``, ``str.__str__``...), never through what it overrides, so
    the copy is what gets checked, serialised and stored. Tuples become
    lists. Iterative, and bounded like :func:`_check_tree` (a string's
    length counts before it is copied).
    """
    out: dict[str, Any] = {}
    stack: list[tuple[Any, Any, int]] = [(root, out, 1)]
    budget = MAX_PAYLOAD_BYTES
    while stack:
        node, target, depth = stack.pop()
        if depth > MAX_PAYLOAD_DEPTH:
            raise ValidationError("payload", f"is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
        if isinstance(node, dict):
            pairs = list(dict.items(node))
            budget -= len(pairs)
            if budget < 0:
                raise _too_large()
            for key, item in pairs:
                if not isinstance(key, str):
                    raise _bad_key(key)
                budget -= str.__len__(key) + _str_len(item)
                if budget < 0:
                    raise _too_large()
                target[str.__str__(key)] = _plain_item(item, stack, depth)
        else:
            items = (
                list.copy(node) if isinstance(node, list) else tuple.__getitem__(node, slice(None))
            )
            budget -= len(items)
            if budget < 0:
                raise _too_large()
            for item in items:
                budget -= _str_len(item)
                if budget < 0:
                    raise _too_large()
                target.append(_plain_item(item, stack, depth))
    return out


def _str_len(item: object) -> int:
    """The length of the text a string carries (its own ``__len__`` is not asked), else 0."""
    return str.__len__(item) if isinstance(item, str) else 0


def _too_large() -> ValidationError:
    return ValidationError("payload", f"is larger than {MAX_PAYLOAD_BYTES} bytes as JSON")


def _plain_item(item: object, stack: list[tuple[Any, Any, int]], depth: int) -> object:
    kind = type(item)
    if kind is str or kind is int or kind is float or kind is bool or item is None:
        return item
    container: dict[str, Any] | list[Any]
    if isinstance(item, dict):
        container = {}
    elif isinstance(item, list | tuple):
        container = []
    elif isinstance(item, str):  # StrEnum, ...
        return str.__str__(item)
    elif isinstance(item, int):  # IntEnum, ... (not bool: it has no subclasses)
        return int.__int__(item)
    elif isinstance(item, float):
        return float.__float__(item)
    else:
        raise _not_json(item)
    stack.append((item, container, depth + 1))
    return container


def _check_ints(root: dict[str, Any]) -> None:
    """Bound every int of a plain tree (checked already: no cycle), comparing ints, not digits."""
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        for item in node.values() if type(node) is dict else node:
            kind = type(item)
            if kind is int:
                if not _NEG_INT_BOUND < item < _INT_BOUND:
                    raise ValidationError("payload", _TOO_MANY_DIGITS)
            elif kind is dict or kind is list:
                stack.append(item)


def _check_no_nul(root: dict[str, Any]) -> None:
    """Find a NUL in a key or a string of a plain tree (checked already: no cycle)."""
    stack: list[Any] = [root]
    while stack:
        node = stack.pop()
        items = node.items() if type(node) is dict else enumerate(node)
        for key, item in items:
            if type(key) is str and "\x00" in key:
                raise ValidationError(
                    "payload", f"has a key containing NUL (\\u0000): {_show(key)}"
                )
            if type(item) is str:
                if "\x00" in item:
                    raise ValidationError("payload", "contains NUL (\\u0000), which jsonb refuses")
            elif type(item) is dict or type(item) is list:
                stack.append(item)


def _bad_key(key: object) -> ValidationError:
    return ValidationError(
        "payload", f"has a key of type {type(key).__name__}; JSON keys are strings"
    )


def _not_json(item: object) -> ValidationError:
    name = type(item).__name__
    hint = " (convert it to str or float)" if name == "Decimal" else ""
    return ValidationError("payload", f"contains a {name}, which is not JSON{hint}")


def redact(text: str) -> str:
    """``text`` with every password in it masked: :func:`jobrun.job.redaction.redact`."""
    return _redaction.redact(text)


_ERROR_SCAN_CHARS = 4 * MAX_ERROR_CHARS
"""Only this much of an error text is redacted, then cut: a huge text costs no more."""


def error_text(value: str) -> str:
    """Error text as stored: passwords redacted, NULs and lone surrogates escaped
    (PostgreSQL's text refuses both), truncated.

    A handler's error may quote a connection string (its own DATABASE_URL):
    the password must reach neither ``last_error`` nor ``job_events``. It may
    also carry anything an exception message can: the text is the worker's
    own report, so it is repaired rather than refused (a failure must always
    be recordable).
    """
    value = str.__str__(value)  # the real characters of a str subclass
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    text = _redaction.redact(value[:_ERROR_SCAN_CHARS]).replace("\x00", "\\0")
    if len(text) > MAX_ERROR_CHARS or len(value) > _ERROR_SCAN_CHARS:
        text = text[: MAX_ERROR_CHARS - 20] + " ... [truncated]"
    return text
