"""The ports name what the adapter really offers: jobrun.postgres's Store matches the port."""

from __future__ import annotations

import inspect

import pytest

from jobrun.job import ports
from jobrun.postgres.store import Store as PgStore


def _port_methods() -> list[str]:
    return sorted(
        name
        for cls in (ports.Store, ports.Schedules)
        for name, value in vars(cls).items()
        if not name.startswith("_") and callable(value)
    )


def test_the_port_has_what_the_worker_uses() -> None:
    for name in ("release", "complete", "complete_many", "complete_many_tx", "watch", "wait"):
        assert name in _port_methods(), name
    assert "result" in inspect.signature(ports.Store.complete).parameters
    assert "results" in inspect.signature(ports.Store.complete_many).parameters
    assert "results" in inspect.signature(ports.Store.complete_many_tx).parameters


@pytest.mark.parametrize("name", _port_methods())
def test_the_postgres_store_has_the_ports_signature(name: str) -> None:
    port = inspect.signature(getattr(ports.Store, name))
    real = inspect.signature(getattr(PgStore, name))
    for param in port.parameters.values():
        assert param.name in real.parameters, f"{name}: {param.name}"
        got = real.parameters[param.name]
        assert got.kind == param.kind, f"{name}: {param.name}"
        assert got.default == param.default, f"{name}: {param.name}"
