"""JobContext: what a handler gets besides its job."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time

from jobrun.job.model import Job
from jobrun.worker.logs import job_fields


@dataclasses.dataclass(eq=False)
class JobContext:
    """The handler's view of its attempt.

    ``cancelled`` is set when the job must stop: its cancel was requested,
    its lease was lost, its timeout passed, or the worker is shutting down.
    Long handlers should check it (or wait on it instead of sleeping): a
    handler that returns after cancellation is reported as failed, never as
    succeeded. ``deadline`` is a ``time.monotonic()`` value (None: no timeout).
    """

    job: Job
    cancelled: threading.Event
    deadline: float | None
    cancel_reason: str | None = None
    _logger: logging.LoggerAdapter[logging.Logger] | None = dataclasses.field(
        default=None, repr=False
    )

    @property
    def logger(self) -> logging.LoggerAdapter[logging.Logger]:
        """``jobrun.job.<type>``, its records carrying the job's fields (made on first use).

        The same fields as the worker's own lines about the job (id, type,
        attempt, max_attempts, queue; see :mod:`jobrun.worker.logs`), so that
        the console and a log shipper tie a handler's lines to its job.
        """
        if self._logger is None:
            self._logger = logging.LoggerAdapter(
                logging.getLogger(f"jobrun.job.{self.job.type}"), job_fields(self.job)
            )
        return self._logger

    @property
    def attempt(self) -> int:
        """1 for the first attempt."""
        return self.job.attempts

    def remaining(self) -> float | None:
        """Seconds until the deadline (None without one)."""
        if self.deadline is None:
            return None
        return max(self.deadline - time.monotonic(), 0.0)

    def cancel(self, reason: str) -> None:
        if self.cancel_reason is None:
            self.cancel_reason = reason
        self.cancelled.set()

    @property
    def is_cancelled(self) -> bool:
        return self.cancelled.is_set()
