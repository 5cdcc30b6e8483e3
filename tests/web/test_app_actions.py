"""The dashboard's actions over HTTP: each changes the database through the Store,
writing its normal event; bulk actions act on exactly the filtered set; read-only
mode and a missing or wrong CSRF token refuse every action with 403.
"""

from __future__ import annotations

import datetime as dt
import re
import urllib.parse
import uuid
from typing import Any

import pytest
from starlette.testclient import TestClient

import jobrun.web.bulk as web_bulk
from jobrun.job.errors import NotFound, ValidationError
from jobrun.job.model import Job, NewJob, ScheduleSpec, State
from jobrun.postgres.store import Store
from jobrun.web import create_app
from tests.web.test_app_support import app, client, csrf_of, parse, post

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def kinds(store: Store, job: Job) -> list[str]:
    return [e.kind.value for e in store.events(job.id)]


def notice_of(response: Any) -> dict[str, list[str]]:
    assert response.status_code == 303, (response.status_code, response.text[:1000])
    return urllib.parse.parse_qs(urllib.parse.urlsplit(response.headers["location"]).query)


def dead_job(store: Store, queue: str = "q", type: str = "t") -> Job:
    job = store.enqueue(NewJob(type=type, queue=queue))
    claimed = store.claim("w", [queue], 100, TTL)
    mine = next(c for c in claimed if c.id == job.id)
    for other in claimed:
        if other.id != job.id:
            store.fail(other, "back", store.now())
    store.fail(mine, "boom", None, permanent=True)
    return job


# -- one job -----------------------------------------------------------------------


def test_cancel_of_a_queued_job_cancels_it_with_its_event_and_comes_back(
    store: Store, client: TestClient
) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    got = post(client, f"/jobs/{job.id}", f"/jobs/{job.id}/cancel")
    assert got.headers["location"] == f"/jobs/{job.id}?notice=cancelled"
    assert store.get(job.id).state is State.CANCELLED
    assert kinds(store, job) == ["enqueued", "cancelled"]
    shown = parse(client.get(got.headers["location"]).text)
    assert shown.by_id("notice").attrs["data-notice"] == "cancelled"
    assert shown.by_id("job").attrs["data-state"] == "cancelled"


def test_cancel_of_a_running_job_requests_it(store: Store, client: TestClient) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    store.claim("w", ["q"], 1, TTL)
    got = post(client, f"/jobs/{job.id}", f"/jobs/{job.id}/cancel")
    assert notice_of(got)["notice"] == ["cancel-requested"]
    stored = store.get(job.id)
    assert stored.state is State.LEASED and stored.cancel_requested
    assert kinds(store, job)[-1] == "cancel_requested"
    assert not parse(client.get(f"/jobs/{job.id}").text).has_id("cancel-job")


def test_retry_of_a_dead_job_queues_it_now_with_a_retried_event(
    store: Store, client: TestClient
) -> None:
    job = dead_job(store)
    got = post(client, f"/jobs/{job.id}", f"/jobs/{job.id}/retry")
    assert notice_of(got)["notice"] == ["retried"]
    stored = store.get(job.id)
    assert stored.state is State.QUEUED and stored.attempts == 0
    assert kinds(store, job)[-1] == "retried"
    assert store.events(job.id)[-1].detail == {"from": "dead"}


def test_retry_of_a_running_job_is_refused_409_and_changes_nothing(
    store: Store, client: TestClient
) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    store.claim("w", ["q"], 1, TTL)
    # The page offers no retry for a leased job; a POST all the same is refused.
    page = client.get(f"/jobs/{job.id}")
    data = {"csrf": csrf_of(page.text), "next": f"/jobs/{job.id}"}
    got = client.post(f"/jobs/{job.id}/retry", data=data, follow_redirects=False)
    assert got.status_code == 409
    assert parse(got.text).by_id("error").attrs["data-status"] == "409"
    assert store.get(job.id).state is State.LEASED
    assert kinds(store, job) == ["enqueued", "claimed"]


