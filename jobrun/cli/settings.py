"""From the flags and the environment to Settings, a database URL and a client.

Every setting comes from the environment (:mod:`jobrun.config`), overridden
by the flags given; a flag not given is None (the global options are absent
from the namespace unless given), so :func:`settings_from` applies only what
the user typed. Without ``--database-url`` the command reads
``DATABASE_URL``, and without that it starts (or reuses) the embedded
PostgreSQL, saying so on stderr in one line (:func:`database_url`).

Every command but ``migrate`` checks the schema's version once, when its
client connects (:func:`open_client`), and stops with exit code 8 when it
is missing, older or newer than this jobrun. The URL's password is added to
:data:`LOG_SECRETS` as soon as it is known: a worker's log lines mask it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import os
from collections.abc import Iterator
from typing import Any

from jobrun.client import Client
from jobrun.config import Settings, parse_duration
from jobrun.postgres import dsn, embedded
from jobrun.postgres.connect import database_url_or_embedded
from jobrun.postgres.pool import conninfo_with

from .exits import EXIT_UNAVAILABLE, CommandError, announce

LOG_SECRETS: list[str] = []
"""The secrets of the DSN in use, masked in every log line (see database_url)."""


def optional_duration(text: str | None, flag: str) -> dt.timedelta | None:
    """A duration flag as typed (30s, 5m, 300), or None when not given."""
    if text is None:
        return None
    return parse_duration(text, flag)


def _is_off(text: str | None) -> bool:
    return text is not None and text.strip().lower() in ("off", "none", "forever")


def off_or_duration(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """Optional-duration flags: 'off' stays a string (see settings_from), else a timedelta."""
    values: dict[str, Any] = {}
    for name in names:
        text: str | None = getattr(args, name)
        flag = "--" + name.replace("_", "-")
        values[name] = text if _is_off(text) else optional_duration(text, flag)
    return values


def settings_from(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings.from_env(os.environ) with the flags that were given applied.

    ``overrides`` hold parsed flag values (None: not given). A string value
    ``"off"`` for an optional duration switches it off (from_env cannot take
    None as an override, so that is applied afterwards).
    """
    switched_off: dict[str, Any] = {
        k: None for k, v in overrides.items() if isinstance(v, str) and _is_off(v)
    }
    given = {k: v for k, v in overrides.items() if k not in switched_off}
    settings = Settings.from_env(
        os.environ,
        database_url=getattr(args, "database_url", None),
        pooler=getattr(args, "pooler", None),
        direct_url=getattr(args, "direct_url", None),
        job_events=getattr(args, "job_events", None),
        notify_channel=getattr(args, "notify_channel", None),
        schema=getattr(args, "schema", None),
        **given,
    )
    if switched_off:
        settings = dataclasses.replace(settings, **switched_off)
    return settings


def database_url(settings: Settings) -> str:
    """The flag, DATABASE_URL, or the embedded PostgreSQL; checked for syntax."""
    try:
        url = database_url_or_embedded(settings.database_url, say=announce)
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    conninfo_with(url)  # ValidationError for an unparseable string, without the password
    for secret in dsn.secrets(url):  # masked in every log line from now on
        if secret not in LOG_SECRETS:
            LOG_SECRETS.append(secret)
    return dsn.normalize(url)  # SQLAlchemy's postgresql+psycopg:// and kin, as libpq reads them


@contextlib.contextmanager
def open_client(args: argparse.Namespace) -> Iterator[Client]:
    """A client on the settings and flags, its schema version checked (SchemaMismatch: exit 8)."""
    settings = settings_from(args)
    url = database_url(settings)
    with Client.connect(
        url, settings=settings, pool_size=1, application_name="jobrun-cli"
    ) as client:
        yield client
