"""``jobrun worker`` and ``jobrun scheduler``: the long-running processes.

Both build a :class:`~jobrun.runtime.Runtime` from the settings and flags
and run it until a signal: one signal drains and exits 0, a second cuts the
drain short, and a signal while starting (importing the app, opening the
pools) stops it there; either exits 128 + the signal's number (see
:mod:`jobrun.worker.stop_signals`). They print no JSON: their output is
their log.

They log on stderr (see :mod:`jobrun.worker.logs`): ``--log-level``
(default info), ``--log-format text|json`` (``JOBRUN_LOG_FORMAT``; json is
one object per line, for log shippers) and ``--log-success debug|info``
(``JOBRUN_LOG_SUCCESS``: the level of each job's "succeeded" line; info by
default, so a person watching sees every job; debug keeps a busy worker's
log to failures). A worker starts with a banner (version, database, queues,
concurrency, job types), then logs one line per job outcome, each naming the
job's id, type and attempt. Each log line goes through the redactor, with the
database URL's password among the secrets it masks.

Both serve probes and metrics when asked (:mod:`jobrun.observe`):
``--metrics-port`` serves Prometheus ``/metrics`` with ``/healthz`` and
``/readyz``, ``--health-port`` the probes alone; ``--tracing otel`` traces
enqueues and jobs with OpenTelemetry, to the TracerProvider the ``--app``
module set up when imported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobrun.config import TRACING_MODES, Settings
from jobrun.job.errors import ValidationError
from jobrun.worker import logs as worker_logs
from jobrun.worker.stop_signals import StopSignals

from .apps import load_app
from .exits import EXIT_OK, EXIT_SIGNALLED
from .parser import Commands, setting_help
from .settings import (
    LOG_SECRETS,
    database_url,
    off_or_duration,
    optional_duration,
    settings_from,
)

if TYPE_CHECKING:
    from jobrun.runtime import Runtime

LOG_FORMAT_ENV = "JOBRUN_LOG_FORMAT"
LOG_SUCCESS_ENV = "JOBRUN_LOG_SUCCESS"


def register(commands: Commands) -> None:
    """Add ``worker`` and ``scheduler``."""
    p = commands.add("worker", cmd_worker, "run a worker (and a scheduler candidate)", json=False)
    p.add_argument(
        "--app",
        required=True,
        metavar="MODULE:REGISTRY",
        help="the handlers, like myapp.jobs:registry (required)",
    )
    p.add_argument(
        "--queues",
        metavar="SPEC",
        help=setting_help("the queues to work: a,b, or emails=4,default for limits", "queues"),
    )
    p.add_argument(
        "--concurrency", type=int, metavar="N", help=setting_help("handler threads", "concurrency")
    )
    p.add_argument(
        "--claim-ahead",
        type=_count_or_auto,
        metavar="N",
        help=setting_help(
            "jobs claimed ahead of free threads: leased, not started (0: none)",
            "claim_ahead",
            "0",
        ),
    )
    p.add_argument("--no-scheduler", action="store_true", help="do not run the scheduler")
    _durations(
        p,
        ("lease-ttl", "how long a claim lasts without a heartbeat"),
        ("heartbeat-interval", "how often running jobs' leases are extended"),
        ("poll-interval", "how often to look for jobs when no notification comes"),
        ("shutdown-grace", "on SIGTERM, how long running jobs may finish before cancel"),
        ("commit-timeout", "statement timeout when completing a job, or off"),
        ("call-timeout", "client-side bound of a database call, or off"),
    )
    p.add_argument(
        "--no-notifications",
        action="store_true",
        help=setting_help("poll only, no LISTEN/NOTIFY", "notifications", "notifications on"),
    )
    _process_options(p)

    p = commands.add("scheduler", cmd_scheduler, "run the scheduler only", json=False)
    p.add_argument(
        "--app", metavar="MODULE[:REGISTRY]", help="import this module first (for side effects)"
    )
    _process_options(p)


def _process_options(p: argparse.ArgumentParser) -> None:
    """Retention, observability and logging: the flags both processes take."""
    _durations(
        p,
        ("retention", "keep finished jobs this long, or off"),
        ("events-retention", "keep job events this long, or off"),
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help=setting_help(
            "serve Prometheus /metrics (and /healthz, /readyz) on this port, 0 for any free "
            "port; needs pip install 'jobrun[metrics]'",
            "metrics_port",
        ),
    )
    p.add_argument(
        "--health-port",
        type=int,
        metavar="PORT",
        help=setting_help(
            "serve /healthz and /readyz on this port, 0 for any free port",
            "health_port",
            "off, or the metrics port when that is set",
        ),
    )
    p.add_argument(
        "--observe-host",
        metavar="HOST",
        help=setting_help("the address the metrics and health server listens on", "observe_host"),
    )
    p.add_argument(
        "--health-stale-after",
        metavar="DURATION",
        help=setting_help(
            "/healthz fails after this long without a successful claim or heartbeat",
            "health_stale_after",
            "2x the lease TTL, at least 3 poll intervals",
        ),
    )
    p.add_argument(
        "--tracing",
        type=str.lower,
        choices=TRACING_MODES,
        help=setting_help(
            "otel: OpenTelemetry spans for enqueues and jobs (needs pip install "
            "'jobrun[otel]'; the app sets the TracerProvider up on import)",
            "tracing",
        ),
    )
    p.add_argument(
        "--log-level",
        default="info",
        type=str.lower,
        choices=("debug", "info", "warning", "error"),
        help="stderr log level (default: info)",
    )
    p.add_argument(
        "--log-format",
        type=str.lower,
        choices=worker_logs.LOG_FORMATS,
        help="stderr log lines: text for people, json (one object per line) for log "
        f"shippers (default: text; env {LOG_FORMAT_ENV})",
    )
    p.add_argument(
        "--log-success",
        type=str.lower,
        choices=tuple(worker_logs.SUCCESS_LEVELS),
        help="the level of each job's 'succeeded' line: debug (shown with --log-level "
        f"debug) or info (default: info; env {LOG_SUCCESS_ENV})",
    )


def _durations(p: argparse.ArgumentParser, *flags: tuple[str, str]) -> None:
    """DURATION flags, each overriding the setting of its name."""
    for flag, what in flags:
        p.add_argument(
            f"--{flag}", metavar="DURATION", help=setting_help(what, flag.replace("-", "_"))
        )


def _count_or_auto(text: str) -> int | str:
    """``--claim-ahead``: an int (checked with the settings), or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'auto'") from None


