"""The workers registry and "why isn't it running?" in a real Chromium (issue 28, items 6 and 9).

The server-rendered pages are tested in tests/web/test_app_workers.py and
test_app_why.py; here a person's view: a real worker registers and shows up
on the Workers page, idle, with the types it runs, reached from the nav;
a queued job's page names what holds it back and follows the database as
it changes (the page refreshes itself).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobrun.job.model import NewJob
from jobrun.postgres.store import Store
from jobrun.web import create_app
from jobrun.worker import Registry, Worker, WorkerConfig
from tests.runtime.conftest import FAST
from tests.support.waiting import wait_for
from tests.web.browser import Browser, browser, chromium, screenshots_dir, serve

__all__ = ["browser", "chromium", "screenshots_dir"]  # fixtures, imported for pytest

REFRESH_SECONDS = 1


@pytest.fixture
def dashboard(store: Store) -> Iterator[str]:
    app = create_app(store, refresh_seconds=REFRESH_SECONDS)
    with serve(app) as base:
        yield base


@pytest.fixture
def start_worker(store: Store) -> Iterator[Callable[..., Worker]]:
    workers: list[Worker] = []

    def start(registry: Registry, **config: Any) -> Worker:
        worker = Worker(store, registry, WorkerConfig(**{**FAST, **config}))
        workers.append(worker)
        worker.start()
        return worker

    yield start
    for w in workers:
        w.stop(timeout=5)


def test_an_idle_worker_is_listed_on_the_workers_page_with_the_types_it_runs(
    browser: Browser, dashboard: str, start_worker: Callable[..., Worker]
) -> None:
    registry = Registry()
    registry.register("emails.send", lambda ctx: None)
    registry.register("reports.build", lambda ctx: None)
    worker = start_worker(registry, queues={"emails": None, "reports": None})
    browser.open(dashboard + "/")
    browser.click("#nav-workers")
    row = f'tr.registered-worker[data-worker-id="{worker.owner}"]'
    browser.wait_text(row + " td.types", "emails.send")
    assert browser.attr(row, "data-status") == "idle"
    assert "reports.build" in browser.find(row + " td.types").text
    assert "emails" in browser.find(row + " td.queues").text
    assert browser.console_errors() == []


def test_a_queued_job_page_says_what_holds_it_back_as_that_changes(
    browser: Browser, dashboard: str, store: Store
) -> None:
    job = store.enqueue(NewJob(type="emails.send", queue="emails"))
    store.pause_queue("emails")
    browser.open(dashboard + f"/jobs/{job.id}")
    holds = '#job-why li[data-hold="paused"]'
    browser.wait_text(holds, "is paused")
    assert browser.count('#job-why li[data-hold="no_worker"]') == 1
    store.resume_queue("emails")
    wait_for(lambda: browser.count(holds) == 0, timeout=20)
    assert browser.count('#job-why li[data-hold="no_worker"]') == 1
    assert browser.console_errors() == []
