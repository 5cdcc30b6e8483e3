"""examples/fastapi_app.py, served by FastAPI's TestClient against a real PostgreSQL.

The app runs its lifespan (AsyncClient.connect and its own pool) on the
TestClient's event loop; a real threaded Worker runs the example's registry
where a test needs the job done.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from examples import fastapi_app
from jobrun import Worker, WorkerConfig
from jobrun.postgres.store import Store
from tests.runtime.conftest import FAST


@pytest.fixture
def orders(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """The example's orders table, made by the migrator; the connection reads it."""
    conn.execute(fastapi_app.ORDERS_DDL)
    # In runtime-role mode the app runs as a DML-only role.
    conn.execute("GRANT SELECT, INSERT ON orders TO PUBLIC")
    return conn


@pytest.fixture
def at_response_start() -> list[tuple[int, int]]:
    """(orders, jobs) as another session saw them when each response started to leave."""
    return []


@pytest.fixture
def http(
    dsn: str, orders: psycopg.Connection[Any], at_response_start: list[tuple[int, int]]
) -> Iterator[TestClient]:
    app = fastapi_app.create_app(dsn)

    async def observed(scope: Any, receive: Any, send: Any) -> None:
        """The app, with the database looked at as each response starts to be sent
        (TestClient itself only answers once the whole request is over)."""
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_after_looking(message: Any) -> None:
            if message["type"] == "http.response.start":
                at_response_start.append(rows(orders))
            await send(message)

        await app(scope, receive, send_after_looking)

    with TestClient(observed) as client:
        yield client


@pytest.fixture
def worker(store: Store) -> Iterator[Worker]:
    w = Worker(store, fastapi_app.registry, WorkerConfig(**FAST, queues={"orders": None}))
    w.start()
    try:
        yield w
    finally:
        w.stop(timeout=5)


def rows(conn: psycopg.Connection[Any]) -> tuple[int, int]:
    """(orders, jobs) in the database, read on a connection of the test's own."""
    found = conn.execute(
        "SELECT (SELECT count(*) FROM orders), (SELECT count(*) FROM jobrun.jobs)"
    ).fetchone()
    assert found is not None
    return found[0], found[1]


def test_an_order_and_its_job_are_committed_before_the_response_is_sent(
    http: TestClient, orders: psycopg.Connection[Any], at_response_start: list[tuple[int, int]]
) -> None:
    response = http.post("/orders", json={"item": "book", "quantity": 2})
    assert response.status_code == 201, response.text
    body = response.json()
    # Another session saw both rows as the response began: the COMMIT came first.
    assert at_response_start == [(1, 1)]
    job = orders.execute(
        "SELECT type, queue, payload, state::text FROM jobrun.jobs WHERE id = %s",
        [uuid.UUID(body["job_id"])],
    ).fetchone()
    assert job == (
        "orders.confirm",
        "orders",
        {"order_id": body["order_id"], "item": "book"},
        "queued",
    )


def test_a_refused_order_rolls_back_both_the_order_and_its_job(
    http: TestClient, orders: psycopg.Connection[Any]
) -> None:
    response = http.post("/orders", json={"item": "crate", "quantity": 1000})
    assert response.status_code == 422
    assert rows(orders) == (0, 0)
    assert http.post("/orders", json={"item": "", "quantity": 1}).status_code == 422
    assert http.post("/orders", json={"item": "x", "quantity": 1}).status_code == 201
    assert rows(orders) == (1, 1)


def test_the_job_endpoint_waits_for_the_result_the_worker_produced(
    http: TestClient, worker: Worker
) -> None:
    created = http.post("/orders", json={"item": "lamp", "quantity": 1}).json()
    response = http.get(f"/jobs/{created['job_id']}", params={"wait": 30})
    assert response.status_code == 200
    job = response.json()
    assert job["state"] == "succeeded"
    assert job["result"] == {"confirmed": created["order_id"], "item": "lamp"}
    assert job["finished_at"] is not None
    again = http.get(f"/jobs/{created['job_id']}").json()
    assert again == job


def test_the_job_endpoint_answers_with_the_job_as_it_stands_when_the_wait_runs_out(
    http: TestClient,
) -> None:
    created = http.post("/orders", json={"item": "lamp", "quantity": 1}).json()
    response = http.get(f"/jobs/{created['job_id']}", params={"wait": 0.3})
    assert response.status_code == 200
    assert response.json()["state"] == "queued"


def test_an_unknown_job_is_404_and_a_malformed_id_or_wait_is_422(http: TestClient) -> None:
    assert http.get(f"/jobs/{uuid.uuid4()}").status_code == 404
    assert http.get(f"/jobs/{uuid.uuid4()}", params={"wait": 1}).status_code == 404
    assert http.get("/jobs/not-a-uuid").status_code == 422
    assert http.get(f"/jobs/{uuid.uuid4()}", params={"wait": 60}).status_code == 422
