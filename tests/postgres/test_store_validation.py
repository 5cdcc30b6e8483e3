"""Bad input: a typed ValidationError before any SQL; no row, no event, no notification."""

from __future__ import annotations

import datetime as dt
import decimal
import math
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import Backoff, NewJob
from jobrun.job.validate import MAX_PAYLOAD_BYTES
from jobrun.postgres.store import Store
from tests.postgres.conftest import counts
from tests.postgres.test_store_enqueue import listen, pending_notifies


def deep(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return root


def circular() -> dict[str, Any]:
    d: dict[str, Any] = {}
    d["self"] = d
    return d


BAD_JOBS: dict[str, Callable[[], NewJob]] = {
    "payload not serialisable (set)": lambda: NewJob(type="t", payload={"s": {1, 2}}),
    "payload not serialisable (bytes)": lambda: NewJob(type="t", payload={"b": b"x"}),
    "payload not serialisable (datetime)": lambda: NewJob(
        type="t", payload={"d": dt.datetime.now(dt.UTC)}
    ),
    "payload not serialisable (Decimal)": lambda: NewJob(
        type="t", payload={"d": decimal.Decimal("1.1")}
    ),
    "payload not serialisable (object)": lambda: NewJob(type="t", payload={"o": object()}),
    "payload NaN": lambda: NewJob(type="t", payload={"x": math.nan}),
    "payload Infinity": lambda: NewJob(type="t", payload={"x": [math.inf]}),
    "payload NUL in a value": lambda: NewJob(type="t", payload={"x": "a\x00b"}),
    "payload NUL in a key": lambda: NewJob(type="t", payload={"a\x00": 1}),
    "payload nested too deep": lambda: NewJob(type="t", payload=deep(100)),
    "payload nested 10k deep": lambda: NewJob(type="t", payload=deep(10_000)),
    "payload circular": lambda: NewJob(type="t", payload=circular()),
    "payload too large": lambda: NewJob(type="t", payload={"x": "a" * (MAX_PAYLOAD_BYTES + 1)}),
    "payload non-string key": lambda: NewJob(type="t", payload={1: "x"}),
    "payload top-level scalar": lambda: NewJob(type="t", payload=5),
    "payload top-level list": lambda: NewJob(type="t", payload=[1]),
    "type empty": lambda: NewJob(type=""),
    "type too long": lambda: NewJob(type="t" * 129),
    "type with spaces": lambda: NewJob(type="send email"),
    "type not a str": lambda: NewJob(type=5),  # type: ignore[arg-type]
    "queue empty": lambda: NewJob(type="t", queue=""),
    "queue whitespace": lambda: NewJob(type="t", queue=" "),
    "queue too long": lambda: NewJob(type="t", queue="q" * 64),
    "queue upper case": lambda: NewJob(type="t", queue="Emails"),
    "queue with NUL": lambda: NewJob(type="t", queue="a\x00"),
    "queue with quote": lambda: NewJob(type="t", queue="a'; DROP TABLE jobrun.jobs; --"),
    "queue None": lambda: NewJob(type="t", queue=None),  # type: ignore[arg-type]
    "priority too high": lambda: NewJob(type="t", priority=40_000),
    "priority too low": lambda: NewJob(type="t", priority=-40_000),
    "priority float": lambda: NewJob(type="t", priority=1.5),  # type: ignore[arg-type]
    "max_attempts zero": lambda: NewJob(type="t", max_attempts=0),
    "max_attempts negative": lambda: NewJob(type="t", max_attempts=-1),
    "max_attempts bool": lambda: NewJob(type="t", max_attempts=True),
    "max_attempts float": lambda: NewJob(type="t", max_attempts=1.5),  # type: ignore[arg-type]
    "max_attempts absurd": lambda: NewJob(type="t", max_attempts=2**31),
    "max_attempts None": lambda: NewJob(type="t", max_attempts=None),  # type: ignore[arg-type]
    "negative delay": lambda: NewJob(type="t", delay=dt.timedelta(seconds=-1)),
    "huge delay": lambda: NewJob(type="t", delay=dt.timedelta.max),
    "delay not a timedelta": lambda: NewJob(type="t", delay=5),  # type: ignore[arg-type]
    "naive run_at": lambda: NewJob(type="t", run_at=dt.datetime(2030, 1, 1)),  # noqa: DTZ001
    "run_at and delay": lambda: NewJob(
        type="t", run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC), delay=dt.timedelta(1)
    ),
    "idempotency key empty": lambda: NewJob(type="t", idempotency_key=""),
    "idempotency key too long": lambda: NewJob(type="t", idempotency_key="k" * 256),
    "idempotency key NUL": lambda: NewJob(type="t", idempotency_key="a\x00"),
    "idempotency key not a str": lambda: NewJob(type="t", idempotency_key=5),  # type: ignore[arg-type]
    "backoff negative": lambda: NewJob(type="t", backoff=Backoff(base=-1.0)),
    "backoff NaN": lambda: NewJob(type="t", backoff=Backoff(base=math.nan)),
    "backoff unknown kind": lambda: NewJob(type="t", backoff=Backoff(kind="random")),  # type: ignore[arg-type]
    "backoff not a Backoff": lambda: NewJob(type="t", backoff={"base": 1}),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("case", sorted(BAD_JOBS))
def test_bad_job_is_a_validation_error_before_anything_is_written(
    case: str, store: Store, conn: psycopg.Connection[Any], dsn: str
) -> None:
    with listen(dsn) as listener:
        with pytest.raises(ValidationError) as info:
            store.enqueue(BAD_JOBS[case]())
        assert info.value.field
        assert pending_notifies(listener, wait=0.05) == []
    assert counts(conn) == (0, 0, 0)


def test_tuples_in_a_payload_become_lists() -> None:
    assert NewJob(type="t", payload={"x": (1, (2, 3))}).payload == {"x": [1, [2, 3]]}


def test_shared_references_are_fine_in_a_payload() -> None:
    shared = [1, 2]
    assert NewJob(type="t", payload={"a": shared, "b": shared}).payload == {
        "a": [1, 2],
        "b": [1, 2],
    }


def test_unicode_payloads_and_keys_round_trip(store: Store) -> None:
    payload = {"naïve": "日本語 \u2603 \U0001f600", "quote": "'\";--"}
    job = store.enqueue(NewJob(type="t", payload=payload))
    assert store.get(job.id).payload == payload


@pytest.mark.parametrize(
    "options",
    [
        {"event_mode": "verbose"},
        {"notify_channel": "Bad-Channel"},
        {"notify_channel": "x" * 64},
        {"notify_channel": "a; DROP TABLE jobrun.jobs"},
        {"commit_timeout": dt.timedelta(0)},
    ],
)
def test_bad_store_options_are_validation_errors(pool: Any, options: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Store(pool, **options)
