"""Correct uses of typed tasks: mypy --strict must accept every line (tests/typing/test_mypy.py).

Never run: only type-checked.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Coroutine
from typing import Any, assert_type

import psycopg

import jobrun
from jobrun.postgres.store import Store

registry = jobrun.Registry()


@registry.task("email.send", queue="emails", max_attempts=5)
def send_email(to: str, subject: str, *, urgent: bool = False) -> dict[str, str]:
    return {"sent_to": to}


@registry.task("video.encode", timeout=dt.timedelta(hours=1))
def encode(ctx: jobrun.JobContext, video_id: int, chunks: int = 1) -> None:
    ctx.progress(0.5)


@registry.task("page.fetch")
async def fetch(url: str, retries: int = 0) -> int:
    return retries


@registry.task("page.fetch_with_context")
async def fetch_with_context(ctx: jobrun.JobContext, url: str) -> str:
    return url


@registry.task("math.double")
def double(n: int, /) -> int:
    return 2 * n


@registry.task("math.double_with_context")
def double_with_context(ctx: jobrun.JobContext, n: int, /) -> int:
    return 2 * n


@registry.handler("plain")  # the handler API stays
def plain(ctx: jobrun.JobContext, job: jobrun.Job) -> None:
    return None


def enqueue_everything(
    client: jobrun.Client, store: Store, conn: psycopg.Connection[Any], ctx: jobrun.JobContext
) -> None:
    assert_type(double, jobrun.Task[[int], int])
    assert_type(double_with_context, jobrun.ContextTask[[int], int])
    assert_type(double.options(priority=1), jobrun.Task[[int], int])
    assert_type(double(2), int)
    assert_type(double_with_context(ctx, 2), int)
    assert_type(send_email.enqueue(client, "ada@example.com", "hi"), jobrun.Job)
    assert_type(send_email.enqueue(store, to="ada@example.com", subject="hi"), jobrun.Job)
    assert_type(send_email.enqueue(client, "ada@example.com", "hi", urgent=True), jobrun.Job)
    assert_type(send_email.new_job("ada@example.com", subject="hi"), jobrun.NewJob)
    assert_type(send_email("ada@example.com", "hi"), dict[str, str])

    configured = send_email.options(
        delay=dt.timedelta(minutes=5),
        idempotency_key="welcome-7",
        concurrency_key="tenant-1",
        priority=-1,
        queue="urgent",
        max_attempts=3,
        conn=conn,
    )
    assert_type(configured.enqueue(client, "ada@example.com", "hi"), jobrun.Job)
    assert_type(
        send_email.options(run_at=dt.datetime.now(dt.UTC)).enqueue(store, "a", "b"), jobrun.Job
    )

    assert_type(encode.enqueue(client, 7), jobrun.Job)
    assert_type(encode.enqueue(client, video_id=7, chunks=3), jobrun.Job)
    assert_type(encode(ctx, 7), None)

    assert_type(fetch.enqueue(client, "https://example.com", retries=2), jobrun.Job)
    coroutine = fetch("https://example.com")  # still the plain (async) function
    _ = assert_type(coroutine, Coroutine[Any, Any, int])
    coroutine.close()
    assert_type(fetch_with_context.enqueue(store, "https://example.com"), jobrun.Job)
    other = fetch_with_context(ctx, "u")
    _ = assert_type(other, Coroutine[Any, Any, str])
    other.close()

    client.enqueue_batch([send_email.new_job("a@b.c", "x"), fetch.new_job("u")])


async def enqueue_async(aclient: jobrun.AsyncClient, aconn: psycopg.AsyncConnection[Any]) -> None:
    assert_type(await send_email.aenqueue(aclient, "ada@example.com", "hi"), jobrun.Job)
    assert_type(await encode.options(priority=1).aenqueue(aclient, 7), jobrun.Job)
    assert_type(await fetch.options(conn=aconn).aenqueue(aclient, "u", retries=1), jobrun.Job)


def durable_steps(ctx: jobrun.JobContext) -> None:
    def rows(source: str, limit: int = 10) -> list[str]:
        return [source] * limit

    assert_type(ctx.step("download", rows, "spring"), list[str])
    assert_type(ctx.step("download-3", rows, "spring", limit=3), list[str])
    assert_type(ctx.fencing_token(), int)
    assert_type(ctx.step_key("download"), str)

    def load(conn: psycopg.Connection[Any]) -> int:
        return conn.execute("SELECT 1").rowcount

    assert_type(ctx.transaction_step("load", load), int)


async def durable_steps_async(ctx: jobrun.JobContext) -> None:
    async def count(source: str) -> int:
        return len(source)

    assert_type(await ctx.step_async("count", count, "spring"), int)
    assert_type(await ctx.fencing_token_async(), int)
    assert_type(await ctx.transaction_step_async("mark", lambda conn: "done"), str)


def read_parents(ctx: jobrun.JobContext) -> None:
    parents = ctx.parent_results()
    assert_type(parents.of(send_email), list[dict[str, str]])
    assert_type(parents.of(fetch), list[int])  # an async task's result, not its coroutine
    assert_type(parents.of(double), list[int])
    assert_type(parents.of("email.send"), list[Any])
    assert_type(parents["email.send"], jobrun.ParentResult)
    flow = jobrun.Workflow("typed")
    first = flow.add(send_email.new_job("a@b.c", "hi"))
    assert_type(flow.add(double.new_job(2), after=[first]), jobrun.NodeRef)