def test_an_action_on_a_job_that_does_not_exist_is_404(store: Store, client: TestClient) -> None:
    store.enqueue(NewJob(type="t", queue="q"))
    got = post(client, "/", f"/jobs/{uuid.uuid4()}/cancel")
    assert got.status_code == 404


# -- queues ------------------------------------------------------------------------


def test_pause_and_resume_a_queue(store: Store, client: TestClient) -> None:
    store.enqueue(NewJob(type="t", queue="mail"))
    got = post(client, "/", "/queues/pause", queue="mail")
    assert got.headers["location"] == "/?notice=queue-paused"
    assert store.paused_queues() == ["mail"]
    assert store.claim("w", ["mail"], 1, TTL) == []  # workers claim nothing from it
    row = parse(client.get("/").text).one("tr", cls="queue-row", data_queue="mail")
    assert row.attrs["data-paused"] == "true"

    got = post(client, "/", "/queues/resume", queue="mail")
    assert notice_of(got)["notice"] == ["queue-resumed"]
    assert store.paused_queues() == []
    assert len(store.claim("w", ["mail"], 1, TTL)) == 1
    assert notice_of(post(client, "/", "/queues/resume", queue="mail"))["notice"] == [
        "queue-not-paused"
    ]


def test_a_queue_name_the_store_refuses_is_a_400(store: Store, client: TestClient) -> None:
    store.enqueue(NewJob(type="t", queue="q"))
    got = post(client, "/", "/queues/pause", queue="Not A Queue!")
    assert got.status_code == 400
    assert store.paused_queues() == []


# -- schedules ---------------------------------------------------------------------


def test_pause_resume_and_trigger_a_schedule(store: Store, client: TestClient) -> None:
    store.create_schedule(
        ScheduleSpec(
            id="nightly",
            cron="0 3 * * *",
            type="report.build",
            queue="reports",
            payload={"kind": "daily"},
            priority=3,
        )
    )
    got = post(client, "/schedules", "/schedules/pause", id="nightly")
    assert got.headers["location"] == "/schedules?notice=schedule-paused"
    assert store.get_schedule("nightly").paused
    got = post(client, "/schedules", "/schedules/resume", id="nightly")
    assert notice_of(got)["notice"] == ["schedule-resumed"]
    resumed = store.get_schedule("nightly")
    assert not resumed.paused and resumed.next_run_at > store.now()

    page = client.get("/schedules")
    form = parse(page.text).one("form", cls="trigger-schedule")
    fields = {i.attrs["name"]: i.attrs["value"] for i in form.select("input")}
    got = client.post("/schedules/trigger", data=fields, follow_redirects=False)
    query = notice_of(got)
    assert query["notice"] == ["schedule-triggered"]
    job = store.get(uuid.UUID(query["job"][0]))
    assert (job.type, job.queue, job.payload, job.priority, job.state) == (
        "report.build",
        "reports",
        {"kind": "daily"},
        3,
        State.QUEUED,
    )
    assert job.run_at <= store.now()
    assert kinds(store, job) == ["enqueued"]
    assert store.get_schedule("nightly").next_run_at == resumed.next_run_at  # not advanced
    # the same form sent twice (a double click) enqueues one run, not two
    again = client.post("/schedules/trigger", data=fields, follow_redirects=False)
    assert notice_of(again)["job"] == query["job"]
    assert len(store.list(queue="reports")) == 1
    shown = parse(client.get(got.headers["location"]).text)
    assert shown.by_id("notice").one("a", cls="job-link").attrs["href"] == f"/jobs/{job.id}"


def test_an_unknown_schedule_is_404(store: Store, client: TestClient) -> None:
    store.create_schedule(ScheduleSpec(id="s", cron="0 3 * * *", type="t"))
    for action in ("pause", "resume", "trigger"):
        assert post(client, "/schedules", f"/schedules/{action}", id="nope").status_code == 404


# -- bulk --------------------------------------------------------------------------


def confirm(client: TestClient, action: str, query: str) -> Any:
    got = client.get(f"/bulk/{action}?{query}")
    assert got.status_code == 200, got.text[:2000]
    return got


