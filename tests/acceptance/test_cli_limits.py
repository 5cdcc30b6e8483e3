"""Flow control from the ``jobrun`` command (issue 14): queue limits, concurrency keys, and
what ``jobrun get`` shows of a job's snoozes and progress.

In this process (``cli.main``), against a real PostgreSQL; the hostile-bytes
cases run ``python -m jobrun.cli`` as a shell would.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from jobrun import cli
from jobrun.client import Client
from tests.acceptance import test_cli_hostile_input as hostile
from tests.acceptance.test_cli import (  # fixtures, imported for pytest
    Result,
    _isolated_environment,
    assert_one_line_error,
    client,
    jobrun,
)

__all__ = ["_isolated_environment", "client", "jobrun"]

TTL = dt.timedelta(seconds=30)
Run = Callable[..., Result]


def limits_of(client: Client, queue: str) -> tuple[Any, ...]:
    lim = client.queue_limits(queue)
    return (lim.concurrency, lim.per_key, None if lim.rate is None else str(lim.rate))


def details(out: str) -> dict[str, str]:
    """``jobrun get``'s key-value lines as a dict."""
    rows = (line.split(None, 1) for line in out.splitlines() if line.strip())
    return {row[0]: row[1] if len(row) > 1 else "" for row in rows}


# -- jobrun queues limit / unlimit ---------------------------------------------------------


def test_limit_sets_every_limit_named_and_prints_the_queues_limits(
    jobrun: Run, client: Client
) -> None:
    result = jobrun("queues", "limit", "emails", "5", "--per-key", "1", "--rate", "100/s")
    assert (result.code, result.err) == (0, "")
    assert result.out == "queue emails: concurrency 5, per key 1, rate 100/s\n"
    assert limits_of(client, "emails") == (5, 1, "100/s")

    as_json = jobrun("queues", "limit", "reports", "--rate", "5/10s", "--json")
    assert as_json.code == 0, as_json.err
    body = as_json.json()
    assert body["queue"] == "reports"
    assert (body["concurrency"], body["per_key"]) == (None, None)
    assert body["rate"] == {"limit": 5, "period": 10.0}
    assert (body["leased"], body["started_in_window"]) == (0, 0)


def test_limit_replaces_the_limits_given_and_keeps_the_others(jobrun: Run, client: Client) -> None:
    client.set_queue_limits("emails", concurrency=5, rate="10/min")
    result = jobrun("queues", "limit", "emails", "--per-key", "2")
    assert result.out == "queue emails: concurrency 5, per key 2, rate 10/min\n"
    assert jobrun("queues", "limit", "emails", "3").out == (
        "queue emails: concurrency 3, per key 2, rate 10/min\n"
    )
    assert jobrun("queues", "limit", "emails", "--rate", "1000/h").out == (
        "queue emails: concurrency 3, per key 2, rate 1000/h\n"
    )
    assert limits_of(client, "emails") == (3, 2, "1000/h")


def test_each_no_flag_removes_its_limit_and_removing_the_last_lifts_them_all(
    jobrun: Run, client: Client
) -> None:
    client.set_queue_limits("emails", concurrency=5, per_key=1, rate="100/s")
    assert jobrun("queues", "limit", "emails", "--no-rate").out == (
        "queue emails: concurrency 5, per key 1\n"
    )
    assert jobrun("queues", "limit", "emails", "--no-per-key", "--rate", "7/s").out == (
        "queue emails: concurrency 5, rate 7/s\n"
    )
    assert jobrun("queues", "limit", "emails", "--no-concurrency", "--no-rate").out == (
        "queue emails: no limits\n"
    )
    assert client.all_queue_limits() == []
    # On a queue without limits, removing one is no error: it still has none.
    assert jobrun("queues", "limit", "idle", "--no-rate").out == "queue idle: no limits\n"


def test_unlimit_lifts_every_limit_or_says_the_queue_had_none(jobrun: Run, client: Client) -> None:
    client.set_queue_limits("emails", concurrency=5, rate="100/s")
    assert jobrun("queues", "unlimit", "emails").out == "queue emails: limits lifted\n"
    assert client.all_queue_limits() == []
    again = jobrun("queues", "unlimit", "emails")
    assert (again.code, again.out) == (0, "queue emails had no limits\n")  # as resume does
    client.set_queue_limits("emails", per_key=1)
    assert jobrun("queues", "unlimit", "emails", "--json").json() == {
        "queue": "emails",
        "limits": None,
        "had_limits": True,
    }
    assert jobrun("queues", "unlimit", "emails", "--json").json()["had_limits"] is False


