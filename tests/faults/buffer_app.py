"""The fault suite's handlers with the claim-ahead buffer held at a fixed depth.

``jobrun worker --app tests.faults.buffer_app:registry`` runs the handlers
of :mod:`tests.faults.app`, but its claimer keeps ``$JOBRUN_FAULTS_AHEAD``
jobs claimed ahead of its free threads whatever their run time (within the
``claim_ahead`` cap). :class:`jobrun.worker.ahead.Ahead` sizes the buffer
from the observed round trip and run time: slow handlers, which keep a full
buffer waiting long enough for a test to kill or freeze the worker, would
get none, and fast ones empty it before a test can look. The scenarios test
what a full buffer promises (no attempt burned by a crash, fenced starts,
limits counted), not how deep it is, so they set the depth here.
"""

from __future__ import annotations

import os

from jobrun.worker.ahead import Ahead
from tests.faults.app import registry

AHEAD_ENV = "JOBRUN_FAULTS_AHEAD"

__all__ = ["AHEAD_ENV", "registry"]


def _fixed_target(self: Ahead) -> int:
    """The buffer's size: ``$JOBRUN_FAULTS_AHEAD``, within the configured cap."""
    return max(min(self._cap, int(os.environ.get(AHEAD_ENV, "0"))), 0)


if os.environ.get(AHEAD_ENV):
    Ahead.target = _fixed_target  # type: ignore[method-assign]
