"""Cron aliases (@daily and kin) and errors that name the wrong field with its range."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator

import pytest

from jobrun.job import cron
from jobrun.job.cron import CronSchedule
from jobrun.job.errors import ValidationError
from jobrun.job.model import ScheduleSpec

UTC = dt.UTC
EXPANSIONS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
INSTANTS = [
    dt.datetime(2026, 1, 1, 0, 0, tzinfo=UTC),
    dt.datetime(2026, 3, 8, 6, 59, 59, tzinfo=UTC),  # just before New York springs forward
    dt.datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # New York's repeated hour
    dt.datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC),
    dt.datetime(2028, 2, 29, 12, 0, tzinfo=UTC),
]


def test_every_alias_of_the_cron_convention_is_accepted() -> None:
    assert set(cron.ALIASES) == set(EXPANSIONS)


@pytest.mark.parametrize(("alias", "expansion"), EXPANSIONS.items())
@pytest.mark.parametrize("zone", ["UTC", "America/New_York", "Asia/Kolkata"])
def test_an_alias_fires_exactly_when_its_five_fields_do(
    alias: str, expansion: str, zone: str
) -> None:
    short, long = CronSchedule.parse(alias, zone), CronSchedule.parse(expansion, zone)
    for instant in INSTANTS:
        assert short.next_after(instant) == long.next_after(instant)
        start = instant - dt.timedelta(days=400)
        assert short.latest_due(start, instant) == long.latest_due(start, instant)


def test_an_alias_is_kept_as_written_in_lower_case() -> None:
    assert CronSchedule.parse("  @Daily ").expression == "@daily"
    assert ScheduleSpec(id="s", cron="@HOURLY", type="t").cron == "@hourly"


def test_hourly_runs_every_hour_on_the_hour() -> None:
    schedule = CronSchedule.parse("@hourly")
    at = dt.datetime(2026, 5, 5, 10, 20, tzinfo=UTC)
    runs = list(itertools.islice(_runs(schedule, at), 3))
    assert [r.hour for r in runs] == [11, 12, 13]
    assert {(r.minute, r.second) for r in runs} == {(0, 0)}


def _runs(schedule: CronSchedule, after: dt.datetime) -> Iterator[dt.datetime]:
    while True:
        after = schedule.next_after(after)
        yield after


@pytest.mark.parametrize("alias", ["@reboot", "@every5m", "@", "@dayly"])
def test_an_unknown_alias_is_a_validation_error_listing_the_aliases(alias: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CronSchedule.parse(alias)
    assert caught.value.field == "cron"
    assert "@daily" in str(caught.value)
    assert "@hourly" in str(caught.value)


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "minute must be 0-59, got 61"),
        ("* 24 * * *", "hour must be 0-23, got 24"),
        ("0 0 0 * *", "day must be 1-31, got 0"),
        ("0 0 32 * *", "day must be 1-31, got 32"),
        ("0 0 1 13 *", "month must be 1-12 or JAN-DEC, got 13"),
        ("0 0 * * 8", "weekday must be 0-7 or SUN-SAT"),
        ("0 0 * * 8", "got 8"),
        ("1-70 * * * *", "minute must be 0-59, got 1-70"),
        ("*/0 * * * *", "minute must be 0-59, got */0"),
        ("60 0 * * * *", "second must be 0-59, got 60"),
        ("0 60 * * * *", "minute must be 0-59, got 60"),
        ("0 0 12 * * FOO", "weekday must be 0-7 or SUN-SAT"),
    ],
)
def test_a_field_out_of_range_is_named_with_its_valid_range(expression: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CronSchedule.parse(expression)
    assert caught.value.field == "cron"
    assert message in str(caught.value)
    assert repr(expression) in str(caught.value)


def test_a_day_that_never_comes_in_the_month_says_so() -> None:
    with pytest.raises(ValidationError) as caught:
        CronSchedule.parse("0 0 31 2 *")
    assert "day 31 never comes in month 2" in str(caught.value)
    assert "must be" not in str(caught.value)  # 31 is a valid day, just not in February
