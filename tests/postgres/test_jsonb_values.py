"""jobrun's pools load jsonb with a cached loader: the values must be exactly
json.loads' values, each row's its own object."""

from __future__ import annotations

import json
from typing import Any

import psycopg
import pytest

from jobrun.job.model import Backoff
from jobrun.postgres.convert import JsonbValues
from jobrun.postgres.store import Store
from tests.postgres.conftest import new_job
from tests.postgres.test_store_leases import claim_one

TEXTS = [
    "{}",
    "[]",
    '{"i": 1, "s": "x", "f": 2.5, "b": true, "n": null}',
    '[1, "two", null, 3.25]',
    '{"nested": {"a": [1, 2, {"b": "c"}]}, "k": "v"}',
    '"text with \\u00e9 and \\"quotes\\""',
    "12345678901234567890123",
    "1e300",
    "true",
    "null",
    json.dumps({"long": "x" * 400}),
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_pooled_connection_loads_jsonb_as_json_loads_does(store: Store, text: str) -> None:
    with store.pool.connection() as c:
        assert c.adapters.get_loader(3802, psycopg.pq.Format.TEXT) is JsonbValues
        for _ in range(3):  # the first decodes, the next come from the cache
            row = c.execute("SELECT %s::jsonb, %s::jsonb", [text, text]).fetchone()
            assert row is not None
            stored = c.execute("SELECT %s::jsonb::text", [text]).fetchone()
            assert stored is not None
            expected = json.loads(stored[0])  # the text as jsonb normalised it
            assert row[0] == expected
            assert type(row[0]) is type(expected)
            if isinstance(expected, dict | list):
                assert row[0] is not row[1]  # each row its own value


def test_a_cached_payload_changed_by_one_handler_is_not_seen_by_the_next(store: Store) -> None:
    store.enqueue(new_job(payload={"n": 1, "tags": "a"}))
    store.enqueue(new_job(payload={"n": 1, "tags": "a"}))
    first = claim_one(store)
    first.payload["n"] = 99  # a handler may change the dict it was given
    second = claim_one(store)
    assert second.payload == {"n": 1, "tags": "a"}
    assert second.backoff == Backoff()


def test_a_json_loads_set_through_psycopg_is_used_as_is(monkeypatch: Any) -> None:
    calls: list[bytes] = []

    def loads(data: bytes | str) -> Any:
        calls.append(data if isinstance(data, bytes) else data.encode())
        return "custom"

    monkeypatch.setattr(JsonbValues, "_loads", staticmethod(loads))
    loader = JsonbValues(3802)
    assert loader.load(b"{}") == "custom"
    assert loader.load(memoryview(b"{}")) == "custom"
    assert calls == [b"{}", b"{}"]


def test_the_cache_is_bounded() -> None:
    loader = JsonbValues(3802)
    for n in range(5000):
        assert loader.load(b'{"i": %d}' % n) == {"i": n}
    assert len(JsonbValues._cache) <= 1024
