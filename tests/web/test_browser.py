"""The dashboard as a person uses it: a real headless Chromium, a real worker, a real database.

Each test serves ``jobrun.web.create_app`` on its own database with uvicorn
(refreshing its live regions every second), drives the pages through
Selenium and watches a real :class:`jobrun.Worker` act on what was clicked.
The element ids and classes are the ones docs/dashboard.md lists as
stable. Screenshots of every page go to ``screenshots/`` under pytest's base
temporary directory (see tests/web/browser.py).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from jobrun.job.model import Backoff, Job, NewJob, ScheduleSpec, State
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store
from jobrun.scheduler import SchedulerConfig, SchedulerService
from jobrun.web import create_app
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for
from tests.web.browser import (
    Browser,
    browser,
    chromium,
    save_for_docs,
    screenshots_dir,
    serve,
)

__all__ = ["browser", "chromium", "screenshots_dir"]  # fixtures, imported for pytest

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
REFRESH_SECONDS = 1


# -- fixtures ------------------------------------------------------------------


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def start_worker(store: Store, registry: Registry) -> Iterator[Callable[..., Worker]]:
    """Start a real Worker on the test's database (stopped at the end)."""
    workers: list[Worker] = []

    def start(**config: Any) -> Worker:
        worker = Worker(store, registry, WorkerConfig(**{**FAST, **config}))
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for w in workers:
        w.stop(timeout=5)


@pytest.fixture
def dashboard(store: Store) -> Iterator[str]:
    """The dashboard on the test's Store, served on a free port: its base URL."""
    app = create_app(store, refresh_seconds=REFRESH_SECONDS)
    with serve(app) as base:
        yield base


