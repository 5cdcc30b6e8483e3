"""The dashboard is safe and usable in a real Chromium: nothing injected runs, narrow screens work.

* Markup in everything a job carries (payload, idempotency key, error text,
  result, lease owner, and, written behind the Store's back, its type, its
  queue and a schedule's type) and in every query parameter the pages echo
  is shown as text on every page and never runs. The pages are served with
  their Content-Security-Policy stripped, so that escaping alone is what is
  proven; a control page with the same markup unescaped shows that the
  probe would have caught it.
* At 420x800 no page scrolls sideways; at 1280x800 neither.
* ``jobrun dashboard --read-only``, a real process, shows no action.
"""

from __future__ import annotations

import base64
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.job.model import Backoff, Job, NewJob, ScheduleSpec, State
from jobrun.postgres.store import Store
from jobrun.web import create_app
from jobrun.worker import JobContext, PermanentFailure, Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for
from tests.web.browser import (
    NARROW,
    WIDE,
    Browser,
    browser,
    chromium,
    dashboard_process,
    http_get,
    screenshots_dir,
    serve,
)

__all__ = ["browser", "chromium", "screenshots_dir"]  # fixtures, imported for pytest

NO_WAIT = Backoff(kind="constant", base=0.0, jitter=0.0)
REFRESH_SECONDS = 1

SCRIPT = "<script>window.__pwned=1</script>"
ATTRIBUTE = '"><img src=x onerror="window.__pwned=1">'
SINGLE = "'><svg onload=window.__pwned=1>"
EVIL = SCRIPT + ATTRIBUTE + SINGLE
"""Breaks out of text, of a double-quoted attribute and of a single-quoted one."""


@pytest.fixture
def registry() -> Registry:
    return Registry()


@pytest.fixture
def start_worker(store: Store, registry: Registry) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(**config: Any) -> Worker:
        worker = Worker(store, registry, WorkerConfig(**{**FAST, **config}))
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for w in workers:
        w.stop(timeout=5)


def enqueue(store: Store, type: str, **fields: Any) -> Job:
    fields.setdefault("backoff", NO_WAIT)
    return store.enqueue(NewJob(type=type, **fields))


# -- nothing injected runs -----------------------------------------------------------


def _without_csp(app: Any) -> Any:
    """The app with its Content-Security-Policy header removed, and a control page.

    ``/__control`` answers EVIL unescaped: what a page that forgot to escape
    would send.
    """

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/__control":
            body = f"<!doctype html><title>control</title><p>{EVIL}</p>".encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/html; charset=utf-8")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return

        async def strip(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() != b"content-security-policy"
                ]
            await send(message)

        await app(scope, receive, strip)

    return wrapped


INJECTED = """return {
  pwned: window.__pwned === undefined ? null : window.__pwned,
  images: document.querySelectorAll('img[src="x"], img[onerror]').length,
  handlers: document.querySelectorAll('[onerror], [onload], [onclick]').length,
  svgs: document.querySelectorAll('svg[onload]').length,
  inline: Array.from(document.scripts).filter(s => !s.src).length,
  text: document.body ? document.body.innerText : '',
}"""


def nothing_ran(page: Browser, where: str) -> str:
    """Assert no injected markup ran or became an element; the page's text."""
    assert page.alert() is None, f"an alert is open on {where}"
    found = page.js(INJECTED)
    assert found["pwned"] is None, f"injected script ran on {where}"
    assert found["images"] == 0, f"an injected <img> on {where}"
    assert found["handlers"] == 0, f"an element with an inline event handler on {where}"
    assert found["svgs"] == 0, f"an injected <svg onload> on {where}"
    assert found["inline"] == 0, f"an inline <script> on {where}"
    return str(found["text"])


def wait_refreshed(page: Browser) -> None:
    """Wait for every live region of the page to have been refreshed once."""
    regions = page.count("[data-refresh-url]")
    if regions:
        page.wait_until(
            lambda: page.count("[data-refresh-url]:not([data-refresh-count='0'])") == regions,
            "the live regions' first refresh",
        )


