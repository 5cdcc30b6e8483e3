"""Credentials: with a token every request needs it (401 otherwise); ``jobrun dashboard``
refuses to serve beyond loopback without one (exit code 7, saying why), serves
127.0.0.1:8080 by default, and with a token asks for it on any address.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest
from starlette.requests import HTTPConnection
from starlette.testclient import TestClient

from jobrun.job.errors import ValidationError
from jobrun.job.model import NewJob, State
from jobrun.postgres.store import Store
from jobrun.web import create_app
from jobrun.web.security import host_of
from jobrun.web.server import (
    DEFAULT_BIND,
    allowed_hosts,
    check_exposure,
    is_loopback,
    parse_bind,
)
from tests.web.test_app_support import csrf_of, parse

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "s3cret-token-for-the-dashboard"


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def test_with_a_token_every_request_without_it_gets_401(store: Store) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    with TestClient(create_app(store, auth=TOKEN)) as client:
        for path in (
            "/",
            "/jobs",
            f"/jobs/{job.id}",
            "/schedules",
            "/live/overview",
            "/static/jobrun.css",
            "/static/jobrun.js",
            "/nope",
        ):
            got = client.get(path)
            assert got.status_code == 401, path
            assert got.headers["www-authenticate"].startswith('Basic realm="jobrun dashboard"')
            assert "content-security-policy" in got.headers
        for headers in (
            {"Authorization": "Bearer wrong-token-wrong-token"},
            {"Authorization": f"Bearer {TOKEN}x"},
            {"Authorization": TOKEN},
            {"Authorization": "Basic !!notbase64"},
            basic("admin", "wrong"),
            basic(TOKEN, ""),
        ):
            assert client.get("/", headers=headers).status_code == 401, headers
        # an action without the token changes nothing, whatever it carries
        got = client.post(f"/jobs/{job.id}/cancel", data={"csrf": "x", "next": "/"})
        assert got.status_code == 401
        assert store.get(job.id).state is State.QUEUED

        assert client.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
        for user in ("admin", "", "anyone"):
            assert client.get("/jobs", headers=basic(user, TOKEN)).status_code == 200
        # a browser resends basic auth on every request, its actions included
        client.headers.update(basic("ops", TOKEN))
        page = client.get(f"/jobs/{job.id}")
        got = client.post(
            f"/jobs/{job.id}/cancel",
            data={"csrf": csrf_of(page.text), "next": f"/jobs/{job.id}"},
            follow_redirects=False,
        )
        assert got.status_code == 303
        assert store.get(job.id).state is State.CANCELLED


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ValueError, match="16"):
        create_app("postgresql://nowhere/db", auth="short")


def test_auth_may_be_a_callable_judging_the_request(store: Store) -> None:
    def allow(conn: HTTPConnection) -> bool:
        return conn.headers.get("x-role") == "ops"

    with TestClient(create_app(store, auth=allow)) as client:
        assert client.get("/").status_code == 401
        assert client.get("/", headers={"x-role": "ops"}).status_code == 200


def test_with_allowed_hosts_any_other_host_header_is_refused_400(store: Store) -> None:
    app = create_app(store, allowed_hosts=["127.0.0.1", "localhost", "[::1]"])
    for base in ("http://127.0.0.1:8080", "http://localhost", "http://[::1]:9000"):
        with TestClient(app, base_url=base) as client:
            assert client.get("/").status_code == 200, base
    for base in ("http://evil.example", "http://127.0.0.1.evil.example:8080", "http://testserver"):
        with TestClient(app, base_url=base) as client:
            got = client.get("/")
            assert got.status_code == 400, base
            assert "Host" in got.text and "content-security-policy" in got.headers
    assert host_of("[::1]:8080") == "::1" and host_of("LocalHost:80") == "localhost"
    assert host_of("example.com") == "example.com"


def test_binding_rules() -> None:
    assert parse_bind(DEFAULT_BIND) == ("127.0.0.1", 8080)
    assert parse_bind("[::1]:0") == ("::1", 0)
    assert parse_bind("0.0.0.0:9000") == ("0.0.0.0", 9000)
    for bad in ("8080", ":8080", "host:", "host:99999", "::1:80", "h:x"):
        with pytest.raises(ValidationError):
            parse_bind(bad)
    assert is_loopback("127.0.0.1") and is_loopback("127.8.9.1") and is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.0.0.1")
    assert not is_loopback("example.com")
    assert allowed_hosts("127.0.0.1", TOKEN) is None
    assert allowed_hosts("127.0.0.2", None) == ["127.0.0.1", "127.0.0.2", "::1", "localhost"]
    check_exposure("127.0.0.1", None)
    check_exposure("0.0.0.0", TOKEN)
    with pytest.raises(ValidationError, match="JOBRUN_DASHBOARD_TOKEN"):
        check_exposure("0.0.0.0", None)
    with pytest.raises(ValidationError, match="16 characters"):
        check_exposure("127.0.0.1", "short")


# -- the command -------------------------------------------------------------------


def env_with(dsn: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "JOBRUN_DASHBOARD_TOKEN"}
    env.update(DATABASE_URL=dsn, PYTHONPATH=str(ROOT), **extra)
    return env


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "jobrun", "dashboard", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize("bind", ["0.0.0.0:0", "[::]:0", "192.0.2.1:8080"])
def test_the_command_refuses_to_bind_beyond_loopback_without_a_token(dsn: str, bind: str) -> None:
    done = run_cli(env_with(dsn), "--bind", bind)
    assert done.returncode == 7, done
    assert done.stderr.startswith("jobrun: ") and done.stderr.count("\n") == 1
    assert "refusing" in done.stderr and "JOBRUN_DASHBOARD_TOKEN" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_command_refuses_a_short_token(dsn: str) -> None:
    done = run_cli(env_with(dsn, JOBRUN_DASHBOARD_TOKEN="abc"), "--bind", "127.0.0.1:0")
    assert done.returncode == 7 and "JOBRUN_DASHBOARD_TOKEN" in done.stderr


def test_the_command_listens_on_127_0_0_1_8080_by_default() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jobrun", "dashboard", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0
    assert "127.0.0.1:8080" in done.stdout and "--read-only" in done.stdout
    assert "JOBRUN_DASHBOARD_TOKEN" in done.stdout


@contextlib.contextmanager
def dashboard(env: dict[str, str], *args: str) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobrun", "dashboard", *args],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"dashboard on (http://\S+/)", line)
        assert match, (line, proc.poll())
        yield match.group(1), proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()


def fetch(
    url: str, headers: dict[str, str] | None = None, data: bytes | None = None
) -> tuple[int, str]:
    request = urllib.request.Request(url, headers=headers or {}, data=data)
    for _ in range(100):
        try:
            with urllib.request.urlopen(request, timeout=10) as reply:
                return reply.status, reply.read().decode()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read().decode()
        except urllib.error.URLError:
            time.sleep(0.1)
    raise AssertionError(f"{url} never answered")


def test_the_command_with_a_token_serves_any_address_and_asks_for_it(
    dsn: str, store: Store
) -> None:
    store.enqueue(NewJob(type="t", queue="served"))
    env = env_with(dsn, JOBRUN_DASHBOARD_TOKEN=TOKEN)
    with dashboard(env, "--bind", "0.0.0.0:0") as (url, proc):
        assert url.startswith("http://0.0.0.0:")
        local = url.replace("0.0.0.0", "127.0.0.1")
        status, body = fetch(local)
        assert status == 401 and "token" in body
        status, body = fetch(local, {"Authorization": f"Bearer {TOKEN}"})
        assert status == 200
        doc = parse(body)
        assert {r.attrs["data-queue"] for r in doc.select("tr", cls="queue-row")} == {"served"}
        assert not doc.has_id("read-only-badge")
    assert proc.returncode == 0


def test_the_command_in_read_only_mode_shows_and_accepts_no_action(dsn: str, store: Store) -> None:
    job = store.enqueue(NewJob(type="t", queue="q"))
    with dashboard(env_with(dsn), "--bind", "127.0.0.1:0", "--read-only") as (url, _proc):
        status, body = fetch(url + f"jobs/{job.id}")
        assert status == 200
        doc = parse(body)
        assert doc.has_id("read-only-badge") and not doc.has_id("cancel-job")
        status, _ = fetch(url + f"jobs/{job.id}/cancel", data=b"csrf=x&next=/")
        assert status == 403
    assert store.get(job.id).state is State.QUEUED


def with_password(dsn: str) -> tuple[str, str]:
    """``dsn`` with a password (one of its own, or a made-up one the server's trust auth
    ignores), and that password."""
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    if params.get("password"):
        return dsn, str(params["password"])
    params["password"] = "pw-" + uuid.uuid4().hex
    url = psycopg.conninfo.make_conninfo("", **params)
    try:
        psycopg.connect(url).close()
    except psycopg.OperationalError:
        pytest.skip("the test server checks passwords and this DSN has none to hide")
    return url, str(params["password"])


def test_the_command_says_where_it_serves_without_the_password(dsn: str, store: Store) -> None:
    url_with_password, password = with_password(dsn)
    store.enqueue(NewJob(type="t", queue="q"))
    with dashboard(env_with(url_with_password), "--bind", "127.0.0.1:0") as (url, proc):
        assert url.startswith("http://127.0.0.1:")
        for path in ("", "jobs", "schedules", "jobs?state=nope"):
            status, body = fetch(url + path)
            assert status in (200, 400)
            assert password not in body
        target = parse(fetch(url)[1]).by_id("db-target").text
        assert "@" in target
        # without a token, a page that renamed its host (DNS rebinding) is not served
        port = url.rsplit(":", 1)[1].rstrip("/")
        assert fetch(url, {"Host": f"evil.example:{port}"})[0] == 400
        assert fetch(url, {"Host": f"localhost:{port}"})[0] == 200
    assert proc.returncode == 0
