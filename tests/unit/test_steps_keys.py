"""The domain of durable steps: step names, idempotency keys that never change,
and the steps of a context made by hand (a unit test of a handler), in memory."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from jobrun.job.errors import ValidationError
from jobrun.job.model import Job
from jobrun.job.steps import MAX_STEP_NAME_CHARS, idempotency_key, step_name
from jobrun.worker.context import JobContext
from tests.support.jobs import leased_job

JOB_ID = uuid.UUID("01a23d32-b08e-7000-9c77-184bfe93faeb")


def _job(**fields: object) -> Job:
    return leased_job(**{"id": JOB_ID, "type": "order.charge", **fields})


def test_the_keys_are_pinned_forever() -> None:
    # A key that changed between versions would charge a customer twice: these
    # values must come out of every future jobrun.
    assert idempotency_key(_job()) == "e9156651-b7a6-5350-b712-4e908ab0e25e"
    assert idempotency_key(_job(), "pay") == "7269ccd1-b071-52a7-9dd8-310a125b5b3d"


def test_the_keys_follow_the_effect_key_not_the_attempt_or_the_claim() -> None:
    first = _job()
    later = _job(attempts=3, lease_owner="another", lease_token=uuid.uuid4())
    assert idempotency_key(first) == idempotency_key(later)
    assert idempotency_key(first, "a") == idempotency_key(later, "a")
    assert idempotency_key(first, "a") != idempotency_key(first, "b") != idempotency_key(first)
    keyed = _job(idempotency_key="order-7")
    assert idempotency_key(keyed) == idempotency_key(
        _job(id=uuid.uuid4(), idempotency_key="order-7")
    )
    assert idempotency_key(keyed) != idempotency_key(
        _job(type="order.refund", idempotency_key="order-7")
    )


@pytest.mark.parametrize(
    "bad", ["", "x" * (MAX_STEP_NAME_CHARS + 1), "a\x00", "\ud800", 3, None, b"a"]
)
def test_a_step_name_is_a_short_non_empty_str(bad: object) -> None:
    with pytest.raises(ValidationError, match="step"):
        step_name(bad)


def test_a_step_name_may_hold_any_other_text() -> None:
    assert step_name("page 3 / ünïcode: ✓") == "page 3 / ünïcode: ✓"
    assert step_name("x" * MAX_STEP_NAME_CHARS) == "x" * MAX_STEP_NAME_CHARS


def test_a_context_made_by_hand_keeps_its_steps_in_memory() -> None:
    ctx = JobContext(_job())
    calls: list[int] = []

    def pair() -> tuple[int, int]:
        calls.append(1)
        return (1, 2)

    value: object = ctx.step("a", pair)
    assert value == [1, 2]  # as JSON gives it back (typed as fn's: keep step values JSON)
    with pytest.raises(ValidationError, match="already used"):
        ctx.step("a", lambda: 0)
    assert ctx.idempotency_key == idempotency_key(ctx.job)
    assert ctx.step_key("a") == idempotency_key(ctx.job, "a")
    with pytest.raises(ValidationError, match="in a worker"):
        ctx.fencing_token()
    with pytest.raises(ValidationError, match="in a worker"):
        ctx.transaction_step("tx", lambda conn: None)

    async def fetch() -> dict[str, int]:
        return {"n": 1}

    assert asyncio.run(ctx.step_async("b", fetch)) == {"n": 1}
    assert calls == [1]


def test_a_plain_step_that_returns_an_awaitable_is_refused() -> None:
    ctx = JobContext(_job())

    async def coroutine() -> int:
        return 1

    with pytest.raises(ValidationError, match="step_async"):
        _ = ctx.step("a", coroutine)


def test_a_plain_step_called_from_a_coroutine_is_refused_before_it_blocks_the_loop() -> None:
    ctx = JobContext(_job())

    async def handler() -> None:
        with pytest.raises(ValidationError, match="step_async"):
            ctx.step("a", int)
        with pytest.raises(ValidationError, match="transaction_step_async"):
            ctx.transaction_step("b", lambda conn: None)
        with pytest.raises(ValidationError, match="fencing_token_async"):
            ctx.fencing_token()
        assert await ctx.step_async("a", asyncio.sleep, 0) is None  # the name was not taken

    asyncio.run(handler())
