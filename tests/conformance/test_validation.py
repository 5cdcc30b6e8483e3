"""Bad input is a ValidationError before any SQL, on either store and client.

The pool is closed before each bad call: a call that reached for a
connection would fail with something else than the ValidationError.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob
from jobrun.postgres.events import EventMode
from tests.conformance.drive import Driven, Flavour
from tests.postgres.conftest import new_job

STORE_CALLS: dict[str, Callable[[Driven], Any]] = {
    "enqueue not a NewJob": lambda s: s.enqueue({"type": "t"}),
    "batch empty": lambda s: s.enqueue_batch([]),
    "batch empty generator": lambda s: s.enqueue_batch(iter([])),
    "batch key twice": lambda s: s.enqueue_batch(
        [new_job(idempotency_key="k"), new_job(idempotency_key="k")]
    ),
    "batch foreign item": lambda s: s.enqueue_batch([new_job(), "nope"]),
    "get not a uuid": lambda s: s.get("not-a-uuid"),
    "events not a uuid": lambda s: s.events("not-a-uuid"),
    "cancel not a uuid": lambda s: s.cancel("not-a-uuid"),
    "retry not a uuid": lambda s: s.retry("not-a-uuid"),
    "watch not a uuid": lambda s: s.watch("not-a-uuid"),
    "list unknown state": lambda s: s.list(state="running"),
    "list limit zero": lambda s: s.list(limit=0),
    "list bad queue": lambda s: s.list(queue="NO SPACES"),
    "list bad type": lambda s: s.list(type=""),
    "list after not a uuid": lambda s: s.list(after="x"),
    "wait negative timeout": lambda s: s.wait(uuid.uuid4(), timeout=-1),
    "wait zero poll interval": lambda s: s.wait(uuid.uuid4(), poll_interval=0),
    "wait bool timeout": lambda s: s.wait(uuid.uuid4(), timeout=True),
    "wait not a uuid": lambda s: s.wait("not-a-uuid", timeout=1),
}


def refused(calls: dict[str, Callable[[Driven], Any]], target: Driven) -> dict[str, str]:
    """The calls that did not raise a ValidationError naming a field: what they did."""
    wrong: dict[str, str] = {}
    for case, call in calls.items():
        try:
            call(target)
        except ValidationError as exc:
            if not exc.field:
                wrong[case] = f"a ValidationError naming no field: {exc}"
        except Exception as exc:
            wrong[case] = f"{type(exc).__name__}: {exc}"
        else:
            wrong[case] = "no error"
    return wrong


def test_a_bad_store_call_is_a_validation_error_before_any_sql(
    flavour: Flavour, flavour_pool: Any, store: Driven
) -> None:
    flavour.close_pool(flavour_pool)
    assert refused(STORE_CALLS, store) == {}


CLIENT_CALLS: dict[str, Callable[[Driven], Any]] = {
    "empty type": lambda c: c.enqueue("", {}),
    "queue name": lambda c: c.enqueue("t", queue="bad queue!"),
    "NaN payload": lambda c: c.enqueue("t", {"x": float("nan")}),
    "bool priority": lambda c: c.enqueue("t", priority=True),
    "naive run_at": lambda c: c.enqueue("t", run_at=dt.datetime(2030, 1, 1)),  # noqa: DTZ001
    "run_at and delay": lambda c: c.enqueue(
        "t", run_at=dt.datetime(2030, 1, 1, tzinfo=dt.UTC), delay=dt.timedelta(1)
    ),
    "enqueue_job not a NewJob": lambda c: c.enqueue_job({"type": "t"}),
    "many of NewJobs": lambda c: c.enqueue_many(NewJob(type="t"), [{}]),
    "many empty": lambda c: c.enqueue_many("t", []),
    "batch empty": lambda c: c.enqueue_batch([]),
    "get not a uuid": lambda c: c.get("not-a-uuid"),
    "cancel not a uuid": lambda c: c.cancel("not-a-uuid"),
    "list bad after": lambda c: c.list(after="not-a-uuid"),
    "wait negative timeout": lambda c: c.wait(uuid.uuid4(), timeout=-1),
}


def test_a_bad_client_call_is_a_validation_error_before_any_sql(
    flavour: Flavour, flavour_pool: Any, client: Driven
) -> None:
    flavour.close_pool(flavour_pool)
    assert refused(CLIENT_CALLS, client) == {}


BAD_OPTIONS: dict[str, dict[str, Any]] = {
    "event_mode": {"event_mode": "verbose"},
    "channel case": {"notify_channel": "Bad-Channel"},
    "channel length": {"notify_channel": "x" * 64},
    "channel injection": {"notify_channel": "a; DROP TABLE jobrun.jobs"},
    "call_timeout zero": {"call_timeout": dt.timedelta(0)},
    "schema": {"schema": "no such; schema"},
}


def test_the_store_options_are_checked(make_store: Callable[..., Driven]) -> None:
    for case, options in BAD_OPTIONS.items():
        with pytest.raises(ValidationError):
            make_store(**options)
            pytest.fail(case)
    assert make_store(event_mode="terminal").event_mode is EventMode.TERMINAL