def enqueue(store: Store, type: str = "t", **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


def state_of(store: Store, job: Job) -> State:
    return store.get(job.id).state


def queue_row(page: Browser, queue: str) -> str:
    return f'tr.queue-row[data-queue="{queue}"]'


def refreshes(page: Browser, region: str) -> int:
    return int(page.attr(region, "data-refresh-count") or 0)


def no_console_errors(page: Browser) -> None:
    """No script failed and the Content-Security-Policy refused nothing on this page."""
    errors = page.console_errors()
    assert not errors, f"console errors at {page.url}: {errors}"


# -- the overview ----------------------------------------------------------------


def spread_over_the_last_hour(conn: psycopg.Connection[Any], ids: list[uuid.UUID]) -> None:
    """Move these jobs' finish and failure times back by up to 58 minutes.

    A steady trickle over the hour and a busy spell about 25 minutes ago, as
    a queue's last hour looks; the same draw every run (seeded).
    """
    draw = random.Random(13)
    ages = [
        draw.uniform(0, 3480) if n % 3 else min(max(draw.gauss(1500, 300), 0), 3480)
        for n in range(len(ids))
    ]
    conn.execute(
        "UPDATE jobrun.jobs AS j SET finished_at = j.finished_at - make_interval(secs => a.age)"
        " FROM unnest(%s::uuid[], %s::float8[]) AS a(id, age) WHERE j.id = a.id",
        [ids, ages],
    )
    conn.execute(
        "UPDATE jobrun.job_events AS e SET at = e.at - make_interval(secs => a.age)"
        " FROM unnest(%s::uuid[], %s::float8[]) AS a(id, age)"
        " WHERE e.job_id = a.id AND e.kind = 'retrying'",
        [ids, ages],
    )


def test_the_overview_shows_every_queue_with_its_depth_workers_leader_and_throughput(
    browser: Browser,
    dashboard: str,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
    dsn: str,
    conn: psycopg.Connection[Any],
) -> None:
    release = threading.Event()
    registry.register("email.send", lambda ctx, job: None)
    registry.register("report.build", lambda ctx, job: release.wait(60) and None)

    def flaky(ctx: JobContext, job: Job) -> None:
        if ctx.attempt == 1 and job.payload.get("n", 0) % 5 == 0:
            raise RuntimeError("SMTP 421: try again later")

    registry.register("email.digest", flaky)

    # history: 160 jobs run by a real worker, one in five failing once first ...
    done = [enqueue(store, "email.digest", payload={"n": n}, max_attempts=3) for n in range(160)]
    worker = start_worker(queues={"default": None, "reports": None}, owner="worker-a")
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in done))
    # ... then spread over the last hour (a steady trickle and a busy spell), so
    # that the chart has bars in many minutes
    spread_over_the_last_hour(conn, [j.id for j in done])

    # now: jobs waiting, waiting for later, running, dead, and a paused queue
    for n in range(4):
        enqueue(store, "email.send", queue="emails", payload={"to": f"user{n}@example.com"})
    for n in range(2):
        enqueue(store, "email.send", queue="emails", delay=dt.timedelta(hours=n + 1))
    running = enqueue(store, "report.build", queue="reports", payload={"month": "2026-11"})
    store.pause_queue("media")
    for n in range(3):
        enqueue(store, "media.thumbnail", queue="media", payload={"image": n})
    wait_for(lambda: state_of(store, running) is State.LEASED)

    def no_data(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure("no data for 2026-11")

    registry.register("report.fail", no_data)
    dead = [
        enqueue(store, "report.fail", queue="reports", max_attempts=1, payload={"n": n})
        for n in range(2)
    ]
    wait_for(lambda: all(state_of(store, j) is State.DEAD for j in dead))
    store.create_schedule(
        ScheduleSpec(id="nightly-report", cron="0 3 * * *", type="report.build", queue="reports")
    )
    # flow control, shown in the limits column (set now: nothing left to claim under them)
    store.set_queue_limits("reports", concurrency=4)
    store.set_queue_limits("emails", per_key=1, rate="100/min")
    leader = SchedulerService(store, AdvisoryLocker(dsn), SchedulerConfig())
    try:
        assert leader.run_once().leader

        browser.open(dashboard + "/")
        assert browser.attr("body", "data-page") == "overview"
        names = ("ready", "scheduled", "leased", "dead", "paused")
        depth = {
            row["queue"]: {k: row[k] for k in names}
            for row in browser.rows("tr.queue-row", "queue", *names)
        }
        assert depth["emails"] == {
            "ready": "4",
            "scheduled": "2",
            "leased": "0",
            "dead": "0",
            "paused": "false",
        }
        assert depth["reports"]["leased"] == "1"
        assert depth["reports"]["dead"] == "2"
        assert depth["media"] == {
            "ready": "3",
            "scheduled": "0",
            "leased": "0",
            "dead": "0",
            "paused": "true",
        }
        # what a person reads, not only the attributes
        assert browser.text(f"{queue_row(browser, 'emails')} td.ready") == "4"
        assert browser.text(f"{queue_row(browser, 'media')} td.paused") == "paused"
        assert browser.text(f"{queue_row(browser, 'reports')} td.dead") == "2"
        assert browser.text(f"{queue_row(browser, 'reports')} td.limits") == "concurrency 1/4"
        assert browser.text(f"{queue_row(browser, 'emails')} span.limit-rate") == (
            "rate 0/100 in 1 min"
        )
        assert browser.text(f"{queue_row(browser, 'media')} td.limits") == "\u2013"
        assert browser.has(f"{queue_row(browser, 'media')} button.resume-queue")
        assert browser.has(f"{queue_row(browser, 'emails')} button.pause-queue")
        assert browser.attr("#leader", "data-leader") == "present"
        # the leased report runs on worker-a, and its page is a click away
        assert browser.attr('tr.worker-row[data-owner="worker-a"]', "data-running") == "1"
        assert browser.has(f'li.running-job[data-job-id="{running.id}"] a.job-link')
        assert browser.attr("svg#throughput", "data-succeeded-total") == "160"
        assert browser.attr("svg#throughput", "data-failed-total") == str(32 + 2)  # retries, dead
        minutes = browser.rows("svg#throughput g.minute", "succeeded", "failed")
        assert len(minutes) == 60
        assert sum(int(m["succeeded"] or 0) for m in minutes) == 160
        assert sum(int(m["failed"] or 0) for m in minutes) == 34
        busy = [m for m in minutes if m["succeeded"] != "0"]
        assert len(busy) >= 20, "the history is spread over many minutes"
        assert "password" not in browser.text("#db-target")
        no_console_errors(browser)

        shot = browser.screenshot("overview")
        save_for_docs(shot, "overview.png")

        # live: new jobs show up without a reload
        marker = browser.mark()
        for _ in range(3):
            enqueue(store, "email.send", queue="emails")
        browser.wait_until(
            lambda: browser.attr(queue_row(browser, "emails"), "data-ready") == "7",
            "the overview's live refresh to show 7 ready emails",
        )
        assert browser.same_document(marker), "the page was not reloaded"
        assert refreshes(browser, "#overview-live") >= 1

        # the dead count links to those jobs
        browser.click_through(f"{queue_row(browser, 'reports')} td.dead a")
        assert browser.path.startswith("/jobs?")
        rows = browser.rows("tr.job-row", "job-id")
        assert sorted(r["job-id"] for r in rows) == sorted(str(j.id) for j in dead)
    finally:
        release.set()
        leader.stop()
        worker.stop(timeout=10)


# -- jobs: filters and keyset pages ----------------------------------------------


def test_the_jobs_page_filters_by_queue_state_type_key_and_id_and_pages_by_keyset(
    browser: Browser, dashboard: str, store: Store
) -> None:
    mails = [enqueue(store, "email.send", queue="emails") for _ in range(3)]
    keyed = enqueue(store, "invoice.render", queue="billing", idempotency_key="invoice-2026-0042")
    bulk = [enqueue(store, "image.resize", queue="media", payload={"n": n}) for n in range(57)]
    cancelled = store.cancel(enqueue(store, "email.send", queue="emails").id)
    assert cancelled.state is State.CANCELLED

    browser.open(dashboard + "/jobs")
    assert browser.attr("body", "data-page") == "jobs"
    first = browser.rows("tr.job-row", "job-id")
    assert len(first) == 50  # one page
    assert first[0]["job-id"] == str(cancelled.id)  # newest first
    browser.screenshot("jobs")
    no_console_errors(browser)

    def apply(**fields: str) -> list[dict[str, str | None]]:
        for name in ("queue", "type", "key", "id"):
            box = browser.find(f"#filter-{name}")
            box.clear()
            box.send_keys(fields.get(name, ""))
        browser.select("#filter-state", fields.get("state", ""))
        browser.click_through("#filter-apply")
        return browser.rows("tr.job-row", "job-id", "state", "queue", "type")

    rows = apply(queue="emails")
    assert [r["job-id"] for r in rows] == [str(j.id) for j in [cancelled, *reversed(mails)]]
    assert "queue=emails" in browser.url

    rows = apply(queue="emails", state="cancelled")
    assert [r["job-id"] for r in rows] == [str(cancelled.id)]
    assert browser.value("#filter-queue") == "emails"  # kept

    rows = apply(type="invoice.render")
    assert [r["job-id"] for r in rows] == [str(keyed.id)]

    rows = apply(key="invoice-2026-0042")
    assert [r["job-id"] for r in rows] == [str(keyed.id)]

    target = bulk[10]
    rows = apply(id=str(target.id)[:28])
    assert [r["job-id"] for r in rows] == [str(target.id)]

    rows = apply(queue="nowhere")
    assert rows == [] and browser.has("#no-jobs")

    # keyset pages: 57 media jobs are 50 + 7, none twice, none lost
    apply(queue="media")
    page1 = [r["job-id"] for r in browser.rows("tr.job-row", "job-id")]
    assert not browser.has("#first-page")
    browser.click_through("#next-page")
    assert "before=" in browser.url and "offset" not in browser.url.lower()
    page2 = [r["job-id"] for r in browser.rows("tr.job-row", "job-id")]
    assert not browser.has("#next-page")
    assert browser.has("#first-page")
    assert page1 + page2 == [str(j.id) for j in reversed(bulk)]
    browser.screenshot("jobs-page-2")

    # a job row opens the job
    browser.click_through(f'tr.job-row[data-job-id="{page2[0]}"] a.job-link')
    assert browser.path == f"/jobs/{page2[0]}"


def test_the_jobs_list_refreshes_itself(browser: Browser, dashboard: str, store: Store) -> None:
    enqueue(store, "a.job", queue="live")
    browser.open(dashboard + "/jobs?queue=live")
    assert browser.count("tr.job-row") == 1
    marker = browser.mark()
    newer = enqueue(store, "a.job", queue="live")
    browser.wait_until(
        lambda: (
            (rows := browser.rows("tr.job-row", "job-id")) and rows[0]["job-id"] == str(newer.id)
        ),
        "the new job at the top of the list",
    )
    assert browser.same_document(marker), "the page was not reloaded"
    assert browser.value("#filter-queue") == "live"


# -- one job ---------------------------------------------------------------------


def test_a_job_page_shows_its_payload_result_error_ledger_and_timeline(
    browser: Browser,
    dashboard: str,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
) -> None:
    def charge(ctx: JobContext, job: Job) -> Any:
        if ctx.attempt < 3:
            raise ConnectionError(f"payment gateway timed out (attempt {ctx.attempt})")
        return lambda conn: None  # the transactional path: an effect in the ledger

    registry.register("payment.charge", charge)
    job = enqueue(
        store,
        "payment.charge",
        queue="payments",
        payload={"order": 1042, "amount": {"value": "19.99", "currency": "EUR"}},
        max_attempts=5,
        idempotency_key="order-1042",
    )
    start_worker(queues={"payments": None})
    wait_for(lambda: state_of(store, job) is State.SUCCEEDED)

    browser.open(dashboard + "/jobs?queue=payments")
    browser.click_through(f'tr.job-row[data-job-id="{job.id}"] a.job-link')
    assert browser.attr("body", "data-page") == "job"
    (section,) = browser.rows("#job", "job-id", "state", "attempts")
    assert section == {"job-id": str(job.id), "state": "succeeded", "attempts": "3"}
    assert browser.text("#job-state") == "succeeded"
    assert browser.text("#job-queue") == "payments"
    assert browser.text("#job-type") == "payment.charge"
    assert browser.text("#job-key") == "order-1042"
    assert browser.text("#job-attempts").startswith("3")
    payload = browser.text("pre#job-payload")
    assert '"order": 1042' in payload and '"currency": "EUR"' in payload
    assert "\n" in payload, "pretty-printed"
    assert browser.attr("#job-effect", "data-recorded") == "true"
    assert browser.attr("#job-effect", "data-key") == "order-1042"
    # the last failure stays on the page with its traceback
    assert "ConnectionError: payment gateway timed out (attempt 2)" in browser.text(
        "pre#job-last-error"
    )
    assert "Traceback" in browser.text("pre#job-last-error")
    timeline = [
        (e["kind"], e["attempt"])
        for e in browser.rows("ol#job-timeline li.event", "kind", "attempt")
    ]
    assert timeline == [
        ("enqueued", "0"),
        ("claimed", "1"),
        ("retrying", "1"),
        ("claimed", "2"),
        ("retrying", "2"),
        ("claimed", "3"),
        ("succeeded", "3"),
    ]
    assert "retrying" in browser.text("ol#job-timeline")
    # Each event's detail reads as key: value pairs under its label, not JSON glued to it.
    retrying = 'ol#job-timeline li.event[data-kind="retrying"]'
    shown = browser.text(retrying)
    assert '{"' not in shown and '"permanent"' not in shown
    assert "ConnectionError: payment gateway timed out (attempt 1)" in browser.text(
        f'{retrying} .field[data-key="error"] pre'
    )
    layout = browser.js(
        """
        const li = document.querySelector(arguments[0]);
        const box = e => li.querySelector(e).getBoundingClientRect();
        const colon = getComputedStyle(li.querySelector('.field[data-key="via"] dt'), '::after');
        return {
          labelBottom: box('strong.kind').bottom, detailTop: box('dl.detail').top,
          keyTop: box('.field[data-key="via"] dt').top,
          valueTop: box('.field[data-key="via"] dd').top,
          value: li.querySelector('.field[data-key="via"] dd').innerText,
          colon: colon.content,
        };
        """,
        retrying,
    )
    assert layout["detailTop"] >= layout["labelBottom"] - 1, layout  # on a line of its own
    assert layout["keyTop"] == layout["valueTop"], layout  # "via: fail" on one line
    assert (layout["value"], layout["colon"]) == ("fail", '":"'), layout
    assert not browser.has("#cancel-job")  # finished: nothing to cancel
    no_console_errors(browser)
    browser.screenshot("job")
    save_for_docs(browser.screenshot_of("ol#job-timeline", "job-timeline"), "job-timeline.png")


def test_retrying_a_dead_job_from_its_page_runs_it_again(
    browser: Browser,
    dashboard: str,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
) -> None:
    broken = threading.Event()
    broken.set()

    def export(ctx: JobContext, job: Job) -> str:
        if broken.is_set():
            raise PermanentFailure("the export bucket does not exist")
        return "exported"

    registry.register("export.csv", export)
    job = enqueue(store, "export.csv", queue="exports", max_attempts=1)
    start_worker(queues={"exports": None})
    wait_for(lambda: state_of(store, job) is State.DEAD)

    browser.open(dashboard + f"/jobs/{job.id}")
    assert browser.attr("#job", "data-state") == "dead"
    assert "the export bucket does not exist" in browser.text("#job-error-summary")
    browser.screenshot("job-dead")
    broken.clear()  # the operator fixed the bucket
    browser.click_through("#retry-job")
    assert browser.attr("#notice", "data-notice") == "retried"
    assert browser.path.startswith(f"/jobs/{job.id}")
    # the worker picks it up; the page shows it by itself (live refresh, no reload)
    marker = browser.mark()
    browser.wait_until(
        lambda: browser.attr("#job", "data-state") == "succeeded",
        "the retried job to show succeeded",
    )
    assert browser.same_document(marker), "the page was not reloaded"
    assert state_of(store, job) is State.SUCCEEDED
    assert '"exported"' in browser.text("pre#job-result")
    kinds = [e["kind"] for e in browser.rows("li.event", "kind")]
    assert kinds[-3:] == ["retried", "claimed", "succeeded"]
    no_console_errors(browser)


def test_cancelling_a_queued_job_from_its_page(
    browser: Browser, dashboard: str, store: Store
) -> None:
    job = enqueue(store, "later.thing", queue="nobody-serves-this")
    browser.open(dashboard + f"/jobs/{job.id}")
    assert browser.attr("#job", "data-state") == "queued"
    browser.click_through("#cancel-job")
    assert browser.attr("#notice", "data-notice") == "cancelled"
    assert browser.attr("#job", "data-state") == "cancelled"
    assert state_of(store, job) is State.CANCELLED


def test_a_bulk_retry_shows_the_count_before_it_acts(
    browser: Browser,
    dashboard: str,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
) -> None:
    broken = threading.Event()
    broken.set()

    def sync(ctx: JobContext, job: Job) -> None:
        if broken.is_set():
            raise PermanentFailure("upstream 500")

    registry.register("crm.sync", sync)
    dead = [enqueue(store, "crm.sync", queue="crm", max_attempts=1) for _ in range(6)]
    other = enqueue(store, "crm.other", queue="crm", max_attempts=1)
    store.cancel(other.id)
    start_worker(queues={"crm": None})
    wait_for(lambda: all(state_of(store, j) is State.DEAD for j in dead))

    browser.open(dashboard + "/jobs?queue=crm&state=dead")
    assert browser.count("tr.job-row") == 6
    browser.click_through("#bulk-retry")
    assert browser.attr("body", "data-page") == "bulk"
    assert browser.attr("#bulk", "data-action") == "retry"
    assert browser.text("#bulk-count") == "6"
    browser.screenshot("bulk-confirm")
    # nothing has happened yet
    assert all(state_of(store, j) is State.DEAD for j in dead)
    broken.clear()
    browser.click_through("#bulk-submit")
    assert browser.attr("#notice", "data-notice") == "bulk-retried"
    assert "Retried 6 jobs" in browser.text("#notice")
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in dead))
    assert state_of(store, other) is State.CANCELLED  # not in the filtered set
    no_console_errors(browser)


