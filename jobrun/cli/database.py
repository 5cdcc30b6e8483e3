"""The database itself: ``jobrun migrate`` and ``jobrun embedded start|status|stop``.

``--schema`` (``JOBRUN_SCHEMA``, default ``jobrun``) is the PostgreSQL
schema every jobrun object lives in; ``jobrun migrate`` creates it and is
the one command that uses the database without checking the schema's
version first (it is the fix for a wrong one). ``jobrun migrate --sql`` prints the DDL instead of
applying it, connecting nowhere, for teams that apply DDL through Alembic,
Django, Flyway or a review. With ``--direct-url`` the migration goes to
PostgreSQL itself: DDL and the migration lock need a session, never a
transaction pooler.

The embedded PostgreSQL is what a command falls back to without a database
URL. It belongs to the invoking user (``$JOBRUN_EMBEDDED_DIR``, or a
per-user default, see :func:`jobrun.postgres.embedded.default_home`) and
keeps its URL across ``jobrun embedded stop``, so an exported
``DATABASE_URL="$(jobrun embedded start --url)"`` stays right.
"""

from __future__ import annotations

import argparse
import sys

from jobrun.postgres import dsn, embedded

from .exits import EXIT_OK, EXIT_UNAVAILABLE, CommandError, UsageError
from .output import print_json, report, say
from .parser import Commands
from .settings import database_url, settings_from


def register_migrate(commands: Commands) -> None:
    """Add ``migrate``."""
    p = commands.add("migrate", cmd_migrate, "apply pending schema migrations", json=True)
    p.add_argument(
        "--sql",
        action="store_true",
        help="print the schema's DDL on stdout instead (connects nowhere), "
        "for Alembic, Django, Flyway or a review",
    )


def register_embedded(commands: Commands) -> None:
    """Add ``embedded`` and its actions."""
    emb = commands.nest("embedded", "the embedded PostgreSQL")
    p = emb.add("start", cmd_embedded_start, "start it (if needed), print its URL", json=True)
    p.add_argument(
        "--url",
        action="store_true",
        help='print only the URL, for export DATABASE_URL="$(jobrun embedded start --url)"',
    )
    emb.add("status", cmd_embedded_status, "whether it runs, and its URL", json=True)
    emb.add("stop", cmd_embedded_stop, "stop it", json=True)


def cmd_migrate(args: argparse.Namespace) -> int:
    """Apply the migrations (never checking the version first: this is the fix), or print them."""
    from jobrun.postgres.migrate import migrate, migration_sql  # noqa: PLC0415 - yoyo is slow

    settings = settings_from(args)
    if args.sql:
        if args.json:
            raise UsageError("migrate: --sql prints SQL, not JSON: give one of --sql and --json")
        sys.stdout.write(migration_sql(settings.schema))
        return EXIT_OK
    url = database_url(settings)
    pooler = settings.pooler
    if settings.direct_url:
        # DDL and the migration lock need a session: never through a transaction pooler.
        url, pooler = dsn.normalize(settings.direct_url), "none"
    applied = migrate(url, schema=settings.schema, pooler=pooler)
    if args.json:
        print_json({"applied": applied})
    elif applied:
        for ident in applied:
            say(f"applied {ident}")
    else:
        say("up to date")
    return EXIT_OK


def cmd_embedded_start(args: argparse.Namespace) -> int:
    try:
        cluster, started = embedded.ensure_embedded(embedded.default_home())
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}", EXIT_UNAVAILABLE) from None
    url = cluster.url(embedded.EMBEDDED_DATABASE)
    if args.url:
        say(url)
    elif args.json:
        print_json({"started": started, "url": url, "datadir": str(cluster.datadir)})
    else:
        say(f"{'started' if started else 'already running'} at {url} (data in {cluster.datadir})")
    return EXIT_OK


def cmd_embedded_status(args: argparse.Namespace) -> int:
    try:
        status = embedded.embedded_status(embedded.default_home())
    except embedded.ClusterError as exc:
        raise CommandError(f"embedded PostgreSQL: {exc}") from None
    datadir = status.datadir
    if args.json:
        print_json(
            {
                "running": status.running,
                "url": status.url if status.running else None,
                "datadir": str(datadir),
                "initialised": status.initialised,
            }
        )
    elif status.running:
        say(f"running at {status.url} (data in {datadir})")
    elif status.initialised:
        again = f"; it starts again at {status.url}" if status.url else ""
        say(f"not running (data in {datadir}{again})")
    else:
        say(f"not running (no cluster created yet in {datadir})")
    return EXIT_OK


def cmd_embedded_stop(args: argparse.Namespace) -> int:
    home = embedded.default_home()
    try:
        stopped = embedded.stop_embedded(home)
    except embedded.ClusterError as exc:
        raise CommandError(f"cannot stop the embedded PostgreSQL: {exc}") from None
    datadir = home / "data"
    text = (
        f"stopped the embedded PostgreSQL (data and port kept in {home})"
        if stopped
        else "the embedded PostgreSQL is not running"
    )
    report(args, {"stopped": stopped, "datadir": str(datadir)}, text)
    return EXIT_OK
