"""How the dashboard writes values for people: durations, timestamps, JSON, ids.

These are the Jinja2 filters of every template (:data:`FILTERS`), kept apart
from the routes so that a change of wording is a change here only, and so
that they stay pure functions a unit test can call without a database or a
request. None of them reads a clock: a relative time ("3m 5s ago") is taken
against the database's ``now`` that the page read along with its data, so
every age on one page agrees with every other and with the workers.

Their output is text (escaped by the template like any string), except
:func:`format_when` and :func:`format_when_in`, which build a ``<time>``
element themselves and so return :class:`~markupsafe.Markup` with every part escaped.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from markupsafe import Markup

from jobrun.job.cron import time_zone
from jobrun.job.errors import ValidationError
from jobrun.job.model import RateLimit
from jobrun.job.validate import redact


def format_age(seconds: float | dt.timedelta | None) -> str:
    """A duration for people: 42s, 3m 5s, 2h 10m, 4d 3h."""
    if seconds is None:
        return ""
    if isinstance(seconds, dt.timedelta):
        seconds = seconds.total_seconds()
    if not math.isfinite(seconds):
        return ""
    total = int(abs(seconds))
    sign = "-" if seconds < 0 else ""
    if total < 60:
        return f"{sign}{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{sign}{minutes}m {secs}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{sign}{hours}h {minutes}m"
    days, hours = divmod(hours, 24)
    return f"{sign}{days}d {hours}h"


def format_when(value: dt.datetime | None, now: dt.datetime | None = None) -> Markup:
    """A ``<time>`` element: UTC to the second, and how long ago (or until) by ``now``."""
    if value is None:
        return Markup('<span class="never">never</span>')
    utc = value.astimezone(dt.UTC)
    text = utc.strftime("%Y-%m-%d %H:%M:%SZ")
    relative = ""
    if now is not None:
        delta = (utc - now).total_seconds()
        relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(-delta)} ago"
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        utc.isoformat(), relative or text, text if not relative else f"{text} ({relative})"
    )


def format_when_in(value: dt.datetime | None, zone: str, now: dt.datetime | None = None) -> Markup:
    """A ``<time>`` element in the time zone ``zone`` (a schedule's), the zone named.

    A schedule's cron runs in its own zone: "0 3 * * *" in Europe/Paris reads
    best as 03:00 CET, and as 02:00Z only after arithmetic. The text is the
    local time with the zone's abbreviation (or its UTC offset, for zones
    that have none); the title names the zone and gives the UTC time, which
    ``datetime`` carries too. A zone that cannot be loaded falls back to UTC.
    """
    if value is None:
        return Markup('<span class="never">never</span>')
    try:
        tz = time_zone(zone)
    except ValidationError:
        return format_when(value, now)
    local = value.astimezone(tz)
    utc = value.astimezone(dt.UTC)
    offset = local.strftime("%z")
    offset = f"UTC{offset[:3]}:{offset[3:]}"
    abbreviation = local.tzname() or ""
    if not abbreviation or abbreviation[0] in "+-":
        abbreviation = offset
    text = f"{local.strftime('%Y-%m-%d %H:%M:%S')} {abbreviation}"
    title = f"{zone} ({offset}); {utc.strftime('%Y-%m-%d %H:%M:%SZ')} in UTC"
    if now is not None:
        delta = (utc - now).total_seconds()
        relative = f"in {format_age(delta)}" if delta > 0 else f"{format_age(-delta)} ago"
        text, title = f"{text} ({relative})", f"{title}; {relative}"
    return Markup('<time datetime="{}" data-timezone="{}" title="{}">{}</time>').format(
        utc.isoformat(), zone, title, text
    )


def format_percent(fraction: float) -> str:
    """A fraction done as people read it: 40%, 99.9% (never 100% before it is 1)."""
    tenths = math.floor(fraction * 1000 + 1e-9)
    return f"{tenths // 10}%" if tenths % 10 == 0 else f"{tenths / 10:.1f}%"


def rate_window(rate: RateLimit) -> str:
    """A rate limit's window as people read it: 1 s, 10 s, 1 min, 500 ms."""
    period = str(rate).split("/", 1)[1]  # s, 10s, min, 500ms
    unit = period.lstrip("0123456789.")
    return f"{period[: len(period) - len(unit)] or '1'} {unit}"


def pretty_json(value: object) -> str:
    """A JSON value as indented text (escaped by the template like any string)."""
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


class DetailField(NamedTuple):
    """One key of an event's detail as the timeline shows it."""

    key: str
    text: str
    block: bool
    """The text has lines of its own (a traceback, a nested value): shown as a block."""


def detail_fields(detail: Mapping[str, object]) -> list[DetailField]:
    """An event's detail object as ``key: value`` pairs, the one-line values first.

    The detail is JSON written by the queries (``{"via": "fail", "error":
    ..., "permanent": false}``): strings are shown as they are, numbers
    without a trailing ``.0``, and anything nested as indented JSON. A
    multi-line value (an error's traceback) goes last, so that the short
    facts read together on one line above it.
    """
    fields = []
    for key, value in detail.items():
        if isinstance(value, str):
            text = value
        elif isinstance(value, bool) or value is None:
            text = json.dumps(value)
        elif isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            text = str(int(value))
        elif isinstance(value, int | float):
            text = repr(value)
        else:
            text = pretty_json(value)
        fields.append(DetailField(str(key), text, "\n" in text))
    return sorted(fields, key=lambda field: field.block)


def short_id(value: uuid.UUID | str) -> str:
    return str(value)[:13]


def error_text(exc: BaseException) -> str:
    """An error as a page shows it: its message (or its class), secrets redacted."""
    return redact(str(exc).strip() or type(exc).__name__)


FILTERS: dict[str, Callable[..., Any]] = {
    "age": format_age,
    "when": format_when,
    "when_in": format_when_in,
    "pretty": pretty_json,
    "fields": detail_fields,
    "short": short_id,
    "percent": format_percent,
    "window": rate_window,
}
"""The templates' filters by name (``{{ job.run_at | when(db_now) }}``)."""

__all__ = [
    "FILTERS",
    "DetailField",
    "detail_fields",
    "error_text",
    "format_age",
    "format_percent",
    "format_when",
    "format_when_in",
    "pretty_json",
    "rate_window",
    "short_id",
]
