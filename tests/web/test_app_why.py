"""The job page says what holds a queued job back, as ``jobrun why`` does (issue 28, item 9)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from starlette.testclient import TestClient

from jobrun.job.model import NewJob
from jobrun.postgres.store import Store
from tests.web.test_app_support import app, client, parse

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def page(client: TestClient, path: str) -> Any:
    got = client.get(path)
    assert got.status_code == 200, (path, got.status_code, got.text[:2000])
    return parse(got.text)


def test_a_queued_job_page_names_what_holds_it_back_and_links_the_holders(
    store: Store, client: TestClient
) -> None:
    store.set_queue_limits("q", concurrency=1)
    holder = store.enqueue(NewJob(type="t", queue="q"))
    waiting = store.enqueue(NewJob(type="t", queue="q"))
    (claimed,) = store.claim("w1", ["q"], 5, TTL)
    assert claimed.id == holder.id
    doc = page(client, f"/jobs/{waiting.id}")
    reasons = doc.one("dd", id="job-why").select("li")
    assert [li.attrs["data-hold"] for li in reasons] == ["concurrency", "no_worker"]
    assert "1 of 1 slots" in reasons[0].text
    assert reasons[0].one("a", cls="job-link").text == str(holder.id)


def test_a_running_job_page_has_no_waiting_line(store: Store, client: TestClient) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    store.claim("w1", ["q"], 1, TTL)
    doc = page(client, f"/jobs/{job.id}")
    assert doc.select("dd", id="job-why") == []
