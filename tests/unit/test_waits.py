"""Durable waits' domain half: what names, keys, payloads and durations are taken,
what a handler may catch, and a context made by hand (no worker)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import uuid

import pytest

from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import Job
from jobrun.job.signals import (
    MAX_SIGNAL_NAME_CHARS,
    Parked,
    SignalTimeout,
    signal_key,
    signal_name,
    signal_payload,
    wait_seconds,
)
from jobrun.worker.context import JobContext
from tests.support.jobs import leased_job

NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _job() -> Job:
    return leased_job(queue="default", type="signup")


@pytest.mark.parametrize("bad", ["", "x" * (MAX_SIGNAL_NAME_CHARS + 1), "a\x00b", 7, None, b"x"])
def test_a_signal_name_or_key_is_a_short_non_empty_str(bad: object) -> None:
    with pytest.raises(ValidationError, match="name"):
        signal_name(bad)
    with pytest.raises(ValidationError, match="key"):
        signal_key(bad)
    assert signal_name("email.confirmed") == "email.confirmed"


def test_a_payload_is_any_json_value_checked_by_the_result_s_rules() -> None:
    assert signal_payload(None) is None
    assert json.loads(signal_payload([1, "two"]) or "") == [1, "two"]
    for bad in ({1: 2}, math.nan, {"x": object()}):
        with pytest.raises(ValidationError, match="payload"):
            signal_payload(bad)


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, True, "5", dt.timedelta(0), 10**12])
def test_a_wait_lasts_a_positive_finite_time_of_at_most_ten_years(bad: object) -> None:
    with pytest.raises(ValidationError, match="timeout"):
        wait_seconds(bad, "timeout")
    assert wait_seconds(dt.timedelta(minutes=2), "timeout") == 120.0
    assert wait_seconds(0.5, "timeout") == 0.5


def test_parked_passes_an_except_exception_and_a_timeout_is_a_timeout_error() -> None:
    assert not issubclass(Parked, Exception)
    assert issubclass(SignalTimeout, JobrunError) and issubclass(SignalTimeout, TimeoutError)
    timeout = SignalTimeout(uuid.UUID(int=1), "confirm", "confirmed", NOW)
    assert "no signal 'confirmed' came before 2026-01-01" in str(timeout)


def test_a_context_made_by_hand_sleeps_not_at_all_and_refuses_a_signal_wait() -> None:
    ctx = JobContext(_job())
    assert ctx.sleep("nap", dt.timedelta(days=1)) is None
    assert ctx.sleep("nap-2", 1) is None
    with pytest.raises(ValidationError, match="already used"):
        ctx.sleep("nap", 1)
    with pytest.raises(ValidationError, match="in a worker"):
        ctx.wait_for_signal("confirmed", timeout=60)
    with pytest.raises(ValidationError, match="timeout"):  # checked before the name is taken
        ctx.wait_for_signal("confirmed", timeout=0, step="nap-3")
    assert ctx.sleep("nap-3", 1) is None


def test_the_async_twins_on_a_context_made_by_hand() -> None:
    ctx = JobContext(_job())

    async def handler() -> None:
        await ctx.sleep_async("nap", 1)
        with pytest.raises(ValidationError, match="in a worker"):
            await ctx.wait_for_signal_async("confirmed", timeout=60)

    asyncio.run(handler())
