"""Durable steps, idempotency keys and fencing tokens: what a handler's context offers.

:class:`DurableSteps` is a part of :class:`~jobrun.worker.context.JobContext`
(its base class); this module is the whole of it, the context only inherits.

- ``ctx.step(name, fn, *args)`` runs ``fn(*args)`` once per job, across retries and
  crashes: its value is stored when it returns (fenced by the claim), and a
  later attempt that reaches the same step returns the stored value without
  calling ``fn``. The job's recorded steps are read once per attempt, at its
  first step. A crash after ``fn`` returned and before its checkpoint
  committed runs ``fn`` again: a step's effects outside the database are
  at-least-once, and made exactly-once by the API they reach with
  :meth:`DurableSteps.step_key` as the idempotency key.
- ``ctx.transaction_step(name, fn)`` runs ``fn(conn)`` inside the
  transaction that records the step: its database writes and its checkpoint
  commit together or not at all (exactly once).
- ``ctx.idempotency_key`` and ``ctx.step_key(name)``: deterministic keys
  for APIs outside the database (:mod:`jobrun.job.steps`).
- ``ctx.fencing_token()``: a number greater than every one an earlier run of
  the job got, for conditional writes downstream (``... WHERE fence <
  :token``): a stale claim's write is refused.

A step name may be used once per attempt (a second use is a
ValidationError: a loop must name each turn's step apart); a step that
raised gives its name back, so a handler may try it again. A step's value
is any JSON value (the job result's rules) and comes back as JSON gives it
back, on the first run as on a replay (a tuple is a list there too).

Async handlers use the ``*_async`` twins: the database work runs on the
worker's ``jobrun-async-io`` threads, never on the event loop (a plain
twin called from a coroutine is a ValidationError naming the one to await).

A durable wait (a sleep, a signal; issue 29 item 5) is meant to be one more
kind of step: a checkpoint that a retried attempt replays.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import json
import threading
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from jobrun.job import validate
from jobrun.job.errors import LeaseLost, ValidationError
from jobrun.job.model import Job
from jobrun.job.steps import StepRecord, StepStore, idempotency_key, step_name

T = TypeVar("T")
P = ParamSpec("P")

_LOCKS = threading.Lock()
"""Guards making a context's own steps lock (once per context that uses steps)."""


