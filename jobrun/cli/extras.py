"""``jobrun dashboard`` and ``jobrun demo``: commands that run an optional part of jobrun.

Both import their part only when run, so ``jobrun`` starts as fast without
them and works where they are not installed; a missing part is one line
(for the dashboard, naming what to install), never an ImportError's traceback.

``jobrun dashboard`` (``pip install 'jobrun[web]'``) serves the web dashboard
(:mod:`jobrun.web`) on 127.0.0.1:8080 unless told ``--bind HOST:PORT``. Any
address but a loopback one needs ``JOBRUN_DASHBOARD_TOKEN``, which every
request must then carry (bearer token, or basic-auth password), or it
refuses to start with exit code 7, before connecting anywhere: a refusal
costs nothing. ``--read-only`` shows everything and allows no action (see
:mod:`jobrun.web.server`).

``jobrun demo`` passes its arguments on to :mod:`jobrun.demo`, which adds
its own options: they are unknown to the top-level parser, the one command
whose unrecognised arguments are not a usage error.
"""

from __future__ import annotations

import argparse
import importlib
import os

from jobrun.client import Client
from jobrun.postgres import dsn

from .exits import EXIT_OK, EXIT_VALIDATION, PROG, CommandError
from .parser import Commands, Parser, global_options
from .settings import database_url, settings_from

DASHBOARD_BIND = "127.0.0.1:8080"
DASHBOARD_TOKEN_ENV = "JOBRUN_DASHBOARD_TOKEN"  # noqa: S105 - the variable's name


def register(commands: Commands) -> None:
    """Add ``demo`` and ``dashboard``."""
    # The demo's own options are added by jobrun.demo, imported only when run.
    p = commands.group.add_parser(
        "demo",
        help="run the demo (jobrun demo --help for its options)",
        parents=[commands.common],
        add_help=False,
        allow_abbrev=False,
    )
    p.set_defaults(func=cmd_demo)

    p = commands.add(
        "dashboard",
        cmd_dashboard,
        "serve the web dashboard (needs pip install 'jobrun[web]')",
        json=False,
    )
    p.add_argument(
        "--bind",
        default=DASHBOARD_BIND,
        metavar="HOST:PORT",
        help=f"where to listen, port 0 for any free port (default: {DASHBOARD_BIND}); any "
        f"address but loopback needs {DASHBOARD_TOKEN_ENV}, a token every request must "
        "then carry as bearer token or basic-auth password (once set, it is required on "
        "loopback too)",
    )
    p.add_argument("--read-only", action="store_true", help="show everything, allow no action")


def cmd_demo(args: argparse.Namespace) -> int:
    try:
        demo = importlib.import_module("jobrun.demo")
    except ModuleNotFoundError as exc:
        if exc.name not in ("jobrun.demo", None):
            raise
        raise CommandError("the demo is not available in this version of jobrun") from None
    parser = Parser(
        prog=f"{PROG} demo",
        description="Run the jobrun demo.",
        parents=[global_options()],
        allow_abbrev=False,
    )
    demo.add_arguments(parser)
    demo_args = parser.parse_args(args.extras, namespace=args)
    url = database_url(settings_from(demo_args))
    return int(demo.run(demo_args, url))


def cmd_dashboard(args: argparse.Namespace) -> int:
    try:
        import uvicorn  # noqa: F401, PLC0415 - the extra's server, checked before anything

        from jobrun.web import create_app, server  # noqa: PLC0415 - the optional extra
        from jobrun.web.app import CONNECTION_WAIT  # noqa: PLC0415
    except ImportError as exc:
        raise CommandError(
            f"the dashboard needs pip install 'jobrun[web]' ({exc.name} is missing)",
            EXIT_VALIDATION,
        ) from None
    host, port = server.parse_bind(args.bind)
    token = os.environ.get(DASHBOARD_TOKEN_ENV) or None
    server.check_exposure(host, token)  # before any connection: a refusal costs nothing
    settings = settings_from(args)
    url = database_url(settings)
    with Client.connect(
        url,
        settings=settings,
        pool_size=4,
        application_name="jobrun-dashboard",
        pool_timeout=CONNECTION_WAIT,
    ) as client:
        sock = server.listen(host, port)
        app = create_app(
            client,
            read_only=args.read_only,
            auth=token,
            allowed_hosts=server.allowed_hosts(host, token),
        )
        notes = [f"database {dsn.describe(url)}"]
        if args.read_only:
            notes.append("read-only")
        if token:
            notes.append(f"{DASHBOARD_TOKEN_ENV} required")
        server.serve(app, sock, describe=", ".join(notes))
    return EXIT_OK
