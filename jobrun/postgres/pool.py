"""The connection pools (sync and asyncio), with production limits, opened and pinged.

``max_size = JOBRUN_CONCURRENCY + 8``: one connection per handler thread (a
commit callable holds one for the length of Complete) plus room for the
claim, heartbeat, completer and scheduler loops, so that busy handlers never
starve them. Every connection says what it is for in ``application_name``
(``jobrun-pool``, ``jobrun-listener``, ``jobrun-leader``, ...), is bounded
client-side (connect timeout, TCP keepalives), and its errors never carry
the password (:mod:`jobrun.postgres.dsn`). A new session's first statement
is guarded against a tiny role- or database-wide ``statement_timeout``
(:data:`~jobrun.postgres.session.POOL_SESSION_SETUP`, :data:`PING`).

Poolers (``JOBRUN_POOLER``, one of :data:`POOLERS`): ``none`` is PostgreSQL
itself, ``session`` a pooler that keeps a server session per client (all
works as direct), ``transaction`` one where each transaction may run on
another server session: no server-side prepared statements, no session
state (every jobrun setting is ``SET LOCAL`` or ``set_config(..., true)``),
and no LISTEN or session lock (the direct connection, ``JOBRUN_DIRECT_URL``,
takes those, else polling and the lease-row leader). ``auto``, the default,
detects a pooler at the ping for free: PostgreSQL sends its own pid as the
startup BackendKeyData, a pooler a key of its own, so the two differ exactly
when a pooler is in between; one found is treated as ``transaction`` (what
works behind either mode), and an INFO line says how to be explicit.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import psycopg
import psycopg.conninfo
from psycopg_pool import ConnectionPool

from jobrun.job import outage
from jobrun.job.errors import TransientError, ValidationError
from jobrun.postgres import dsn
from jobrun.postgres.forksafe import ForkSafePool
from jobrun.postgres.reconnect import RECONNECT_TIMEOUT
from jobrun.postgres.session import configure_pooled

log = logging.getLogger("jobrun")

POOLER_FIELD = "JOBRUN_POOLER"
POOLERS = ("auto", "none", "session", "transaction")
"""The values of ``JOBRUN_POOLER`` (see the module docs)."""
DEFAULT_POOLER = "auto"

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


def pooler_mode(value: object, field: str = POOLER_FIELD) -> str:
    """``value`` as one of :data:`POOLERS` (case and blanks ignored), or ValidationError."""
    mode = value.strip().lower() if isinstance(value, str) else value
    if mode not in POOLERS:
        raise ValidationError(field, f"{value!r}: must be one of {', '.join(POOLERS)}")
    assert isinstance(mode, str)
    return mode


PING = "SET LOCAL statement_timeout = 0; SELECT pg_backend_pid()"
"""The ping, in one simple-protocol round trip: the first statement of a cold
session, guarded as the pools' session set-up is against a tiny role- or
database-wide statement_timeout (LOCAL: nothing stays behind a pooler)."""

PING_ATTEMPTS = 3
"""How many cold sessions a ping tries when its statement is cancelled: the
guard is itself a statement, which a timeout of a millisecond or so cancels
now and then on a loaded server (each statement of the string is timed on
its own). Other failures (refused, bad password) are reported at once."""


def ping(conninfo: str, *, application_name: str = "jobrun-pool") -> bool:
    """Connect once and run one statement; a clear, password-free error if that fails.

    Returns whether the connection goes through a pooler: the backend pid
    the server reports differs from the one the connection was given at
    startup (see the module docs).
    """
    full = conninfo_with(conninfo, application_name=application_name)
    for attempt in range(PING_ATTEMPTS):
        try:
            with psycopg.connect(full, prepare_threshold=None) as conn:
                cur = conn.execute(PING)
                cur.nextset()
                row = cur.fetchone()
                return row is not None and row[0] != conn.info.backend_pid
        except psycopg.OperationalError as exc:
            failure = ping_failure(conninfo, exc)
            if not ping_again(exc, attempt):
                break
    # Raised outside the except block: the driver's error is not chained to it.
    raise failure


def ping_again(exc: psycopg.OperationalError, attempt: int) -> bool:
    """Whether a ping that failed with ``exc`` on its ``attempt`` (from 0) tries a
    new session: only when a statement timeout cancelled it (PING_ATTEMPTS)."""
    return isinstance(exc, psycopg.errors.QueryCanceled) and attempt + 1 < PING_ATTEMPTS


def ping_failure(conninfo: str, exc: psycopg.OperationalError) -> TransientError:
    """A failed ping as a clear, password-free error (either pool's)."""
    text = str(exc).strip()
    reason = dsn.redact_for(conninfo, text.splitlines()[-1] if text else type(exc).__name__)
    return TransientError(f"cannot connect to PostgreSQL at {describe(conninfo)}: {reason}")


def check_pool_args(concurrency: object, pooler: object) -> str:
    """Either pool's arguments checked before it connects; the pooler mode asked for."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise ValidationError("concurrency", "must be a positive int")
    return pooler_mode(pooler, "pooler")


def pool_options(
    conninfo: str,
    mode: str,
    pooled: bool,
    sizes: tuple[int, int | None, int | None],
    application_name: str,
    *,
    timeout: float,
) -> tuple[str, dict[str, Any]]:
    """The pooler mode decided (after the ping) and either pool's options.

    ``sizes`` is (concurrency, min_size, max_size). Autocommit: a lone
    statement is its own transaction (one round trip); the store opens
    explicit transactions where it needs more.
    """
    concurrency, min_size, max_size = sizes
    mode = resolve_pooler(conninfo, mode, pooled=pooled)
    if max_size is None:
        max_size = concurrency + RESERVED_CONNECTIONS
    return mode, {
        "conninfo": conninfo_with(conninfo, application_name=application_name),
        "kwargs": {"autocommit": True, **connection_kwargs(mode)},
        "min_size": min(min_size if min_size is not None else 4, max_size),
        "max_size": max_size,
        "timeout": timeout,
        "open": False,
        "reconnect_timeout": RECONNECT_TIMEOUT,
    }


def resolve_pooler(conninfo: str, pooler: str, *, pooled: bool) -> str:
    """The pooler mode to run ``conninfo`` with: ``pooler``, with ``auto`` decided.

    ``pooled`` is what the ping found. ``auto`` becomes ``transaction`` when
    a pooler answered (the safe guess, said in one INFO line), else
    ``none``; ``none`` when a pooler answered is kept, with a WARNING naming
    the setting, since only the operator knows the pooler's mode.
    """
    mode = pooler_mode(pooler)
    where = describe(conninfo)
    if mode == "auto":
        if not pooled:
            return "none"
        log.info(
            "jobrun: %s answers through a connection pooler (PgBouncer or similar: the backend "
            "pid differs from the one the connection was given); running as behind a transaction "
            "pooler: no prepared statements, no session state, LISTEN and the leader's lock only "
            "on JOBRUN_DIRECT_URL. Set %s=transaction or %s=session to say so",
            where,
            POOLER_FIELD,
            POOLER_FIELD,
        )
        return "transaction"
    if mode == "none" and pooled:
        log.warning(
            "jobrun: %s=none, but %s answers through a connection pooler (PgBouncer or "
            "similar); if it pools transactions, set %s=transaction",
            POOLER_FIELD,
            where,
            POOLER_FIELD,
        )
    return mode


def pooler_of(pool: Any) -> str:
    """The resolved pooler mode of a pool from :func:`open_pool` (``none`` for any other)."""
    mode = getattr(pool, "jobrun_pooler", None)
    if mode in ("none", "session", "transaction"):
        return str(mode)
    kwargs = getattr(pool, "kwargs", None) or {}
    return "transaction" if kwargs.get("prepare_threshold", 5) is None else "none"


def sync_conninfo(pool: Any) -> str:
    """A pool's connection string (the pool may hold a callable making it)."""
    given: Any = pool.conninfo
    return str(given() if callable(given) else given)


async def async_conninfo(pool: Any) -> str:
    """An asyncio pool's connection string (a callable making it may be async)."""
    given: Any = pool.conninfo
    text = given() if callable(given) else given
    if inspect.isawaitable(text):
        text = await text
    return str(text)


def connection_kwargs(pooler: str) -> dict[str, Any]:
    """psycopg connection arguments for a (resolved) pooler mode."""
    if pooler == "transaction":
        # A statement prepared on one server session is missing on the next.
        return {"prepare_threshold": None}
    return {}


def open_pool(
    conninfo: str,
    *,
    concurrency: int = 1,
    min_size: int | None = None,
    max_size: int | None = None,
    timeout: float = DEFAULT_POOL_TIMEOUT,
    application_name: str = "jobrun-pool",
    pooler: str = DEFAULT_POOLER,
) -> ConnectionPool[psycopg.Connection[Any]]:
    """Open a pool sized for ``concurrency`` handler threads, after a ping.

    ``pooler`` says whether ``conninfo`` goes through a connection pooler
    (``auto``, ``none``, ``session``, ``transaction``; see the module docs);
    the mode decided is the pool's ``jobrun_pooler`` (:func:`pooler_of`).

    ``max_size`` overrides ``concurrency + 8`` (tests and single-purpose
    tools only: a worker needs the reserve). ``timeout`` bounds how long a
    caller waits for a free connection before a clear ``PoolTimeout``
    (mapped to TransientError by the store).

    The pool reconnects within half a second of the server accepting
    connections again, however long it was away, and reports its attempts
    to the database's outage reporter (``pool.outage``; see
    :mod:`jobrun.postgres.reconnect`).

    The pool is fork-safe (:mod:`jobrun.postgres.forksafe`): a process
    forked after this call gets a fresh pool of its own, with the same
    settings, on first use, and never touches the parent's connections.
    """
    mode = check_pool_args(concurrency, pooler)
    pooled = ping(conninfo, application_name=application_name)
    sizes = (concurrency, min_size, max_size)
    mode, options = pool_options(conninfo, mode, pooled, sizes, application_name, timeout=timeout)
    pool = ForkSafePool(
        # Behind a transaction pooler no session state: a SET would stay on
        # one server session and be missing on the next. Every timestamp
        # jobrun reads is made UTC in Python there (jobrun.postgres.convert.utc).
        configure=None if mode == "transaction" else configure_pooled,
        name="jobrun",
        **options,
    )
    pool.jobrun_pooler = mode  # type: ignore[attr-defined]
    pool.outage = outage.for_database(describe(conninfo))
    pool.open(wait=True, timeout=max(timeout, 5.0))
    return pool
