"""Jobs claimed ahead of a worker's free threads, on the dashboard (issue 27).

A pipelined worker keeps a buffer of jobs it leased but has not started
(``state = 'leased'``, ``started_at`` NULL, their attempt not counted yet).
They are leases like any other, but not running: every page says so, from
what the database holds (claims made with the Store's own exchange).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from starlette.testclient import TestClient

from jobrun.job.model import Job, NewJob
from jobrun.postgres.store import Store
from tests.web.test_app_support import app, client, parse

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def page(client: TestClient, path: str) -> Any:
    got = client.get(path)
    assert got.status_code == 200, (path, got.status_code, got.text[:2000])
    return parse(got.text)


def one_started_two_waiting(store: Store) -> tuple[Job, list[Job]]:
    """worker-a runs one job of queue q and holds two more ahead, not started."""
    for _ in range(3):
        store.enqueue(NewJob(type="t", queue="q"))
    (running,) = store.claim("worker-a", ["q"], 1, TTL)
    ahead = store.exchange("worker-a", queues=["q"], limit=2, ttl=TTL, start_now=0).claimed
    assert len(ahead) == 2 and not any(j.started for j in ahead)
    return running, list(ahead)


def test_the_overview_counts_running_and_waiting_jobs_per_queue_and_worker(
    store: Store, client: TestClient
) -> None:
    running, waiting = one_started_two_waiting(store)
    doc = page(client, "/")
    row = doc.one("tr", cls="queue-row", data_queue="q")
    assert (row.attrs["data-leased"], row.attrs["data-running"], row.attrs["data-waiting"]) == (
        "3",
        "1",
        "2",
    )
    cell = row.one("td", cls="leased")
    assert (cell.one("a").text, cell.one("span", cls="waiting-count").text) == ("1", "+2 waiting")
    worker = doc.one("tr", cls="worker-row", data_owner="worker-a")
    assert (worker.attrs["data-running"], worker.attrs["data-waiting"]) == ("1", "2")
    listed = {li.attrs["data-job-id"]: li for li in doc.select("li", cls="running-job")}
    assert {i: li.attrs["data-waiting"] for i, li in listed.items()} == {
        str(running.id): "false",
        **{str(j.id): "true" for j in waiting},
    }
    assert "waiting for a thread" in listed[str(waiting[0].id)].text
    assert "waiting" not in listed[str(running.id)].text

    # Started by the worker's next round: running, nothing waits.
    store.exchange("worker-a", start=waiting, queues=["q"], limit=0, ttl=TTL)
    row = page(client, "/live/overview").one("tr", cls="queue-row", data_queue="q")
    assert (row.attrs["data-running"], row.attrs["data-waiting"]) == ("3", "0")
    assert row.one("td", cls="leased").text == "3"
    assert not row.select("span", cls="waiting-count")


def test_the_jobs_list_marks_leased_jobs_waiting_for_a_thread(
    store: Store, client: TestClient
) -> None:
    running, waiting = one_started_two_waiting(store)
    for path in ("/jobs", "/jobs?state=leased"):
        rows = {r.attrs["data-job-id"]: r for r in page(client, path).select("tr", cls="job-row")}
        assert {i: r.attrs["data-waiting"] for i, r in rows.items()} == {
            str(running.id): "false",
            **{str(j.id): "true" for j in waiting},
        }
        badges = {i: [b.text for b in r.select("span", cls="state")] for i, r in rows.items()}
        assert badges[str(waiting[1].id)] == ["leased", "waiting"]
        assert badges[str(running.id)] == ["leased"]


def test_the_job_page_says_a_waiting_job_has_not_started(store: Store, client: TestClient) -> None:
    running, waiting = one_started_two_waiting(store)
    doc = page(client, f"/jobs/{waiting[0].id}")
    section = doc.by_id("job")
    assert (section.attrs["data-state"], section.attrs["data-waiting"]) == ("leased", "true")
    assert section.attrs["data-attempts"] == "0"  # not counted until it starts
    badges = [b.text for b in doc.by_id("job-state").select("span", cls="state")]
    assert badges == ["leased", "waiting for a thread"]
    started = doc.by_id("job-started")
    assert started.attrs["data-started"] == "false" and "waiting for a free thread" in started.text

    doc = page(client, f"/jobs/{running.id}")
    assert doc.by_id("job").attrs["data-waiting"] == "false"
    assert doc.by_id("job-state").text == "leased"
    started = doc.by_id("job-started")
    assert started.attrs["data-started"] == "true"
    assert running.started_at is not None
    assert dt.datetime.fromisoformat(started.one("time").attrs["datetime"]) == running.started_at

    store.complete(running)  # finished: no started row, nothing waiting
    doc = page(client, f"/jobs/{running.id}")
    assert not doc.has_id("job-started")
    assert doc.by_id("job").attrs["data-waiting"] == "false"
