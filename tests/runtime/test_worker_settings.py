"""Settings that contradict each other: refused, or warned in one line, at start.

- a lease shorter than three heartbeats (``heartbeat_interval`` above a third
  of ``lease_ttl``) is refused: one late heartbeat would lose healthy leases
  and run their jobs twice;
- a ``commit_timeout`` longer than ``lease_ttl`` is warned: the completer
  gives a completion up when its lease runs out, so the commit timeout never
  applies in full (refusing it would refuse every worker that only shortened
  its lease, the default commit timeout being 30 s).

Each through the public paths: WorkerConfig, Settings, Runtime and the
``jobrun worker`` command.
"""

from __future__ import annotations

import datetime as dt
import logging

import pytest

import jobrun
from jobrun import cli
from jobrun.job.errors import ValidationError
from jobrun.worker import WorkerConfig

S = dt.timedelta(seconds=1)


@pytest.mark.parametrize(
    "make",
    [
        lambda: WorkerConfig(lease_ttl=5 * S, heartbeat_interval=2 * S),
        lambda: jobrun.Settings(lease_ttl=5 * S, heartbeat_interval=2 * S),
        lambda: jobrun.Settings.from_env(
            {"JOBRUN_LEASE_TTL": "5s", "JOBRUN_HEARTBEAT_INTERVAL": "2s"}
        ),
    ],
    ids=["WorkerConfig", "Settings", "environment"],
)
def test_a_lease_shorter_than_three_heartbeats_is_refused_naming_both(make: object) -> None:
    with pytest.raises(ValidationError) as caught:
        make()  # type: ignore[operator]
    message = str(caught.value)
    assert "\n" not in message
    assert "heartbeat_interval" in message and "lease_ttl" in message
    assert "2.0 s" in message and "5.0 s" in message


def test_the_jobrun_worker_command_refuses_such_a_lease_in_one_line(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        [
            "worker",
            "--database-url",
            dsn,
            "--app",
            "tests.acceptance.apps.touch:registry",
            "--lease-ttl",
            "5s",
            "--heartbeat-interval",
            "2s",
        ]
    )
    err = capsys.readouterr().err
    assert code == cli.EXIT_VALIDATION, err
    [line] = err.splitlines()
    assert "heartbeat_interval" in line and "lease_ttl" in line


def _contradictions(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno == logging.WARNING and "commit_timeout" in r.getMessage()
    ]


@pytest.mark.parametrize(
    ("commit_timeout", "warned"),
    [(30 * S, True), (10 * S, False), (None, False)],
    ids=["longer", "equal", "off"],
)
def test_a_commit_timeout_longer_than_the_lease_is_warned_at_start_in_one_line(
    commit_timeout: dt.timedelta | None,
    warned: bool,
    dsn: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="jobrun")
    registry = jobrun.Registry()
    settings = jobrun.Settings(
        database_url=dsn, lease_ttl=10 * S, heartbeat_interval=2 * S, commit_timeout=commit_timeout
    )
    with jobrun.Runtime(settings, registry, scheduler=False):
        pass
    records = _contradictions(caplog)
    if not warned:
        assert records == []
        return
    [record] = records
    line = record.getMessage()
    assert "\n" not in line
    for name in ("commit_timeout", "JOBRUN_COMMIT_TIMEOUT", "30.0 s", "lease_ttl", "10.0 s"):
        assert name in line
