"""Durations as the docs write them (``1h30m``, ``90s``, ``2d``), everywhere one is taken."""

from __future__ import annotations

import datetime as dt

import pytest

from jobrun.config import Settings, parse_duration
from jobrun.job.errors import ValidationError


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("300", 300),
        ("1.5", 1.5),
        ("250ms", 0.25),
        ("90s", 90),
        ("5m", 300),
        ("2h", 7200),
        ("2d", 172_800),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        (" 2d12h ", 216_000),
        ("1h30m15s", 5415),
        ("1m500ms", 60.5),
        ("1.5h", 5400),
    ],
)
def test_single_and_compound_durations_are_read(text: str, seconds: float) -> None:
    assert parse_duration(text, "x") == dt.timedelta(seconds=seconds)


@pytest.mark.parametrize(
    "text", ["", " ", "h", "soon", "1x", "1h30", "30m1h", "5m5m", "-5s", "1 h 1"]
)
def test_a_bad_duration_is_one_clear_line_naming_the_flag(text: str) -> None:
    with pytest.raises(ValidationError) as raised:
        parse_duration(text, "--delay")
    assert str(raised.value) == f"--delay: {text!r} is not a duration (like 90s, 5m, 1h30m, 7d)"


def test_too_long_a_duration_is_refused() -> None:
    with pytest.raises(ValidationError, match="too long"):
        parse_duration("4000d", "x")


def test_settings_from_the_environment_take_compound_durations() -> None:
    settings = Settings.from_env({"JOBRUN_LEASE_TTL": "1m30s", "JOBRUN_SHUTDOWN_GRACE": "1h30m"})
    assert settings.lease_ttl == dt.timedelta(seconds=90)
    assert settings.shutdown_grace == dt.timedelta(minutes=90)


def test_a_bad_duration_in_the_environment_names_the_variable() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings.from_env({"JOBRUN_LEASE_TTL": "1h30"})
    assert raised.value.field == "JOBRUN_LEASE_TTL"
    assert "\n" not in str(raised.value)