class DurableSteps:
    """Durable steps, keys and fencing for a job's handler (see the module docstring).

    The worker sets ``_step_store`` (and, for an async handler, ``_step_io``)
    when it makes the context; a context made by hand (a unit test of a
    handler) keeps its steps in memory and has no fencing token.
    """

    job: Job
    _step_store: StepStore | None = None
    """Where steps are recorded (set by the worker)."""
    _step_io: concurrent.futures.Executor | None = None
    """Where an async handler's step writes run (the worker's io threads)."""
    _steps_done: dict[str, StepRecord] | None = None
    """The job's steps recorded, read at the first step of the attempt."""
    _steps_named: set[str] | None = None
    """The step names this attempt has used."""
    _fence: int | None = None
    """This claim's fencing token, once issued."""
    _steps_lock: threading.Lock | None = None

    def cancel(self, reason: str) -> None:  # pragma: no cover - JobContext's
        raise NotImplementedError

    # -- keys ----------------------------------------------------------------------

    @property
    def idempotency_key(self) -> str:
        """The job's key for APIs outside the database: the same on every attempt,
        worker and crash (a UUID string; see :func:`jobrun.job.steps.idempotency_key`)."""
        return idempotency_key(self.job)

    def step_key(self, name: str) -> str:
        """Step ``name``'s key for APIs outside the database (stable like
        :attr:`idempotency_key`, and different for every step name)."""
        return idempotency_key(self.job, name)

    # -- steps ---------------------------------------------------------------------

    def step(self, name: str, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn(*args, **kwargs)`` once per job: the value stored by an earlier
        attempt, or ``fn``'s value, recorded before it is returned (see the
        module docstring).

        ``name``: a non-empty str of at most 200 characters, once per attempt
        (ValidationError). A value that cannot be stored as JSON is a
        ValidationError naming the step (nothing recorded: a retry runs
        ``fn`` again). LeaseLost when this claim no longer holds the job
        (the context is cancelled; nothing recorded).
        """
        _off_any_loop("step_async")
        name = self._take(name, fn)
        try:
            done = self._done().get(name)
            if done is not None:
                return done.value  # type: ignore[no-any-return]
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                _close(value)
                raise ValidationError(
                    "fn", f"step {name!r} returned an awaitable: use await ctx.step_async(...)"
                )
            return self._record(name, value).value  # type: ignore[no-any-return]
        except BaseException:
            self._give_back(name)
            raise

    async def step_async(
        self, name: str, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """:meth:`step` for an ``async def`` handler: ``await fn(*args, **kwargs)``
        once per job.

        The read of the steps and the checkpoint run off the event loop.
        """
        name = self._take(name, fn)
        try:
            steps = self._steps_done  # read already: no hop to an io thread
            if steps is None:
                steps = await self._off_loop(self._done)
            done = steps.get(name)
            if done is not None:
                return done.value  # type: ignore[no-any-return]
            value = await fn(*args, **kwargs)
            record = await self._off_loop(self._record, name, value)
            return record.value  # type: ignore[no-any-return]
        except BaseException:
            self._give_back(name)
            raise

    def transaction_step(self, name: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(conn)`` once per job, in the transaction that records the step.

        ``conn`` is the open psycopg connection of that transaction: ``fn``
        runs its statements on it and may not commit or roll back
        (CommitRefused). Its writes and the checkpoint commit together, or
        neither does (an exception, a crash, a lost lease: LeaseLost, ``fn``
        not called). A replay returns the stored value without calling
        ``fn``. The transaction runs under the worker store's
        ``commit_timeout`` and holds the job's row: keep it short, as a
        commit callable.
        """
        _off_any_loop("transaction_step_async")
        name = self._take(name, fn)
        try:
            done = self._done().get(name)
            if done is not None:
                return done.value  # type: ignore[no-any-return]
            store = self._step_store
            if store is None:
                raise ValidationError(
                    "ctx", "a transactional step runs in a worker (this context has no store)"
                )
            record = self._fenced(lambda: store.transaction_step(self.job, name, fn))
            return record.value  # type: ignore[no-any-return]
        except BaseException:
            self._give_back(name)
            raise

    async def transaction_step_async(self, name: str, fn: Callable[[Any], T]) -> T:
        """:meth:`transaction_step` for an ``async def`` handler: ``fn(conn)`` (a
        plain function on a sync connection) runs on an io thread, never on the loop."""
        return await self._off_loop(self.transaction_step, name, fn)

    # -- fencing -------------------------------------------------------------------

    def fencing_token(self) -> int:
        """This claim's fencing token: greater than every token an earlier run of
        the job got (a failed attempt, an expired lease, a snooze, an
        operator's retry), and refused to a claim that lost the job.

        Issued on first use (one fenced statement), then the same for the
        rest of the attempt. Compare tokens of one job only. LeaseLost when
        this claim no longer holds the job (the context is cancelled).
        """
        fence = self._fence
        if fence is not None:
            return fence
        _off_any_loop("fencing_token_async")
        with self._lock():
            if self._fence is None:
                store = self._step_store
                if store is None:
                    raise ValidationError(
                        "ctx", "a fencing token is issued in a worker (this context has no store)"
                    )
                self._fence = self._fenced(lambda: store.issue_fencing_token(self.job))
            return self._fence

    async def fencing_token_async(self) -> int:
        """:meth:`fencing_token` for an ``async def`` handler (issued off the loop)."""
        fence = self._fence
        if fence is not None:
            return fence
        return await self._off_loop(self.fencing_token)

    # -- the parts -----------------------------------------------------------------

    def _take(self, name: str, fn: object) -> str:
        name = step_name(name)
        if not callable(fn):
            raise ValidationError("fn", f"step {name!r}: must be callable")
        with self._lock():
            named = self._steps_named
            if named is None:
                named = self._steps_named = set()
            if name in named:
                raise ValidationError(
                    "step", f"step {name!r} was already used in this attempt (names are unique)"
                )
            named.add(name)
        return name

    def _give_back(self, name: str) -> None:
        with self._lock():
            if self._steps_named is not None:
                self._steps_named.discard(name)

    def _done(self) -> dict[str, StepRecord]:
        """The job's steps recorded (read once per attempt, at its first step)."""
        done = self._steps_done
        if done is not None:
            return done
        with self._lock():
            if self._steps_done is None:
                store = self._step_store
                self._steps_done = {} if store is None else store.load_steps(self.job)
            return self._steps_done

    def _record(self, name: str, value: object) -> StepRecord:
        store = self._step_store
        if store is None:  # in memory: the value as JSON gives it back, as a store would
            text = validate.result(value)
            record = StepRecord(None if text is None else json.loads(text), self.job.attempts)
        else:
            record = self._fenced(lambda: store.record_step(self.job, name, value))
        done = self._done()
        with self._lock():
            done[name] = record
        return record

    def _fenced(self, call: Callable[[], T]) -> T:
        """``call()``; a lost lease cancels this context on its way out."""
        try:
            return call()
        except LeaseLost:
            self.cancel("lease lost")
            raise

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._step_io, functools.partial(fn, *args))

    def _lock(self) -> threading.Lock:
        lock = self._steps_lock
        if lock is None:
            with _LOCKS:
                lock = self._steps_lock
                if lock is None:
                    lock = self._steps_lock = threading.Lock()
        return lock


def _off_any_loop(twin: str) -> None:
    """A ValidationError when called from a coroutine: the database round trip
    would hold up every coroutine of the loop (``twin`` is what to await instead)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise ValidationError(
        "ctx", f"called from a coroutine, it would block the event loop: await ctx.{twin}(...)"
    )


def _close(value: object) -> None:
    """Close a coroutine nothing will await (no "never awaited" warning)."""
    close = getattr(value, "close", None)
    if callable(close):
        close()