def submit(client: TestClient, confirm_page: Any) -> Any:
    form = parse(confirm_page.text).by_id("bulk-form")
    fields = {i.attrs["name"]: i.attrs["value"] for i in form.select("input")}
    return client.post(form.attrs["action"], data=fields, follow_redirects=False)


def test_bulk_retry_shows_the_count_then_retries_exactly_the_filtered_set(
    store: Store, client: TestClient
) -> None:
    chosen = [dead_job(store, "q1", "a") for _ in range(3)]
    other_queue = [dead_job(store, "q2", "a") for _ in range(2)]
    other_type = dead_job(store, "q1", "b")
    queued = store.enqueue(NewJob(type="a", queue="q1"))

    listing = parse(client.get("/jobs?queue=q1&type=a&state=dead").text)
    link = listing.by_id("bulk-retry").attrs["href"]
    assert not listing.has_id("bulk-cancel")  # dead jobs cannot be cancelled
    page = client.get(link)
    doc = parse(page.text)
    assert doc.by_id("bulk").attrs["data-action"] == "retry"
    assert doc.by_id("bulk-count").text == "3"
    # nothing happened on the confirm step
    assert all(store.get(j.id).state is State.DEAD for j in chosen)

    got = submit(client, page)
    query = notice_of(got)
    assert query["notice"] == ["bulk-retried"] and query["n"] == ["3"]
    assert urllib.parse.urlsplit(got.headers["location"]).path == "/jobs"
    assert {"queue": ["q1"], "type": ["a"], "state": ["dead"]}.items() <= query.items()
    for job in chosen:
        assert store.get(job.id).state is State.QUEUED
        assert kinds(store, job)[-1] == "retried"
    for job in [*other_queue, other_type]:
        assert store.get(job.id).state is State.DEAD
        assert kinds(store, job)[-1] == "dead"
    assert kinds(store, queued) == ["enqueued"]
    shown = parse(client.get(got.headers["location"]).text)
    assert "Retried 3 jobs" in shown.by_id("notice").text


def test_a_bulk_action_leaves_jobs_that_arrived_after_its_confirm_step_alone(
    store: Store, client: TestClient
) -> None:
    before = [dead_job(store) for _ in range(2)]
    page = confirm(client, "retry", "state=dead")
    assert parse(page.text).by_id("bulk-count").text == "2"
    late = dead_job(store)  # a newer id than the confirm step saw
    query = notice_of(submit(client, page))
    assert query["n"] == ["2"]
    assert all(store.get(j.id).state is State.QUEUED for j in before)
    assert store.get(late.id).state is State.DEAD


def test_a_bulk_action_skips_jobs_that_stopped_matching_meanwhile(
    store: Store, client: TestClient
) -> None:
    jobs = [store.enqueue(NewJob(type="t", queue="q")) for _ in range(3)]
    page = confirm(client, "cancel", "state=queued")
    assert parse(page.text).by_id("bulk-count").text == "3"
    store.cancel(jobs[0].id)  # someone else got there first
    query = notice_of(submit(client, page))
    assert (query["n"], query.get("skipped", ["0"])) == (["2"], ["0"])
    assert all(store.get(j.id).state is State.CANCELLED for j in jobs)


def test_bulk_cancel_cancels_queued_jobs_and_requests_it_for_running_ones(
    store: Store, client: TestClient
) -> None:
    queued = [store.enqueue(NewJob(type="t", queue="q")) for _ in range(2)]
    running = store.enqueue(NewJob(type="t", queue="busy"))
    store.claim("w", ["busy"], 1, TTL)
    query = notice_of(submit(client, confirm(client, "cancel", "state=queued&queue=q")))
    assert query["notice"] == ["bulk-cancelled"] and query["n"] == ["2"]
    assert all(store.get(j.id).state is State.CANCELLED for j in queued)
    assert not store.get(running.id).cancel_requested
    query = notice_of(submit(client, confirm(client, "cancel", "state=leased")))
    assert query["n"] == ["1"] and store.get(running.id).cancel_requested


