"""deploy/: every file checked by the tool that reads it, and against the code it runs.

The systemd units go through ``systemd-analyze verify`` (skipped without it,
except under ``CI=true``, where .ci/run installs it and a missing tool
fails); the Kubernetes manifests through ``kubernetes-validate`` with the
schemas it bundles (offline, strict: an unknown field fails). Both carry
the command lines of ``jobrun``: each is parsed by the CLI's own parser,
so a flag renamed in the code fails here, not in a deployment. The worker's
stop timeouts must cover its shutdown grace (the default in code) plus what
follows the grace. The worker's and the scheduler's Deployments are run as
written (the test's handlers and database in place of the placeholders):
their probes' paths answer 200, and SIGTERM ends them, exit 0, within the
pod's termination grace.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from jobrun.cli.entry import build_parser
from jobrun.cli.exits import UsageError
from jobrun.config import parse_duration
from jobrun.worker.worker import ABANDONED_RELEASE_BOUND, DEFAULT_SHUTDOWN_GRACE
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
UNITS = sorted((DEPLOY / "systemd").glob("*.service"))
MANIFESTS = sorted((DEPLOY / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSION = "1.30.0"
"""The oldest Kubernetes the manifests are written for (fields newer than it fail)."""
STOP_MARGIN = dt.timedelta(seconds=15)
"""What a stop may take past the grace: cancelled handlers get up to 5 s, the
jobs of those that ignored it are given back within ABANDONED_RELEASE_BOUND,
and the pools and the scheduler close."""
CANCEL_WAIT = dt.timedelta(seconds=5)


def _systemd_analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        message = "systemd-analyze is not installed (Debian package: systemd)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{message}; CI=true: the unit files must be verified", pytrace=False)
        pytest.skip(message)
    return tool


def _unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A unit file's sections and their settings (a key may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


def _jobrun_argv(command: list[str]) -> list[str]:
    assert Path(command[0]).name == "jobrun", command
    return command[1:]


def _parses(argv: list[str]) -> Any:
    """The namespace the jobrun CLI makes of ``argv``; a usage error fails the test."""
    try:
        return build_parser().parse_args(argv)
    except (UsageError, SystemExit) as exc:
        pytest.fail(f"jobrun {shlex.join(argv)}: the CLI refuses it ({exc})")


def _documents() -> list[tuple[Path, dict[str, Any]]]:
    return [
        (path, doc)
        for path in MANIFESTS
        for doc in yaml.safe_load_all(path.read_text())
        if doc is not None
    ]


def _containers(kind: str, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    for _, doc in _documents():
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            pod = doc["spec"]["template"]["spec"]
            return pod, pod["containers"]
    raise AssertionError(f"no {kind} {name} in deploy/kubernetes")


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from secret>") for e in container.get("env", [])}


# -- systemd ---------------------------------------------------------------------


def test_there_is_a_unit_for_each_long_running_jobrun_command() -> None:
    names = {path.name for path in UNITS}
    assert {
        "jobrun-worker.service",
        "jobrun-scheduler.service",
        "jobrun-dashboard.service",
        "jobrun-migrate.service",
    } <= names


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verifies_the_unit_without_a_word(path: Path, tmp_path: Path) -> None:
    tool = _systemd_analyze()
    # The units name the virtualenv they expect (/srv/jobrun/venv), which this
    # machine has not: only that path is pointed at a stand-in executable.
    stand_in = tmp_path / "bin" / "jobrun"
    stand_in.parent.mkdir()
    stand_in.write_text("#!/bin/sh\nexit 0\n")
    stand_in.chmod(0o755)
    for unit in UNITS:  # the ordering dependencies (After=) resolve among them
        text = unit.read_text().replace("/srv/jobrun/venv/bin/jobrun", str(stand_in))
        (tmp_path / unit.name).write_text(text)
    result = subprocess.run(
        [tool, "verify", "--man=no", str(tmp_path / path.name)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout + result.stderr == "", result.stdout + result.stderr


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_each_units_command_line_is_one_the_jobrun_cli_accepts(path: Path) -> None:
    (start,) = _unit(path)["Service"]["ExecStart"]
    _parses(_jobrun_argv(shlex.split(start)))


def test_the_worker_unit_waits_for_the_shutdown_grace_and_what_follows_it() -> None:
    service = _unit(DEPLOY / "systemd" / "jobrun-worker.service")["Service"]
    env = dict(value.split("=", 1) for value in service["Environment"])
    grace = parse_duration(env["JOBRUN_SHUTDOWN_GRACE"], "JOBRUN_SHUTDOWN_GRACE")
    assert grace == DEFAULT_SHUTDOWN_GRACE
    (stop,) = service["TimeoutStopSec"]
    assert dt.timedelta(seconds=int(stop)) == grace + STOP_MARGIN
    assert service["KillSignal"] == ["SIGTERM"]
    args = _parses(_jobrun_argv(shlex.split(service["ExecStart"][0])))
    assert args.no_scheduler  # jobrun-scheduler.service runs it


# -- Kubernetes ------------------------------------------------------------------


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_kubernetes_validate_accepts_the_manifest_strictly(path: Path) -> None:
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_a_misspelt_flag_or_field_fails_the_checks() -> None:
    # The checks have teeth: the CLI's parser refuses a flag it lacks, and
    # kubernetes-validate's strict mode a field the schema lacks.
    with pytest.raises(pytest.fail.Exception, match="no-schedulr"):
        _parses(["worker", "--app", "myapp.jobs:registry", "--no-schedulr"])
    (_, doc), *_ = [(p, d) for p, d in _documents() if d["kind"] == "Deployment"]
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_there_is_a_deployment_for_the_worker_the_scheduler_and_the_dashboard() -> None:
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in _documents()}
    assert {
        ("Deployment", "jobrun-worker"),
        ("Deployment", "jobrun-scheduler"),
        ("Deployment", "jobrun-dashboard"),
        ("Service", "jobrun-dashboard"),
        ("Job", "jobrun-migrate"),
    } <= kinds


@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("Deployment", "jobrun-worker"),
        ("Deployment", "jobrun-scheduler"),
        ("Deployment", "jobrun-dashboard"),
        ("Job", "jobrun-migrate"),
    ],
)
def test_each_containers_command_is_one_the_jobrun_cli_accepts(kind: str, name: str) -> None:
    _, (container,) = _containers(kind, name)
    _parses(_jobrun_argv(container["command"] + container.get("args", [])))


@pytest.mark.parametrize("name", ["jobrun-worker", "jobrun-scheduler"])
def test_the_probes_ask_the_health_endpoints_on_the_port_jobrun_serves_them(name: str) -> None:
    _, (container,) = _containers("Deployment", name)
    env = _env(container)
    (port,) = container["ports"]
    assert port["containerPort"] == int(env["JOBRUN_HEALTH_PORT"])
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port["name"]}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port["name"]}


def test_the_dashboard_probes_its_port_because_every_request_needs_the_token() -> None:
    _, (container,) = _containers("Deployment", "jobrun-dashboard")
    assert "JOBRUN_DASHBOARD_TOKEN" in _env(container)
    args = _parses(_jobrun_argv(container["command"]))
    (port,) = container["ports"]
    assert args.bind.endswith(f":{port['containerPort']}")
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["tcpSocket"] == {"port": port["name"]}


def test_the_worker_pod_is_given_the_shutdown_grace_and_what_follows_it() -> None:
    pod, (container,) = _containers("Deployment", "jobrun-worker")
    grace = parse_duration(_env(container)["JOBRUN_SHUTDOWN_GRACE"], "JOBRUN_SHUTDOWN_GRACE")
    assert grace == DEFAULT_SHUTDOWN_GRACE
    assert dt.timedelta(seconds=pod["terminationGracePeriodSeconds"]) == grace + STOP_MARGIN
    assert CANCEL_WAIT + dt.timedelta(seconds=ABANDONED_RELEASE_BOUND) < STOP_MARGIN
    assert _parses(_jobrun_argv(container["command"])).no_scheduler


# -- the manifests' processes, run ---------------------------------------------

APP_MODULE = "tests.acceptance.lifecycle_app"
SERVING = re.compile(r"serving (?P<paths>/\S+(?:, /\S+)*) on http://127\.0\.0\.1:(?P<port>\d+)")


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code
    except OSError:
        return 0


@pytest.mark.parametrize("name", ["jobrun-worker", "jobrun-scheduler"])
def test_the_deployments_process_answers_its_probes_and_stops_within_the_pods_grace(
    name: str, dsn: str, tmp_path: Path
) -> None:
    # The container's command and environment as written, with the test's
    # handlers for myapp's, the test database for the secret, and any free
    # port on loopback (its log line names it) for the health port.
    pod, (container,) = _containers("Deployment", name)
    argv = [arg.replace("myapp.jobs", APP_MODULE) for arg in _jobrun_argv(container["command"])]
    env = {k: v for k, v in _env(container).items() if v != "<from secret>"}
    env |= {"DATABASE_URL": dsn, "JOBRUN_HEALTH_PORT": "0", "JOBRUN_OBSERVE_HOST": "127.0.0.1"}
    log = tmp_path / "process.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jobrun.cli", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            cwd=ROOT,
        )
    try:
        found = wait_for(lambda: SERVING.search(log.read_text()), timeout=60)
        base = f"http://127.0.0.1:{found['port']}"
        for probe in ("livenessProbe", "readinessProbe"):
            path = container[probe]["httpGet"]["path"]
            assert wait_for(lambda p=path: _status(base + p) == 200, timeout=30), log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(pod["terminationGracePeriodSeconds"]) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
