"""Session helpers shared by the dedicated connections and the pools.

A pooled session and the long-lived dedicated ones (the listener, the
advisory-lock holder, the leader lease) meet the same hostile settings: a
role- or database-wide ``statement_timeout`` of a few milliseconds, an
``idle_session_timeout`` that kills an idle holder, a half-open network that
never answers. What guards them lives here, once, for notify, lock, leader
and both pools.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from jobrun.job.errors import ValidationError
from jobrun.postgres.convert import statement_timeout_setting, use_jsonb_values
from jobrun.postgres.deadline import shutdown_socket

DEFAULT_CHANNEL = "jobrun_jobs"
CHANNEL_PATTERN = re.compile(r"[a-z_][a-z0-9_]{0,62}")
"""A channel is an identifier: lower-case ASCII so LISTEN cannot case-fold it,
at most 63 bytes so PostgreSQL cannot truncate it (``pg_notify`` would then
notify a name nobody listens on)."""


def validate_channel(name: object, field: str = "channel") -> str:
    """``name`` if it is a valid channel identifier, else ValidationError."""
    if not isinstance(name, str) or not CHANNEL_PATTERN.fullmatch(name):
        raise ValidationError(
            field,
            f"{name!r} is not a valid channel name (1-63 characters of a-z 0-9 _, "
            "not starting with a digit)",
        )
    return name


def check_seconds(value: object, field: str, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValidationError(field, f"must be a number of seconds, not {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        raise ValidationError(
            field, f"must be a finite number of seconds {'>=' if allow_zero else '>'} 0"
        )
    return seconds


def backoff_delay(attempt: int, initial: float, maximum: float) -> float:
    """The pause before reconnect ``attempt`` (0-based): doubling from ``initial``,
    capped at ``maximum``, with "equal jitter" (uniform in [d/2, d]) so that many
    workers that lost the server together do not all come back at once."""
    delay = min(maximum, initial * (2 ** min(attempt, 32)))
    return random.uniform(delay / 2, delay)


class ProbeTimeout(psycopg.OperationalError):
    """The server did not answer in time; the connection was shut down."""


@contextlib.contextmanager
def interrupt_after(conn: psycopg.Connection[Any], seconds: float) -> Iterator[None]:
    """Bound the statements run on ``conn`` in this block by ``seconds``, client-side.

    ``statement_timeout`` cannot help when the network is half-open (the
    server never sees the query, or its answer never arrives). When the
    block is still running after ``seconds``, a watchdog shuts the
    connection's socket down: the blocked call fails, the connection is
    unusable afterwards (close it), and :class:`ProbeTimeout` is raised.
    Race-free: once the block has finished, the watchdog does nothing.
    """
    mutex = threading.Lock()
    state = {"done": False, "fired": False}

    def fire() -> None:
        with mutex:
            if state["done"]:
                return
            state["fired"] = True
            shutdown_socket(conn)

    timer = threading.Timer(seconds, fire)
    timer.name = "jobrun-probe-watchdog"
    timer.daemon = True
    timer.start()
    try:
        yield
    except psycopg.Error as exc:
        if state["fired"]:
            raise ProbeTimeout(f"no answer from the server within {seconds:g}s") from exc
        raise
    finally:
        with mutex:
            state["done"] = True
        timer.cancel()
    if state["fired"]:
        # The block finished but the socket is gone: report it all the same.
        raise ProbeTimeout(f"no answer from the server within {seconds:g}s")


def configure_session(conn: psycopg.Connection[Any], statement_timeout: float) -> None:
    """Session settings for a long-lived, mostly idle dedicated connection.

    ``idle_session_timeout`` (role or database wide) would kill a listener or a
    lock holder between probes; it is switched off for this session only.
    ``statement_timeout`` is set to the probe bound, so that a role-wide 1 ms
    cannot break our tiny statements and nothing of ours can run long.
    """
    conn.execute(
        "SELECT set_config('statement_timeout', %s, false),"
        " set_config('idle_in_transaction_session_timeout', '0', false)",
        [statement_timeout_setting(statement_timeout)],
    )
    if conn.info.server_version >= 140000:
        conn.execute("SELECT set_config('idle_session_timeout', '0', false)")


POOL_SESSION_SETUP = "SET statement_timeout = 0; SET TIME ZONE 'UTC'; RESET statement_timeout"
"""A new pooled session's settings, in one simple-protocol round trip: timestamps
come back in UTC whatever the server's or role's TimeZone. It is a cold
session's first statement (the time zone's data is read from disk then), so a
role- or database-wide statement_timeout of a few milliseconds could cancel
it, and the pool would then never hand out a connection; the timeout is off
for this one statement and back to the session's own value (RESET) after it."""


def configure_pooled(conn: psycopg.Connection[Any]) -> None:
    """The sync pool's ``configure``: :data:`POOL_SESSION_SETUP`, and jsonb
    loaded with jobrun's cached loader (:class:`~jobrun.postgres.convert.JsonbValues`)."""
    use_jsonb_values(conn)
    conn.execute(POOL_SESSION_SETUP)


async def configure_pooled_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """The asyncio pool's ``configure``: the same."""
    use_jsonb_values(conn)
    await conn.execute(POOL_SESSION_SETUP)
