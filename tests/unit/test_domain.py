"""The domain: pure values, no database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
import threading
import time
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

import jobrun.job as job_pkg
from jobrun.job import validate
from jobrun.job.errors import JobrunError, ValidationError
from jobrun.job.model import Backoff, EffectKey, EventKind, Job, NewJob, State, new_job_id


def test_exponential_backoff_doubles_and_caps() -> None:
    b = Backoff(kind="exponential", base=1.0, factor=2.0, max_delay=10.0, jitter=0.0)
    assert [b.delay(n).total_seconds() for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_linear_and_constant_backoff() -> None:
    assert Backoff(kind="linear", base=3.0, jitter=0.0).delay(4) == dt.timedelta(seconds=12)
    assert Backoff(kind="constant", base=5.0, jitter=0.0).delay(9) == dt.timedelta(seconds=5)


def test_backoff_of_a_huge_attempt_number_does_not_overflow() -> None:
    b = Backoff(base=1.0, factor=10.0, max_delay=60.0, jitter=0.0)
    assert b.delay(100_000) == dt.timedelta(seconds=60)


@given(attempt=st.integers(min_value=1, max_value=10_000), seed=st.integers())
def test_jittered_backoff_stays_within_its_spread(attempt: int, seed: int) -> None:
    b = Backoff(base=2.0, factor=3.0, max_delay=600.0, jitter=0.25)
    plain = dataclasses.replace(b, jitter=0.0).delay(attempt).total_seconds()
    got = b.delay(attempt, random.Random(seed)).total_seconds()
    assert plain * 0.75 - 1e-9 <= got <= plain * 1.25 + 1e-9


def test_backoff_round_trips_through_its_stored_form() -> None:
    b = Backoff(kind="linear", base=1.5, factor=1.0, max_delay=30.0, jitter=0.2)
    assert Backoff.from_json(b.to_json()) == b


def test_backoff_from_json_rejects_unknown_keys() -> None:
    with pytest.raises(ValidationError):
        Backoff.from_json({"kind": "exponential", "surprise": 1})


@pytest.mark.parametrize(
    "fields",
    [
        {"base": -1.0},
        {"factor": 0.5},
        {"jitter": 1.5},
        {"max_delay": 1e12},
        {"base": True},
        {"kind": "fibonacci"},
    ],
)
def test_bad_backoff_is_a_validation_error(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Backoff(**fields)  # type: ignore[arg-type]


def test_job_ids_are_time_ordered_uuid7() -> None:
    ids = [new_job_id() for _ in range(1000)]
    assert all(i.version == 7 for i in ids)
    assert all(i.variant == uuid.RFC_4122 for i in ids)
    assert ids == sorted(ids)
    assert [uuid.UUID(str(i)) for i in ids] == ids  # the same value through its text


def test_job_ids_keep_to_the_clock_however_many_are_made() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_job_id() for _ in range(100_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)
    # 4,096 ids fit in a millisecond: 100,000 never run ahead of the clock
    # by more than 25 ms (the old uuid6 ids ran 100 s ahead).
    assert before <= ids[0].int >> 80
    assert ids[-1].int >> 80 <= after + 25


def test_job_ids_from_many_threads_are_unique_and_increase_in_each() -> None:
    made: list[list[uuid.UUID]] = [[] for _ in range(8)]

    def make(into: list[uuid.UUID]) -> None:
        for _ in range(5_000):
            into.append(new_job_id())

    threads = [threading.Thread(target=make, args=(into,)) for into in made]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({i for into in made for i in into}) == 40_000
    assert all(into == sorted(into) for into in made)


def test_job_ids_move_on_a_millisecond_when_the_counter_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobrun.job import ids as job_ids  # noqa: PLC0415

    frozen = 1_800_000_000_000
    # Restored afterwards: ids made later in this process keep to the real clock.
    monkeypatch.setattr(job_ids, "_last_ms", job_ids._last_ms)
    monkeypatch.setattr(job_ids, "_counter", job_ids._counter)
    monkeypatch.setattr(job_ids, "_time_ns", lambda: frozen * 1_000_000)
    made = [new_job_id() for _ in range(4_097)]
    assert made == sorted(made)
    assert {i.int >> 80 for i in made[:4_096]} == {frozen}
    assert made[4_096].int >> 80 == frozen + 1
    # A clock stepping back never makes a smaller id.
    monkeypatch.setattr(job_ids, "_time_ns", lambda: (frozen - 5_000) * 1_000_000)
    assert new_job_id() > made[-1]


def test_job_ids_made_in_a_block_are_those_made_one_by_one() -> None:
    from jobrun.job import ids as job_ids  # noqa: PLC0415

    before = new_job_id()
    block = job_ids.uuid7_many(5_000)
    after = new_job_id()
    assert len(set(block)) == 5_000
    assert [before, *block, after] == sorted([before, *block, after])
    assert all(i.version == 7 and i.variant == uuid.RFC_4122 for i in block)
    assert [uuid.UUID(str(i)) for i in block] == block
    assert block[-1].int >> 80 <= time.time_ns() // 1_000_000 + 2  # keeps to the clock
    assert job_ids.uuid7_many(0) == []
    # The random bits differ from id to id (one read for the block, 62 bits each).
    assert len({i.int & ((1 << 62) - 1) for i in block}) == 5_000


def test_job_ids_in_a_block_move_on_a_millisecond_when_the_counter_runs_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from jobrun.job import ids as job_ids  # noqa: PLC0415

    frozen = 1_800_000_000_000
    monkeypatch.setattr(job_ids, "_last_ms", job_ids._last_ms)
    monkeypatch.setattr(job_ids, "_counter", job_ids._counter)
    monkeypatch.setattr(job_ids, "_time_ns", lambda: frozen * 1_000_000)
    made = job_ids.uuid7_many(4_097)
    assert made == sorted(made)
    assert {i.int >> 80 for i in made[:4_096]} == {frozen}
    assert made[4_096].int >> 80 == frozen + 1
    assert new_job_id() > made[-1]  # the one-by-one clock carries on after the block


def test_effect_key_is_type_scoped_and_prefers_the_idempotency_key() -> None:
    base = {
        "queue": "q",
        "type": "email.send",
        "payload": {},
        "priority": 0,
        "state": State.LEASED,
        "attempts": 1,
        "max_attempts": 3,
        "backoff": Backoff(),
        "run_at": _T,
        "lease_owner": "w",
        "lease_token": uuid.uuid4(),
        "lease_expires_at": _T,
        "cancel_requested": False,
        "last_error": None,
        "created_at": _T,
        "updated_at": _T,
        "finished_at": None,
    }
    jid = uuid.uuid4()
    assert EffectKey.of(Job(id=jid, idempotency_key=None, **base)) == EffectKey(
        "job:email.send", str(jid)
    )
    assert EffectKey.of(Job(id=jid, idempotency_key="k", **base)) == EffectKey(
        "job:email.send", "k"
    )


_T = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)


def test_terminal_states_and_event_kinds() -> None:
    assert {s for s in State if s.terminal} == {State.SUCCEEDED, State.DEAD, State.CANCELLED}
    assert {k for k in EventKind if k.terminal} == {
        EventKind.SUCCEEDED,
        EventKind.DEAD,
        EventKind.CANCELLED,
    }


def test_every_jobrun_error_derives_from_jobrun_error() -> None:
    for name in job_pkg.__all__:
        obj = getattr(job_pkg, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, JobrunError), name
    assert issubclass(ValidationError, ValueError)


def test_new_job_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        NewJob(type="t").queue = "x"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["a", "emails", "q-1", "x.y_z", "0", "a" * 63])
def test_valid_queue_names(name: str) -> None:
    assert validate.queue_name(name) == name


def test_error_text_is_truncated_and_cleaned() -> None:
    text = validate.error_text("a\x00b" + "c" * 20_000)
    assert "\x00" not in text and len(text) <= validate.MAX_ERROR_CHARS
    assert text.endswith("[truncated]")


def test_a_job_built_by_its_fast_init_equals_one_built_field_by_field() -> None:
    now = dt.datetime.now(dt.UTC)
    fields = dict(
        id=uuid.uuid4(), queue="q", type="t", payload={"a": 1}, priority=0,
        state=State.LEASED, attempts=1, max_attempts=3, backoff=Backoff(), run_at=now,
        lease_owner="o", lease_token=uuid.uuid4(), lease_expires_at=now,
        cancel_requested=False, idempotency_key=None, last_error=None, created_at=now,
        updated_at=now, finished_at=None,
    )  # fmt: skip
    job = Job(**fields)  # type: ignore[arg-type]
    defaults = {
        f.name: f.default for f in dataclasses.fields(Job) if f.default is not dataclasses.MISSING
    }
    assert {f.name: getattr(job, f.name) for f in dataclasses.fields(Job)} == {**defaults, **fields}
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.queue = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Job(**{k: v for k, v in fields.items() if k != "queue"})  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Job("positional", **fields)  # type: ignore[arg-type, misc]
    assert dataclasses.replace(job, attempts=2).attempts == 2
    assert dataclasses.replace(job, attempts=2) != job
    assert dataclasses.replace(job, attempts=1) == job