def test_a_bulk_action_needs_a_state_it_applies_to(store: Store, client: TestClient) -> None:
    store.enqueue(NewJob(type="t", queue="q"))
    for path in (
        "/bulk/retry?state=queued",
        "/bulk/retry?queue=q",
        "/bulk/cancel?state=dead",
        "/bulk/cancel",
    ):
        got = client.get(path)
        assert got.status_code == 400, path
        assert "state" in parse(got.text).by_id("error").text
    assert client.get("/bulk/delete?state=dead").status_code == 404
    assert parse(client.get("/jobs?state=queued").text).has_id("bulk-cancel")
    assert not parse(client.get("/jobs").text).has_id("bulk-retry")


def test_a_bulk_step_with_nothing_to_do_says_so(store: Store, client: TestClient) -> None:
    doc = parse(confirm(client, "retry", "state=dead").text)
    assert doc.has_id("bulk-nothing") and not doc.has_id("bulk-form")


def test_a_bulk_set_larger_than_the_limit_is_refused_on_the_confirm_step(
    store: Store, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_bulk, "BULK_LIMIT", 3)
    for _ in range(4):
        store.enqueue(NewJob(type="t", queue="q"))
    doc = parse(confirm(client, "cancel", "state=queued").text)
    assert doc.has_id("bulk-too-many") and not doc.has_id("bulk-form")


# -- refusals ----------------------------------------------------------------------

ACTIONS = [
    ("/jobs/{job}/cancel", {}),
    ("/jobs/{job}/retry", {}),
    ("/bulk/retry", {"state": "dead", "upto": "{job}"}),
    ("/bulk/cancel", {"state": "queued", "upto": "{queued}"}),
    ("/queues/pause", {"queue": "q"}),
    ("/queues/resume", {"queue": "q"}),
    ("/schedules/pause", {"id": "s"}),
    ("/schedules/resume", {"id": "s"}),
    ("/schedules/trigger", {"id": "s", "nonce": "n1"}),
]


def snapshot(store: Store, jobs: list[Job]) -> Any:
    return (
        [(j.id, store.get(j.id).state, len(store.events(j.id))) for j in jobs],
        store.paused_queues(),
        store.get_schedule("s").paused,
        len(store.list(limit=1000)),
    )


def refusal_setup(store: Store) -> tuple[Job, Job]:
    job = dead_job(store)
    queued = store.enqueue(NewJob(type="t", queue="q"))
    store.create_schedule(ScheduleSpec(id="s", cron="0 3 * * *", type="t"))
    return job, queued


def test_read_only_hides_every_action_and_refuses_each_with_403(store: Store) -> None:
    job, queued = refusal_setup(store)
    store.pause_queue("q2")
    with TestClient(create_app(store, read_only=True)) as client:
        for path in (
            "/",
            "/jobs",
            "/jobs?state=dead",
            "/jobs?state=queued",
            f"/jobs/{job.id}",
            f"/jobs/{queued.id}",
            "/schedules",
            "/live/overview",
            f"/live/jobs/{job.id}",
        ):
            got = client.get(path)
            assert got.status_code == 200, path
            doc = parse(got.text)
            if not path.startswith("/live/"):  # a live fragment has no page around it
                assert doc.one("body").attrs["data-read-only"] == "true"
                assert doc.has_id("read-only-badge")
            assert not [f for f in doc.select("form") if f.attrs.get("method") == "post"], path
            assert not doc.select("button", cls="pause-queue") and not doc.select(
                "button", cls="resume-queue"
            )
            for hidden in ("retry-job", "cancel-job", "bulk-retry", "bulk-cancel"):
                assert not doc.has_id(hidden), (path, hidden)
        assert client.get("/bulk/retry?state=dead").status_code == 403
        before = snapshot(store, [job, queued])
        for path, fields in ACTIONS:
            target = path.format(job=job.id)
            data = {k: v.format(job=job.id, queued=queued.id) for k, v in fields.items()}
            got = client.post(target, data={"csrf": "x", "next": "/", **data})
            assert got.status_code == 403, target
            assert "read-only" in parse(got.text).by_id("error").text
        assert snapshot(store, [job, queued]) == before