# -- queues: pause and resume from the overview ----------------------------------


def test_pausing_a_queue_from_the_overview_stops_workers_claiming_from_it(
    browser: Browser,
    dashboard: str,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
) -> None:
    registry.register("media.encode", lambda ctx, job: None)
    registry.register("mail.send", lambda ctx, job: None)
    enqueue(store, "media.encode", queue="media", delay=dt.timedelta(hours=1))  # the row
    start_worker(queues={"media": None, "default": None})

    browser.open(dashboard + "/")
    row = queue_row(browser, "media")
    assert browser.attr(row, "data-paused") == "false"
    browser.click_through(f"{row} button.pause-queue")
    assert browser.attr("#notice", "data-notice") == "queue-paused"
    assert browser.attr(row, "data-paused") == "true"
    assert browser.text(f"{row} td.paused") == "paused"
    assert store.paused_queues() == ["media"]

    # jobs enqueued after the pause: the other queue's run, the paused one's wait
    held = [enqueue(store, "media.encode", queue="media") for _ in range(3)]
    free = enqueue(store, "mail.send")
    wait_for(lambda: state_of(store, free) is State.SUCCEEDED)
    time.sleep(1.0)  # five more poll intervals of the worker
    assert all(state_of(store, j) is State.QUEUED for j in held)
    assert all(store.get(j.id).attempts == 0 for j in held)
    browser.wait_until(
        lambda: browser.attr(row, "data-ready") == "3",
        "the paused queue to show 3 ready jobs",
    )
    browser.screenshot("overview-paused")

    browser.click_through(f"{row} button.resume-queue")
    assert browser.attr("#notice", "data-notice") == "queue-resumed"
    assert store.paused_queues() == []
    wait_for(lambda: all(state_of(store, j) is State.SUCCEEDED for j in held))
    browser.wait_until(
        lambda: (
            browser.attr(row, "data-ready") == "0" and browser.attr(row, "data-paused") == "false"
        ),
        "the resumed queue to show its jobs done",
    )
    no_console_errors(browser)