def test_markup_in_jobs_errors_names_and_parameters_never_runs_on_any_page(
    browser: Browser,
    store: Store,
    registry: Registry,
    start_worker: Callable[..., Worker],
    conn: psycopg.Connection[Any],
) -> None:
    release = threading.Event()

    def fail(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure(f"upstream said {EVIL}")

    registry.register("xss.fail", fail)
    registry.register("xss.result", lambda ctx, job: {"echo": EVIL})
    registry.register("xss.block", lambda ctx, job: release.wait(60) and None)

    dead = enqueue(
        store,
        "xss.fail",
        queue="xss",
        payload={"note": EVIL, EVIL: [EVIL, {"nested": EVIL}]},
        idempotency_key=f"key-{EVIL}",
        max_attempts=1,
    )
    done = enqueue(store, "xss.result", queue="xss", payload={"text": EVIL})
    running = enqueue(store, "xss.block", queue="xss")
    renamed = enqueue(store, "xss.renamed", queue="xss-later", payload={"n": 1})
    flow = jobrun.Workflow(EVIL)
    first = flow.add(NewJob(type="xss.wf", queue="xss-later"), name=EVIL)
    flow.add(NewJob(type="xss.wf", queue="xss-later"), after=[first], name=f"child {EVIL}")
    workflow = jobrun.Client(store).enqueue_workflow(flow)
    worker = start_worker(queues={"xss": None}, owner=f"worker-{EVIL}")
    try:
        wait_for(lambda: store.get(dead.id).state is State.DEAD)
        wait_for(lambda: store.get(done.id).state is State.SUCCEEDED)
        wait_for(lambda: store.get(running.id).state is State.LEASED)
        # names the Store would refuse, as an older or foreign writer might leave them
        conn.execute(
            "UPDATE jobrun.jobs SET type = %s, queue = %s WHERE id = %s",
            [EVIL, f"q{EVIL}", renamed.id],
        )
        conn.execute("INSERT INTO jobrun.queue_pauses (queue) VALUES (%s)", [f"p{EVIL}"])
        store.create_schedule(
            ScheduleSpec(
                id="xss-schedule", cron="0 * * * *", type="xss.fail", payload={"text": EVIL}
            )
        )
        conn.execute("UPDATE jobrun.schedules SET type = %s, queue = %s", [EVIL, f"s{EVIL}"])

        app = create_app(store, refresh_seconds=REFRESH_SECONDS)
        with serve(_without_csp(app)) as base:
            # the probe works: the same markup unescaped runs here
            browser.open(base + "/__control")
            assert browser.js("return window.__pwned") == 1
            assert browser.count('img[src="x"]') == 1

            quoted = urllib.parse.quote(EVIL, safe="")
            pages = {
                "overview": "/",
                "jobs": "/jobs",
                "jobs-filtered": f"/jobs?queue={quoted}&type={quoted}&key={quoted}",
                "jobs-bad-id": f"/jobs?id={quoted}",
                "jobs-bad-state": f"/jobs?state={quoted}",
                "jobs-bad-before": f"/jobs?before={quoted}",
                "job-dead": f"/jobs/{dead.id}",
                "job-result": f"/jobs/{done.id}",
                "job-running": f"/jobs/{running.id}",
                "job-renamed": f"/jobs/{renamed.id}",
                "job-not-an-id": f"/jobs/{quoted}",
                "schedules": "/schedules",
                "workflows": "/workflows",
                "workflows-bad-state": f"/workflows?state={quoted}",
                "workflow": f"/workflows/{workflow.id}",
                "workflow-job": f"/jobs/{workflow[EVIL].id}",
                "workflow-not-an-id": f"/workflows/{quoted}",
                "bulk-retry": f"/bulk/retry?state=dead&queue=xss&type={quoted}",
                "bulk-cancel": f"/bulk/cancel?state=queued&queue={quoted}",
                "bulk-unknown": f"/bulk/{quoted}?state=dead",
                "notice": f"/?notice={quoted}&n={quoted}&job={quoted}",
            }
            seen: dict[str, str] = {}
            for name, path in pages.items():
                browser.open(base + path)
                wait_refreshed(browser)  # the live script's innerHTML path too
                seen[name] = nothing_ran(browser, name)
                browser.screenshot(f"xss-{name}")

            # ... and the markup was there, shown as text, not dropped
            assert SCRIPT in seen["job-dead"] and ATTRIBUTE in seen["job-dead"]
            assert SCRIPT in seen["workflow"] and SINGLE in seen["workflows"]
            assert SINGLE in seen["job-dead"]
            assert f"upstream said {EVIL}" in seen["job-dead"]  # the error text
            assert f"key-{EVIL}" in seen["job-dead"]  # the idempotency key
            assert SCRIPT in seen["job-result"]  # payload and result
            assert f"worker-{EVIL}" in seen["job-running"]  # the lease owner
            assert f"worker-{EVIL}" in seen["overview"]  # live workers
            assert f"q{EVIL}" in seen["overview"] and f"p{EVIL}" in seen["overview"]
            assert EVIL in seen["job-renamed"] and f"q{EVIL}" in seen["job-renamed"]
            assert EVIL in seen["jobs"]  # the type column
            assert EVIL in seen["schedules"]
            assert SCRIPT in seen["jobs-bad-state"]  # reflected in the 400 message, as text
            # the filters keep what was typed, as the fields' values
            browser.open(base + pages["jobs-filtered"])
            for field in ("queue", "type", "key"):
                assert browser.value(f"#filter-{field}") == EVIL
            nothing_ran(browser, "jobs-filtered, again")
    finally:
        release.set()
        worker.stop(timeout=10)


# -- usable on a narrow screen -------------------------------------------------------


def test_every_page_fits_a_narrow_window_and_a_wide_one(
    browser: Browser, store: Store, registry: Registry, start_worker: Callable[..., Worker]
) -> None:
    release = threading.Event()
    long_word = "https://example.com/exports/" + "a1b2c3d4" * 40
    registry.register("report.build", lambda ctx, job: release.wait(60) and None)

    def fail(ctx: JobContext, job: Job) -> None:
        raise PermanentFailure(f"could not fetch {long_word}: HTTP 404")

    registry.register("report.fail", fail)
    for n in range(5):
        enqueue(
            store,
            "report.render.monthly.with-a-rather-long-type-name",
            queue="reports-for-the-finance-department",
            payload={"n": n},
            idempotency_key=f"report-{n}-" + "k" * 120,
        )
    dead = enqueue(
        store, "report.fail", queue="reports", payload={"url": long_word}, max_attempts=1
    )
    enqueue(store, "report.build", queue="reports")
    store.create_schedule(
        ScheduleSpec(id="nightly-finance-report", cron="30 2 * * 1-5", type="report.build")
    )
    flow = jobrun.Workflow("the-monthly-finance-reports-of-every-department-" + "x" * 80)
    months = [
        flow.add(
            NewJob(type="report.render", queue="reports-later"),
            name=f"render-the-monthly-report-for-the-finance-department-{n}",
        )
        for n in range(12)
    ]
    flow.add(NewJob(type="report.merge", queue="reports-later"), after=months, name="m" * 200)
    workflow = jobrun.Client(store).enqueue_workflow(flow)
    worker = start_worker(queues={"reports": None}, owner="worker-" + "x" * 60)
    try:
        wait_for(lambda: store.get(dead.id).state is State.DEAD)
        app = create_app(store, refresh_seconds=REFRESH_SECONDS)
        with serve(app) as base:
            pages = {
                "overview": "/",
                "jobs": "/jobs",
                "jobs-dead": "/jobs?state=dead",
                "job": f"/jobs/{dead.id}",
                "schedules": "/schedules",
                "workflows": "/workflows",
                "workflow": f"/workflows/{workflow.id}",
                "bulk": "/bulk/retry?state=dead",
                "not-found": "/jobs/00000000-0000-7000-8000-000000000000",
            }
            for size, label in ((NARROW, "narrow"), (WIDE, "wide")):
                browser.viewport(*size)
                for name, path in pages.items():
                    browser.open(base + path)
                    wide, inner = browser.horizontal_overflow()
                    assert inner == size[0]
                    shot = browser.screenshot(f"{label}-{name}")
                    assert wide <= inner, (
                        f"{name} at {size[0]}px scrolls sideways: the body is {wide}px wide "
                        f"(screenshot {shot}); sticking out: {browser.sticking_out()}"
                    )
                    # the navigation stays on screen and usable
                    for link in ("#nav-overview", "#nav-jobs", "#nav-schedules"):
                        box = browser.js(
                            "const r = document.querySelector(arguments[0])"
                            ".getBoundingClientRect(); return [r.left, r.right, r.width]",
                            link,
                        )
                        assert box[2] > 0 and box[0] >= 0 and box[1] <= inner, (name, link, box)
            # and a narrow window still drives the pages: filter, then open a job
            browser.viewport(*NARROW)
            browser.open(base + "/jobs")
            browser.select("#filter-state", "dead")
            browser.click_through("#filter-apply")
            assert [r["job-id"] for r in browser.rows("tr.job-row", "job-id")] == [str(dead.id)]
            browser.click_through(f'tr.job-row[data-job-id="{dead.id}"] a.job-link')
            assert browser.attr("#job", "data-state") == "dead"
            assert browser.has("#retry-job")
    finally:
        release.set()
        worker.stop(timeout=10)


# -- jobrun dashboard, a real process -----------------------------------------------

ACTIONS = (
    "#retry-job, #cancel-job, #bulk-retry, #bulk-cancel, button.pause-queue,"
    " button.resume-queue, button.pause-schedule, button.resume-schedule,"
    " button.trigger-schedule"
)


def test_jobrun_dashboard_read_only_shows_no_action_in_the_browser(
    browser: Browser, store: Store, dsn: str, tmp_path: Path
) -> None:
    queued = enqueue(store, "mail.send", queue="emails")
    cancelled = store.cancel(enqueue(store, "mail.send", queue="emails").id)
    store.create_schedule(ScheduleSpec(id="daily", cron="0 6 * * *", type="mail.send"))
    with dashboard_process(dsn, tmp_path / "dashboard.log", "--read-only") as served:
        browser.open(served.base + "/")
        assert browser.attr("body", "data-read-only") == "true"
        assert browser.has("#read-only-badge")
        assert browser.attr('tr.queue-row[data-queue="emails"]', "data-ready") == "1"
        for path in (
            "/",
            "/jobs?state=queued",
            "/jobs?state=cancelled",
            f"/jobs/{queued.id}",
            f"/jobs/{cancelled.id}",
            "/schedules",
        ):
            browser.open(served.base + path)
            assert browser.count("form[method=post]") == 0, path
            assert not browser.has(ACTIONS), path
            browser.screenshot("read-only-" + path.strip("/").split("/")[0].split("?")[0])
        # the database is named, never with its password
        target = browser.text("#db-target")
        assert target and "@" in target
        password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
        if password:  # the runtime role's DSN has one
            assert str(password) not in browser.js("return document.documentElement.outerHTML")
        served.stop()


def test_jobrun_dashboard_with_a_token_asks_the_browser_for_it(
    browser: Browser, store: Store, dsn: str, tmp_path: Path
) -> None:
    token = "s3cret-" + "t" * 24
    enqueue(store, "mail.send", queue="emails")
    with dashboard_process(
        dsn, tmp_path / "dashboard.log", env={"JOBRUN_DASHBOARD_TOKEN": token}
    ) as served:
        browser.open(served.base + "/")
        assert browser.attr("body", "data-page") is None  # not a page of the dashboard
        assert http_get(served.base + "/")[0] == 401  # what the browser was answered
        # what the browser sends once the person typed the token in its prompt
        credentials = base64.b64encode(f"operator:{token}".encode()).decode()
        browser.driver.execute_cdp_cmd("Network.enable", {})
        browser.driver.execute_cdp_cmd(
            "Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Basic {credentials}"}}
        )
        try:
            browser.open(served.base + "/")
            assert browser.attr("body", "data-page") == "overview"
            marker = browser.mark()
            enqueue(store, "mail.send", queue="emails")
            browser.wait_until(
                lambda: browser.attr('tr.queue-row[data-queue="emails"]', "data-ready") == "2",
                "the live refresh, authenticated too",
            )
            assert browser.same_document(marker)
            # an action works too (CSRF token and credential together)
            browser.click_through('tr.queue-row[data-queue="emails"] button.pause-queue')
            assert browser.attr("#notice", "data-notice") == "queue-paused"
            assert store.paused_queues() == ["emails"]
        finally:
            browser.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {}})
            browser.driver.execute_cdp_cmd("Network.disable", {})
        served.stop()