def cmd_worker(args: argparse.Namespace) -> int:
    with StopSignals() as signals:  # first: a signal while it starts stops it there
        _worker_runtime(args).run()
    return _stopped(signals)


def cmd_scheduler(args: argparse.Namespace) -> int:
    with StopSignals() as signals:  # first: a signal while it starts stops it there
        _scheduler_runtime(args).run()
    return _stopped(signals)


def _worker_runtime(args: argparse.Namespace) -> Runtime:
    from jobrun.runtime import Runtime  # noqa: PLC0415
    from jobrun.worker.worker import parse_queues  # noqa: PLC0415

    registry = load_app(args.app)
    settings = _process_settings(
        args,
        queues=None if args.queues is None else parse_queues(args.queues),
        concurrency=args.concurrency,
        claim_ahead=None if args.claim_ahead == "auto" else args.claim_ahead,
        lease_ttl=optional_duration(args.lease_ttl, "--lease-ttl"),
        heartbeat_interval=optional_duration(args.heartbeat_interval, "--heartbeat-interval"),
        poll_interval=optional_duration(args.poll_interval, "--poll-interval"),
        shutdown_grace=optional_duration(args.shutdown_grace, "--shutdown-grace"),
        notifications=False if args.no_notifications else None,
        **off_or_duration(args, "commit_timeout", "call_timeout"),
    )
    if args.claim_ahead == "auto":  # over JOBRUN_CLAIM_AHEAD (from_env skips None overrides)
        settings = dataclasses.replace(settings, claim_ahead=None)
    url = database_url(settings)
    return Runtime(settings, registry, database_url=url, scheduler=not args.no_scheduler)


def _scheduler_runtime(args: argparse.Namespace) -> Runtime:
    from jobrun.runtime import Runtime  # noqa: PLC0415

    if args.app:
        load_app(args.app, need_registry=False)
    settings = _process_settings(args)
    url = database_url(settings)
    return Runtime(settings, None, database_url=url, worker=False)


def _process_settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """The settings with the flags both processes take applied, and logging configured."""
    settings = settings_from(
        args,
        **overrides,
        **off_or_duration(args, "retention", "events_retention"),
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        observe_host=args.observe_host,
        health_stale_after=optional_duration(args.health_stale_after, "--health-stale-after"),
    )
    if args.tracing is not None:  # not through settings_from, where "off" means None
        settings = dataclasses.replace(settings, tracing=args.tracing)
    _configure_logging(args.log_level, args.log_format, args.log_success)
    return settings


def _stopped(signals: StopSignals) -> int:
    """A process's exit code once run() returned: 0 drained, 128 + the signal that cut it short."""
    return EXIT_OK if signals.forced_by is None else EXIT_SIGNALLED + signals.forced_by


def _log_choice(flag: str | None, env: str, choices: Sequence[str], default: str) -> str:
    """A logging option: the flag, else the environment variable (checked), else the default."""
    if flag is not None:
        return flag
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return default
    if text not in choices:
        raise ValidationError(env, f"{text!r}: expected one of {', '.join(choices)}")
    return text


def _configure_logging(
    level: str, log_format: str | None = None, success: str | None = None
) -> None:
    """Log lines on stderr, each through the redactor (a handler's error may quote a DSN).

    ``text`` (job id, type and attempt first on a job's lines) or ``json`` (one
    object per line), see :mod:`jobrun.worker.logs`; ``success`` is the level
    of the succeeded lines.
    """
    worker_logs.configure(
        level=level,
        log_format=_log_choice(log_format, LOG_FORMAT_ENV, worker_logs.LOG_FORMATS, "text"),
        success=_log_choice(success, LOG_SUCCESS_ENV, tuple(worker_logs.SUCCESS_LEVELS), "info"),
        known=LOG_SECRETS,
    )
