"""How many jobs a worker claims ahead of its free threads.

A worker that claims only for the threads free right now leaves them idle
for a round trip each time they free up, and its claims shrink to the few
threads that happened to be free. Claiming ahead keeps a buffer of leased,
not yet started jobs (:class:`~jobrun.worker.leases.Leases`), started by the
claimer's next round together with its claim and completions, so that
claims are large and rounds overlap the handlers' work.

The buffer is sized from what the worker observes: the jobs its threads end
during about two round trips (``concurrency`` times the round trip over the
mean run time, both moving averages). Short jobs get a deep buffer, long
ones none: a one-second job on ten threads with a 3 ms round trip buffers
nothing, so long jobs are never hoarded by one worker while another is
idle. ``WorkerConfig.claim_ahead`` caps it (0: never claim ahead); by
default the cap is the larger of ``concurrency`` and the completion batch.
"""

from __future__ import annotations

import math

from jobrun.job import validate
from jobrun.worker.config import WorkerConfig
from jobrun.worker.leases import Leases

_WEIGHT = 0.2
"""Weight of the newest round trip in its moving average."""
_ROUND_TRIPS = 2.0
"""Round trips of work the buffer covers."""


class Ahead:
    """The size of the claimer's buffer (see the module docstring)."""

    def __init__(self, config: WorkerConfig, leases: Leases) -> None:
        self._concurrency = config.concurrency
        cap = config.claim_ahead
        if cap is None:
            cap = max(config.concurrency, config.complete_batch_size)
        self._cap = min(cap, validate.MAX_CLAIM_LIMIT - config.concurrency)
        self._leases = leases
        self._round_trip: float | None = None

    def round_trip(self, seconds: float) -> None:
        """A round took ``seconds``, from its send to its answer."""
        rtt = self._round_trip
        self._round_trip = seconds if rtt is None else rtt + _WEIGHT * (seconds - rtt)

    def target(self) -> int:
        """The buffer's size now: 0 until a round trip and a run were observed."""
        rtt, run = self._round_trip, self._leases.mean_run_time()
        if self._cap <= 0 or rtt is None or run is None:
            return 0
        want = self._concurrency * _ROUND_TRIPS * rtt / max(run, 1e-6)
        return min(self._cap, math.floor(want))

    def room(self, buffered: int) -> int:
        """Jobs to claim ahead now, with ``buffered`` still in the buffer."""
        return max(self.target() - buffered, 0)
