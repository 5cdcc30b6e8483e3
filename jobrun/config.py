"""Settings from the environment (each with a matching ``jobrun`` flag).

One :class:`Settings` serves every part of a deployment: the producer's
``Client.connect(settings=...)``, the worker's ``Runtime(settings, registry)``
and the ``jobrun`` command read the same fields, so a producer and a worker
built from ``Settings.from_env()`` cannot disagree on the database, the
schema, the event mode or the notification channel without noticing.

=============================  ======================  =========================
environment                    flag                    default
=============================  ======================  =========================
DATABASE_URL                   --database-url          none (see below)
JOBRUN_POOLER                  --pooler                auto (auto|none|session|transaction)
JOBRUN_DIRECT_URL              --direct-url            none (LISTEN, the leader, migrations)
JOBRUN_SCHEMA                  --schema                jobrun
JOBRUN_CONCURRENCY             --concurrency           10
JOBRUN_CLAIM_AHEAD             --claim-ahead           0 (see below)
JOBRUN_JOB_EVENTS              --job-events            all (all|terminal)
JOBRUN_QUEUES                  --queues                default
JOBRUN_LEASE_TTL               --lease-ttl             30s
JOBRUN_HEARTBEAT_INTERVAL      --heartbeat-interval    5s
JOBRUN_POLL_INTERVAL           --poll-interval         1s
JOBRUN_NOTIFY_CHANNEL          --notify-channel        jobrun_jobs
JOBRUN_NOTIFICATIONS (on|off)  --no-notifications      on
JOBRUN_COMMIT_TIMEOUT          --commit-timeout        30s
JOBRUN_CALL_TIMEOUT            --call-timeout          10s (client-side bound of a call)
JOBRUN_SHUTDOWN_GRACE          --shutdown-grace        30s
JOBRUN_RETENTION               --retention             7d (finished jobs; "off" keeps them)
JOBRUN_EVENTS_RETENTION        --events-retention      7d ("off" keeps them)
JOBRUN_METRICS_PORT            --metrics-port          off (0: any free port)
JOBRUN_HEALTH_PORT             --health-port           off (see below)
JOBRUN_OBSERVE_HOST            --observe-host          0.0.0.0
JOBRUN_HEALTH_STALE_AFTER      --health-stale-after    2 x lease TTL (see below)
JOBRUN_TRACING (off|otel)      --tracing               off
=============================  ======================  =========================

Every variable but the conventional ``DATABASE_URL`` starts with ``JOBRUN_``.
The old names ``WORKER_CONCURRENCY`` and ``JOB_EVENTS`` are still read, with
one WARNING per process naming the new one; the new name wins when both are
set.

Without a database URL, the ``jobrun`` command and ``Client.connect()`` fall
back to the embedded PostgreSQL (and say so); a :class:`~jobrun.Runtime`
refuses to start instead. ``JOBRUN_SCHEMA`` is the PostgreSQL schema every
jobrun object lives in (:func:`jobrun.postgres.schema.schema_name` says
which names are valid); ``jobrun migrate`` creates it.

The observability ports serve metrics and the health probes
(:mod:`jobrun.observe`) on every interface by default, because probes and
scrapers connect from outside the container. ``JOBRUN_POOLER`` and
``JOBRUN_DIRECT_URL`` say what ``DATABASE_URL`` goes through and where the
work that needs a session of its own goes (:mod:`jobrun.postgres.pool`).

Durations are ``250ms``, ``30s``, ``5m``, ``2h``, ``7d`` or plain seconds.
Invalid settings raise ValidationError naming the variable, at start.
Settings that contradict each other: ``JOBRUN_HEARTBEAT_INTERVAL`` above a
third of ``JOBRUN_LEASE_TTL`` is refused (one late heartbeat would lose
healthy leases); ``JOBRUN_COMMIT_TIMEOUT`` above ``JOBRUN_LEASE_TTL`` is a
WARNING when the worker starts (a completion is given up when its lease runs
out, so the commit timeout never applies in full).
``JOBRUN_CLAIM_AHEAD`` caps the jobs a worker claims ahead of its free
threads (leased, not started, their attempt not counted until they start:
:mod:`jobrun.worker.ahead` sizes that buffer from the observed run time);
``0``, the default, claims only for free threads; ``auto`` caps it at the
larger of the concurrency and the completion batch.
``DATABASE_URL`` takes every form :mod:`jobrun.postgres.dsn` accepts; the
repr of :class:`Settings` masks its password.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
import os
import re
from collections.abc import Mapping
from typing import Any

from jobrun.job import validate
from jobrun.job.errors import ValidationError
from jobrun.postgres import dsn
from jobrun.postgres.events import EventMode
from jobrun.postgres.notify import DEFAULT_CHANNEL, validate_channel
from jobrun.postgres.pool import DEFAULT_POOLER, POOLER_FIELD, pooler_mode
from jobrun.postgres.schema import DEFAULT_SCHEMA, schema_name
from jobrun.scheduler.service import SchedulerConfig
from jobrun.worker.worker import (
    DEFAULT_CONCURRENCY,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_LEASE_TTL,
    DEFAULT_POLL_INTERVAL,
    DEFAULT_SHUTDOWN_GRACE,
    WorkerConfig,
    parse_queues,
)

log = logging.getLogger("jobrun")

TRACING_MODES = ("off", "otel")
DEFAULT_OBSERVE_HOST = "0.0.0.0"  # noqa: S104 - probes and scrapers connect from outside
_HOST = re.compile(r"[A-Za-z0-9._:%-]+")

_DURATION_PART = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)\s*")
_SECONDS = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_ORDER = ("d", "h", "m", "s", "ms")


def parse_duration(text: str, name: str) -> dt.timedelta:
    """``"250ms"``, ``"30s"``, ``"1h30m"``, ``"2d 12h"``, ``"7d"`` or seconds -> timedelta.

    Parts go from the largest unit to the smallest, each unit at most once
    (``1h30m``, not ``30m1h``): a typo like ``5m5m`` is an error, not 10 minutes.
    """
    bad = ValidationError(name, f"{text!r} is not a duration (like 90s, 5m, 1h30m, 7d)")
    if not isinstance(text, str):
        raise bad
    plain = _SECONDS.fullmatch(text)
    if plain:
        seconds = float(plain.group(1))
    else:
        seconds, at, last = 0.0, 0, -1
        while at < len(text):
            part = _DURATION_PART.match(text, at)
            if part is None or part.end() == at:
                raise bad
            rank = _DURATION_ORDER.index(part.group(2))
            if rank <= last:
                raise bad
            seconds += float(part.group(1)) * _UNITS[part.group(2)]
            at, last = part.end(), rank
        if last < 0:
            raise bad
    if not math.isfinite(seconds) or seconds > 10 * 365 * 86400:
        raise ValidationError(name, f"{text!r} is too long")
    return dt.timedelta(seconds=seconds)


def _optional_duration(text: str, name: str) -> dt.timedelta | None:
    if text.strip().lower() in ("off", "none", "forever"):
        return None
    return parse_duration(text, name)


def _int(text: str, name: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValidationError(name, f"{text!r} is not an integer") from None


def _auto_int(text: str, name: str) -> int | None:
    """An int, or ``auto`` (None: the default, derived from other settings)."""
    if text.strip().lower() == "auto":
        return None
    return _int(text.strip(), name)


def _port(text: str, name: str) -> int | None:
    if text.strip().lower() in ("off", "none"):
        return None
    return _int(text.strip(), name)


def _check_port(value: object, name: str) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ValidationError(name, f"{value!r} is not a port (0 to 65535; 0: any free port)")


def _switch(text: str, name: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "on", "true", "yes"):
        return True
    if value in ("0", "off", "false", "no"):
        return False
    raise ValidationError(name, f"{text!r} is not on/off")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything a jobrun process is configured with: the client's settings and the worker's.

    Frozen and validated on construction, so a bad value fails where it is
    made, naming its environment variable where it has one.
    """

    database_url: str | None = None
    pooler: str = DEFAULT_POOLER
    """What ``database_url`` goes through: auto, none, session or transaction."""
    direct_url: str | None = None
    """A connection string to PostgreSQL itself, for work that needs a session."""
    schema: str = DEFAULT_SCHEMA
    concurrency: int = DEFAULT_CONCURRENCY
    claim_ahead: int | None = 0
    """Jobs claimed ahead of the free threads at most; None: auto (WorkerConfig's)."""
    job_events: EventMode = EventMode.ALL
    queues: Mapping[str, int | None] = dataclasses.field(default_factory=lambda: {"default": None})
    lease_ttl: dt.timedelta = DEFAULT_LEASE_TTL
    heartbeat_interval: dt.timedelta = DEFAULT_HEARTBEAT_INTERVAL
    poll_interval: dt.timedelta = DEFAULT_POLL_INTERVAL
    notify_channel: str = DEFAULT_CHANNEL
    notifications: bool = True
    commit_timeout: dt.timedelta | None = dt.timedelta(seconds=30)
    call_timeout: dt.timedelta | None = dt.timedelta(seconds=10)
    shutdown_grace: dt.timedelta = DEFAULT_SHUTDOWN_GRACE
    retention: dt.timedelta | None = dt.timedelta(days=7)
    events_retention: dt.timedelta | None = dt.timedelta(days=7)
    metrics_port: int | None = None
    health_port: int | None = None
    observe_host: str = DEFAULT_OBSERVE_HOST
    health_stale_after: dt.timedelta | None = None
    """None: derived from the worker's lease TTL and poll interval."""
    tracing: str = "off"

    def __repr__(self) -> str:
        """The dataclass repr, with the password of ``database_url`` masked."""
        fields = []
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("database_url", "direct_url") and isinstance(value, str):
                value = dsn.redacted(value)
            fields.append(f"{field.name}={value!r}")
        return f"{type(self).__qualname__}({', '.join(fields)})"

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "job_events", EventMode(self.job_events))
        except ValueError:
            raise ValidationError("JOBRUN_JOB_EVENTS", "must be 'all' or 'terminal'") from None
        object.__setattr__(self, "pooler", pooler_mode(self.pooler, POOLER_FIELD))
        if self.direct_url is not None:
            if not isinstance(self.direct_url, str) or not self.direct_url.strip():
                raise ValidationError("JOBRUN_DIRECT_URL", "must be a connection string")
            try:
                dsn.parse(self.direct_url)
            except ValidationError as exc:
                raise ValidationError("JOBRUN_DIRECT_URL", exc.message) from None
        validate_channel(self.notify_channel, "JOBRUN_NOTIFY_CHANNEL")
        schema_name(self.schema, "JOBRUN_SCHEMA")
        for name, var in (
            ("commit_timeout", "JOBRUN_COMMIT_TIMEOUT"),
            ("call_timeout", "JOBRUN_CALL_TIMEOUT"),
        ):
            value = getattr(self, name)
            if value is not None:
                validate.positive_duration(var, value)
        _check_port(self.metrics_port, "JOBRUN_METRICS_PORT")
        _check_port(self.health_port, "JOBRUN_HEALTH_PORT")
        host = self.observe_host
        if not isinstance(host, str) or not _HOST.fullmatch(host.strip("[]")):
            raise ValidationError(
                "JOBRUN_OBSERVE_HOST", f"{host!r} is not a host name or an IP address"
            )
        if self.health_stale_after is not None:
            validate.positive_duration("JOBRUN_HEALTH_STALE_AFTER", self.health_stale_after)
        if not isinstance(self.tracing, str) or self.tracing.strip().lower() not in TRACING_MODES:
            raise ValidationError("JOBRUN_TRACING", f"{self.tracing!r}: must be 'off' or 'otel'")
        object.__setattr__(self, "tracing", self.tracing.strip().lower())
        # Building the service configs validates the rest, with their own messages.
        self.worker_config()
        self.scheduler_config()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read the environment, then apply ``overrides`` (the CLI flags that were given)."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for var, (field, parse) in _ENV.items():
            name = _set_name(env, var)
            if name is not None:
                values[field] = parse(env[name], name)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def session_url(self, database_url: str, pooler: str) -> str | None:
        """Where work that needs a server session of its own connects (LISTEN, the
        leader's lock): the direct URL when there is one, else ``database_url``
        unless that goes through a transaction pooler (``pooler``, resolved)."""
        if self.direct_url:
            return self.direct_url
        return None if pooler == "transaction" else database_url

    def worker_config(self) -> WorkerConfig:
        return WorkerConfig(
            queues=self.queues,
            concurrency=self.concurrency,
            claim_ahead=self.claim_ahead,
            lease_ttl=self.lease_ttl,
            heartbeat_interval=self.heartbeat_interval,
            poll_interval=self.poll_interval,
            shutdown_grace=self.shutdown_grace,
        )

    def scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            finished_retention=self.retention, events_retention=self.events_retention
        )