# case -> (the arguments after `queues limit`, what the error line says)
BAD_LIMITS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "zero": (("emails", "0"), ("concurrency: ", "1 to 1,000,000", "'0'")),
    "negative": (("emails", "-1"), ("concurrency: ", "'-1'")),
    "a word": (("emails", "five"), ("concurrency: ", "'five'")),
    "above the maximum": (("emails", "1000001"), ("concurrency: ", "1,000,000")),
    "5000 digits": (("emails", "9" * 5000), ("concurrency: ", "1,000,000")),
    "per key zero": (("emails", "--per-key", "0"), ("--per-key: ", "'0'")),
    "per key fractional": (("emails", "--per-key", "1.5"), ("--per-key: ", "'1.5'")),
    "rate not a rate": (("emails", "--rate", "fast"), ("rate: ", "'fast' is not a rate", "100/s")),
    "rate of zero": (("emails", "--rate", "0/s"), ("rate: ", "1 to 1,000,000")),
    "rate unit unknown": (("emails", "--rate", "10/fortnight"), ("rate: ", "'10/fortnight'")),
    "rate period too long": (("emails", "--rate", "10/2d"), ("rate: ", "1 day")),
    "rate period too short": (("emails", "3", "--rate", "1/0.0001s"), ("rate: ", "1 ms")),
    "queue name": (("no such!", "5"), ("queue: ",)),
}


@pytest.mark.parametrize("case", sorted(BAD_LIMITS))
def test_bad_limits_are_a_one_line_validation_error_and_change_nothing(
    jobrun: Run, client: Client, case: str
) -> None:
    args, fragments = BAD_LIMITS[case]
    client.set_queue_limits("emails", concurrency=9, rate="50/s")
    result = jobrun("queues", "limit", *args)
    assert_one_line_error(result, cli.EXIT_VALIDATION, *fragments)
    assert [lim.queue for lim in client.all_queue_limits()] == ["emails"]
    assert limits_of(client, "emails") == (9, None, "50/s")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("emails",), "give CONCURRENCY, --per-key or --rate"),
        (("emails", "5", "--no-concurrency"), "CONCURRENCY or --no-concurrency, not both"),
        (("emails", "--per-key", "1", "--no-per-key"), "--per-key or --no-per-key, not both"),
        (("emails", "--rate", "1/s", "--no-rate"), "--rate or --no-rate, not both"),
    ],
    ids=["nothing", "concurrency", "per key", "rate"],
)
def test_limit_with_nothing_to_do_or_a_limit_and_its_removal_is_a_usage_error(
    jobrun: Run, client: Client, args: tuple[str, ...], fragment: str
) -> None:
    assert_one_line_error(jobrun("queues", "limit", *args), cli.EXIT_USAGE, fragment)
    assert client.all_queue_limits() == []


def test_hostile_bytes_in_a_limit_or_a_concurrency_key_exit_7_and_write_nothing(
    dsn: str, conn: psycopg.Connection[Any]
) -> None:
    for args, field in (
        (("queues", "limit", b"q\xfe", "5"), "queue"),
        (("queues", "limit", "q", "--rate", b"5/\xffs"), "rate"),
        (("queues", "limit", "q", b"\xff5"), "concurrency"),
        (("enqueue", "t.a", "--concurrency-key", b"acme-\xff"), "concurrency_key"),
        (("enqueue", "t.a", "--concurrency-key", ""), "concurrency_key"),
    ):
        result = hostile.jobrun(dsn, *args)
        assert_one_line_error(result, cli.EXIT_VALIDATION, f"jobrun: {field}: ")
    assert hostile.row_counts(conn) == (0, 0, 0)
    assert conn.execute("SELECT count(*) FROM jobrun.queue_limits").fetchone() == (0,)


# -- jobrun queues list --------------------------------------------------------------------


