"""Cron expressions in a time zone, and the DST rule jobrun follows.

Expressions are standard 5-field cron (``minute hour day month weekday``) or
6 fields with a leading seconds field (``second minute hour day month
weekday``), parsed by ``cronsim``. Each schedule has an IANA time zone.

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
        if len(fields) not in (5, 6):
            raise ValidationError(
                "cron",
                f"{expression!r} must have 5 fields (minute hour day month weekday) "
                "or 6 with a leading seconds field",
            )
        tz = time_zone(timezone)
        schedule = cls(" ".join(fields), tz)
        start = dt.datetime(2000, 1, 1)  # noqa: DTZ001 - a naive local wall-clock time
        try:
            next(CronSim(schedule.expression, start))
        except CronSimError as exc:
            raise ValidationError("cron", f"{expression!r}: {exc}") from None
        except StopIteration:
            raise ValidationError("cron", f"{expression!r} never fires") from None
        return schedule

    def _local_occurrences(self, after_local: dt.datetime) -> Iterator[dt.datetime]:
        """Naive local wall-clock occurrences strictly after ``after_local``."""
        try:
            yield from CronSim(self.expression, after_local)
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
        backwards = CronSim(self.expression, local + dt.timedelta(seconds=1), reverse=True)
        for occurrence in itertools.islice(backwards, 1000):
            at = self._instant(occurrence)
            if at <= now:
                return max(at, start)
        return start  # pragma: no cover - start itself is an occurrence <= now
