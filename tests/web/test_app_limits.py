"""Flow control on the dashboard (issue 14): each queue's limits and what they hold on
the overview; a job's progress, snoozes and concurrency key on its page.

Over HTTP (Starlette's TestClient) against a real database, like test_app.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from starlette.testclient import TestClient

from jobrun.job.model import NewJob, RateLimit
from jobrun.postgres.store import Store
from jobrun.web.app import format_percent, rate_window
from tests.web.test_app_support import Element, app, client, parse

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def page(client: TestClient, path: str) -> Element:
    got = client.get(path)
    assert got.status_code == 200, (path, got.status_code, got.text[:2000])
    return parse(got.text)


def queue_rows(doc: Element) -> dict[str, Element]:
    return {r.attrs["data-queue"]: r for r in doc.select("tr", cls="queue-row")}


# -- the overview --------------------------------------------------------------------


def test_the_overview_shows_each_queues_limits_and_what_they_hold(
    store: Store, client: TestClient
) -> None:
    for key in ("acme", "acme", "globex", "initech"):
        store.enqueue(NewJob(type="t", queue="mail", concurrency_key=key))
    store.enqueue(NewJob(type="t", queue="plain"))
    store.set_queue_limits("mail", concurrency=2, per_key=1, rate="10/min")
    store.set_queue_limits("quiet", rate="5/10s")  # no job: listed all the same
    assert len(store.claim("w", ["mail"], 10, TTL)) == 2

    for path in ("/", "/live/overview"):
        rows = queue_rows(page(client, path))
        assert sorted(rows) == ["mail", "plain", "quiet"]
        mail = rows["mail"]
        assert {k: mail.attrs.get(f"data-{k}") for k in LIMIT_ATTRIBUTES} == {
            "limited": "true",
            "concurrency": "2",
            "per-key": "1",
            "rate": "10/min",
            "limit-leased": "2",
            "started-in-window": "2",
        }
        concurrency = mail.one("span", cls="limit-concurrency")
        assert concurrency.text == "concurrency 2/2"
        assert "full" in concurrency.classes  # reached: the next claim waits for a slot
        assert mail.one("span", cls="limit-per-key").text == "per key 1"
        rate = mail.one("span", cls="limit-rate")
        assert (rate.text, "full" in rate.classes) == ("rate 2/10 in 1 min", False)

        quiet = rows["quiet"]
        assert (quiet.attrs["data-ready"], quiet.attrs["data-leased"]) == ("0", "0")
        assert quiet.attrs["data-rate"] == "5/10s"
        assert "data-concurrency" not in quiet.attrs
        assert quiet.one("span", cls="limit-rate").text == "rate 0/5 in 10 s"
        assert not quiet.select("span", cls="limit-concurrency")

        plain = rows["plain"]
        assert plain.attrs["data-limited"] == "false"
        assert "data-limit-leased" not in plain.attrs
        assert plain.one("td", cls="limits").text == "\u2013"


LIMIT_ATTRIBUTES = (
    "limited",
    "concurrency",
    "per-key",
    "rate",
    "limit-leased",
    "started-in-window",
)


def test_a_limits_row_the_store_cannot_read_leaves_the_rest_of_the_overview_up(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(NewJob(type="t", queue="mail"))
    store.set_queue_limits("video", concurrency=2)
    # Written by SQL (or an older version): a name the Store refuses to read back.
    conn.execute("INSERT INTO jobrun.queue_limits (queue, concurrency) VALUES ('no such!', 1)")
    doc = page(client, "/")
    assert not doc.has_id("limits-error")
    rows = queue_rows(doc)
    assert rows["mail"].attrs["data-limited"] == "false"
    assert rows["video"].attrs["data-limited"] == "true"
    assert "no such!" not in rows


# -- the job page ------------------------------------------------------------------------


def test_the_job_page_shows_progress_snoozes_and_concurrency_key_only_when_present(
    store: Store, client: TestClient
) -> None:
    plain = store.enqueue(NewJob(type="t", queue="q"))
    doc = page(client, f"/jobs/{plain.id}")
    for absent in ("job-progress", "job-snoozes", "job-concurrency-key"):
        assert not doc.has_id(absent), absent

    job = store.enqueue(NewJob(type="video.encode", queue="video", concurrency_key="acme"))
    (claimed,) = store.claim("w", ["video"], 1, TTL)
    store.release(claimed, dt.timedelta(0), "not yet", snooze=True)
    (claimed,) = store.claim("w", ["video"], 1, TTL)
    at = store.record_progress(claimed, 0.4, "chunk 4 of 10")

    for path in (f"/jobs/{job.id}", f"/live/jobs/{job.id}"):
        doc = page(client, path)
        progress = doc.by_id("job-progress")
        assert progress.attrs["data-progress"] == "0.4"
        bar = progress.one("progress")
        assert (bar.attrs["max"], bar.attrs["value"]) == ("1", "0.4")
        assert progress.one("strong", cls="percent").text == "40%"
        assert doc.by_id("job-progress-message").text == "chunk 4 of 10"
        when = doc.by_id("job-progress-at").one("time").attrs["datetime"]
        assert dt.datetime.fromisoformat(when) == at
        assert doc.by_id("job-snoozes").text.startswith("1 ")
        assert doc.by_id("job-attempts").text == "1 of 25"  # the snooze gave it back
        assert doc.by_id("job-concurrency-key").text == "acme"

    # The overview's running jobs say how far each one is.
    running = page(client, "/").one("li", cls="running-job", data_job_id=str(job.id))
    assert running.one("span", cls="progress-percent").text == "40%"


def test_progress_messages_and_concurrency_keys_are_escaped(
    store: Store, client: TestClient
) -> None:
    key = "<script>window.k=1</script>"
    message = '"><img src=x onerror="window.m=1">'
    job = store.enqueue(NewJob(type="t", queue="q", concurrency_key=key))
    (claimed,) = store.claim("w", ["q"], 1, TTL)
    store.record_progress(claimed, 0.5, message)
    body = client.get(f"/jobs/{job.id}").text
    assert "<script>window" not in body and "<img" not in body
    doc = parse(body)
    assert doc.by_id("job-concurrency-key").text == key
    assert doc.by_id("job-progress-message").text == message


def test_progress_and_rate_windows_read_as_people_write_them() -> None:
    assert [format_percent(f) for f in (0, 0.125, 0.4, 0.9999, 1)] == [
        "0%",
        "12.5%",
        "40%",
        "99.9%",
        "100%",
    ]
    windows = ("100/s", "10/min", "5/10s", "1000/h", "3/500ms", "1/90s")
    assert [rate_window(RateLimit.parse(w)) for w in windows] == [
        "1 s",
        "1 min",
        "10 s",
        "1 h",
        "500 ms",
        "90 s",
    ]