def test_queues_list_shows_each_queues_limits_and_what_they_hold(
    jobrun: Run, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(3):
        client.enqueue("t.a", queue="emails")
    client.enqueue("t.a", queue="default")
    client.set_queue_limits("emails", concurrency=2, rate="10/min")
    client.set_queue_limits("reports", per_key=1)  # limited, and no job yet
    client.pause_queue("reports")
    assert len(client.store.claim("w", ["emails"], 10, TTL)) == 2  # the limit holds
    client.store.claim("w", ["default"], 10, TTL)

    rows = {r["queue"]: r for r in jobrun("queues", "list", "--json").json()}
    assert sorted(rows) == ["default", "emails", "reports"]
    assert rows["default"] == {"queue": "default", "paused": False, "leased": 1, "limits": None}
    emails = rows["emails"]
    assert (emails["paused"], emails["leased"]) == (False, 2)
    assert emails["limits"]["concurrency"] == 2
    assert emails["limits"]["rate"] == {"limit": 10, "period": 60.0}
    assert (emails["limits"]["leased"], emails["limits"]["started_in_window"]) == (2, 2)
    assert rows["reports"]["paused"] is True
    assert rows["reports"]["limits"]["per_key"] == 1

    monkeypatch.setenv("COLUMNS", "80")
    lines = jobrun("queues", "list").out.splitlines()
    assert lines[0].split() == ["queue", "paused", "limits", "leased", "started"]
    assert all(len(line) <= 80 for line in lines)
    table = {line.split()[0]: line for line in lines[1:]}
    assert re.fullmatch(r"emails\s+concurrency 2, rate 10/min\s+2/2\s+2/10", table["emails"])
    assert re.fullmatch(r"reports\s+paused\s+per key 1\s+0", table["reports"])
    assert re.fullmatch(r"default\s+1", table["default"])


# -- jobrun enqueue --concurrency-key, jobrun get ------------------------------------------


def test_enqueue_concurrency_key_is_what_the_per_key_limit_counts(
    jobrun: Run, client: Client
) -> None:
    first = jobrun("enqueue", "t.a", "--queue", "tenants", "--concurrency-key", "acme", "--json")
    assert first.code == 0, first.err
    assert first.json()["concurrency_key"] == "acme"
    jobrun("enqueue", "t.a", "--queue", "tenants", "--concurrency-key", "acme")
    other = jobrun("enqueue", "t.a", "--queue", "tenants", "--concurrency-key", "globex").out
    unkeyed = jobrun("enqueue", "t.a", "--queue", "tenants").out
    assert jobrun("queues", "limit", "tenants", "--per-key", "1").code == 0

    claimed = client.store.claim("w", ["tenants"], 10, TTL)
    # The second acme job waits; the jobs behind it are not held up by it.
    assert sorted(str(j.id) for j in claimed) == sorted(
        [first.json()["id"], other.strip(), unkeyed.strip()]
    )
    assert {j.concurrency_key for j in claimed} == {"acme", "globex", None}


def test_get_shows_the_concurrency_key_snoozes_and_progress_only_when_present(
    jobrun: Run, client: Client
) -> None:
    plain = client.enqueue("t.a", queue="plain")
    shown = details(jobrun("get", str(plain.id)).out)
    assert not {"concurrency_key", "snoozes", "releases", "progress"} & set(shown)

    job = client.enqueue("video.encode", queue="video", concurrency_key="acme")
    (claimed,) = client.store.claim("w", ["video"], 1, TTL)
    client.store.release(claimed, dt.timedelta(0), "not yet", snooze=True)
    (claimed,) = client.store.claim("w", ["video"], 1, TTL)
    at = client.store.record_progress(claimed, 0.4, "chunk 4\nof 10")

    result = jobrun("get", str(job.id))
    assert result.code == 0, result.err
    shown = details(result.out)
    assert shown["concurrency_key"] == "acme"
    assert shown["snoozes"] == "1"
    assert shown["attempts"] == "1 of 25"  # the snooze gave its attempt back
    assert shown["progress"] == f"40% at {at:%Y-%m-%dT%H:%M:%SZ}: chunk 4 of 10"

    body = jobrun("get", str(job.id), "--json").json()
    assert (body["concurrency_key"], body["snoozes"]) == ("acme", 1)
    assert (body["progress"], body["progress_message"]) == (0.4, "chunk 4\nof 10")
    assert dt.datetime.fromisoformat(body["progress_at"]) == at

    assert "releases" not in shown
    client.store.record_progress(claimed, 1)
    assert details(jobrun("get", str(job.id)).out)["progress"] == (
        f"100% at {client.get(job.id).progress_at:%Y-%m-%dT%H:%M:%SZ}"
    )


def test_progress_reads_as_a_percentage_that_never_rounds_up_to_done() -> None:
    assert [cli.percent(f) for f in (0, 0.001, 0.125, 0.4, 0.57, 0.29, 0.9999, 1)] == [
        "0%",
        "0.1%",
        "12.5%",
        "40%",
        "57%",
        "29%",
        "99.9%",
        "100%",
    ]


def test_get_shows_how_often_workers_without_its_handler_released_a_job(
    jobrun: Run, client: Client
) -> None:
    job = client.enqueue("t.unknown", queue="nobody")
    for _ in range(2):
        (claimed,) = client.store.claim("w", ["nobody"], 1, TTL)
        client.store.release(claimed, dt.timedelta(0), "no handler for it here")
    assert details(jobrun("get", str(job.id)).out)["releases"] == "2"
    assert jobrun("get", str(job.id), "--json").json()["releases"] == 2
