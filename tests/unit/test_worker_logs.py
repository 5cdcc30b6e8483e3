"""The console formats: job fields first in text, one JSON object per line, never a password."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import pytest

from jobrun.job.errors import ValidationError
from jobrun.worker import logs

JOB = {
    "job_id": "0194b7c2-7d2e-7cc1-9f7e-2f1a3b4c5d6e",
    "job_type": "email.send",
    "attempt": 2,
    "max_attempts": 25,
    "queue": "emails",
}


def record(message: str, *args: Any, exc: BaseException | None = None, **extra: Any) -> Any:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    rec = logging.LogRecord("jobrun.worker", logging.INFO, __file__, 1, message, args, exc_info)
    rec.__dict__.update(extra)
    return rec


def raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_the_text_format_puts_the_job_id_type_and_attempt_first() -> None:
    line = logs.TextFormatter().format(record("succeeded in %d ms", 12, **JOB))
    assert line.endswith(
        " INFO jobrun.worker: job 0194b7c2-7d2e-7cc1-9f7e-2f1a3b4c5d6e email.send "
        "attempt 2/25: succeeded in 12 ms"
    )


def test_the_text_format_leaves_other_records_as_they_were() -> None:
    line = logs.TextFormatter().format(record("claim failed"))
    assert line.endswith(" INFO jobrun.worker: claim failed")


def test_the_text_format_masks_passwords_in_the_message_and_the_traceback() -> None:
    exc = raised(RuntimeError("cannot reach postgresql://app:hunter2@db/app"))
    line = logs.TextFormatter(known=["s3cret"]).format(
        record("failed: %s (s3cret)", exc, exc=exc, **JOB)
    )
    assert "hunter2" not in line and "s3cret" not in line
    assert "Traceback (most recent call last)" in line


def test_the_json_format_is_one_object_per_line_with_the_job_fields() -> None:
    exc = raised(ValueError("boom"))
    line = logs.JsonFormatter().format(
        record(
            "failed in 3 ms",
            exc=exc,
            **JOB,
            outcome="failed",
            duration_ms=3.2,
            next_run_at="2025-01-31T10:00:02.000Z",
            error="ValueError: boom",
        )
    )
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["ts"].endswith("Z")
    assert (obj["level"], obj["logger"], obj["message"]) == (
        "INFO",
        "jobrun.worker",
        "failed in 3 ms",
    )
    assert {k: obj[k] for k in JOB} == JOB
    assert obj["outcome"] == "failed" and obj["duration_ms"] == 3.2
    assert obj["next_run_at"] == "2025-01-31T10:00:02.000Z"
    assert obj["error"] == "ValueError: boom"
    assert obj["traceback"].startswith("Traceback (most recent call last)")
    assert obj["traceback"].rstrip().endswith("ValueError: boom")


@pytest.mark.parametrize(
    "text",
    [
        "password=hunter2",  # runs to the next blank: the closing quote must survive
        "postgresql://app:hunter2@db/app",
        "{'password': 'hunter2'}",
        "dsn 'host=db password=hunter2'",
    ],
)
def test_the_json_format_masks_passwords_everywhere_and_stays_valid_json(text: str) -> None:
    exc = raised(RuntimeError(text))
    line = logs.JsonFormatter().format(
        record(f"failed: {text}", exc=exc, **JOB, error=text, detail={"dsn": text})
    )
    assert "hunter2" not in line
    obj = json.loads(line)
    assert "***" in obj["message"] and "***" in obj["error"] and "***" in obj["detail"]["dsn"]


def test_the_json_format_is_ascii_whatever_the_message_holds() -> None:
    line = logs.JsonFormatter().format(record("café \ud800 done"))
    assert line.isascii()
    assert json.loads(line)["message"].startswith("café")


def test_configure_installs_one_stderr_handler_in_the_chosen_format() -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, logs.success_level())
    try:
        logs.configure(level="info", log_format="json", success="info")
        assert logs.success_level() == logging.INFO
        (handler,) = root.handlers
        assert isinstance(handler, logging.StreamHandler) and handler.stream is sys.stderr
        assert isinstance(handler.formatter, logs.JsonFormatter)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logs.set_success_level(saved[2])


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: logs.formatter("xml"), "log_format"),
        (lambda: logs.set_success_level("loud"), "log_success"),
        (lambda: logs.set_success_level(-1), "log_success"),
    ],
)
def test_bad_log_options_are_validation_errors(call: Any, field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        call()
    assert caught.value.field == field
