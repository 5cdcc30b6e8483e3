"""The operator's ``jobrun``: batch enqueue, guarded bulk actions, short ids, completion.

Every test runs ``python -m jobrun`` as a real process against a real
PostgreSQL (stdin a pipe, or a pseudo-terminal where the prompt is tested).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobrun.client import Client
from jobrun.job.model import State

ROOT = Path(__file__).resolve().parents[2]
_AMBIENT = ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL", "COLUMNS")


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


def jobrun(dsn: str | None, *args: str, stdin: str | None = None, **env: str) -> Result:
    """``python -m jobrun ARGS`` in a pipe (stdin ``stdin``, or empty)."""
    environ = {k: v for k, v in os.environ.items() if k not in _AMBIENT}
    if dsn is not None:
        environ["DATABASE_URL"] = dsn
    environ.update(env)
    proc = subprocess.run(
        [sys.executable, "-m", "jobrun", *args],
        env=environ,
        cwd=ROOT,
        input=stdin or "",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def client(dsn: str) -> Iterator[Client]:
    with Client.connect(dsn) as c:
        yield c


def lines(*jobs: dict[str, Any]) -> str:
    return "".join(json.dumps(job) + "\n" for job in jobs)


# -- enqueue --batch ---------------------------------------------------------------------


def test_batch_enqueues_ten_thousand_jobs_from_stdin_in_seconds(dsn: str, client: Client) -> None:
    text = lines(*({"type": "email.send", "payload": {"n": n}} for n in range(10_000)))
    started = time.monotonic()
    result = jobrun(dsn, "enqueue", "--batch", "-", stdin=text)
    elapsed = time.monotonic() - started
    assert result.code == 0, result.err
    assert result.out == "enqueued 10000 jobs\n"
    assert elapsed < 20  # one process, one COPY: seconds (including the interpreter's start)
    depth = {d.queue: d.ready for d in client.depth()}
    assert depth == {"default": 10_000}


def test_batch_lines_carry_their_options_over_the_flags_defaults(
    dsn: str, client: Client, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text(
        lines(
            {"type": "a", "payload": {"x": 1}},
            {"type": "b", "queue": "other", "priority": 5, "max_attempts": 2, "key": "k1"},
        )
        + "\n"  # a blank line is skipped
        + lines({"type": "c", "delay": "1h30m", "concurrency_key": "tenant-1"})
    )
    result = jobrun(dsn, "enqueue", "--batch", str(path), "--queue", "bulk", "--json")
    assert result.code == 0, result.err
    assert result.json() == {"inserted": 3, "replayed": []}
    jobs = {j.type: j for q in ("bulk", "other") for j in client.list(queue=q)}
    assert (jobs["a"].queue, jobs["a"].payload) == ("bulk", {"x": 1})
    assert (jobs["b"].queue, jobs["b"].priority, jobs["b"].max_attempts) == ("other", 5, 2)
    assert jobs["b"].idempotency_key == "k1"
    delay = jobs["c"].run_at - jobs["c"].created_at
    assert 5399 <= delay.total_seconds() <= 5401
    assert jobs["c"].concurrency_key == "tenant-1"

    again = jobrun(dsn, "enqueue", "--batch", str(path), "--queue", "bulk")
    assert again.code == 0, again.err
    assert again.out.startswith("enqueued 2 jobs; 1 already enqueued under the same key")


@pytest.mark.parametrize(
    ("bad_line", "says"),
    [
        ("{not json", "line 3: job: is not valid JSON"),
        ('["a list"]', "line 3: job: must be a JSON object"),
        ('{"payload": {}}', "line 3: type: is required"),
        ('{"type": "t", "colour": "red"}', "line 3: colour: is not a job field"),
        ('{"type": "t", "priority": "high"}', "line 3: priority: must be an integer"),
        ('{"type": "t", "delay": "soon"}', "line 3: delay: 'soon' is not a duration"),
        ('{"type": ""}', "line 3: type:"),
    ],
)
def test_a_bad_line_is_named_by_its_number_and_nothing_is_written(
    dsn: str, client: Client, bad_line: str, says: str
) -> None:
    good = lines(*({"type": "t", "payload": {"n": n}} for n in range(2)))
    result = jobrun(dsn, "enqueue", "--batch", "-", stdin=good + bad_line + "\n" + good)
    assert result.code == 7, result.err
    assert result.out == ""
    assert result.err.startswith(f"jobrun: {says}"), result.err
    assert len(result.err.splitlines()) == 1
    assert client.list() == []


def test_a_bad_line_after_many_chunks_rolls_the_whole_batch_back(dsn: str, client: Client) -> None:
    good = lines(*({"type": "t", "payload": {"n": n}} for n in range(5000)))
    result = jobrun(dsn, "enqueue", "--batch", "-", stdin=good + "{oops}\n")
    assert result.code == 7
    assert result.err.startswith("jobrun: line 5001: job: is not valid JSON"), result.err
    assert client.depth() == []


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("enqueue", "t", "--batch", "-"), "enqueue --batch reads TYPE and payload"),
        (("enqueue", "--batch", "-", "--key", "k"), "one --key cannot name many jobs"),
        (("enqueue",), "give a job TYPE, or --batch FILE"),
    ],
)
def test_batch_flags_that_do_not_go_together_are_usage_errors(
    dsn: str, args: tuple[str, ...], says: str
) -> None:
    result = jobrun(dsn, *args, stdin=lines({"type": "t"}))
    assert result.code == 2
    assert says in result.err


def test_an_empty_or_missing_batch_is_a_validation_error(dsn: str, tmp_path: Path) -> None:
    empty = jobrun(dsn, "enqueue", "--batch", "-", stdin="\n\n")
    assert (empty.code, empty.err) == (7, "jobrun: --batch: stdin holds no job\n")
    missing = jobrun(dsn, "enqueue", "--batch", str(tmp_path / "nope.jsonl"))
    assert missing.code == 7
    assert "cannot read" in missing.err


def test_jobs_of_a_batch_are_the_same_as_single_enqueues(dsn: str, client: Client) -> None:
    text = lines({"type": "t", "payload": {"a": [1]}})
    result = jobrun(dsn, "enqueue", "--batch", "-", stdin=text)
    assert result.code == 0, result.err
    (job,) = client.list()
    assert (job.type, job.payload, job.state) == ("t", {"a": [1]}, State.QUEUED)


# -- bulk retry, cancel and purge: count, --dry-run, --yes, the prompt ----------------


def dead_jobs(client: Client, count: int, type_: str = "email.send") -> list[Any]:
    """``count`` dead jobs of ``type_`` (each claimed and failed for good)."""
    ids = [client.enqueue(type_, max_attempts=1).id for _ in range(count)]
    for job in client.store.claim("test-worker", ["default"], count, dt.timedelta(seconds=30)):
        client.store.fail(job, "boom", None, permanent=True)
    assert {client.get(i).state for i in ids} == {State.DEAD}
    return ids


def on_terminal(dsn: str, *args: str, answer: str) -> tuple[int, str]:
    """``python -m jobrun ARGS`` with stdin on a pseudo-terminal; types ``answer`` at the
    prompt. Returns the exit code and everything written on the terminal and stderr."""
    leader, follower = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in _AMBIENT}
    environ["DATABASE_URL"] = dsn
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobrun", *args],
        env=environ,
        cwd=ROOT,
        stdin=follower,
        stdout=subprocess.PIPE,
        stderr=follower,
    )
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + 60
    try:
        while b"[y/N]" not in seen and time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                seen += os.read(leader, 4096)
            elif proc.poll() is not None:
                break
        os.write(leader, answer.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
        while select.select([leader], [], [], 0.2)[0]:
            try:
                seen += os.read(leader, 4096)
            except OSError:  # EIO: the terminal closed
                break
    finally:
        os.close(leader)
    return proc.returncode, seen.decode() + out.decode()


def test_bulk_retry_off_a_terminal_without_yes_refuses_and_changes_nothing(
    dsn: str, client: Client
) -> None:
    ids = dead_jobs(client, 3)
    result = jobrun(dsn, "retry", "--state", "dead", "--type", "email.send")
    assert result.code == 9
    assert result.out == ""
    assert result.err == (
        "jobrun: not confirmed: would retry 3 jobs (state dead, type email.send); stdin is "
        "not a terminal, so pass --yes to go ahead (or --dry-run to look first)\n"
    )
    assert {client.get(i).state for i in ids} == {State.DEAD}


def test_bulk_dry_run_shows_the_count_and_a_sample_and_changes_nothing(
    dsn: str, client: Client
) -> None:
    ids = dead_jobs(client, 7)
    result = jobrun(dsn, "retry", "--state", "dead", "--dry-run", COLUMNS="80")
    assert result.code == 0, result.err
    first, *table, last = result.out.splitlines()
    assert first == "would retry 7 jobs (state dead); nothing changed (--dry-run)"
    assert len(table) == 6  # a header and five jobs
    assert last == "... and 2 more"
    as_json = jobrun(dsn, "cancel", "--state", "queued", "--dry-run", "--json").json()
    assert as_json == {"matched": 0, "sample": []}
    sample = jobrun(dsn, "retry", "--state", "dead", "--dry-run", "--json").json()
    assert sample["matched"] == 7
    assert [j["id"] for j in sample["sample"]] == [str(i) for i in ids[:5]]
    assert {client.get(i).state for i in ids} == {State.DEAD}


def test_bulk_retry_with_yes_acts_and_prints_the_count(dsn: str, client: Client) -> None:
    ids = dead_jobs(client, 3)
    result = jobrun(dsn, "retry", "--state", "dead", "--yes")
    assert (result.code, result.out) == (0, "retried 3 jobs\n"), result.err
    assert {client.get(i).state for i in ids} == {State.QUEUED}
    none = jobrun(dsn, "retry", "--state", "dead")  # nothing matches: no question to ask
    assert (none.code, none.out) == (0, "no jobs match; nothing changed\n")


def test_bulk_cancel_on_a_terminal_asks_and_acts_only_on_yes(dsn: str, client: Client) -> None:
    ids = [client.enqueue("t").id for _ in range(2)]
    code, text = on_terminal(dsn, "cancel", "--state", "queued", answer="n")
    assert code == 9
    assert "cancel 2 jobs (state queued)? [y/N]" in text
    assert "not confirmed: nothing changed" in text
    assert {client.get(i).state for i in ids} == {State.QUEUED}

    code, text = on_terminal(dsn, "cancel", "--state", "queued", answer="y")
    assert code == 0, text
    assert "cancelled 2 jobs" in text
    assert {client.get(i).state for i in ids} == {State.CANCELLED}


def test_purge_counts_then_needs_yes_off_a_terminal(
    dsn: str, client: Client, admin_dsn: str
) -> None:
    old = [client.cancel(client.enqueue("t").id).id for _ in range(2)]
    recent = client.cancel(client.enqueue("t").id).id
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE jobrun.jobs SET finished_at = now() - interval '10 days' WHERE id = ANY(%s)",
            [old],
        )
    dry = jobrun(dsn, "purge", "--older-than", "1d12h", "--dry-run")
    assert dry.code == 0, dry.err
    assert dry.out.startswith("would purge 2 jobs finished before 1d12h ago, finished 20")
    refused = jobrun(dsn, "purge", "--older-than", "7d")
    assert refused.code == 9
    assert "would purge 2 jobs" in refused.err
    assert len(client.list()) == 3
    done = jobrun(dsn, "purge", "--older-than", "7d", "--yes")
    assert (done.code, done.out) == (0, "purged 2 jobs\n"), done.err
    assert [j.id for j in client.list()] == [recent]


def test_a_single_id_dry_run_shows_the_job_and_leaves_it(dsn: str, client: Client) -> None:
    (job_id,) = dead_jobs(client, 1)
    result = jobrun(dsn, "retry", str(job_id), "--dry-run")
    assert result.code == 0, result.err
    assert result.out == f"would retry job {job_id} (now dead); nothing changed (--dry-run)\n"
    assert client.get(job_id).state == State.DEAD


# -- short ids, unique prefixes, the error column at 80 columns ---------------------------


def test_every_command_taking_an_id_takes_a_unique_prefix(dsn: str, client: Client) -> None:
    (dead_id,) = dead_jobs(client, 1)
    queued_id = client.enqueue("t").id
    full = str(dead_id)
    prefix = full[:20]  # past the millisecond: this job's alone
    got = jobrun(dsn, "get", prefix, "--json")
    assert (got.code, got.json()["id"]) == (0, full), got.err
    events = jobrun(dsn, "events", prefix.replace("-", "").upper(), "--json")
    assert events.code == 0, events.err
    assert {e["job_id"] for e in events.json()} == {full}
    retried = jobrun(dsn, "retry", prefix)
    assert (retried.code, retried.out) == (0, f"job {full} queued to run now\n"), retried.err
    cancelled = jobrun(dsn, "cancel", str(queued_id)[:20])
    assert (cancelled.code, cancelled.out) == (0, f"job {queued_id} cancelled\n"), cancelled.err
    older = jobrun(dsn, "list", "--before", str(queued_id)[:20], "--json")
    assert [j["id"] for j in older.json()] == [full]


def test_an_ambiguous_prefix_names_how_many_jobs_it_matches(dsn: str, client: Client) -> None:
    ids = [client.enqueue("t").id for _ in range(3)]
    texts = [str(i) for i in ids]
    n = 0
    while all(t[n] == texts[0][n] for t in texts):
        n += 1
    common = texts[0][:n]
    result = jobrun(dsn, "get", common)
    assert result.code == 7
    assert result.err == f"jobrun: ID: {common!r} is the start of 3 job ids: give more of the id\n"
    unknown = jobrun(dsn, "get", "ffff")
    assert (unknown.code, unknown.err) == (3, "jobrun: job with an id starting 'ffff' not found\n")
    bad = jobrun(dsn, "cancel", "xyz")
    assert bad.code == 7
    assert "is not a job id" in bad.err


def test_at_80_columns_list_shows_short_ids_that_get_takes_back_and_keeps_last_error(
    dsn: str, client: Client
) -> None:
    ids = dead_jobs(client, 4, type_="email.send")  # made in one millisecond or a few
    result = jobrun(dsn, "list", "--state", "dead", COLUMNS="80")
    assert result.code == 0, result.err
    header, *rows, _count = result.out.splitlines()
    assert header.split() == ["id", "queue", "type", "state", "attempts", "last_error"]
    assert all(len(line) <= 80 for line in rows)
    shown = [line.split()[0] for line in rows]
    assert len(shown[0]) < 36
    assert sorted(str(i) for i in ids) == sorted(
        next(str(i) for i in ids if str(i).startswith(s)) for s in shown
    )
    assert all(line.endswith("boom") for line in rows)
    for short in shown:  # unique: each one is a job's own
        got = jobrun(dsn, "get", short, "--json")
        assert got.code == 0, got.err
        assert got.json()["id"].startswith(short)


def test_a_long_error_is_cut_with_an_ellipsis_at_80_columns(dsn: str, client: Client) -> None:
    job_id = client.enqueue("t", max_attempts=1).id
    (job,) = client.store.claim("w", ["default"], 1, dt.timedelta(seconds=30))
    client.store.fail(job, "connection refused by upstream " * 10, None, permanent=True)
    result = jobrun(dsn, "list", COLUMNS="80")
    (row,) = result.out.splitlines()[1:-1]
    assert str(job_id).startswith(row.split()[0])
    assert len(row) == 80
    assert row.endswith("…")
    assert "connection refused" in row
    wide = jobrun(dsn, "list")  # a pipe without COLUMNS: the full id and run_at
    assert str(job_id) in wide.out
    assert "run_at" in wide.out.splitlines()[0]


# -- per-command help ---------------------------------------------------------------------


def _help(*command: str) -> str:
    result = jobrun(None, *command, "--help", COLUMNS="200")
    assert result.code == 0, result.err
    return result.out


def test_a_command_s_help_leaves_out_global_options_that_do_nothing_for_it() -> None:
    for command in (("get",), ("list",), ("events",), ("purge",), ("queues", "pause")):
        text = _help(*command)
        assert "--database-url" in text, command
        assert "--job-events" not in text, command
        assert "--notify-channel" not in text, command
    for command in (("enqueue",), ("worker",), ("retry",), ("queues", "resume")):
        text = _help(*command)
        assert "--job-events" in text, command
        assert "--notify-channel" in text, command
    embedded = _help("embedded", "start")
    assert "--database-url" not in embedded
    assert "--url" in embedded
    everything = _help()
    assert "--job-events" in everything  # jobrun --help still shows every global option


def test_a_global_option_left_out_of_a_help_is_still_accepted(dsn: str, client: Client) -> None:
    job_id = client.enqueue("t").id
    result = jobrun(dsn, "get", str(job_id), "--job-events", "terminal", "--notify-channel", "x")
    assert result.code == 0, result.err
    assert str(job_id) in result.out


# -- shell completion ---------------------------------------------------------------------


def _complete(script: Path, *words: str) -> list[str]:
    """What bash offers after ``words`` (the last one being completed), via the script."""
    quoted = " ".join("'" + w.replace("'", "'\\''") + "'" for w in words)
    program = (
        f"source {script}\n"
        f"COMP_WORDS=({quoted}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1))\n"
        '_jobrun; printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    proc = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [w for w in proc.stdout.splitlines() if w]


def test_bash_completion_completes_commands_options_choices_and_files(tmp_path: Path) -> None:
    result = jobrun(None, "completion", "bash")
    assert result.code == 0, result.err
    script = tmp_path / "jobrun.bash"
    script.write_text(result.out)
    assert "complete -F _jobrun jobrun" in result.out

    assert _complete(script, "jobrun", "en") == ["enqueue"]
    assert set(_complete(script, "jobrun", "queues", "")) >= {"pause", "resume", "limit", "list"}
    assert _complete(script, "jobrun", "--schema", "x", "queues", "pa") == ["pause"]
    assert _complete(script, "jobrun", "retry", "--d") == [
        "--database-url",
        "--direct-url",
        "--dry-run",
    ]
    assert "--job-events" not in _complete(script, "jobrun", "get", "--")
    assert _complete(script, "jobrun", "list", "--pooler", "") == [
        "auto",
        "none",
        "session",
        "transaction",
    ]
    assert _complete(script, "jobrun", "worker", "--log-level", "w") == ["warning"]
    assert _complete(script, "jobrun", "retry", "--state", "d") == ["dead"]
    (tmp_path / "jobs.jsonl").write_text("")
    assert _complete(script, "jobrun", "enqueue", "--batch", str(tmp_path / "jobs.")) == [
        str(tmp_path / "jobs.jsonl")
    ]
    assert _complete(script, "jobrun", "get", "--database-url", "") == []


def test_zsh_completion_is_the_same_function_through_bashcompinit() -> None:
    zsh = jobrun(None, "completion", "zsh")
    bash = jobrun(None, "completion", "bash")
    assert zsh.code == 0, zsh.err
    assert "bashcompinit" in zsh.out
    assert bash.out.split("_jobrun() {", 1)[1] == zsh.out.split("_jobrun() {", 1)[1]
    wrong = jobrun(None, "completion", "fish")
    assert wrong.code == 2
    assert "invalid choice" in wrong.err


# -- durations ----------------------------------------------------------------------------


def test_cli_flags_and_settings_take_compound_durations(dsn: str, client: Client) -> None:
    result = jobrun(dsn, "enqueue", "t", "--delay", "1h30m", "--json")
    assert result.code == 0, result.err
    job = client.get(result.json()["id"])
    assert 5399 <= (job.run_at - job.created_at).total_seconds() <= 5401
    bad = jobrun(dsn, "enqueue", "t", "--delay", "1h30")
    assert (bad.code, bad.err) == (
        7,
        "jobrun: --delay: '1h30' is not a duration (like 90s, 5m, 1h30m, 7d)\n",
    )
    env_bad = jobrun(dsn, "list", JOBRUN_LEASE_TTL="2x")
    assert env_bad.code == 7
    assert env_bad.err.startswith("jobrun: JOBRUN_LEASE_TTL: '2x' is not a duration")
    assert jobrun(dsn, "list", JOBRUN_LEASE_TTL="1m30s").code == 0
