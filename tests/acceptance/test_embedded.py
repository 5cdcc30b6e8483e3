"""The embedded PostgreSQL stays put and stays private (real processes, real servers).

Each test has its own ``JOBRUN_EMBEDDED_DIR``; the command runs as a process
without ``DATABASE_URL``, so it falls back to the embedded cluster there.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from jobrun.postgres import embedded
from tests.acceptance.conftest import FAST_ENV
from tests.acceptance.embedded_home import EmbeddedHome, embedded_home

pytestmark = pytest.mark.slow


@pytest.fixture
def home() -> Iterator[EmbeddedHome]:
    with embedded_home() as h:
        yield h


@pytest.fixture
def other_home() -> Iterator[EmbeddedHome]:
    with embedded_home() as h:
        yield h


def test_restart_keeps_the_url_and_the_old_url_connects_again(home: EmbeddedHome) -> None:
    url = home.start()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (42)")
    before_stop = psycopg.connect(url, autocommit=True)

    stopped = home.jobrun("embedded", "stop", "--json")
    assert stopped.code == 0, stopped
    assert stopped.json()["stopped"] is True
    with pytest.raises(psycopg.OperationalError):  # the server really went away
        before_stop.execute("SELECT 1")
    before_stop.close()
    status = home.jobrun("embedded", "status")
    assert status.out.startswith("not running"), status
    assert url in status.out  # where it will be again

    again = home.jobrun("embedded", "start", "--json").json()
    assert again["started"] is True
    assert again["url"] == url
    with psycopg.connect(url) as conn:  # the URL copied before the stop
        assert conn.execute("SELECT n FROM kept").fetchall() == [(42,)]


def test_a_running_worker_carries_on_after_a_restart(home: EmbeddedHome, tmp_path: Path) -> None:
    home.start()
    assert home.jobrun("migrate").code == 0
    log = tmp_path / "worker.log"
    worker = home.popen(
        "worker", "--app", "tests.acceptance.apps.touch:registry", env=FAST_ENV, log=log
    )
    try:

        def touched(name: str) -> bool:
            target = tmp_path / name
            assert home.jobrun("enqueue", "touch", json.dumps({"path": str(target)})).code == 0
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and worker.poll() is None:
                if target.exists():
                    return True
                time.sleep(0.1)
            return False

        assert touched("before")
        assert home.jobrun("embedded", "stop").code == 0
        time.sleep(2)  # the worker notices
        assert home.jobrun("embedded", "start").code == 0
        assert touched("after"), log.read_text()
        assert worker.poll() is None
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.communicate(timeout=60)


def test_a_taken_port_is_a_clear_error_and_never_a_new_address(home: EmbeddedHome) -> None:
    url = home.start()
    port = psycopg.conninfo.conninfo_to_dict(url)["port"]
    assert home.jobrun("embedded", "stop").code == 0

    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", int(str(port))))
        squatter.listen()
        taken = home.jobrun("embedded", "start")
        assert taken.code == 6, taken
        lines = taken.err.splitlines()
        assert len(lines) == 1, taken.err
        assert f"port {port}" in lines[0]
        assert "taken by another program" in lines[0]
        assert str(home.path / "port") in lines[0]

    assert home.start() == url


def test_falling_back_says_so_on_one_line_with_the_data_dir_and_url(home: EmbeddedHome) -> None:
    first = home.jobrun("migrate")
    assert first.code == 0, first
    (line,) = [x for x in first.err.splitlines() if "embedded" in x]
    url = home.start()
    assert line == (
        f"jobrun: no DATABASE_URL; started the embedded PostgreSQL at {url} "
        f"(data in {home.path / 'data'})"
    )
    again = home.jobrun("depth")
    assert again.code == 0, again
    assert f"reusing the embedded PostgreSQL at {url}" in again.err


def test_two_embedded_dirs_are_two_independent_clusters(
    home: EmbeddedHome, other_home: EmbeddedHome
) -> None:
    url_a, url_b = home.start(), other_home.start()
    assert url_a != url_b
    with psycopg.connect(url_a, autocommit=True) as conn:
        conn.execute("CREATE TABLE only_in_a ()")
        a_dir = conn.execute("SHOW data_directory").fetchone()
    with psycopg.connect(url_b) as conn:
        exists = conn.execute("SELECT to_regclass('only_in_a') IS NOT NULL").fetchone()
        b_dir = conn.execute("SHOW data_directory").fetchone()
    assert exists == (False,)
    assert a_dir == (str(home.path / "data"),)
    assert b_dir == (str(other_home.path / "data"),)

    assert home.jobrun("embedded", "stop").code == 0
    with psycopg.connect(url_b) as conn:  # B does not care
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert other_home.jobrun("embedded", "status", "--json").json()["running"] is True
    assert home.jobrun("embedded", "status", "--json").json()["running"] is False


def test_the_embedded_dir_and_its_data_are_closed_to_other_users(home: EmbeddedHome) -> None:
    home.start()
    for path in (home.path, home.path / "data"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == 0o700, f"{path}: {oct(mode)}"
    if os.geteuid() != 0:
        assert home.path.stat().st_uid == os.geteuid()
        return
    server = pwd.getpwnam(embedded.UNPRIVILEGED_USER)
    assert home.path.stat().st_uid == server.pw_uid  # the server user can enter; root can anyway
    assert (home.path / "data").stat().st_uid == server.pw_uid
    nobody = pwd.getpwnam("nobody")
    for path in (home.path, home.path / "data"):
        listing = subprocess.run(
            ["ls", str(path)],
            user=nobody.pw_uid,
            group=nobody.pw_gid,
            capture_output=True,
            check=False,
        )
        assert listing.returncode != 0, f"{path} is readable by nobody"


def test_other_users_can_neither_read_the_password_nor_log_in(home: EmbeddedHome) -> None:
    url = home.start()
    assert "password" not in url
    passfile = home.path / "pgpass"
    assert f"passfile={passfile}" in url
    assert stat.S_IMODE(passfile.stat().st_mode) == 0o600
    assert passfile.stat().st_uid == os.geteuid()

    without_passfile = url.split("?")[0]  # what anyone on this machine could try
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(without_passfile).close()
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("postgres",)

    psql = shutil.which("psql")
    if os.geteuid() != 0 or psql is None:
        return
    nobody = pwd.getpwnam("nobody")
    for who, attempt in (("root", url), ("nobody", url), ("nobody", without_passfile)):
        user = nobody if who == "nobody" else None
        proc = subprocess.run(
            [psql, attempt, "-XAtc", "SELECT 1"],
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
            env={"HOME": "/", "PATH": "/usr/bin:/bin", "PGCONNECT_TIMEOUT": "5"},
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert (proc.returncode == 0) == (who == "root"), (who, attempt, proc)


# -- where the directory is (unit level) ----------------------------------------------------


def test_the_default_dir_is_per_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("JOBRUN_EMBEDDED_DIR", raising=False)
    homes = {uid: embedded.default_home(uid) for uid in (0, 1000, 1001, 65534, 4242424)}
    assert len(set(homes.values())) == len(homes), homes
    assert embedded.default_home() == embedded.default_home(os.getuid())
    assert embedded.default_home(0) == Path(tempfile.gettempdir()) / "jobrun-embedded-0"


def test_jobrun_embedded_dir_overrides_the_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("JOBRUN_EMBEDDED_DIR", str(tmp_path / "mine"))
    assert embedded.default_home() == tmp_path / "mine"
    assert embedded.default_home(0) != tmp_path / "mine"  # another user's is not overridden


def test_a_directory_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    crowded = tmp_path / "crowded"
    crowded.mkdir()
    (crowded / "notes.txt").write_text("someone's files")
    mode = crowded.stat().st_mode
    with pytest.raises(embedded.ClusterError, match="not a jobrun embedded directory"):
        embedded.prepare_home(crowded)
    assert crowded.stat().st_mode == mode  # untouched
    link = tmp_path / "link"
    link.symlink_to(crowded)
    with pytest.raises(embedded.ClusterError, match="not a directory"):
        embedded.prepare_home(link)
    if os.geteuid() == 0:
        squatted = tmp_path / "squatted"
        squatted.mkdir()
        os.chown(squatted, 65534, 65534)
        with pytest.raises(embedded.ClusterError, match="belongs to uid 65534"):
            embedded.prepare_home(squatted)


def test_start_with_url_prints_only_a_url_a_shell_can_export(home: EmbeddedHome) -> None:
    url = home.start()
    printed = home.jobrun("embedded", "start", "--url")
    assert printed.code == 0, printed
    assert printed.out == url + "\n"  # nothing else on stdout: $(...) takes it whole
    with psycopg.connect(printed.out.strip(), autocommit=True) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
