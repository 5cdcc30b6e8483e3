"""The dashboard's Workers page (issue 28): every registered worker, idle ones too.

Server-rendered over HTTP (Starlette's TestClient) against a real database:
the registry rows the workers write, the leader shown as its worker, a gone
worker marked, and the nav link on every page.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
from starlette.testclient import TestClient

from jobrun.job.model import NewJob
from jobrun.job.workers import WorkerInfo
from jobrun.postgres.leader import LeaseLocker, leader_lock_name
from jobrun.postgres.lock import AdvisoryLocker
from jobrun.postgres.store import Store
from tests.web.test_app_support import Element, app, client, parse

__all__ = ["app", "client"]  # fixtures, imported for pytest

TTL = dt.timedelta(seconds=30)


def info(worker_id: str, types: tuple[str, ...]) -> WorkerInfo:
    return WorkerInfo(
        id=worker_id,
        host="node-1",
        pid=4242,
        version="9.9.9",
        queues=("default", "mail"),
        concurrency=8,
        types=types,
        lease_ttl=TTL,
    )


def page(client: TestClient, path: str) -> Element:
    got = client.get(path)
    assert got.status_code == 200, (path, got.status_code, got.text[:2000])
    return parse(got.text)


def rows(doc: Element) -> dict[str, Element]:
    return {r.attrs["data-worker-id"]: r for r in doc.select("tr", cls="registered-worker")}


def test_the_workers_page_lists_idle_busy_and_gone_workers_with_their_types(
    store: Store, client: TestClient, conn: psycopg.Connection[Any]
) -> None:
    store.register_worker(info("idle-one", ("email.send", "report.build")))
    store.register_worker(info("busy-one", ("t",)))
    store.register_worker(info("gone-one", ()))
    store.enqueue(NewJob(type="t"))
    assert len(store.claim("busy-one", ["default"], 1, TTL)) == 1
    conn.execute(
        "UPDATE jobrun.workers SET last_seen_at = now() - interval '1 minute' WHERE id = 'gone-one'"
    )
    doc = page(client, "/workers")
    assert doc.one("body").attrs["data-page"] == "workers"
    assert "active" in doc.by_id("nav-workers").classes
    found = rows(doc)
    assert sorted(found) == ["busy-one", "gone-one", "idle-one"]
    assert {k: r.attrs["data-status"] for k, r in found.items()} == {
        "idle-one": "idle",
        "busy-one": "busy",
        "gone-one": "gone",
    }
    idle = found["idle-one"]
    assert idle.one("td", cls="types").text == "email.send, report.build"
    assert idle.one("td", cls="queues").text == "default, mail"
    assert idle.one("td", cls="host").text == "node-1"
    assert idle.one("td", cls="pid").text == "4242"
    assert idle.one("td", cls="version").text == "9.9.9"
    assert idle.one("td", cls="concurrency").text == "8"
    assert found["busy-one"].one("td", cls="leased").text == "1"
    assert found["gone-one"].one("td", cls="types").text == "none"
    assert doc.has_id("no-leader-worker")


def test_the_scheduler_leader_is_shown_as_its_worker(store: Store, client: TestClient) -> None:
    store.register_worker(info("leader-one", ("t",)))
    store.register_worker(info("follower", ("t",)))
    locker = LeaseLocker(store, leader_lock_name(store.schema), holder="leader-one")
    try:
        assert locker.try_acquire()
        found = rows(page(client, "/workers"))
        assert found["leader-one"].attrs["data-leader"] == "true"
        assert found["leader-one"].one("span", cls="leader-badge").text == "scheduler leader"
        assert found["follower"].attrs["data-leader"] == "false"
    finally:
        locker.close()


def test_no_registered_worker_says_so_and_every_page_links_the_workers_page(
    client: TestClient,
) -> None:
    doc = page(client, "/workers")
    assert doc.has_id("no-registered-workers")
    for path in ("/", "/jobs", "/schedules"):
        assert page(client, path).by_id("nav-workers").attrs["href"].endswith("/workers")


def test_the_overview_names_the_leader_by_its_worker_not_a_backend_pid(
    store: Store, client: TestClient, dsn: str
) -> None:
    store.register_worker(info("leader-one", ("t",)))
    locker = AdvisoryLocker(dsn, leader_lock_name(store.schema))
    try:
        assert locker.try_acquire()
        store.mark_leader("leader-one", locker.backend_pid)
        for path in ("/", "/live/overview"):
            leader = page(client, path).by_id("leader")
            assert leader.attrs["data-worker-id"] == "leader-one"
            assert "data-pid" not in leader.attrs
            assert leader.one("a", id="leader-worker").attrs["href"].endswith("/workers")
    finally:
        locker.close()
