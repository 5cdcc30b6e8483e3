"""The stop-signal policy of a worker process, in this process (real signals, no database)."""

from __future__ import annotations

import signal

import pytest

from jobrun.worker.stop_signals import Interrupted, StopSignals


def _handlers() -> dict[int, object]:
    return {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_before_attach_raises_interrupted_and_the_handlers_come_back(
    sig: signal.Signals,
) -> None:
    before = _handlers()
    with pytest.raises(Interrupted) as caught, StopSignals() as signals:
        assert StopSignals.installed() is signals
        signal.raise_signal(sig)
    assert caught.value.signum == sig
    assert str(caught.value) == f"interrupted by {sig.name} while starting"
    assert not isinstance(caught.value, Exception)  # `except Exception` lets it through
    assert _handlers() == before
    assert StopSignals.installed() is None


def test_once_attached_the_first_signal_stops_and_the_second_forces() -> None:
    calls: list[str] = []
    with StopSignals() as signals:
        signals.attach(lambda: calls.append("stop"), lambda: calls.append("kill"))
        signal.raise_signal(signal.SIGTERM)
        assert calls == ["stop"]
        assert signals.forced_by is None
        signal.raise_signal(signal.SIGINT)
        assert calls == ["stop", "kill"]
        assert signals.forced_by == signal.SIGINT
