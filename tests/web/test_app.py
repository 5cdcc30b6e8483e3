"""The dashboard's pages over HTTP (Starlette's TestClient) against a real database.

Every page renders what the database holds; the jobs list is filtered and
keyset-paged newest first; user-supplied text is escaped everywhere; no
page shows the database password; mounted under a prefix, every link,
form and cookie follows it.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.parse
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from jobrun.client import Client
from jobrun.config import Settings
from jobrun.job.model import DEFAULT_BACKOFF, NewJob, ScheduleSpec, State
from jobrun.postgres.leader import LeaseLocker
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.pool import open_pool
from jobrun.postgres.store import Store
from jobrun.web import PAGE_SIZE, create_app
from tests.web.test_app_support import app, client, csrf_of, parse, post

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def page(client: TestClient, path: str, status: int = 200) -> Any:
    got = client.get(path)
    assert got.status_code == status, (path, got.status_code, got.text[:2000])
    return parse(got.text)


# -- the overview -------------------------------------------------------------------


def test_the_overview_shows_each_queue_by_state_with_its_oldest_due_age_and_pause(
    store: Store, client: TestClient
) -> None:
    now = store.now()
    store.enqueue(NewJob(type="t", queue="mail", run_at=now - dt.timedelta(minutes=10)))
    store.enqueue(NewJob(type="t", queue="mail"))
    store.enqueue(NewJob(type="t", queue="mail", run_at=now + dt.timedelta(hours=1)))
    store.enqueue(NewJob(type="t", queue="busy"))
    store.claim("w", ["busy"], 1, TTL)
    store.enqueue(NewJob(type="t", queue="broken"))
    (doomed,) = store.claim("w", ["broken"], 1, TTL)
    store.fail(doomed, "no", None, permanent=True)
    store.pause_queue("idle")

    doc = page(client, "/")
    assert doc.one("body").attrs["data-page"] == "overview"
    rows = {r.attrs["data-queue"]: r for r in doc.select("tr", cls="queue-row")}
    assert sorted(rows) == ["broken", "busy", "idle", "mail"]
    counts = {
        q: tuple(int(r.attrs[f"data-{k}"]) for k in ("ready", "scheduled", "leased", "dead"))
        for q, r in rows.items()
    }
    assert counts == {
        "mail": (2, 1, 0, 0),
        "busy": (0, 0, 1, 0),
        "broken": (0, 0, 0, 1),
        "idle": (0, 0, 0, 0),
    }
    assert 600 <= float(rows["mail"].attrs["data-oldest-ready-seconds"]) < 900
    assert rows["mail"].one("td", cls="oldest-ready").text.startswith("10m")
    assert {q: r.attrs["data-paused"] for q, r in rows.items()} == {
        "mail": "false",
        "busy": "false",
        "broken": "false",
        "idle": "true",
    }
    # The paused queue offers Resume, the others Pause; the dead count links to them.
    assert rows["idle"].select("button", cls="resume-queue")
    assert not rows["idle"].select("button", cls="pause-queue")
    assert rows["mail"].select("button", cls="pause-queue")
    link = rows["broken"].one("td", cls="dead").one("a").attrs["href"]
    assert parse(client.get(link).text).one("tr", cls="job-row").attrs["data-job-id"] == str(
        doomed.id
    )


def test_the_overview_charts_successes_and_failed_attempts_of_the_last_hour(
    store: Store, client: TestClient
) -> None:
    for _ in range(3):
        store.enqueue(NewJob(type="ok", queue="q"))
    for job in store.claim("w", ["q"], 3, TTL):
        store.complete(job)
    store.enqueue(NewJob(type="flaky", queue="q"))
    (flaky,) = store.claim("w", ["q"], 1, TTL)
    store.fail(flaky, "once", store.now())  # retrying
    (again,) = store.claim("w", ["q"], 1, TTL)
    store.fail(again, "twice", None, permanent=True)  # dead

    doc = page(client, "/")
    chart = doc.by_id("throughput")
    assert chart.tag == "svg"
    assert (chart.attrs["data-succeeded-total"], chart.attrs["data-failed-total"]) == ("3", "2")
    minutes = chart.select("g", cls="minute")
    assert len(minutes) == 60
    assert sum(int(m.attrs["data-succeeded"]) for m in minutes) == 3
    assert sum(int(m.attrs["data-failed"]) for m in minutes) == 2
    # The latest minute (or the one before, across a minute boundary) holds them.
    assert int(minutes[-1].attrs["data-succeeded"]) + int(minutes[-2].attrs["data-succeeded"]) == 3
    busiest = max(minutes, key=lambda m: int(m.attrs["data-succeeded"]))
    assert float(busiest.one("rect", cls="bar-succeeded").attrs["height"]) > 0
    assert float(minutes[0].one("rect", cls="bar-succeeded").attrs["height"]) == 0


def test_the_overview_names_the_scheduler_leader_or_says_there_is_none(
    store: Store, client: TestClient, dsn: str
) -> None:
    assert page(client, "/").by_id("leader").attrs["data-leader"] == "none"
    with AdvisoryLocker(dsn) as locker:  # the default schema's leader lock
        assert locker.try_acquire()
        leader = page(client, "/").by_id("leader")
        assert leader.attrs["data-leader"] == "present"
        assert leader.attrs["data-pid"] == str(locker.backend_pid)
        assert "jobrun-leader" in leader.text
        locker.release()


def test_the_overview_names_a_lease_row_leader_by_its_holder_and_term(
    store: Store, client: TestClient
) -> None:
    locker = LeaseLocker(store, None)  # the election of workers behind a transaction pooler
    assert locker.try_acquire()
    try:
        leader = page(client, "/").by_id("leader")
        assert leader.attrs["data-leader"] == "present"
        assert (leader.attrs["data-holder"], leader.attrs["data-term"]) == (locker.holder, "1")
        assert "data-pid" not in leader.attrs
        assert locker.holder in leader.text
    finally:
        locker.release()
    assert page(client, "/").by_id("leader").attrs["data-leader"] == "none"


def test_the_overview_lists_live_workers_with_the_jobs_they_run(
    store: Store, client: TestClient
) -> None:
    assert page(client, "/").has_id("no-workers")
    for _ in range(3):
        store.enqueue(NewJob(type="t", queue="q"))
    two = store.claim("worker-a", ["q"], 2, TTL)
    one = store.claim("worker-b", ["q"], 1, TTL)

    doc = page(client, "/")
    workers = {
        r.attrs["data-owner"]: r for r in doc.by_id("workers").select("tr", cls="worker-row")
    }
    assert {o: (r.attrs["data-running"], r.attrs["data-expired"]) for o, r in workers.items()} == {
        "worker-a": ("2", "false"),
        "worker-b": ("1", "false"),
    }
    listed = {li.attrs["data-job-id"] for li in doc.select("li", cls="running-job")}
    assert listed == {str(j.id) for j in [*two, *one]}
    # the live fragment is the same region, without the page around it
    live = client.get("/live/overview")
    assert live.status_code == 200 and "<html" not in live.text
    assert {
        li.attrs["data-job-id"] for li in parse(live.text).select("li", cls="running-job")
    } == listed
    region = doc.by_id("overview-live")
    assert region.attrs["data-refresh-url"] == "/live/overview"
    assert float(region.attrs["data-refresh-seconds"]) >= 1


# -- jobs -----------------------------------------------------------------------------


def ids_on(doc: Any) -> list[str]:
    return [r.attrs["data-job-id"] for r in doc.select("tr", cls="job-row")]


def test_jobs_are_listed_newest_first_and_filtered_by_queue_state_type_key_and_id_prefix(
    store: Store, client: TestClient
) -> None:
    a1 = store.enqueue(NewJob(type="mail.send", queue="mail", idempotency_key="order-1"))
    a2 = store.enqueue(NewJob(type="mail.send", queue="mail"))
    b1 = store.enqueue(NewJob(type="img.resize", queue="media", idempotency_key="order-1"))
    b2 = store.enqueue(NewJob(type="img.resize", queue="media"))
    (claimed,) = store.claim("w", ["media"], 1, TTL)
    assert claimed.id == b1.id
    store.fail(claimed, "no", None, permanent=True)

    assert ids_on(page(client, "/jobs")) == [str(j.id) for j in (b2, b1, a2, a1)]
    cases = {
        "queue=mail": [a2, a1],
        "state=dead": [b1],
        "state=queued&queue=media": [b2],
        "type=mail.send": [a2, a1],
        "key=order-1": [b1, a1],
        "key=order-1&queue=media": [b1],
        f"id={str(a2.id)[:23].upper()}": [a2],
        "queue=nothing-here": [],
    }
    for query, expected in cases.items():
        doc = page(client, "/jobs?" + query)
        assert ids_on(doc) == [str(j.id) for j in expected], query
        if not expected:
            assert doc.has_id("no-jobs")
    # the filter form shows what was asked
    doc = page(client, "/jobs?queue=mail&state=queued&type=mail.send&key=k&id=01")
    assert doc.by_id("filter-queue").attrs["value"] == "mail"
    assert doc.by_id("filter-type").attrs["value"] == "mail.send"
    assert doc.by_id("filter-key").attrs["value"] == "k"
    assert doc.by_id("filter-id").attrs["value"] == "01"
    (selected,) = [o for o in doc.by_id("filter-state").select("option") if "selected" in o.attrs]
    assert selected.attrs["value"] == "queued"
    row = page(client, "/jobs?state=dead").one("tr", cls="job-row")
    assert (row.attrs["data-state"], row.attrs["data-queue"], row.attrs["data-type"]) == (
        "dead",
        "media",
        "img.resize",
    )


def test_keyset_pages_newest_first_each_starting_after_the_last_id_of_the_one_before(
    store: Store, client: TestClient
) -> None:
    jobs = store.enqueue_batch([NewJob(type="t", queue="bulk") for _ in range(PAGE_SIZE * 2 + 7)])
    assert jobs.inserted == PAGE_SIZE * 2 + 7
    everything = [
        str(j.id) for j in sorted(store.list(queue="bulk", limit=500), key=lambda j: j.id)
    ]
    newest_first = everything[::-1]

    seen: list[str] = []
    url: str | None = "/jobs?queue=bulk"
    pages = 0
    while url is not None:
        doc = page(client, url)
        ids = ids_on(doc)
        if seen:
            assert doc.has_id("first-page")
            before = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query)["before"][0]
            assert before == seen[-1]  # page n+1 starts after page n's last id
            assert all(uuid.UUID(i) < uuid.UUID(before) for i in ids)
        else:
            assert not doc.has_id("first-page")
        assert "offset" not in url.lower()
        seen.extend(ids)
        pages += 1
        nxt = doc.select(id="next-page")
        url = nxt[0].attrs["href"] if nxt else None
    assert pages == 3
    assert seen == newest_first


def test_a_filtered_page_keeps_its_filters_in_the_next_page_link(
    store: Store, client: TestClient
) -> None:
    store.enqueue_batch([NewJob(type="t", queue="q1") for _ in range(PAGE_SIZE + 1)])
    store.enqueue_batch([NewJob(type="t", queue="q2") for _ in range(3)])
    doc = page(client, "/jobs?queue=q1&state=queued")
    href = doc.by_id("next-page").attrs["href"]
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(href).query)
    assert query["queue"] == ["q1"] and query["state"] == ["queued"]
    rest = page(client, href)
    assert len(ids_on(rest)) == 1 and not rest.has_id("next-page")


def test_bad_filters_are_a_400_page_saying_which(client: TestClient) -> None:
    for query, word in (
        ("state=done", "state"),
        ("id=xyz", "id_prefix"),
        ("before=nope", "before"),
    ):
        doc = page(client, "/jobs?" + query, status=400)
        assert doc.by_id("error").attrs["data-status"] == "400"
        assert word in doc.by_id("error").text
    assert page(client, f"/jobs/{uuid.uuid4()}", status=404).by_id("error").text
    page(client, "/jobs/not-a-uuid", status=404)


# -- one job -----------------------------------------------------------------------


def test_the_job_page_shows_payload_result_lease_error_timeline_and_effect(
    store: Store, client: TestClient
) -> None:
    job = store.enqueue(
        NewJob(
            type="pay",
            queue="money",
            payload={"order": 7, "items": ["a", "b"]},
            idempotency_key="order-7",
            max_attempts=3,
        )
    )
    (first,) = store.claim("worker-1", ["money"], 1, TTL)
    error = 'ValueError: card declined\nTraceback (most recent call last):\n  File "h.py", line 3'
    store.fail(first, error, store.now())
    (second,) = store.claim("worker-2", ["money"], 1, TTL)

    doc = page(client, f"/jobs/{job.id}")
    section = doc.by_id("job")
    assert (section.attrs["data-state"], section.attrs["data-attempts"]) == ("leased", "2")
    assert doc.by_id("job-lease-owner").text == "worker-2"
    expires = doc.by_id("job-lease-expires").one("time").attrs["datetime"]
    assert dt.datetime.fromisoformat(expires) == second.lease_expires_at
    assert doc.by_id("job-attempts").text == "2 of 3"
    assert doc.by_id("job-key").text == "order-7"
    assert json.loads(doc.by_id("job-payload").text) == {"order": 7, "items": ["a", "b"]}
    assert doc.by_id("job-error-summary").text == "ValueError: card declined"
    assert "Traceback (most recent call last):" in doc.by_id("job-last-error").text
    kinds = [(e.attrs["data-kind"], e.attrs["data-attempt"]) for e in doc.select("li", cls="event")]
    assert kinds == [("enqueued", "0"), ("claimed", "1"), ("retrying", "1"), ("claimed", "2")]
    effect = doc.by_id("job-effect")
    assert (effect.attrs["data-recorded"], effect.attrs["data-key"]) == ("false", "order-7")
    assert doc.has_id("cancel-job") and not doc.has_id("retry-job")  # leased: cancel only

    store.complete(second, lambda conn: None, result={"charged": 42})
    doc = page(client, f"/jobs/{job.id}")
    assert doc.by_id("job").attrs["data-state"] == "succeeded"
    assert json.loads(doc.by_id("job-result").text) == {"charged": 42}
    assert doc.by_id("job-effect").attrs["data-recorded"] == "true"
    assert doc.by_id("job-lease-owner").text == "\u2013"
    assert doc.has_id("retry-job") and not doc.has_id("cancel-job")
    live = parse(client.get(f"/live/jobs/{job.id}").text)
    assert live.by_id("job").attrs["data-state"] == "succeeded"
    assert doc.by_id("job-live").attrs["data-refresh-url"] == f"/live/jobs/{job.id}"


def test_the_timeline_shows_each_events_detail_as_key_value_pairs_escaped(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    job = store.enqueue(NewJob(type="pay", queue="money", max_attempts=3))
    (first,) = store.claim("w", ["money"], 1, TTL)
    error = 'ValueError: <b>card</b> declined\nTraceback (most recent call last):\n  File "h.py"'
    store.fail(first, error, store.now())
    (second,) = store.claim("w", ["money"], 1, TTL)
    store.release(second, dt.timedelta(seconds=30), "rate limited", snooze=True)
    # Details the queries never write, behind the Store's back: nested, and not an object.
    conn.execute(
        "INSERT INTO jobrun.job_events (job_id, kind, attempt, detail) VALUES"
        " (%(id)s, 'retried', 1, %(nested)s), (%(id)s, 'retried', 1, %(list)s)",
        {
            "id": job.id,
            "nested": json.dumps({"from": "dead", "by": {"user": "<i>ops</i>", "ids": [1, 2]}}),
            "list": json.dumps(["a", 2]),
        },
    )

    doc = page(client, f"/jobs/{job.id}")
    events = doc.by_id("job-timeline").select("li", cls="event")
    retrying, snoozed, nested, listed = (
        events[2],
        events[4],
        *(e for e in events if e.attrs["data-kind"] == "retried"),
    )
    assert (retrying.attrs["data-kind"], snoozed.attrs["data-kind"]) == ("retrying", "snoozed")
    # The label stands alone; the details are pairs beside it, never JSON glued to it.
    assert retrying.one("strong", cls="kind").text == "retrying"
    assert not retrying.select("code")

    def pairs(event: Any) -> list[tuple[str, str]]:
        return [
            (f.one("dt").text, f.one("dd").text)
            for f in event.one("dl", cls="detail").select("div", cls="field")
        ]

    fields = {
        f.attrs["data-key"]: f for f in retrying.one("dl", cls="detail").select("div", cls="field")
    }
    # One-line facts first, then the error as a block with its lines kept and its markup as text.
    assert list(fields) == ["via", "permanent", "error"]
    assert (fields["via"].one("dt").text, fields["via"].one("dd").text) == ("via", "fail")
    assert fields["permanent"].one("dd").text == "false"
    assert "block" in fields["error"].classes
    assert "".join(fields["error"].one("pre").text_parts) == error
    assert not retrying.select("b")
    assert pairs(snoozed) == [
        ("via", "snooze"),
        ("reason", "rate limited"),
        ("delay_seconds", "30"),
    ]
    nested_fields = {
        f.attrs["data-key"]: f for f in nested.one("dl", cls="detail").select("div", cls="field")
    }
    assert nested_fields["from"].one("dd").text == "dead"
    shown = json.loads("".join(nested_fields["by"].one("pre").text_parts))
    assert shown == {"user": "<i>ops</i>", "ids": [1, 2]}
    assert not nested.select("i")
    assert json.loads("".join(listed.one("pre", cls="detail").text_parts)) == ["a", 2]
    assert not events[0].select("dl") and not events[0].select("pre")  # enqueued: no detail


def test_the_effect_of_another_job_with_the_same_key_is_named(
    store: Store, client: TestClient
) -> None:
    first = store.enqueue(NewJob(type="fx", queue="q1", idempotency_key="same"))
    second = store.enqueue(NewJob(type="fx", queue="q2", idempotency_key="same"))
    (claim,) = store.claim("w", ["q1"], 1, TTL)
    store.complete(claim, lambda conn: None)
    doc = page(client, f"/jobs/{second.id}")
    effect = doc.by_id("job-effect")
    assert effect.attrs["data-recorded"] == "true"
    assert effect.one("a", cls="job-link").attrs["href"] == f"/jobs/{first.id}"


# -- schedules ---------------------------------------------------------------------


def test_the_schedules_page_shows_cron_zone_next_run_last_fire_and_pause(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    store.create_schedule(
        ScheduleSpec(id="every-minute", cron="* * * * *", type="tick", timezone="Europe/Paris")
    )
    store.create_schedule(ScheduleSpec(id="yearly", cron="0 0 1 1 *", type="t"))
    store.pause_schedule("yearly")
    conn.execute(
        "UPDATE jobrun.schedules SET next_run_at = now() - interval '1 minute' "
        "WHERE id = 'every-minute'"
    )
    now = store.now()
    (due,) = store.due_schedules(now, 10)
    store.materialize(due, now)
    fired = conn.execute(
        "SELECT last_fired_at, next_run_at FROM jobrun.schedules WHERE id = 'every-minute'"
    ).fetchone()

    doc = page(client, "/schedules")
    rows = {r.attrs["data-schedule-id"]: r for r in doc.select("tr", cls="schedule-row")}
    assert sorted(rows) == ["every-minute", "yearly"]
    minute = rows["every-minute"]
    assert minute.one("td", cls="cron").text == "* * * * *"
    assert minute.one("td", cls="timezone").text == "Europe/Paris"
    assert (
        dt.datetime.fromisoformat(minute.one("td", cls="last-fired").one("time").attrs["datetime"])
        == fired[0]
    )
    assert (
        dt.datetime.fromisoformat(minute.one("td", cls="next-run").one("time").attrs["datetime"])
        == fired[1]
    )
    assert minute.attrs["data-paused"] == "false" and minute.select("button", cls="pause-schedule")
    yearly = rows["yearly"]
    assert yearly.attrs["data-paused"] == "true" and yearly.select("button", cls="resume-schedule")
    assert yearly.one("td", cls="last-fired").text == "never"
    assert all(r.select("button", cls="trigger-schedule") for r in rows.values())


def test_schedule_times_are_shown_in_the_schedules_own_zone_with_utc_in_the_title(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    zones = {
        "paris-winter": ("Europe/Paris", "2027-01-15 02:00:00+00"),
        "paris-summer": ("Europe/Paris", "2027-07-15 01:00:00+00"),
        "sao-paulo": ("America/Sao_Paulo", "2027-01-15 12:00:00+00"),  # no abbreviation
        "kolkata": ("Asia/Kolkata", "2027-01-15 03:30:00+00"),
        "plain": ("UTC", "2027-01-15 03:00:00+00"),
        "broken": ("UTC", "2027-01-15 03:00:00+00"),
    }
    for schedule, (zone, _) in zones.items():
        store.create_schedule(ScheduleSpec(id=schedule, cron="0 3 * * *", type="t", timezone=zone))
    for schedule, (_, next_run) in zones.items():
        conn.execute(
            "UPDATE jobrun.schedules SET next_run_at = %s, last_fired_at = %s WHERE id = %s",
            [next_run, next_run, schedule],
        )
    # A zone this Python cannot load (written behind the Store's back, markup and all).
    conn.execute("UPDATE jobrun.schedules SET timezone = '<b>Mars/Olympus</b>' WHERE id = 'broken'")

    doc = page(client, "/schedules")
    rows = {r.attrs["data-schedule-id"]: r for r in doc.select("tr", cls="schedule-row")}

    def shown(schedule: str, cell: str = "next-run") -> tuple[str, str, str]:
        time = rows[schedule].one("td", cls=cell).one("time")
        at = dt.datetime.fromisoformat(time.attrs["datetime"])
        assert at == dt.datetime.fromisoformat(zones[schedule][1]), "datetime= stays UTC"
        return time.text.split(" (")[0], time.attrs["title"], time.attrs.get("data-timezone", "")

    text, title, zone = shown("paris-winter")
    assert (text, zone) == ("2027-01-15 03:00:00 CET", "Europe/Paris")
    assert title.startswith("Europe/Paris (UTC+01:00); 2027-01-15 02:00:00Z in UTC; in ")
    assert shown("paris-summer")[0] == "2027-07-15 03:00:00 CEST"  # daylight saving time
    assert shown("paris-summer")[1].startswith("Europe/Paris (UTC+02:00)")
    assert shown("sao-paulo")[0] == "2027-01-15 09:00:00 UTC-03:00"
    assert shown("kolkata")[0] == "2027-01-15 09:00:00 IST"
    assert shown("kolkata")[1].startswith("Asia/Kolkata (UTC+05:30); 2027-01-15 03:30:00Z")
    assert shown("plain")[0] == "2027-01-15 03:00:00 UTC"
    assert shown("paris-winter", "last-fired")[0] == "2027-01-15 03:00:00 CET"
    assert " CET (in " in rows["paris-winter"].one("td", cls="next-run").text  # and how soon
    # An unknown zone falls back to UTC, and its name is text, not markup.
    broken = rows["broken"]
    assert broken.one("td", cls="next-run").one("time").text.startswith("2027-01-15 03:00:00Z")
    assert broken.one("td", cls="timezone").text == "<b>Mars/Olympus</b>"
    assert not broken.select("b")


def test_no_schedules_says_so(client: TestClient) -> None:
    assert page(client, "/schedules").has_id("no-schedules")


# -- escaping ----------------------------------------------------------------------

HOSTILE = ["<script>window.__pwned=1</script>", '"><img src=x onerror="window.__pwned=2">']


def test_payloads_types_errors_and_queues_are_escaped_on_every_page(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    # What the Store would refuse can still be in the table (written by SQL, an older version).
    backoff = json.dumps(DEFAULT_BACKOFF.to_json())
    ids = []
    for text in HOSTILE:
        job_id = uuid.uuid4()
        ids.append(job_id)
        conn.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts,"
            " last_error, finished_at, idempotency_key) VALUES (%s, %s, %s, %s, %s, 'dead', 1,"
            " %s, now(), %s)",
            (job_id, text, text, json.dumps({"x": text}), backoff, text + "\n" + text, text),
        )
        conn.execute(
            "INSERT INTO jobrun.job_events (job_id, kind, attempt, detail) VALUES"
            " (%s, 'dead', 1, %s)",
            (job_id, json.dumps({"error": text})),
        )
        conn.execute(
            "INSERT INTO jobrun.jobs (id, queue, type, payload, backoff, state, attempts,"
            " lease_owner, lease_token, lease_expires_at) VALUES (%s, %s, %s, '{}', %s,"
            " 'leased', 1, %s, gen_random_uuid(), now() + interval '1 minute')",
            (uuid.uuid4(), text, text, backoff, text),
        )
        conn.execute("INSERT INTO jobrun.queue_pauses (queue) VALUES (%s)", (text,))
    conn.execute(
        "INSERT INTO jobrun.schedules (id, cron, timezone, queue, type, payload, backoff,"
        " next_run_at) VALUES (%s, '* * * * *', 'UTC', %s, %s, '{}', %s, now())",
        (HOSTILE[1], HOSTILE[0], HOSTILE[0], backoff),
    )
    quoted = [urllib.parse.quote(t) for t in HOSTILE]
    paths = [
        "/",
        "/live/overview",
        "/jobs",
        "/live/jobs",
        "/schedules",
        *(f"/jobs/{i}" for i in ids),
        *(f"/live/jobs/{i}" for i in ids),
        *(f"/jobs?queue={q}&type={q}&key={q}" for q in quoted),
        *(f"/jobs?queue={q}" for q in quoted),
        *(f"/bulk/retry?state=dead&queue={q}" for q in quoted),
        *(f"/jobs?state={q}" for q in quoted),  # an error page quoting it
        "/jobs?state=dead",
    ]
    for path in paths:
        got = client.get(path)
        assert got.status_code in (200, 400), (path, got.status_code)
        body = got.text
        assert "<script>window" not in body and "<img" not in body, path
        assert 'onerror="window' not in body, path
        assert "&lt;script&gt;" in body or "&#34;&gt;&lt;img" in body, path
    # the text arrives intact, as text: in cells, attributes and the payload
    doc = page(client, "/")
    queues = {r.attrs["data-queue"] for r in doc.select("tr", cls="queue-row")}
    assert set(HOSTILE) <= queues
    detail = page(client, f"/jobs/{ids[1]}")
    assert json.loads(detail.by_id("job-payload").text) == {"x": HOSTILE[1]}
    assert detail.by_id("job-type").text == HOSTILE[1]
    assert detail.by_id("job-error-summary").text == HOSTILE[1]
    scripts = [s for s in doc.select("script")]
    assert [s.attrs.get("src") for s in scripts] == ["/static/jobrun.js"]


def test_every_response_forbids_inline_script_and_framing(client: TestClient) -> None:
    for path in ("/", "/jobs", "/schedules", "/static/jobrun.js", "/nope"):
        headers = client.get(path).headers
        policy = headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert "frame-ancestors 'none'" in policy
        assert headers["x-content-type-options"] == "nosniff"


# -- secrets -----------------------------------------------------------------------


def test_no_page_shows_the_database_password(
    pg_server: Any, database: str, conn: psycopg.Connection[Any]
) -> None:
    password = "pw-" + uuid.uuid4().hex
    role = "dash_" + uuid.uuid4().hex[:8]
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN SUPERUSER PASSWORD {}").format(
            sql.Identifier(role), sql.Literal(password)
        )
    )
    params = psycopg.conninfo.conninfo_to_dict(pg_server.dsn(database))
    params.update(user=role, password=password)
    url = psycopg.conninfo.make_conninfo("", **params)
    pool = open_pool(url, max_size=2)
    try:
        store = Store(pool)
        job = store.enqueue(NewJob(type="t", queue="q"))
        with TestClient(create_app(store)) as client:
            for path in (
                "/",
                "/jobs",
                f"/jobs/{job.id}",
                "/schedules",
                "/bulk/cancel?state=queued",
                "/jobs?state=bad",
                "/live/overview",
            ):
                body = client.get(path).text
                assert password not in body, path
            target = parse(client.get("/").text).by_id("db-target").text
            assert target.startswith(f"{role}@") and database in target
    finally:
        pool.close()
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


# -- mounted under a prefix --------------------------------------------------------


def test_mounted_under_a_prefix_every_link_form_and_cookie_follows_it(store: Store) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    dead = store.enqueue(NewJob(type="t", queue="q"))
    (claim,) = store.claim("w", ["q"], 1, TTL)
    store.fail(claim, "x", None, permanent=True)
    store.create_schedule(ScheduleSpec(id="s1", cron="0 0 1 1 *", type="t"))
    host = Starlette(routes=[Mount("/admin/jobs", app=create_app(store))])
    with TestClient(host) as client:
        visited: set[str] = set()
        todo = ["/admin/jobs/"]
        forms: list[str] = []
        while todo:
            path = todo.pop()
            if path in visited:
                continue
            visited.add(path)
            got = client.get(path)
            assert got.status_code == 200, (path, got.status_code)
            if "text/html" not in got.headers["content-type"]:
                continue
            doc = parse(got.text)
            for element in doc.walk():
                for attr in ("href", "src", "action", "data-refresh-url"):
                    target = element.attrs.get(attr)
                    if target is None:
                        continue
                    assert target.startswith("/admin/jobs/") or target == "/admin/jobs", (
                        path,
                        target,
                    )
                    if attr == "action":
                        forms.append(target)
                    elif len(visited) < 60:
                        todo.append(target)
        assert "/admin/jobs/static/jobrun.css" in visited
        assert f"/admin/jobs/jobs/{job.id}" in visited or f"/admin/jobs/jobs/{dead.id}" in visited
        assert any(f.endswith("/retry") for f in forms) and "/admin/jobs/queues/pause" in forms
        # an action under the prefix works and comes back under it
        got = post(
            client,
            f"/admin/jobs/jobs/{dead.id}",
            f"/admin/jobs/jobs/{dead.id}/retry",
            next=f"/jobs/{dead.id}",
        )
        assert got.status_code == 303
        assert got.headers["location"] == f"/admin/jobs/jobs/{dead.id}?notice=retried"
        assert store.get(dead.id).state is State.QUEUED


def test_a_fresh_browser_gets_its_csrf_cookie_scoped_to_the_dashboard(store: Store) -> None:
    store.enqueue(NewJob(type="t", queue="q"))  # a queue, so the page has a form
    host = Starlette(routes=[Mount("/ops", app=create_app(store))])
    with TestClient(host) as client:
        got = client.get("/ops/")
        cookie = got.headers["set-cookie"]
        assert cookie.startswith("jobrun_csrf=")
        assert "Path=/ops" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie
        token = csrf_of(got.text)
        again = client.get("/ops/live/overview")
        assert "set-cookie" not in again.headers  # the same nonce, the same token
        assert csrf_of(again.text) == token


@pytest.mark.parametrize("source", ["client", "settings", "url"])
def test_the_app_takes_a_client_settings_or_a_url(source: str, dsn: str, store: Store) -> None:
    store.enqueue(NewJob(type="t", queue="from-" + source))
    made: Any
    opened = None
    if source == "client":
        opened = Client.connect(dsn, pool_size=1)
        made = opened
    elif source == "settings":
        made = Settings(database_url=dsn)
    else:
        made = dsn
    try:
        app = create_app(made)
        with TestClient(app) as client:
            doc = page(client, "/")
            assert {r.attrs["data-queue"] for r in doc.select("tr", cls="queue-row")} == {
                "from-" + source
            }
        if source != "client":
            assert app.state.dashboard._client is None  # closed with the app's lifespan
    finally:
        if opened is not None:
            opened.close()
