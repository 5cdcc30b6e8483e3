"""Cron expressions in a time zone, and the DST rule jobrun follows.

Expressions are standard 5-field cron (``minute hour day month weekday``) or
6 fields with a leading seconds field (``second minute hour day month
weekday``), parsed by ``cronsim``, or one of the aliases ``@yearly``
(``@annually``), ``@monthly``, ``@weekly``, ``@daily`` (``@midnight``) and
``@hourly``, kept as written and expanded to 5 fields for ``cronsim``. A bad
field is named with its valid range ("minute must be 0-59, got 61"). Each
schedule has an IANA time zone.

The DST rule: **one run per local occurrence.** Occurrences are computed on
the local wall clock, then placed on the time line:

- a local time that does not exist (the spring-forward gap) runs at the first
  instant after the gap: ``30 2 * * *`` in America/New_York on 2026-03-08
  runs at 03:00 EDT. Several occurrences inside one gap land on that same
  instant and therefore run once;
- a local time that happens twice (the fall-back hour) runs once, at its
  first occurrence: ``30 1 * * *`` on 2026-11-01 runs at 01:30 EDT, not again
  at 01:30 EST. The same goes for ``0 * * * *``: local 01:00 runs once.

All arithmetic starts from an instant the caller read from the database
clock; nothing here reads this host's clock.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import re
import zoneinfo
from collections.abc import Iterator

from cronsim import CronSim, CronSimError

from jobrun.job.errors import ValidationError

UTC = dt.UTC
MAX_EXPRESSION_LENGTH = 200
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
"""The ``@`` shorthands accepted for a whole expression (``@reboot`` has no meaning here)."""
_FIELDS = (
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day", "1-31"),
    ("month", "1-12 or JAN-DEC"),
    ("weekday", "0-7 or SUN-SAT (0 and 7 are Sunday)"),
)
"""Each field of a 6-field expression and its valid values (5 fields drop the first)."""
_CRONSIM_FIELDS = {
    "second": "second",
    "minute": "minute",
    "hour": "hour",
    "day-of-month": "day",
    "month": "month",
    "day-of-week": "weekday",
}
_BAD_FIELD = re.compile(r"Bad ([a-z-]+)")
_TZ_NAME = re.compile(r"[A-Za-z0-9_+\-]+(/[A-Za-z0-9_+\-]+)*")


def time_zone(name: object) -> zoneinfo.ZoneInfo:
    """An IANA time zone by name, or a ValidationError."""
    if not isinstance(name, str) or not _TZ_NAME.fullmatch(name) or len(name) > 64:
        raise ValidationError("timezone", f"{name!r} is not an IANA time zone name")
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValidationError("timezone", f"unknown time zone {name!r}") from None


@dataclasses.dataclass(frozen=True, slots=True)
class CronSchedule:
    """A parsed expression bound to a time zone. Build it with :meth:`parse`."""

    expression: str
    tz: zoneinfo.ZoneInfo

    @classmethod
    def parse(cls, expression: object, timezone: object = "UTC") -> CronSchedule:
        """Validate ``expression`` (and that it ever fires) and ``timezone``."""
        if not isinstance(expression, str):
            raise ValidationError("cron", "must be a str")
        if len(expression) > MAX_EXPRESSION_LENGTH:
            raise ValidationError("cron", f"must be at most {MAX_EXPRESSION_LENGTH} characters")
        fields = expression.split()
        if len(fields) == 1 and fields[0].startswith("@"):
            alias = fields[0].lower()
            if alias not in ALIASES:
                raise ValidationError(
                    "cron", f"{expression!r} is not one of the aliases {', '.join(ALIASES)}"
                )
            fields = [alias]
        elif len(fields) not in (5, 6):
            raise ValidationError(
                "cron",
                f"{expression!r} must have 5 fields (minute hour day month weekday) "
                "or 6 with a leading seconds field, or be an alias like @daily",
            )
        tz = time_zone(timezone)
        schedule = cls(" ".join(fields), tz)
        start = dt.datetime(2000, 1, 1)  # noqa: DTZ001 - a naive local wall-clock time
        try:
            next(CronSim(schedule.cronsim_expression, start))
        except CronSimError as exc:
            raise ValidationError("cron", _explain(expression, fields, exc)) from None
        except StopIteration:
            raise ValidationError("cron", f"{expression!r} never fires") from None
        return schedule

    @property
    def cronsim_expression(self) -> str:
        """The expression as ``cronsim`` reads it: an alias expanded to its 5 fields."""
        return ALIASES.get(self.expression, self.expression)

    def _local_occurrences(self, after_local: dt.datetime) -> Iterator[dt.datetime]:
        """Naive local wall-clock occurrences strictly after ``after_local``."""
        try:
            yield from CronSim(self.cronsim_expression, after_local)
        except CronSimError as exc:  # pragma: no cover - parse() already checked
            raise ValidationError("cron", str(exc)) from None

    def _instant(self, local: dt.datetime) -> dt.datetime:
        """The UTC instant of a naive local time, by the DST rule above."""
        first = local.replace(tzinfo=self.tz, fold=0).astimezone(UTC)
        if first.astimezone(self.tz).replace(tzinfo=None) == local:
            return first  # it exists; fold=0 is the first of two when repeated
        # It falls in a gap. Read with the offsets before and after the jump
        # it names two instants that bracket the transition; the transition
        # (where the wall clock resumes) is the first instant whose local time
        # is past ``local``. Transitions fall on whole seconds.
        low = int(local.replace(tzinfo=self.tz, fold=1).timestamp())
        high = int(first.timestamp())
        low, high = min(low, high), max(low, high)
        while high - low > 1:
            mid = (low + high) // 2
            wall = dt.datetime.fromtimestamp(mid, self.tz).replace(tzinfo=None)
            if wall > local:
                high = mid
            else:
                low = mid
        return dt.datetime.fromtimestamp(high, UTC)

    def next_after(self, instant: dt.datetime) -> dt.datetime:
        """The first occurrence strictly after ``instant`` (aware), as UTC."""
        if instant.tzinfo is None:
            raise ValidationError("now", "must be timezone-aware")
        # The wall clock only runs backwards in a repeated hour, and the
        # occurrences there were already placed at their first occurrence
        # (before ``instant``), so the next one is after the local time of
        # ``instant``; the check below skips anything not strictly later.
        local = instant.astimezone(self.tz).replace(tzinfo=None, microsecond=0)
        for occurrence in self._local_occurrences(local):
            at = self._instant(occurrence)
            if at > instant:
                return at
        raise ValidationError("cron", f"{self.expression!r} never fires again")

    def latest_due(self, start: dt.datetime, now: dt.datetime) -> dt.datetime | None:
        """The latest occurrence in [start, now], or None when start is after now.

        ``start`` is a schedule's ``next_run_at`` (itself an occurrence): after
        downtime spanning several periods only the latest one is due
        (coalesced), never a burst. Found by walking back from ``now``, so a
        long downtime costs nothing.
        """
        if start > now:
            return None
        local = now.astimezone(self.tz).replace(tzinfo=None, microsecond=0)
        backwards = CronSim(self.cronsim_expression, local + dt.timedelta(seconds=1), reverse=True)
        for occurrence in itertools.islice(backwards, 1000):
            at = self._instant(occurrence)
            if at <= now:
                return max(at, start)
        return start  # pragma: no cover - start itself is an occurrence <= now


def _explain(expression: str, fields: list[str], exc: CronSimError) -> str:
    """cronsim's "Bad minute" as "minute must be 0-59, got 61" (the field, its range, its text)."""
    match = _BAD_FIELD.match(str(exc))
    name = _CRONSIM_FIELDS.get(match.group(1), "") if match else ""
    names = [n for n, _ in _FIELDS[6 - len(fields) :]]
    if name not in names:
        return f"{expression!r}: {exc}"
    index = names.index(name)
    alone = ["*"] * len(fields)
    alone[index] = fields[index]
    try:
        CronSim(" ".join(alone), dt.datetime(2000, 1, 1))  # noqa: DTZ001 - naive wall clock
    except CronSimError:
        valid = dict(_FIELDS)[name]
        return f"{expression!r}: {name} must be {valid}, got {fields[index]}"
    # The field is fine on its own: cronsim refused the combination (day 31 in February).
    if name == "day":
        month = fields[names.index("month")]
        return f"{expression!r}: day {fields[index]} never comes in month {month}"
    return f"{expression!r}: {exc}"  # pragma: no cover - cronsim only checks day with month
