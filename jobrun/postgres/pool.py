"""The connection pool, with production limits, opened and pinged.

``max_size = WORKER_CONCURRENCY + 8``: one connection per handler thread
(a commit callable holds one for the length of Complete) plus room for the
claim loop, the heartbeat loop, the completer and the scheduler, so that
those loops are never starved by busy handlers.

Every connection jobrun opens says what it is for in ``application_name``
(``jobrun-pool``, ``jobrun-listener``, ``jobrun-leader``, ``jobrun-migrate``),
so operators (``pg_stat_activity``) and tests (``pg_terminate_backend``) can
tell them apart. Every connection is bounded client-side: a connect timeout
and TCP keepalives, so a half-open network cannot hang a thread forever.

Error messages never carry the password: :mod:`jobrun.postgres.dsn` parses
and normalises every connection string and removes its secrets from the
driver messages that might echo one.
"""

from __future__ import annotations

from typing import Any

import psycopg
import psycopg.conninfo
from psycopg_pool import ConnectionPool

from jobrun.job.errors import TransientError, ValidationError
from jobrun.postgres import dsn
from jobrun.postgres.forksafe import ForkSafePool

RESERVED_CONNECTIONS = 8
DEFAULT_CONNECT_TIMEOUT = 10
DEFAULT_POOL_TIMEOUT = 30.0

# Client-side bounds applied unless the connection string sets them itself.
_CLIENT_DEFAULTS: dict[str, Any] = {
    "connect_timeout": DEFAULT_CONNECT_TIMEOUT,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    # Data sent into a dead link is unacknowledged, which keepalives ignore:
    # this bounds it (milliseconds; Linux, libpq 12+).
    "tcp_user_timeout": 20_000,
}


def conninfo_with(conninfo: str, **overrides: Any) -> str:
    """``conninfo`` with client-side defaults filled in and ``overrides`` applied.

    Accepts every form :mod:`jobrun.postgres.dsn` does (libpq URLs and
    key=value strings, SQLAlchemy's ``postgresql+psycopg://`` and kin);
    raises ValidationError (without the password) when the string cannot be
    parsed.
    """
    params: dict[str, Any] = dict(dsn.parse(conninfo))
    for name, value in _CLIENT_DEFAULTS.items():
        params.setdefault(name, value)
    params.update(overrides)
    return psycopg.conninfo.make_conninfo("", **params)


def describe(conninfo: str) -> str:
    """A password-free description of where ``conninfo`` points, for messages."""
    return dsn.describe(conninfo)


def ping(conninfo: str, *, application_name: str = "jobrun-pool") -> None:
    """Connect once and run ``SELECT 1``; a clear, password-free error if that fails."""
    full = conninfo_with(conninfo, application_name=application_name)
    try:
        with psycopg.connect(full) as conn:
            conn.execute("SELECT 1")
        return
    except psycopg.OperationalError as exc:
        text = str(exc).strip()
        reason = dsn.redact_for(conninfo, text.splitlines()[-1] if text else type(exc).__name__)
    # Raised outside the except block: the driver's error is not chained to it.
    raise TransientError(f"cannot connect to PostgreSQL at {describe(conninfo)}: {reason}")


def _configure(conn: psycopg.Connection[Any]) -> None:
    # Timestamps come back in UTC whatever the server's or role's TimeZone.
    conn.execute("SET TIME ZONE 'UTC'")


def open_pool(
    conninfo: str,
    *,
    concurrency: int = 1,
    min_size: int | None = None,
    max_size: int | None = None,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    application_name: str = "jobrun-pool",
) -> ConnectionPool[psycopg.Connection[Any]]:
    """Open a pool sized for ``concurrency`` handler threads, after a ping.

    ``max_size`` overrides ``concurrency + 8`` (tests and single-purpose
    tools only: a worker needs the reserve). ``timeout`` bounds how long a
    caller waits for a free connection before a clear ``PoolTimeout``
    (mapped to TransientError by the store).

    The pool is fork-safe (:mod:`jobrun.postgres.forksafe`): a process
    forked after this call gets a fresh pool of its own, with the same
    settings, on first use, and never touches the parent's connections.
    """
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValidationError("concurrency", "must be a positive int")
    full = conninfo_with(conninfo, application_name=application_name)
    ping(conninfo, application_name=application_name)
    if max_size is None:
        max_size = concurrency + RESERVED_CONNECTIONS
    # Autocommit: a lone statement is its own transaction (one round trip);
    # Store._with_tx opens explicit transactions where it needs more.
    pool = ForkSafePool(
        full,
        kwargs={"autocommit": True},
        configure=_configure,
        min_size=min(min_size if min_size is not None else 4, max_size),
        max_size=max_size,
        timeout=timeout,
        name="jobrun",
        open=False,
        reconnect_timeout=300.0,
    )
    pool.open(wait=True, timeout=max(timeout, 5.0))
    return pool
