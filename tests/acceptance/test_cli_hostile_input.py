"""Hostile input to the real ``jobrun`` command: exit code 7, one line naming the field (issue 10).

Each test runs ``python -m jobrun.cli`` as a process, as a shell would: bytes
arguments (invalid UTF-8 reaches Python as lone surrogates, through
``surrogateescape``), stdin, files. Nothing may be written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.job.validate import MAX_PAYLOAD_BYTES
from tests.acceptance.test_cli import ROOT, Result, assert_one_line_error

EXIT_USAGE = 2
EXIT_VALIDATION = 7


def jobrun(dsn: str, *args: str | bytes, stdin: bytes | None = None) -> Result:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL")
    }
    env["DATABASE_URL"] = dsn
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun.cli", *args],
        env=env,
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )
    return Result(
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def row_counts(conn: psycopg.Connection[Any]) -> tuple[int, int, int]:
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobrun.jobs), (SELECT count(*) FROM jobrun.job_events), "
        "(SELECT count(*) FROM jobrun.schedules)"
    ).fetchone()
    assert row is not None
    return (row[0], row[1], row[2])


def nested(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


def big_payload() -> dict[str, str]:
    """A payload whose JSON text is exactly MAX_PAYLOAD_BYTES (1 MiB) of UTF-8."""
    payload = {"x": "a" * (MAX_PAYLOAD_BYTES - len('{"x":""}'))}
    assert len(json.dumps(payload, separators=(",", ":")).encode()) == MAX_PAYLOAD_BYTES
    return payload


# case -> (arguments, the field the error names)
HOSTILE_ARGS: dict[str, tuple[tuple[str | bytes, ...], str]] = {
    "invalid UTF-8 in the payload": (("enqueue", "t.a", b'{"to": "\xff@example.com"}'), "payload"),
    "invalid UTF-8 in a payload key": (("enqueue", "t.a", b'{"\xc3(": 1}'), "payload"),
    "invalid UTF-8 in the type": (("enqueue", b"t.\xff"), "type"),
    "invalid UTF-8 in the queue": (("enqueue", "t.a", "--queue", b"q\xfe"), "queue"),
    "invalid UTF-8 in the key": (("enqueue", "t.a", "--key", b"k-\xff"), "idempotency_key"),
    "a 5001-digit integer": (("enqueue", "t.a", '{"n": ' + "9" * 5001 + "}"), "payload"),
    "a negative 4301-digit integer": (
        ("enqueue", "t.a", '{"n": [-1' + "0" * 4300 + "]}"),
        "payload",
    ),
    "1000 levels of nesting": (("enqueue", "t.a", nested(1000)), "payload"),
    "20000 levels of list nesting": (("enqueue", "t.a", "[" * 20_000 + "]" * 20_000), "payload"),
    "65 levels of nesting": (("enqueue", "t.a", nested(65)), "payload"),
    "NaN": (("enqueue", "t.a", '{"x": NaN}'), "payload"),
    "not JSON": (("enqueue", "t.a", "{"), "payload"),
    "a schedule with invalid UTF-8 in the payload": (
        ("schedules", "add", "s1", "* * * * *", "t.a", b'{"a": "\xff"}'),
        "payload",
    ),
    "a schedule with a 5001-digit integer": (
        ("schedules", "add", "s1", "* * * * *", "t.a", '{"n": ' + "9" * 5001 + "}"),
        "payload",
    ),
    "a schedule nested 1000 levels": (
        ("schedules", "add", "s1", "* * * * *", "t.a", nested(1000)),
        "payload",
    ),
    "a schedule with invalid UTF-8 in its id": (
        ("schedules", "add", b"s\xff", "* * * * *", "t.a"),
        "id",
    ),
    "a schedule with invalid UTF-8 in its cron": (
        ("schedules", "add", "s1", b"* * * * \xff", "t.a"),
        "cron",
    ),
    "a schedule with invalid UTF-8 in its time zone": (
        ("schedules", "add", "s1", "* * * * *", "t.a", "--tz", b"Europe/\xff"),
        "timezone",
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_ARGS))
def test_hostile_arguments_exit_7_naming_the_field(
    case: str, dsn: str, conn: psycopg.Connection[Any]
) -> None:
    args, field = HOSTILE_ARGS[case]
    result = jobrun(dsn, *args)
    assert_one_line_error(result, EXIT_VALIDATION, f"jobrun: {field}: ")
    assert row_counts(conn) == (0, 0, 0)


def test_a_1_mib_payload_from_stdin_is_enqueued(dsn: str, conn: psycopg.Connection[Any]) -> None:
    payload = big_payload()
    result = jobrun(
        dsn, "enqueue", "t.a", "--payload-file", "-", "--json", stdin=json.dumps(payload).encode()
    )
    assert result.code == 0, result.err
    job_id = result.json()["id"]
    (stored,) = (
        conn.execute("SELECT payload FROM jobrun.jobs WHERE id = %s", [job_id]).fetchone() or ()
    )
    assert stored == payload


def test_a_1_mib_payload_from_a_file_is_enqueued_and_one_byte_more_is_refused(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    payload = big_payload()
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload, indent=2), encoding="utf-8")
    result = jobrun(dsn, "enqueue", "t.a", "--payload-file", str(path))
    assert result.code == 0, result.err
    (stored,) = (
        conn.execute(
            "SELECT payload FROM jobrun.jobs WHERE id = %s", [result.out.strip()]
        ).fetchone()
        or ()
    )
    assert stored == payload

    payload["x"] += "a"
    path.write_text(json.dumps(payload), encoding="utf-8")
    too_big = jobrun(dsn, "enqueue", "t.a", "--payload-file", str(path))
    assert_one_line_error(too_big, EXIT_VALIDATION, "payload: ", str(MAX_PAYLOAD_BYTES))
    assert row_counts(conn)[0] == 1


def test_a_schedule_payload_from_stdin(dsn: str, conn: psycopg.Connection[Any]) -> None:
    result = jobrun(
        dsn,
        "schedules",
        "add",
        "s1",
        "* * * * *",
        "t.a",
        "--payload-file",
        "-",
        stdin=b'{"report": "daily"}',
    )
    assert result.code == 0, result.err
    assert conn.execute("SELECT payload FROM jobrun.schedules").fetchall() == [
        ({"report": "daily"},)
    ]


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b'{"a": "\xff"}', "UTF-8"),
        (b'{"n": ' + b"9" * 5001 + b"}", "4300"),
        (nested(1000).encode(), "nested"),
        (b"[1, 2]", "dict"),
        (b"", "JSON"),
    ],
    ids=["invalid UTF-8", "5001 digits", "1000 levels", "not an object", "empty"],
)
def test_a_hostile_payload_file_exits_7_naming_the_payload(
    content: bytes, fragment: str, dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = tmp_path / "payload.json"
    path.write_bytes(content)
    for source, stdin in ((str(path), None), ("-", content)):
        result = jobrun(dsn, "enqueue", "t.a", "--payload-file", source, stdin=stdin)
        assert_one_line_error(result, EXIT_VALIDATION, "jobrun: payload: ", fragment)
    assert row_counts(conn) == (0, 0, 0)


def test_an_unreadable_payload_file_exits_7_naming_the_option(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    result = jobrun(dsn, "enqueue", "t.a", "--payload-file", str(tmp_path / "missing.json"))
    assert_one_line_error(result, EXIT_VALIDATION, "jobrun: --payload-file: ", "missing.json")
    assert row_counts(conn) == (0, 0, 0)


def test_payload_json_and_payload_file_together_are_a_usage_error(
    dsn: str, conn: psycopg.Connection[Any], tmp_path: Path
) -> None:
    path = tmp_path / "payload.json"
    path.write_text("{}")
    for args in (
        ("enqueue", "t.a", "{}", "--payload-file", str(path)),
        ("schedules", "add", "s1", "* * * * *", "t.a", "{}", "--payload-file", str(path)),
    ):
        result = jobrun(dsn, *args)
        assert_one_line_error(result, EXIT_USAGE, "PAYLOAD_JSON", "--payload-file", "not both")
    assert row_counts(conn) == (0, 0, 0)
