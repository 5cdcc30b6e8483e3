"""One JOBRUN_ prefix: every setting's variable has it; the old names still read, said once."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from jobrun import config
from jobrun.config import DEPRECATED_ENV, Settings
from jobrun.postgres.events import EventMode


@pytest.fixture(autouse=True)
def _fresh_warnings() -> Iterator[None]:
    """Each test sees the once-per-process WARNING as a new process would."""
    saved = set(config._warned)
    config._warned.clear()
    yield
    config._warned.clear()
    config._warned.update(saved)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_every_variable_but_database_url_has_the_jobrun_prefix() -> None:
    names = set(config._ENV) - {"DATABASE_URL"}
    assert {n for n in names if not n.startswith("JOBRUN_")} == set()
    assert set(DEPRECATED_ENV.values()) <= names


def test_the_new_names_set_concurrency_and_job_events_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobrun"):
        settings = Settings.from_env({"JOBRUN_CONCURRENCY": "7", "JOBRUN_JOB_EVENTS": "terminal"})
    assert settings.concurrency == 7
    assert settings.job_events is EventMode.TERMINAL
    assert warnings_of(caplog) == []


def test_worker_concurrency_still_reads_with_one_warning_naming_the_new_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobrun"):
        first = Settings.from_env({"WORKER_CONCURRENCY": "3"})
        again = Settings.from_env({"WORKER_CONCURRENCY": "3"})
    assert first.concurrency == again.concurrency == 3
    (line,) = warnings_of(caplog)  # once per process, not per read
    assert "WORKER_CONCURRENCY is deprecated" in line
    assert "JOBRUN_CONCURRENCY" in line


def test_job_events_still_reads_with_one_warning_naming_the_new_name(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobrun"):
        settings = Settings.from_env({"JOB_EVENTS": "terminal"})
    assert settings.job_events is EventMode.TERMINAL
    (line,) = warnings_of(caplog)
    assert "JOB_EVENTS is deprecated" in line
    assert "JOBRUN_JOB_EVENTS" in line


@pytest.mark.parametrize(
    ("old", "new", "field", "old_value", "new_value", "expected"),
    [
        ("WORKER_CONCURRENCY", "JOBRUN_CONCURRENCY", "concurrency", "3", "5", 5),
        ("JOB_EVENTS", "JOBRUN_JOB_EVENTS", "job_events", "terminal", "all", EventMode.ALL),
    ],
)
def test_the_new_name_wins_when_both_are_set(
    caplog: pytest.LogCaptureFixture,
    old: str,
    new: str,
    field: str,
    old_value: str,
    new_value: str,
    expected: object,
) -> None:
    with caplog.at_level(logging.WARNING, logger="jobrun"):
        settings = Settings.from_env({old: old_value, new: new_value})
    assert getattr(settings, field) == expected
    (line,) = warnings_of(caplog)
    assert f"{old} is deprecated" in line and "ignored" in line


def test_a_bad_old_value_is_refused_naming_the_variable_that_was_set() -> None:
    with pytest.raises(config.ValidationError) as raised:
        Settings.from_env({"WORKER_CONCURRENCY": "many"})
    assert raised.value.field == "WORKER_CONCURRENCY"


def test_a_flag_still_beats_an_old_name() -> None:
    assert Settings.from_env({"WORKER_CONCURRENCY": "3"}, concurrency=4).concurrency == 4
