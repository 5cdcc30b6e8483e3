"""Wrong uses of typed tasks: mypy --strict must report each line marked ``# E: code``
with that error code, and nothing else (tests/typing/test_mypy.py).

Never run: only type-checked.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

import jobrun

registry = jobrun.Registry()


@registry.task("email.send", queue="emails")
def send_email(to: str, subject: str, *, urgent: bool = False) -> dict[str, str]:
    return {"sent_to": to}


@registry.task("video.encode")
def encode(ctx: jobrun.JobContext, video_id: int) -> None:
    return None


@registry.task("page.fetch")
async def fetch(url: str) -> int:
    return 0


def wrong(
    client: jobrun.Client,
    conn: psycopg.Connection[Any],
    ctx: jobrun.JobContext,
    aclient: jobrun.AsyncClient,
) -> None:
    send_email.enqueue(client, 1, "hi")  # E: arg-type
    send_email.enqueue(client, "ada@example.com")  # E: call-arg
    send_email.enqueue(client, "ada@example.com", "hi", "extra")  # E: call-arg arg-type
    send_email.enqueue(client, "ada@example.com", "hi", cc="grace@example.com")  # E: call-arg
    send_email.enqueue(client, "ada@example.com", "hi", urgent="yes")  # E: arg-type
    send_email.enqueue(client, "ada@example.com", "hi", conn=conn)  # E: call-arg
    send_email.enqueue(client, "ada@example.com", "hi", True)  # E: call-arg
    send_email.enqueue("ada@example.com", "hi")  # E: arg-type call-arg
    send_email.enqueue(aclient, "ada@example.com", "hi")  # E: arg-type
    send_email.new_job(to=3, subject="hi")  # E: arg-type
    send_email.options(delay=5)  # E: arg-type
    send_email.options(dely=dt.timedelta(seconds=5))  # E: call-arg
    send_email.options(priority="high")  # E: arg-type
    send_email("ada@example.com")  # E: call-arg
    sent: int = send_email.enqueue(client, "ada@example.com", "hi")  # noqa: F841  # E: assignment
    result: str = send_email("ada@example.com", "hi")  # noqa: F841  # E: assignment
    encode.enqueue(client, "seven")  # E: arg-type
    encode.enqueue(client, ctx, 7)  # E: call-arg arg-type
    encode(7)  # E: call-arg arg-type
    fetch.enqueue(client, b"https://example.com")  # E: arg-type
    count: int = fetch("https://example.com")  # noqa: F841  # E: assignment


async def wrong_async(client: jobrun.Client, aclient: jobrun.AsyncClient) -> None:
    await send_email.aenqueue(client, "ada@example.com", "hi")  # E: arg-type
    await send_email.aenqueue(aclient, "ada@example.com", subject=1)  # E: arg-type
    send_email.aenqueue(aclient, "ada@example.com", "hi")  # E: unused-coroutine


def wrong_steps(ctx: jobrun.JobContext) -> None:
    def rows(source: str) -> list[str]:
        return [source]

    ctx.step("download", rows, 3)  # E: arg-type
    ctx.step("download", rows)  # E: call-arg
    total: int = ctx.step("download", rows, "spring")  # noqa: F841  # E: assignment
