"""Hostile input gets a typed ValidationError naming the field, before any SQL (issue 10).

The first half needs no database: every case of the table must raise
ValidationError with its field. The second half runs a representative set
against a real PostgreSQL through enqueue, enqueue_batch (COPY) and the
schedule calls, and checks that no row was written.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import json
import sys
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import jobrun
from jobrun.aio import AsyncClient
from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob, ScheduleSpec
from jobrun.job.validate import MAX_PAYLOAD_INT_DIGITS
from jobrun.postgres.store import BATCH_CHUNK, Store

SURROGATE = "\ud800"
ESCAPED = "\udcff"  # what the byte 0xff becomes in argv under surrogateescape
CRON = "* * * * *"
TTL = dt.timedelta(seconds=30)


class Disguised(str):
    """A str whose methods lie about the value it carries (json and psycopg send the real one)."""

    __slots__ = ()

    def __str__(self) -> str:
        return "clean"

    def __repr__(self) -> str:
        return "'clean'"

    def __contains__(self, item: object) -> bool:
        return False

    def __len__(self) -> int:
        return 5

    def __eq__(self, other: object) -> bool:
        return True

    def __hash__(self) -> int:
        return hash("clean")

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"clean"

    def isascii(self) -> bool:
        return True

    def split(self, sep: str | None = None, maxsplit: int = -1) -> list[str]:
        return ["*", "*", "*", "*", "*"]


class LyingDict(dict[Any, Any]):
    """json.dumps serialises a dict subclass through its ``items()``: a lie here is stored."""

    def items(self) -> Any:
        return [("clean", 1)]

    def __len__(self) -> int:
        return 1


class LyingList(list[Any]):
    def __iter__(self) -> Iterator[Any]:
        return iter([1])

    def __len__(self) -> int:
        return 1


def nested(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(levels):
        node["x"] = {}
        node = node["x"]
    return root


def job(**fields: Any) -> Callable[[], object]:
    fields.setdefault("type", "t")
    return lambda: NewJob(**fields)


def spec(**fields: Any) -> Callable[[], object]:
    fields.setdefault("id", "s")
    fields.setdefault("cron", CRON)
    fields.setdefault("type", "t")
    return lambda: ScheduleSpec(**fields)


# case -> (the call, the field its ValidationError must name)
HOSTILE: dict[str, tuple[Callable[[], object], str]] = {
    # lone surrogates: in payload values, keys, nested, and in every text field
    "surrogate in a payload value": (job(payload={"a": SURROGATE}), "payload"),
    "surrogate in a payload key": (job(payload={SURROGATE: 1}), "payload"),
    "surrogate nested in a payload": (job(payload={"a": [{"b": ["x", "y" + ESCAPED]}]}), "payload"),
    "surrogate pair halves reversed": (job(payload={"a": "\udc00\ud800"}), "payload"),
    "surrogate in a job type": (job(type="t" + SURROGATE), "type"),
    "surrogate in a queue": (job(queue="q" + ESCAPED), "queue"),
    "surrogate in an idempotency key": (job(idempotency_key="k" + SURROGATE), "idempotency_key"),
    "surrogate in a schedule id": (spec(id="s" + ESCAPED), "id"),
    "surrogate in a cron expression": (spec(cron="* * * * " + ESCAPED), "cron"),
    "surrogate in a time zone": (spec(timezone="Europe/" + ESCAPED), "timezone"),
    "surrogate in a schedule payload": (spec(payload={"a": SURROGATE}), "payload"),
    "surrogate in a schedule type": (spec(type="t" + SURROGATE), "type"),
    "surrogate in an owner": (lambda: validate.owner("worker-" + ESCAPED), "owner"),
    # str subclasses: checks must see the value they carry, not their methods
    "disguised NUL in a payload value": (job(payload={"a": Disguised("a\x00")}), "payload"),
    "disguised NUL in a payload key": (job(payload={Disguised("a\x00"): 1}), "payload"),
    "disguised surrogate in a payload value": (
        job(payload={"a": [Disguised(SURROGATE)]}),
        "payload",
    ),
    "disguised NUL in a job type": (job(type=Disguised("t\x00")), "type"),
    "disguised NUL in a queue": (job(queue=Disguised("q\x00")), "queue"),
    "disguised NUL in an idempotency key": (
        job(idempotency_key=Disguised("k\x00")),
        "idempotency_key",
    ),
    "disguised surrogate in an idempotency key": (
        job(idempotency_key=Disguised("k" + SURROGATE)),
        "idempotency_key",
    ),
    "disguised NUL in a schedule id": (spec(id=Disguised("s\x00")), "id"),
    "disguised NUL in a cron expression": (spec(cron=Disguised("* * * * *\x00")), "cron"),
    "disguised NUL in a schedule payload": (spec(payload={"a": Disguised("\x00")}), "payload"),
    "disguised NUL in an owner": (lambda: validate.owner(Disguised("w\x00")), "owner"),
    "dict subclass whose items() lies": (job(payload={"a": LyingDict({"\x00": 1})}), "payload"),
    "dict subclass payload whose items() lies": (
        job(payload=LyingDict({"a": SURROGATE})),
        "payload",
    ),
    "list subclass whose iteration lies": (
        job(payload={"a": LyingList([1, {1, 2}])}),
        "payload",
    ),
    # not JSON, or not faithfully
    "bytes value": (job(payload={"a": b"x"}), "payload"),
    "bytes key": (job(payload={b"a": 1}), "payload"),
    "set value": (job(payload={"a": {1, 2}}), "payload"),
    "frozenset value": (job(payload={"a": frozenset()}), "payload"),
    "tuple key": (job(payload={(1, 2): 1}), "payload"),
    "int key": (job(payload={1: 2}), "payload"),
    "float key": (job(payload={1.5: 2}), "payload"),
    "None key": (job(payload={None: 2}), "payload"),
    "bool key": (job(payload={True: 2}), "payload"),
    "non-string key nested": (job(payload={"a": [{"b": {2: 3}}]}), "payload"),
    "Decimal NaN": (job(payload={"a": decimal.Decimal("NaN")}), "payload"),
    "Decimal sNaN": (job(payload={"a": [decimal.Decimal("sNaN")]}), "payload"),
    "Decimal": (job(payload={"a": decimal.Decimal("1.10")}), "payload"),
    "complex": (job(payload={"a": 1j}), "payload"),
    "an int of 4301 digits": (job(payload={"a": 10**MAX_PAYLOAD_INT_DIGITS}), "payload"),
    "a negative int of 4301 digits": (
        job(payload={"a": [-(10**MAX_PAYLOAD_INT_DIGITS)]}),
        "payload",
    ),
    "an int of 5001 digits": (job(payload={"a": 10**5000}), "payload"),
    "an int of 100000 digits": (job(payload={"a": 10**100_000}), "payload"),
    "an int subclass of 4301 digits": (
        job(payload={"a": type("Big", (int,), {})(10**MAX_PAYLOAD_INT_DIGITS)}),
        "payload",
    ),
    "a float subclass NaN": (job(payload={"a": type("F", (float,), {})("nan")}), "payload"),
    "1000 levels of nesting": (job(payload=nested(1000)), "payload"),
    "100000 levels of nesting": (job(payload=nested(100_000)), "payload"),
    "schedule payload with a big int": (spec(payload={"a": 10**5000}), "payload"),
    "schedule payload with bytes": (spec(payload={"a": b"x"}), "payload"),
    "schedule payload with a set": (spec(payload={"a": {1}}), "payload"),
    "schedule payload nested 1000 deep": (spec(payload=nested(1000)), "payload"),
    # the CLI's parser: its problems are the payload's
    "JSON text with a 5001-digit int": (
        lambda: validate.payload_from_json('{"n": ' + "9" * 5001 + "}"),
        "payload",
    ),
    "JSON text with a -4301-digit int": (
        lambda: validate.payload_from_json('{"n": -1' + "0" * 4300 + "}"),
        "payload",
    ),
    "JSON text nested 1000 deep": (
        lambda: validate.payload_from_json('{"a":' * 1000 + "1" + "}" * 1000),
        "payload",
    ),
    "JSON text nested 100000 deep in lists": (
        lambda: validate.payload_from_json("[" * 100_000 + "]" * 100_000),
        "payload",
    ),
    "JSON bytes that are not UTF-8": (
        lambda: validate.payload_from_json(b'{"a": "\xff"}'),
        "payload",
    ),
    "JSON text that is not JSON": (lambda: validate.payload_from_json("{"), "payload"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_input_is_a_validation_error_naming_the_field(case: str) -> None:
    call, field = HOSTILE[case]
    with pytest.raises(ValidationError) as info:
        call()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    # The message can always be printed and sent: no raw surrogate or NUL in it.
    str(info.value).encode("utf-8")
    assert "\x00" not in str(info.value)


def test_json_text_with_a_huge_int_says_so() -> None:
    with pytest.raises(ValidationError) as info:
        validate.payload_from_json('{"n": ' + "9" * 5001 + "}")
    assert str(info.value).startswith("payload: contains an integer of more than 4300 digits")


def test_a_lower_int_limit_in_this_process_is_still_a_validation_error() -> None:
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        with pytest.raises(ValidationError, match="payload"):
            NewJob(type="t", payload={"a": 10**2000})
        with pytest.raises(ValidationError, match="payload"):
            validate.payload_from_json('{"n": ' + "9" * 2000 + "}")
    finally:
        sys.set_int_max_str_digits(previous)


def test_an_int_of_4300_digits_is_accepted() -> None:
    largest = 10**MAX_PAYLOAD_INT_DIGITS - 1
    new = NewJob(type="t", payload={"a": largest, "b": -largest})
    assert json.loads(new.payload_json) == {"a": largest, "b": -largest}


def test_the_int_limit_holds_whatever_this_process_allows() -> None:
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # unlimited here; a worker with the default could not read it
    try:
        with pytest.raises(ValidationError, match="4300"):
            NewJob(type="t", payload={"a": 10**5000})
        with pytest.raises(ValidationError, match="4300"):
            validate.payload_from_json('{"n": ' + "9" * 5001 + "}")
    finally:
        sys.set_int_max_str_digits(previous)


def test_a_str_subclass_is_stored_as_the_value_it_carries() -> None:
    new = NewJob(
        type=Disguised("t.a"),
        queue=Disguised("emails"),
        idempotency_key=Disguised("k-1"),
        payload={Disguised("key"): Disguised("value")},
    )
    assert type(new.type) is str and new.type == "t.a"
    assert type(new.queue) is str and new.queue == "emails"
    assert type(new.idempotency_key) is str and new.idempotency_key == "k-1"
    assert new.payload_json == '{"key":"value"}'
    assert [type(k) for k in new.payload] == [str]
    assert [type(v) for v in new.payload.values()] == [str]


def test_container_subclasses_and_enums_are_stored_as_plain_json() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    class Name(enum.StrEnum):
        ADA = "ada"

    payload = collections.OrderedDict(c=Colour.RED, n=Name.ADA, t=(1, (2,)), d=LyingDict(a=1))
    new = NewJob(type="t", payload=payload)
    assert type(new.payload) is dict
    assert new.payload == {"c": 1, "n": "ada", "t": [1, [2]], "d": {"a": 1}}
    assert json.loads(new.payload_json) == new.payload
    assert [type(v) for v in new.payload.values()] == [int, str, list, dict]


def test_a_backslash_u0000_spelled_out_is_not_a_nul() -> None:
    new = NewJob(type="t", payload={"a": "\\u0000", "\\u0000": ["C:\\u0000"]})
    assert json.loads(new.payload_json) == {"a": "\\u0000", "\\u0000": ["C:\\u0000"]}


def test_a_plain_payload_is_kept_as_given() -> None:
    payload = {"to": "a@example.com", "n": 7, "tags": ["x", "y"], "ü": "日本"}
    new = NewJob(type="t", payload=payload)
    assert new.payload is payload
    assert new.payload_json == json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"i": 1},
        {"f": 1.5, "big": 10**40, "neg": -0.0, "tiny": 5e-324, "e": 1e16},
        {"s": 'quote " backslash \\ tab \t nl \n ctl \x01 é 日本 😀', "n": None, "b": False},
        {"nested": [{"a": [[], {}]}, [1, [2, [3]]]], "": ""},
    ],
)
def test_the_payload_text_is_what_the_json_encoder_makes(payload: dict[str, Any]) -> None:
    # The prebuilt C encoder (jobrun.job.validate._encode_json) stands for
    # JSONEncoder.encode with the same settings: the same text, byte for byte.
    expected = json.JSONEncoder(
        allow_nan=False, separators=(",", ":"), ensure_ascii=False, check_circular=False
    ).encode(payload)
    assert NewJob(type="t", payload=payload).payload_json == expected
    assert json.loads(expected) == payload


def test_a_payload_of_exactly_the_size_limit_is_accepted() -> None:
    overhead = len('{"x":""}')
    text = validate.payload({"x": "é" * ((validate.MAX_PAYLOAD_BYTES - overhead) // 2)})[1]
    assert len(text.encode()) <= validate.MAX_PAYLOAD_BYTES
    with pytest.raises(ValidationError, match="payload"):
        validate.payload({"x": "é" * ((validate.MAX_PAYLOAD_BYTES - overhead) // 2 + 1)})


BIG = 50_000_000
"""50 MB: a payload fifty times the limit, as a careless caller might send."""


class Tagged(str):
    """A str subclass: the payload check copies the plain value it carries."""

    __slots__ = ()


def _big_payloads() -> dict[str, Callable[[], Any]]:
    return {
        "one ASCII string": lambda: {"blob": "x" * BIG},
        "one non-ASCII string": lambda: {"blob": "\u00e9" * (BIG // 2)},
        "one huge key": lambda: {"k" * BIG: 1},
        "many strings": lambda: {"parts": ["y" * 1_000_000] * (BIG // 1_000_000)},
        "a str subclass": lambda: {"blob": Tagged("z" * BIG)},
        "a tuple of strings": lambda: {"parts": ("w" * 1_000_000,) * (BIG // 1_000_000)},
    }


@pytest.mark.parametrize("case", list(_big_payloads()))
def test_refusing_a_50_mb_payload_stays_well_under_its_size_in_memory(case: str) -> None:
    payload = _big_payloads()[case]()
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError) as caught:
            NewJob(type="t", payload=payload)  # what Client.enqueue builds
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value) == (
        f"payload: is larger than {validate.MAX_PAYLOAD_BYTES} bytes as JSON"
    )
    assert peak < BIG // 20, f"refusing it peaked at {peak:,} bytes"


def test_a_handler_result_of_50_mb_is_refused_without_a_copy() -> None:
    value = ["r" * BIG]
    tracemalloc.start()
    try:
        with pytest.raises(ValidationError) as caught:
            validate.result(value)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(caught.value) == f"result: is larger than {validate.MAX_RESULT_BYTES} bytes as JSON"
    assert peak < BIG // 20, f"refusing it peaked at {peak:,} bytes"


def test_a_payload_whose_escapes_pass_the_limit_is_still_refused() -> None:
    # Fewer characters than the limit, but each control character is six
    # bytes of JSON (\u0001): only the encoded text can tell.
    with pytest.raises(ValidationError, match="larger than"):
        validate.payload({"x": "\x01" * (validate.MAX_PAYLOAD_BYTES // 5)})
    text = validate.payload({"x": "\x01" * (validate.MAX_PAYLOAD_BYTES // 7)})[1]
    assert len(text.encode()) <= validate.MAX_PAYLOAD_BYTES


# -- against PostgreSQL: nothing is written ----------------------------------------------


def row_counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs), (SELECT count(*) FROM jobrun.job_events), "
        "(SELECT count(*) FROM jobrun.schedules)"
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


# Values that reached psycopg or the server before (UnicodeEncodeError, a jsonb
# error, a ValueError): a representative set of the table above.
HOSTILE_PAYLOADS: dict[str, Callable[[], dict[Any, Any]]] = {
    "surrogate in a value": lambda: {"a": SURROGATE},
    "surrogate in a key": lambda: {"k" + ESCAPED: 1},
    "surrogate nested": lambda: {"a": [{"b": [ESCAPED]}]},
    "disguised NUL in a value": lambda: {"a": Disguised("\x00")},
    "disguised NUL in a key": lambda: {Disguised("\x00"): 1},
    "dict subclass whose items() lies": lambda: {"a": LyingDict({"\x00": 1})},
    "an int of 5001 digits": lambda: {"a": 10**5000},
}


@pytest.mark.parametrize("case", sorted(HOSTILE_PAYLOADS))
def test_enqueue_of_a_hostile_payload_writes_nothing(
    case: str, store: Store, conn: psycopg.Connection[Any]
) -> None:
    store.enqueue(NewJob(type="t"))
    counts = row_counts(conn)
    with pytest.raises(ValidationError) as info:
        store.enqueue(NewJob(type="t", payload=HOSTILE_PAYLOADS[case]()))
    assert info.value.field == "payload"
    assert row_counts(conn) == counts


@pytest.mark.parametrize("case", sorted(HOSTILE_PAYLOADS))
def test_enqueue_batch_of_a_hostile_payload_writes_nothing(
    case: str, store: Store, conn: psycopg.Connection[Any]
) -> None:
    with pytest.raises(ValidationError) as info:
        store.enqueue_batch(
            [NewJob(type="t", payload={"i": i}) for i in range(10)]
            + [NewJob(type="t", payload=HOSTILE_PAYLOADS[case]())]
        )
    assert info.value.field == "payload"
    assert row_counts(conn) == (0, 0, 0)


def test_a_streamed_batch_that_meets_a_hostile_job_after_a_copied_chunk_writes_nothing(
    store: Store, conn: psycopg.Connection[Any]
) -> None:
    def jobs() -> Iterator[NewJob]:
        for i in range(BATCH_CHUNK + 10):
            # Built lazily: the first chunk is already COPYed when this one fails.
            yield NewJob(type="t", payload={"i": i, "s": SURROGATE if i == BATCH_CHUNK + 5 else ""})

    with pytest.raises(ValidationError) as info:
        store.enqueue_batch(jobs())
    assert info.value.field == "payload"
    assert row_counts(conn) == (0, 0, 0)


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("idempotency_key", {"idempotency_key": "k" + ESCAPED}),
        ("idempotency_key", {"idempotency_key": Disguised("k\x00")}),
        ("queue", {"queue": Disguised("q\x00")}),
        ("type", {"type": "t" + SURROGATE}),
    ],
)
def test_enqueue_and_batch_of_a_hostile_text_field_write_nothing(
    field: str, fields: dict[str, Any], store: Store, conn: psycopg.Connection[Any]
) -> None:
    for enqueue in (store.enqueue, lambda j: store.enqueue_batch([NewJob(type="t"), j])):
        with pytest.raises(ValidationError) as info:
            enqueue(NewJob(**{"type": "t", **fields}))
        assert info.value.field == field
    assert row_counts(conn) == (0, 0, 0)


@pytest.mark.parametrize(
    ("field", "fields"),
    [
        ("payload", {"payload": {"a": SURROGATE}}),
        ("payload", {"payload": {"a": Disguised("\x00")}}),
        ("payload", {"payload": {"a": 10**5000}}),
        ("payload", {"payload": {ESCAPED: 1}}),
        ("id", {"id": "s" + ESCAPED}),
        ("cron", {"cron": Disguised("* * * * *\x00")}),
        ("timezone", {"timezone": "UTC" + SURROGATE}),
    ],
)
def test_create_and_upsert_schedule_of_hostile_input_write_nothing(
    field: str, fields: dict[str, Any], store: Store, conn: psycopg.Connection[Any]
) -> None:
    for save in (store.create_schedule, store.upsert_schedule):
        with pytest.raises(ValidationError) as info:
            save(ScheduleSpec(**{"id": "s", "cron": CRON, "type": "t", **fields}))
        assert info.value.field == field
    assert row_counts(conn) == (0, 0, 0)


def test_schedule_lookups_of_a_hostile_id_are_validation_errors(store: Store) -> None:
    for call in (
        store.get_schedule,
        store.delete_schedule,
        store.pause_schedule,
        store.resume_schedule,
    ):
        for bad in ("s" + ESCAPED, "s\x00", Disguised("s\x00")):
            with pytest.raises(ValidationError) as info:
                call(bad)
            assert info.value.field == "schedule_id"


def test_claim_with_a_hostile_owner_is_a_validation_error(store: Store) -> None:
    store.enqueue(NewJob(type="t"))
    for bad in ("w" + ESCAPED, Disguised("w\x00")):
        with pytest.raises(ValidationError) as info:
            store.claim(bad, ["default"], 1, TTL)
        assert info.value.field == "owner"
    assert store.claim("w", ["default"], 1, TTL)  # still queued: the bad claims took nothing


def test_the_largest_int_and_disguised_values_round_trip_through_postgres(store: Store) -> None:
    largest = 10**MAX_PAYLOAD_INT_DIGITS - 1
    job = store.enqueue(NewJob(type="t", payload={"n": -largest, Disguised("k"): Disguised("v")}))
    assert store.get(job.id).payload == {"n": -largest, "k": "v"}
    schedule = store.create_schedule(
        ScheduleSpec(id="s", cron=CRON, type="t", payload={"n": largest, "d": LyingDict(a=1)})
    )
    assert schedule.payload == {"n": largest, "d": {"a": 1}}
    assert store.get_schedule("s").payload == {"n": largest, "d": {"a": 1}}


@pytest.mark.parametrize("url", ["postgresql://localhost/app", b"postgresql://localhost/app"])
def test_a_client_built_from_a_url_says_to_connect(url: Any) -> None:
    """``Client(url)`` was accepted and failed later on its first call with an
    AttributeError; a URL is the likely mistake, and the error says what to use."""
    with pytest.raises(ValidationError, match=r"store: .*Client\.connect\(url\)"):
        jobrun.Client(url)
    with pytest.raises(ValidationError, match=r"store: .*AsyncClient\.connect\(url\)"):
        AsyncClient(url)
