"""``jobrun enqueue --batch FILE|-``: many jobs from JSON lines, in one COPY.

One process per job costs a process start, an import and a connection each
(10,000 jobs took over 100 minutes); a batch reads JSON lines, one job a
line, and streams them through :meth:`Client.enqueue_batch`: one
transaction, COPY in chunks, so 10,000 jobs take seconds and memory stays
bounded however long stdin is.

A line is an object with ``type`` (required), ``payload`` (default ``{}``)
and the options ``enqueue`` takes, under the names of its flags:
``queue``, ``priority``, ``max_attempts``, ``delay`` (``"1h30m"`` or
seconds), ``key`` and ``concurrency_key``. The flags given on the command
line (``--queue``, ``--priority``, ``--max-attempts``, ``--delay``,
``--concurrency-key``) are the defaults of every line. Blank lines are
skipped (but counted, so that a line number is the editor's).

All or nothing: each line is checked as it is read, inside the batch's
transaction, and a bad one (by its number: ``line 3: ...``) rolls back
every job sent before it; nothing is written, exit code 7.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import sys
from collections.abc import Iterator
from typing import IO, Any

from jobrun.config import parse_duration
from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob
from jobrun.job.validate import payload_from_json

from .exits import EXIT_OK, UsageError
from .output import count_jobs, report
from .parser import MAX_PAYLOAD_FILE_BYTES
from .settings import open_client, optional_duration

LINE_FIELDS = frozenset(
    ("type", "payload", "queue", "priority", "max_attempts", "delay", "key", "concurrency_key")
)
"""What a line may hold: a job's type and payload, and ``enqueue``'s options."""

MAX_LINE_BYTES = MAX_PAYLOAD_FILE_BYTES
"""A line holds at most this much: a 1 MiB payload with room for the options around it."""


def check_batch_flags(args: argparse.Namespace) -> None:
    """--batch takes no TYPE, payload or key: each line carries its own."""
    if args.type is not None or args.payload is not None or args.payload_file is not None:
        raise UsageError(
            "enqueue --batch reads TYPE and payload from each line: give neither on the "
            "command line"
        )
    if args.key is not None:
        raise UsageError("enqueue --batch: one --key cannot name many jobs; put 'key' on lines")


def cmd_enqueue_batch(args: argparse.Namespace) -> int:
    """Enqueue every line of ``args.batch``; prints the count (and the replayed keys)."""
    check_batch_flags(args)
    defaults: dict[str, Any] = {
        "queue": args.queue,
        "priority": args.priority,
        "max_attempts": args.max_attempts,
        "delay": optional_duration(args.delay, "--delay"),
        "concurrency_key": args.concurrency_key,
    }
    with _open(args.batch) as source:
        jobs = new_jobs(source, defaults)
        first = next(jobs, None)  # the first line checked before a connection is opened
        if first is None:
            raise ValidationError("--batch", f"{_name(args.batch)} holds no job")
        with open_client(args) as client:
            result = client.enqueue_batch(_chain(first, jobs))
    text = f"enqueued {count_jobs(result.inserted)}"
    if result.replayed:
        text += f"; {len(result.replayed)} already enqueued under the same key (left as they were)"
    value = {"inserted": result.inserted, "replayed": [str(j.id) for j in result.replayed]}
    report(args, value, text)
    return EXIT_OK


def _chain(first: NewJob, rest: Iterator[NewJob]) -> Iterator[NewJob]:
    yield first
    yield from rest


def _name(path: str) -> str:
    return "stdin" if path == "-" else repr(path)


@contextlib.contextmanager
def _open(path: str) -> Iterator[IO[bytes]]:
    """The batch's lines as bytes: a file opened (and closed) here, or stdin (left open)."""
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        handle = open(path, "rb")  # noqa: SIM115 - closed below, after the batch
    except OSError as exc:
        raise ValidationError("--batch", f"cannot read {path!r}: {exc.strerror}") from None
    with handle:
        yield handle


def new_jobs(source: IO[bytes], defaults: dict[str, Any]) -> Iterator[NewJob]:
    """A NewJob per non-blank line, each checked as it is read (errors name the line)."""
    number = 0
    while True:
        line = source.readline(MAX_LINE_BYTES + 1)
        if not line:
            return
        number += 1
        if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
            raise ValidationError(f"line {number}", f"longer than {MAX_LINE_BYTES} bytes")
        if not line.strip():
            continue
        try:
            yield line_job(line, defaults)
        except ValidationError as exc:
            raise ValidationError(f"line {number}", str(exc)) from None


def line_job(line: bytes, defaults: dict[str, Any]) -> NewJob:
    """One line's job: its fields over the command line's defaults, checked by NewJob."""
    try:
        fields = payload_from_json(line)
    except ValidationError as exc:
        raise ValidationError("job", exc.message) from None
    if not isinstance(fields, dict):
        raise ValidationError("job", 'must be a JSON object like {"type": "email.send"}')
    unknown = sorted(set(fields) - LINE_FIELDS)
    if unknown:
        known = ", ".join(sorted(LINE_FIELDS))
        raise ValidationError(unknown[0], f"is not a job field (one of {known})")
    if "type" not in fields:
        raise ValidationError("type", "is required")
    options = {**defaults}
    for name in ("queue", "priority", "max_attempts", "concurrency_key"):
        if name in fields:
            options[name] = fields[name]
    if "delay" in fields:
        options["delay"] = _delay(fields["delay"])
    for name in ("priority", "max_attempts"):
        if isinstance(options[name], bool) or not isinstance(options[name], int):
            raise ValidationError(name, f"must be an integer, not {options[name]!r}")
    return NewJob(
        type=fields["type"],
        payload=fields.get("payload", {}),
        idempotency_key=fields.get("key"),
        **options,
    )


def _delay(value: object) -> dt.timedelta | None:
    if value is None:
        return None
    if isinstance(value, str):
        return parse_duration(value, "delay")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_duration(str(value), "delay")
    raise ValidationError("delay", f"must be a duration like '1h30m' or seconds, not {value!r}")