# -- schedules ---------------------------------------------------------------------


def test_schedules_are_listed_and_paused_resumed_and_triggered_from_the_page(
    browser: Browser, dashboard: str, store: Store
) -> None:
    store.create_schedule(
        ScheduleSpec(id="nightly-report", cron="0 3 * * *", type="report.build", timezone="UTC")
    )
    store.create_schedule(
        ScheduleSpec(id="hourly-sync", cron="15 * * * *", type="crm.sync", timezone="Europe/Paris")
    )
    browser.open(dashboard + "/schedules")
    assert browser.attr("body", "data-page") == "schedules"
    ids = [r["schedule-id"] for r in browser.rows("tr.schedule-row", "schedule-id")]
    assert sorted(ids) == ["hourly-sync", "nightly-report"]
    row = 'tr.schedule-row[data-schedule-id="hourly-sync"]'
    assert browser.text(f"{row} td.cron") == "15 * * * *"
    assert browser.text(f"{row} td.timezone") == "Europe/Paris"
    # Next runs in each schedule's own zone, named; UTC in the title (and datetime=).
    utc, title = (browser.attr(f"{row} td.next-run time", n) for n in ("datetime", "title"))
    assert utc is not None and title is not None
    at = dt.datetime.fromisoformat(utc)
    assert at == store.get_schedule("hourly-sync").next_run_at
    paris = at.astimezone(ZoneInfo("Europe/Paris"))
    assert paris.minute == 15
    assert browser.text(f"{row} td.next-run").startswith(
        paris.strftime("%Y-%m-%d %H:%M:%S ") + str(paris.tzname())
    )
    assert title.startswith("Europe/Paris (UTC+0")
    assert at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ in UTC") in title
    nightly = 'tr.schedule-row[data-schedule-id="nightly-report"] td.next-run'
    assert browser.text(nightly).startswith(
        store.get_schedule("nightly-report").next_run_at.strftime("%Y-%m-%d 03:00:00 UTC")
    )
    no_console_errors(browser)
    browser.screenshot("schedules")
    save_for_docs(browser.screenshot_of("main#main", "schedules-table"), "schedules.png")

    browser.click_through(f"{row} button.pause-schedule")
    assert browser.attr("#notice", "data-notice") == "schedule-paused"
    assert browser.attr(row, "data-paused") == "true"
    assert store.get_schedule("hourly-sync").paused

    browser.click_through(f"{row} button.resume-schedule")
    assert browser.attr("#notice", "data-notice") == "schedule-resumed"
    assert browser.attr(row, "data-paused") == "false"
    assert not store.get_schedule("hourly-sync").paused

    browser.click_through(f"{row} button.trigger-schedule")
    assert browser.attr("#notice", "data-notice") == "schedule-triggered"
    (job,) = store.list(type="crm.sync")
    assert job.state is State.QUEUED
    browser.click_through("#notice a.job-link")
    assert browser.path == f"/jobs/{job.id}"