@pytest.mark.parametrize("token", ["missing", "wrong", "other-cookie", "no-cookie"])
def test_an_action_without_the_pages_csrf_token_is_refused_403(
    store: Store, client: TestClient, token: str
) -> None:
    job, queued = refusal_setup(store)
    page = client.get(f"/jobs/{job.id}")
    good = csrf_of(page.text)
    # A token that is right for another browser's cookie (another app's secret too).
    with TestClient(create_app(store)) as stranger:
        foreign = csrf_of(stranger.get(f"/jobs/{job.id}").text)
    value = {"missing": None, "wrong": "0" * 64, "other-cookie": foreign, "no-cookie": good}[token]
    if token == "no-cookie":
        client.cookies.clear()
    before = snapshot(store, [job, queued])
    for path, fields in ACTIONS:
        data = {
            "next": "/",
            **{k: v.format(job=job.id, queued=queued.id) for k, v in fields.items()},
        }
        if value is not None:
            data["csrf"] = value
        got = client.post(path.format(job=job.id), data=data, follow_redirects=False)
        assert got.status_code == 403, (token, path)
        assert "CSRF" in parse(got.text).by_id("error").text
    assert snapshot(store, [job, queued]) == before


def test_the_right_csrf_token_is_accepted_by_every_action(store: Store, client: TestClient) -> None:
    """The refusals above are the token's doing: the same requests with it succeed."""
    job, queued = refusal_setup(store)
    store.pause_queue("q")
    token = csrf_of(client.get(f"/jobs/{job.id}").text)
    for path, fields in ACTIONS:
        data = {
            "csrf": token,
            "next": "/",
            **{k: v.format(job=job.id, queued=queued.id) for k, v in fields.items()},
        }
        got = client.post(path.format(job=job.id), data=data, follow_redirects=False)
        assert got.status_code == 303, (path, got.status_code, got.text[:500])


def test_a_get_never_acts_and_a_form_must_be_urlencoded(store: Store, client: TestClient) -> None:
    job = dead_job(store)
    assert client.get(f"/jobs/{job.id}/retry").status_code == 405
    token = csrf_of(client.get(f"/jobs/{job.id}").text)
    got = client.post(f"/jobs/{job.id}/retry", json={"csrf": token}, follow_redirects=False)
    assert got.status_code == 415
    assert store.get(job.id).state is State.DEAD


@pytest.mark.parametrize(
    "target", ["https://evil.example/", "//evil.example/x", "/\\evil.example", "jobs", ""]
)
def test_after_an_action_it_goes_back_only_inside_the_dashboard(
    store: Store, client: TestClient, target: str
) -> None:
    job = dead_job(store)
    got = post(client, f"/jobs/{job.id}", f"/jobs/{job.id}/retry", next=target)
    location = got.headers["location"]
    assert re.fullmatch(r"/\?notice=retried", location), location


def test_store_trigger_schedule_enqueues_a_run_now_keyed_by_its_nonce(store: Store) -> None:
    """The Store method behind "Run now": one job per nonce, a new one per call without."""
    store.create_schedule(ScheduleSpec(id="s", cron="0 3 * * *", type="t", queue="q"))
    store.pause_schedule("s")  # a paused schedule can still be run by hand
    first = store.trigger_schedule("s", nonce="abc")
    assert first.idempotency_key == "sched:s:manual:abc"
    assert store.trigger_schedule("s", nonce="abc").id == first.id
    one, two = store.trigger_schedule("s"), store.trigger_schedule("s")
    assert len({first.id, one.id, two.id}) == 3
    assert one.idempotency_key is not None and one.idempotency_key.startswith("sched:s:manual:")
    assert store.get_schedule("s").paused
    assert len(store.list(queue="q")) == 3
    with pytest.raises(NotFound):
        store.trigger_schedule("missing")
    for bad in ("", "a:b", "x" * 65):
        with pytest.raises(ValidationError):
            store.trigger_schedule("s", nonce=bad)
