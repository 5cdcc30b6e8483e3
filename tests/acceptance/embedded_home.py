"""A private ``JOBRUN_EMBEDDED_DIR`` for a test, and the ``jobrun`` command run against it.

The command runs as a real process with no ``DATABASE_URL``, so it falls back
to the embedded PostgreSQL of that directory: a test never touches the real
user's cluster. The directory sits under the temp dir (its parents open to
traversal), because as root the server runs as an unprivileged user that
must reach it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

# Run as from a terminal: Ctrl-C raises KeyboardInterrupt even when the test
# runner itself was started with SIGINT ignored (a background job).
AS_FROM_A_TERMINAL = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from jobrun.cli import main; sys.exit(main(sys.argv[1:]))"
)


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


@dataclasses.dataclass
class EmbeddedHome:
    path: Path

    def env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("DATABASE_URL", "JOB_EVENTS", "JOBRUN_NOTIFY_CHANNEL")
        }
        env["JOBRUN_EMBEDDED_DIR"] = str(self.path)
        env["PYTHONPATH"] = str(ROOT)
        return env

    def jobrun(self, *args: str, timeout: float = 120) -> Result:
        proc = subprocess.run(
            [sys.executable, "-m", "jobrun.cli", *args],
            env=self.env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    def popen(
        self, *args: str, env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen[str]:
        """The command in the background; stdout and stderr piped, or both into ``log``."""
        with contextlib.ExitStack() as stack:
            out = stack.enter_context(open(log, "w")) if log else None
            return subprocess.Popen(
                [sys.executable, "-c", AS_FROM_A_TERMINAL, *args],
                env={**self.env(), **(env or {})},
                cwd=ROOT,
                stdout=out or subprocess.PIPE,
                stderr=subprocess.STDOUT if out else subprocess.PIPE,
                text=True,
            )

    def start(self) -> str:
        """``jobrun embedded start``; returns the URL."""
        result = self.jobrun("embedded", "start", "--json")
        assert result.code == 0, result
        url: str = result.json()["url"]
        return url


@contextlib.contextmanager
def embedded_home() -> Iterator[EmbeddedHome]:
    root = Path(tempfile.mkdtemp(prefix="jobrun-test-home-"))
    os.chmod(root, 0o755)
    home = EmbeddedHome(root / "home")
    try:
        yield home
    finally:
        stop_server(home.path / "data")
        shutil.rmtree(root, ignore_errors=True)


def stop_server(datadir: Path, timeout: float = 30) -> None:
    """Fast shutdown of the server on ``datadir`` (SIGINT to its postmaster), if one runs."""
    try:
        pid = int((datadir / "postmaster.pid").read_text().splitlines()[0])
        os.kill(pid, signal.SIGINT)
    except (OSError, ValueError, IndexError):
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            return
        time.sleep(0.1)
