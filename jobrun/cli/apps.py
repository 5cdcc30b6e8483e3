"""``--app MODULE:REGISTRY``: importing the user's handlers, and saying where that failed.

``jobrun worker``, ``jobrun scheduler`` and ``jobrun schedules add`` import
the application's module by name, the current directory first on
``sys.path`` (as ``python -m`` would), so ``jobrun worker --app
myapp.jobs:registry`` works from the project's root without installing it.

An app that fails to import is the first thing a newcomer meets, and its
traceback is mostly jobrun's and importlib's frames, the same for every app.
The error stays one line (``jobrun: importing myapp failed: ...``); at
``--log-level debug`` the traceback is shown above it with the app's frames
only (:func:`app_traceback`), so the line that failed is the one in sight.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from jobrun.job.errors import ValidationError

from .exits import CommandError


def load_app(spec: str, *, need_registry: bool = True) -> Any:
    """Import MODULE of ``MODULE:ATTR`` (the current directory first on sys.path) and return ATTR.

    With ``need_registry``, ATTR is required and must be a jobrun Registry.
    """
    from jobrun.worker.registry import Registry  # noqa: PLC0415

    module_name, _, attr = spec.partition(":")
    module_name, attr = module_name.strip(), attr.strip()
    if not module_name or (need_registry and not attr):
        raise ValidationError(
            "--app", f"{spec!r} is not MODULE:REGISTRY (like myapp.jobs:registry)"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ValidationError(
                "--app", f"no module named {module_name!r} (looked in {cwd} and sys.path)"
            ) from None
        raise CommandError(
            f"importing {module_name} failed: {exc}", details=app_traceback(exc)
        ) from None
    except Exception as exc:  # noqa: BLE001 - the application's own import error, reported
        raise CommandError(
            f"importing {module_name} failed: {type(exc).__name__}: {exc}",
            details=app_traceback(exc),
        ) from None
    if not attr:
        return None
    missing_attr = object()
    value = getattr(module, attr, missing_attr)
    if value is missing_attr:
        raise ValidationError("--app", f"module {module_name!r} has no attribute {attr!r}")
    if not isinstance(value, Registry):
        raise ValidationError(
            "--app", f"{module_name}:{attr} is a {type(value).__name__}, not a jobrun Registry"
        )
    return value


_IMPORT_MACHINERY = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,  # jobrun
    os.path.dirname(os.path.abspath(importlib.__file__)) + os.sep,
)


def app_traceback(exc: BaseException) -> str:
    """The traceback of an app's import error, with the app's frames only.

    jobrun's and importlib's frames are the way into the app, the same for
    every app, and hide where it failed; they are left out (also between
    the app's own modules). Frames of the libraries the app called are kept.
    """
    shown = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    todo = [shown]
    while todo:
        part = todo.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list(
            [frame for frame in part.stack if not _import_machinery(frame.filename)]
        )
        todo.extend(p for p in (part.__cause__, part.__context__) if p is not None)
        todo.extend(part.exceptions or ())
    return "".join(shown.format())


def _import_machinery(filename: str) -> bool:
    if filename.startswith("<frozen importlib"):
        return True
    return os.path.abspath(filename).startswith(_IMPORT_MACHINERY)
