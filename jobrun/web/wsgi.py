"""The dashboard for WSGI hosts (Flask, Django, gunicorn's sync workers), through a2wsgi.

::

    from jobrun.web.wsgi import create_wsgi_app

    dashboard = create_wsgi_app(client, read_only=True)

    # Flask: under /admin/jobs, next to the application's own routes
    from werkzeug.middleware.dispatcher import DispatcherMiddleware
    flask_app.wsgi_app = DispatcherMiddleware(flask_app.wsgi_app, {"/admin/jobs": dashboard})

    # Django (urls.py / wsgi.py): dispatch the prefix the same way, or route it in the
    # front server; the dashboard reads its prefix from SCRIPT_NAME.

The ASGI app of :func:`jobrun.web.create_app` runs on an event loop of its
own, in a thread a2wsgi starts; each request is one WSGI call. A WSGI host
runs no ASGI lifespan, so give a :class:`jobrun.Client` or a Store (closed
by the application) rather than Settings or a URL, whose pool would then be
closed only with the process (or by ``app.state.dashboard.close()`` on the
ASGI app, ``dashboard.app`` here).
"""

from __future__ import annotations

from typing import Any

from a2wsgi import ASGIMiddleware

from jobrun.web.app import Source, create_app


def create_wsgi_app(source: Source, **options: Any) -> ASGIMiddleware:
    """The dashboard as a WSGI callable; ``options`` are :func:`jobrun.web.create_app`'s."""
    # Starlette types its scope as a plain mapping, a2wsgi as typed dicts: the same protocol.
    return ASGIMiddleware(create_app(source, **options))  # type: ignore[arg-type]


__all__ = ["create_wsgi_app"]
