"""What kind of callable a handler is: run on a thread, or on the worker's event loop.

The registry (which refuses an async generator) and typed tasks (which wrap
the function) both ask, so the answer lives here, below both of them.
"""

from __future__ import annotations

import functools
import inspect


def _unwrap(fn: object) -> object:
    """What runs when ``fn`` is called: through partials, to an object's ``__call__``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not inspect.isroutine(fn) and not inspect.isclass(fn):
        call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's, not the instance's
        if call is not None:
            return call
    return fn


def is_async(fn: object) -> bool:
    """True for an ``async def`` function (or async generator), a partial of
    one, or an object whose ``__call__`` is one: what a thread cannot run."""
    target = _unwrap(fn)
    return inspect.iscoroutinefunction(target) or inspect.isasyncgenfunction(target)


def is_coroutine_handler(fn: object) -> bool:
    """True for what the worker runs on its event loop: an ``async def``
    function, a partial of one, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(_unwrap(fn))
