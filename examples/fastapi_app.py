"""A FastAPI app on jobrun's AsyncClient: jobs enqueued in the request's transaction.

``POST /orders`` inserts an order and enqueues its confirmation job in one
transaction: the request's, opened by a dependency and committed when the
endpoint returns, before the response is sent. An order refused after both
writes (a quantity over ``MAX_QUANTITY``) raises, the transaction rolls back,
and neither the order nor its job exist: no worker ever confirms an order
that is not there. ``GET /jobs/{id}?wait=5`` answers with the job, waiting up
to 5 seconds for it to finish (woken by a notification, not by polling).

Run it (PostgreSQL 14+, the jobrun schema migrated)::

    export DATABASE_URL=postgresql://localhost/app
    jobrun migrate
    python -m examples.fastapi_app            # creates the example's orders table
    uvicorn examples.fastapi_app:app
    jobrun worker --app examples.fastapi_app:registry --queues orders

    curl -X POST localhost:8000/orders -H 'content-type: application/json' \\
         -d '{"item": "book", "quantity": 2}'
    curl 'localhost:8000/jobs/<job_id>?wait=5'

The request's transaction is a dependency with ``yield`` and
``scope="function"`` (FastAPI 0.121+): its exit, the COMMIT, runs before the
response leaves, so a client that reads the job id from the response finds
the job. Tested in tests/aio/test_fastapi_example.py.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import psycopg
from fastapi import APIRouter, Depends, FastAPI, HTTPException, Query, Request
from psycopg_pool import AsyncConnectionPool
from pydantic import BaseModel, Field

import jobrun

MAX_QUANTITY = 100

ORDERS_DDL = """
CREATE TABLE IF NOT EXISTS orders (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    item     text NOT NULL,
    quantity int NOT NULL
)
"""

# -- the worker's side: ``jobrun worker --app examples.fastapi_app:registry`` --------

registry = jobrun.Registry()


@registry.handler("orders.confirm")
def confirm_order(ctx: jobrun.JobContext, job: jobrun.Job) -> dict[str, Any]:
    """Confirm an order; the return value is the job's result (``GET /jobs/{id}``)."""
    return {"confirmed": job.payload["order_id"], "item": job.payload["item"]}


# -- the web side ----------------------------------------------------------------------


class Order(BaseModel):
    item: str = Field(min_length=1, max_length=200)
    quantity: int = Field(gt=0)


def job_view(job: jobrun.Job) -> dict[str, Any]:
    return {
        "id": str(job.id),
        "type": job.type,
        "state": str(job.state),
        "attempts": job.attempts,
        "result": job.result,
        "last_error": job.last_error,
        "finished_at": None if job.finished_at is None else job.finished_at.isoformat(),
    }


async def transaction(request: Request) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    """The request's transaction: committed when the endpoint returns, rolled back
    when it raises."""
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = request.app.state.pool
    async with pool.connection() as conn, conn.transaction():
        yield conn


def jobs_client(request: Request) -> jobrun.AsyncClient:
    client: jobrun.AsyncClient = request.app.state.jobs
    return client


# scope="function": the COMMIT runs when the endpoint returns, before the response.
Transaction = Annotated[psycopg.AsyncConnection[Any], Depends(transaction, scope="function")]
Jobs = Annotated[jobrun.AsyncClient, Depends(jobs_client)]

router = APIRouter()


@router.post("/orders", status_code=201)
async def create_order(order: Order, conn: Transaction, jobs: Jobs) -> dict[str, Any]:
    cur = await conn.execute(
        "INSERT INTO orders (item, quantity) VALUES (%s, %s) RETURNING id",
        (order.item, order.quantity),
    )
    row = await cur.fetchone()
    assert row is not None
    order_id: int = row[0]
    job = await jobs.enqueue(
        "orders.confirm",
        {"order_id": order_id, "item": order.item},
        queue="orders",
        idempotency_key=f"order-{order_id}",
        conn=conn,  # the request's transaction: the job exists iff the order does
    )
    if order.quantity > MAX_QUANTITY:
        # Refused after both writes: raising rolls both back.
        raise HTTPException(422, f"at most {MAX_QUANTITY} per order")
    return {"order_id": order_id, "job_id": str(job.id)}


@router.get("/jobs/{job_id}")
async def get_job(
    job_id: uuid.UUID,
    jobs: Jobs,
    wait: Annotated[float, Query(ge=0, le=30)] = 0,
) -> dict[str, Any]:
    """The job; with ``wait``, once it has finished or after ``wait`` seconds."""
    try:
        job = await jobs.wait(job_id, timeout=wait) if wait else await jobs.get(job_id)
    except jobrun.WaitTimeout as exc:
        assert isinstance(exc.job, jobrun.Job)
        job = exc.job  # still running: the job as it stands
    except jobrun.NotFound:
        raise HTTPException(404, "no such job") from None
    return job_view(job)


def create_app(database_url: str | None = None) -> FastAPI:
    """The app; ``database_url`` defaults to ``DATABASE_URL`` (read at startup)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        url = database_url or jobrun.Settings.from_env().database_url
        if not url:
            raise RuntimeError("set DATABASE_URL to the application's PostgreSQL")
        async with (
            await jobrun.AsyncClient.connect(url) as jobs,
            AsyncConnectionPool(url, min_size=1, max_size=10, open=False) as pool,
        ):
            app.state.jobs = jobs  # jobrun's own pool (autocommit)
            app.state.pool = pool  # the application's
            yield

    app = FastAPI(title="jobrun + FastAPI", lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()


async def create_tables(database_url: str | None = None) -> None:
    """Create the example's ``orders`` table (``python -m examples.fastapi_app``)."""
    url = database_url or jobrun.Settings.from_env().database_url
    if not url:
        raise SystemExit("set DATABASE_URL")
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute(ORDERS_DDL)


if __name__ == "__main__":
    asyncio.run(create_tables())
