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

from jobrun.job.ports import Store
from jobrun.job.service import LoopThread
from jobrun.worker.config import WorkerConfig
from jobrun.worker.leases import Leases
from jobrun.worker.outcomes import Outcomes
from jobrun.worker.stall_watch import Activity

log = logging.getLogger("jobrun.worker")


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
