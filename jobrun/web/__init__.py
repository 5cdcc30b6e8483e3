"""jobrun's web dashboard (``pip install 'jobrun[web]'``): see :mod:`jobrun.web.app`.

Nothing in jobrun's core imports this package; importing it without the
extra's libraries (Starlette, Jinja2) raises ImportError naming the extra.
"""

from __future__ import annotations

try:
    import jinja2  # noqa: F401
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without the extra installed
    raise ImportError(
        f"the jobrun dashboard needs pip install 'jobrun[web]' ({exc.name} is missing)",
        name=exc.name,
    ) from exc

from jobrun.web.app import BULK_LIMIT, PAGE_SIZE, Dashboard, create_app

__all__ = ["BULK_LIMIT", "PAGE_SIZE", "Dashboard", "create_app"]
