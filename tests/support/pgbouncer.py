"""A real PgBouncer in front of the test PostgreSQL, for the pooler suite.

:class:`PgBouncer` starts Debian's ``pgbouncer`` (1.18 on bookworm) as a
child process on 127.0.0.1 and a free port, in ``transaction`` or
``session`` pooling mode, with a wildcard database entry: every per-test
database of the server is reachable through it under its own name.
PgBouncer, like PostgreSQL, refuses to run as root, so as root it runs as
the unprivileged user the embedded PostgreSQL uses (``jobrun-pg``), from a
directory of that user's.

Authentication: clients are trusted (the listener is loopback only); to log
into the server PgBouncer uses the passwords of ``users`` (written to its
``auth_file``), so the runtime role's scram login works through it.

Without the binary, :func:`pgbouncer_binary` returns None; the fixtures then
skip, except with ``CI=true``, where a missing PgBouncer is a failure (the
CI installs it, so its absence is a broken CI, not a gap to hide).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import psycopg.conninfo

from jobrun.postgres.embedded import _run_as, free_port

CANDIDATES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


def pgbouncer_binary() -> str | None:
    """The pgbouncer executable, or None when it is not installed."""
    found = os.environ.get("JOBRUN_TEST_PGBOUNCER") or shutil.which("pgbouncer")
    if found:
        return found
    return next((c for c in CANDIDATES if Path(c).exists()), None)


def ci() -> bool:
    """Whether we run in CI, where a missing pgbouncer must fail the suite."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


class PgBouncer:
    """One PgBouncer process (see the module docs). ``start``/``stop`` are idempotent."""

    def __init__(
        self,
        server_dsn: str,
        *,
        pool_mode: str = "transaction",
        users: dict[str, str] | None = None,
        pool_size: int = 20,
        binary: str | None = None,
        listen_addr: str = "127.0.0.1",
    ) -> None:
        if pool_mode not in ("transaction", "session", "statement"):
            raise ValueError(pool_mode)
        params = psycopg.conninfo.conninfo_to_dict(server_dsn)
        self.server_host = str(params.get("host") or "127.0.0.1")
        self.server_port = int(params.get("port") or 5432)
        self.pool_mode = pool_mode
        self.users = dict(users or {})
        self.pool_size = pool_size
        self.listen_addr = listen_addr
        """PgBouncer's ``listen_addr``: loopback, or a comma list (the scale test's hosts)."""
        self.binary = binary or pgbouncer_binary()
        if self.binary is None:
            raise FileNotFoundError("pgbouncer is not installed (apt-get install pgbouncer)")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"jobrun-pgbouncer-{pool_mode}-"))
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle ------------------------------------------------------------

    def _write(self, name: str, text: str) -> Path:
        path = self.dir / name
        path.write_text(text)
        return path

    def config(self) -> str:
        return "\n".join(
            [
                "[databases]",
                f"* = host={self.server_host} port={self.server_port}",
                "[pgbouncer]",
                f"listen_addr = {self.listen_addr}",
                f"listen_port = {self.port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"auth_file = {self.dir / 'users.txt'}",
                f"pool_mode = {self.pool_mode}",
                "max_client_conn = 2000",
                f"default_pool_size = {self.pool_size}",
                "reserve_pool_size = 0",
                "server_lifetime = 3600",
                "server_idle_timeout = 60",
                # A per-test database is dropped WITH (FORCE) while PgBouncer
                # may still hold server connections to it: forget them fast.
                "server_check_delay = 1",
                f"logfile = {self.dir / 'pgbouncer.log'}",
                f"pidfile = {self.dir / 'pgbouncer.pid'}",
                "admin_users = postgres",
                "ignore_startup_parameters = extra_float_digits",
                "",
            ]
        )

    def start(self, timeout: float = 20.0) -> None:
        if self._proc is not None:
            return
        user = _run_as()
        users = "".join(f'"{name}" "{password}"\n' for name, password in self.users.items())
        self._write("users.txt", users or '"postgres" ""\n')
        ini = self._write("pgbouncer.ini", self.config())
        if user is not None:
            for path in (self.dir, *self.dir.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
        os.chmod(self.dir, 0o700)
        # The log goes to the logfile; stderr (start-up errors) to a file too:
        # a pipe nobody reads fills up and blocks PgBouncer for good.
        with open(self.dir / "stderr.log", "wb") as stderr:
            self._proc = subprocess.Popen(
                [self.binary, "--quiet", str(ini)],
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                cwd=str(self.dir),
                user=user.pw_uid if user else None,
                group=user.pw_gid if user else None,
            )
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                err = (self.dir / "stderr.log").read_text(errors="replace")
                self._proc = None
                raise RuntimeError(f"pgbouncer exited at start: {err.strip()}\n{self.log()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"pgbouncer did not listen within {timeout}s\n{self.log()}")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self) -> str:
        try:
            return (self.dir / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    # -- connecting -------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """The pgbouncer process (for its CPU time), while it runs."""
        return self._proc.pid if self._proc is not None else None

    def dsn(self, server_dsn: str, host: str = "127.0.0.1") -> str:
        """``server_dsn`` (same user, password and database) through this PgBouncer,
        at ``host`` (one of its listen addresses)."""
        params = psycopg.conninfo.conninfo_to_dict(server_dsn)
        params.pop("passfile", None)
        params.update(host=host, port=str(self.port))
        return psycopg.conninfo.make_conninfo("", **params)

    def admin(self, command: str) -> list[tuple[object, ...]]:
        """Run a PgBouncer console command (``SHOW POOLS``, ``RECONNECT``) as ``postgres``."""
        with psycopg.connect(
            host="127.0.0.1", port=self.port, dbname="pgbouncer", user="postgres", autocommit=True
        ) as conn:
            cur = conn.execute(command, prepare=False)
            return list(cur.fetchall()) if cur.description else []
