"""``jobrun why ID``: what holds a job back, one line per reason (issue 28, item 9).

In this process (``cli.main``), against a real PostgreSQL; each reason's
reading is tested in tests/postgres/test_why.py, this is what a person sees.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable

from jobrun.client import Client
from tests.acceptance.test_cli import (  # fixtures, imported for pytest
    Result,
    _isolated_environment,
    assert_one_line_error,
    client,
    jobrun,
)

__all__ = ["_isolated_environment", "client", "jobrun"]

Run = Callable[..., Result]


def test_why_names_each_reason_on_a_line_of_its_own(jobrun: Run, client: Client) -> None:
    job = client.enqueue("emails.send", {}, queue="emails", delay=dt.timedelta(hours=2))
    client.pause_queue("emails")
    result = jobrun("why", str(job.id))
    assert (result.code, result.err) == (0, "")
    lines = result.out.splitlines()
    assert lines[0] == f"job {job.id} (emails.send, queue 'emails'): queued"
    assert lines[1].startswith("- it is not due yet: due at ")
    assert lines[1].endswith("(2h from now)") or lines[1].endswith("(1h 59m from now)")
    assert lines[2].startswith("- its queue 'emails' is paused (since ")
    assert lines[3] == (
        "- no live worker serves queue 'emails' (none registered has been seen within its "
        "lease TTL): start one with `jobrun worker --queues emails`"
    )
    assert len(lines) == 4


def test_why_names_the_jobs_holding_a_full_limit(jobrun: Run, client: Client) -> None:
    client.set_queue_limits("emails", concurrency=1)
    first = client.enqueue("emails.send", {}, queue="emails")
    second = client.enqueue("emails.send", {}, queue="emails")
    assert [j.id for j in client.store.claim("w1", ["emails"], 5, dt.timedelta(minutes=1))] == [
        first.id
    ]
    result = jobrun("why", str(second.id))
    assert result.code == 0, result.err
    assert "- its queue 'emails' is at its concurrency limit: 1 of 1 slots" in result.out
    assert f"  held by: {first.id}" in result.out


def test_why_takes_a_unique_prefix_of_the_id(jobrun: Run, client: Client) -> None:
    job = client.enqueue("emails.send", {}, queue="emails")
    result = jobrun("why", str(job.id)[:13])
    assert result.code == 0, result.err
    assert result.out.startswith(f"job {job.id} ")


def test_why_as_json_gives_each_reason_its_stable_name(jobrun: Run, client: Client) -> None:
    job = client.enqueue("emails.send", {}, queue="emails")
    body = jobrun("why", str(job.id), "--json").json()
    assert body["state"] == "queued" and body["queue"] == "emails"
    assert [r["hold"] for r in body["reasons"]] == ["no_worker"]
    assert body["reasons"][0]["jobs"] == []


def test_why_of_an_unknown_or_malformed_id_is_one_line_and_its_exit_code(
    jobrun: Run,
) -> None:
    missing = uuid.uuid4()
    assert_one_line_error(jobrun("why", str(missing)), 3, str(missing), "not found")
    assert_one_line_error(jobrun("why", "not-an-id"), 7, "not-an-id")
