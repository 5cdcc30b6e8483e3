"""The outage reporter: one WARNING, one every 30 s, one INFO, however many failures."""

from __future__ import annotations

import logging

import pytest

from jobrun.job import outage
from jobrun.job.errors import ConnectionUnavailable, TransientError
from jobrun.job.outage import Outage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str]]:
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "jobrun.outage"]


def test_an_outage_is_one_warning_a_summary_every_30_s_and_one_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun.outage")
    clock = Clock()
    reporter = Outage("db:5432/app", clock=clock)
    reporter.ok()
    assert lines(caplog) == [] and not reporter.down
    for _ in range(100):  # a failure every 0.5 s for 75 s
        reporter.failed(TransientError("connection refused\n\tIs the server running?"), "claim")
        clock.now += 0.75
    reporter.ok()
    reporter.ok()
    said = lines(caplog)
    assert [level for level, _ in said] == ["WARNING", "WARNING", "WARNING", "INFO"], said
    assert "db:5432/app unavailable: claim: connection refused;" in said[0][1]
    assert "Is the server running" not in "".join(text for _, text in said)  # one line each
    assert "still unavailable after 30 s (41 failures: claim 41; last: claim: conn" in said[1][1]
    assert "still unavailable after 60 s (81 failures: claim 81;" in said[2][1]
    assert "available again after 75.0 s (100 failures: claim 100)" in said[3][1]
    assert not reporter.down and reporter.describe() is None


def test_a_call_that_got_no_connection_keeps_the_connection_error_as_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun.outage")
    clock = Clock()
    reporter = Outage("db", clock=clock)
    reporter.failed("connection refused", "connecting")
    clock.now += 3
    reporter.failed(ConnectionUnavailable("no database connection within 10 s: ..."), "claim")
    reporter.failed(TransientError("server closed the connection"), "listener connect")
    assert reporter.describe() == (
        "database at db unavailable for 3.0 s (3 failure(s); "
        "last: listener connect: server closed the connection)"
    )
    assert reporter.down_for() == pytest.approx(3.0)
    reporter.ok()
    assert "(3 failures: claim 1, connecting 1, listener 1)" in lines(caplog)[-1][1]


def test_passwords_stay_out_of_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobrun.outage")
    Outage("db").failed("cannot connect to postgresql://app:s3cret@db/app")
    assert "s3cret" not in caplog.text


def test_one_reporter_per_database_and_a_store_finds_its_own() -> None:
    a = outage.for_database("u@h:1/a")
    assert outage.for_database("u@h:1/a") is a
    assert outage.for_database("u@h:1/b") is not a

    class WithOne:
        outage = a

    assert outage.of(WithOne()) is a
    assert outage.of(object()) is outage.for_database("the database")


def test_a_call_in_flight_when_the_outage_began_does_not_end_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun.outage")
    clock = Clock()
    reporter = Outage("db", clock=clock)
    in_flight = reporter.mark()  # a claim sent while the server still answered
    clock.now += 0.5
    reporter.failed("server closed the connection", "listener")
    reporter.ok(in_flight)  # its answer arrives just after the listener's failure
    assert reporter.down
    reporter.failed("connection refused", "connecting")
    clock.now += 2
    reporter.ok(reporter.mark())  # a call made since the outage began: it is over
    said = lines(caplog)
    assert [level for level, _ in said] == ["WARNING", "INFO"], said
    assert "available again after 2.0 s (2 failures: connecting 1, listener 1)" in said[1][1]