_ENV: dict[str, tuple[str, Any]] = {
    "DATABASE_URL": ("database_url", lambda text, name: text.strip()),
    "JOBRUN_POOLER": ("pooler", lambda text, name: text.strip().lower()),
    "JOBRUN_DIRECT_URL": ("direct_url", lambda text, name: text.strip()),
    "JOBRUN_SCHEMA": ("schema", lambda text, name: text.strip()),
    "JOBRUN_CONCURRENCY": ("concurrency", _int),
    "JOBRUN_CLAIM_AHEAD": ("claim_ahead", _auto_int),
    "JOBRUN_JOB_EVENTS": ("job_events", lambda text, name: text.strip().lower()),
    "JOBRUN_QUEUES": ("queues", lambda text, name: parse_queues(text)),
    "JOBRUN_LEASE_TTL": ("lease_ttl", parse_duration),
    "JOBRUN_HEARTBEAT_INTERVAL": ("heartbeat_interval", parse_duration),
    "JOBRUN_POLL_INTERVAL": ("poll_interval", parse_duration),
    "JOBRUN_NOTIFY_CHANNEL": ("notify_channel", lambda text, name: text.strip()),
    "JOBRUN_NOTIFICATIONS": ("notifications", _switch),
    "JOBRUN_COMMIT_TIMEOUT": ("commit_timeout", _optional_duration),
    "JOBRUN_CALL_TIMEOUT": ("call_timeout", _optional_duration),
    "JOBRUN_SHUTDOWN_GRACE": ("shutdown_grace", parse_duration),
    "JOBRUN_RETENTION": ("retention", _optional_duration),
    "JOBRUN_EVENTS_RETENTION": ("events_retention", _optional_duration),
    "JOBRUN_METRICS_PORT": ("metrics_port", _port),
    "JOBRUN_HEALTH_PORT": ("health_port", _port),
    "JOBRUN_OBSERVE_HOST": ("observe_host", lambda text, name: text.strip()),
    "JOBRUN_HEALTH_STALE_AFTER": ("health_stale_after", parse_duration),
    "JOBRUN_TRACING": ("tracing", lambda text, name: text.strip().lower()),
}

DEPRECATED_ENV: dict[str, str] = {
    "WORKER_CONCURRENCY": "JOBRUN_CONCURRENCY",
    "JOB_EVENTS": "JOBRUN_JOB_EVENTS",
}
"""The old names still read (old -> new): the new one wins; the old one is a WARNING."""

_OLD_NAME = {new: old for old, new in DEPRECATED_ENV.items()}
_warned: set[str] = set()


def _set_name(env: Mapping[str, str], var: str) -> str | None:
    """The variable that sets ``var``'s field: ``var``, else its old name (said once), else None."""
    old = _OLD_NAME.get(var)
    new_set = bool(env.get(var, "").strip())
    if old is not None and env.get(old, "").strip():
        if old not in _warned:
            _warned.add(old)
            what = "ignored: the new name is set too" if new_set else f"read for now as {var}"
            log.warning("jobrun: %s is deprecated, set %s instead (%s)", old, var, what)
        if not new_set:
            return old
    return var if new_set else None
