"""The worker's half of a durable wait: parking the job its handler left.

A handler in a durable wait that is not over leaves by raising
:class:`~jobrun.job.signals.Parked` (:mod:`jobrun.worker.waits`); the
executor hands it here, as it hands a Snooze to
:meth:`~jobrun.worker.outcomes.Outcomes.snooze`. The park is written like
the other outcomes (``Outcomes.record``: database faults retried, a lost
lease said once), counted in ``stats["parked"]`` and reported to the hooks
as a "parked" outcome. A park is no snooze: ``snoozes`` and ``max_snoozes``
are not involved (a workflow may wait as often as it needs).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from jobrun.job.model import Job, State
from jobrun.job.signals import Parked, WaitStore
from jobrun.worker import text
from jobrun.worker.outcomes import Outcomes


def park(outcomes: Outcomes, job: Job, parked: Parked, started: float) -> None:
    """Record a durable wait's park (the executor's half of :class:`Parked`): the
    job queued again until the wait is over, its lease and attempt given back;
    cancelled instead when a cancel was requested (cancel wins)."""
    duration = time.monotonic() - started
    what = "sleeping" if parked.signal is None else f"waiting for signal {parked.signal!r}"
    reason = f"{what} (step {parked.step!r}) until {text.iso(parked.until)}"
    store: WaitStore = outcomes.store
    done = outcomes.record(
        job,
        lambda: store.park(job, parked.step, signal=parked.signal is not None),
        "durable wait",
        duration=duration,
    )
    if done is None:
        return
    fields: dict[str, Any] = {"duration_ms": round(duration * 1000, 3)}
    if done.state is State.CANCELLED:
        outcomes.count("cancelled")
        if outcomes.hooks is not None:
            outcomes.finished("cancelled", job, duration=duration, error_text=reason)
        outcomes.job_log(
            logging.INFO,
            job,
            "cancelled",
            f"cancelled in {text.ms(duration)}: cancel was requested (it wins over the wait)",
            fields,
        )
        return
    outcomes.count("parked")
    if outcomes.hooks is not None:
        outcomes.finished(
            "parked", job, duration=duration, error_text=reason, next_run_at=done.run_at
        )
    fields.update(next_run_at=text.iso(done.run_at), step=parked.step, signal=parked.signal)
    outcomes.job_log(
        logging.INFO,
        job,
        "parked",
        f"{reason}: parked after {text.ms(duration)} (attempt not counted); "
        f"next run at {text.iso(done.run_at)}",
        fields,
    )
