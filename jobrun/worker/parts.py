"""What every loop thread of the worker works with, given once.

The claimer, the completer and the heartbeat are each a
:class:`~jobrun.job.service.LoopThread` over the same store, configuration,
ledger (:class:`~jobrun.worker.leases.Leases`) and outcome recorder
(:class:`~jobrun.worker.outcomes.Outcomes`), each marking its steps for the
stall watch; :class:`WorkerLoop` holds them so that no part wires them its
own way.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

from jobrun.job.errors import JobrunError
from jobrun.job.model import Job, State
from jobrun.job.ports import Store
from jobrun.job.service import LoopThread
from jobrun.worker.config import WorkerConfig
from jobrun.worker.leases import Leases
from jobrun.worker.outcomes import Outcomes
from jobrun.worker.stall_watch import Activity

log = logging.getLogger("jobrun.worker")

GIVE_BACK_PAGE = 1000
"""Jobs per ``Store.unclaim`` statement when a buffer is given back."""


@dataclasses.dataclass(frozen=True, slots=True)
class Parts:
    """The store, configuration, ledger and recorder one worker's loops share."""

    store: Store
    config: WorkerConfig
    leases: Leases
    outcomes: Outcomes


class WorkerLoop(LoopThread):
    """A named loop thread of one worker, with the parts it shares."""

    def __init__(self, name: str, parts: Parts, activity: Activity) -> None:
        super().__init__(name)
        self.store = parts.store
        self.config = parts.config
        self.owner = parts.outcomes.owner
        self._leases = parts.leases
        self._outcomes = parts.outcomes
        self._activity = activity
        self._log = logging.LoggerAdapter(log, {"owner": self.owner})

    def give_back_unstarted(self, jobs: Sequence[Job]) -> None:
        """Buffered jobs that will not run here (the worker stops, or the
        database would not start them) leave the buffer and go back to their
        queue unstarted, attempts untouched; one whose cancel was requested
        ends cancelled. Those it cannot give back expire and are requeued
        without an attempt by the reaper."""
        for at in range(0, len(jobs), GIVE_BACK_PAGE):
            chunk = jobs[at : at + GIVE_BACK_PAGE]
            try:
                given = self.store.unclaim(chunk)
            except JobrunError as exc:
                self._log.info("giving back %d unstarted job(s) failed: %s", len(chunk), exc)
                given = None
            self._leases.unbuffer(chunk, started=False)
            if given is None:
                continue
            for job in chunk:
                state = given.get(job.id)
                if state is State.CANCELLED:
                    self._outcomes.count("cancelled", 1)
                elif state is None:
                    self._outcomes.count("lease_lost", 1)
