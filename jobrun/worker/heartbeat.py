"""The heartbeat: keeps the leases of the jobs a worker holds, and hears cancels.

Every ``heartbeat_interval`` it extends, in one statement, the lease of
every job running or finished and not yet recorded, and cancels the context
of each job the store left out (its cancel was requested, or its lease is
lost: another worker may run it). While heartbeats fail for longer than the
lease TTL the leases may be gone, so the running handlers are cancelled
rather than left to finish work someone else may already redo. Each beat
also keeps the worker's registry row fresh (jobrun.workers): in the
heartbeat's own statement when it holds leases, by registering again when
idle. It stops
last, after the completer has flushed: a lease is kept until its outcome is.
"""

from __future__ import annotations

import time
import uuid

from jobrun.job import outage
from jobrun.job.errors import JobrunError
from jobrun.job.model import Job
from jobrun.job.workers import WorkerInfo
from jobrun.worker.leases import token
from jobrun.worker.parts import Parts, WorkerLoop
from jobrun.worker.stall_watch import Activity


class Heartbeat(WorkerLoop):
    """The ``jobrun-heartbeat`` thread; :meth:`heartbeat_once` is one beat."""

    def __init__(self, parts: Parts, activity: Activity) -> None:
        super().__init__("jobrun-heartbeat", parts, activity)
        self.info: WorkerInfo | None = None
        """The worker's registry row (set when it starts; None: not registered)."""
        self.registered = False

    def loop(self) -> None:
        interval = self.config.heartbeat_interval.total_seconds()
        ttl = self.config.lease_ttl.total_seconds()
        last_ok = time.monotonic()
        activity = self._activity
        while not self.stopping.wait(interval):
            activity.busy("extending leases")
            try:
                self.heartbeat_once()
                last_ok = time.monotonic()
            except JobrunError as exc:
                outage.of(self.store).failed(exc, "heartbeat")
                if time.monotonic() - last_ok > ttl:
                    # Our leases may be gone: stop the handlers rather than
                    # let them finish work someone else may already redo.
                    for r in self._leases.running():
                        r.ctx.cancel("heartbeats failing for longer than the lease TTL")
            except Exception:
                self._log.exception("heartbeat loop error")
            activity.idle()

    def heartbeat_once(self) -> None:
        """Extend every lease this worker holds; cancel the jobs the store left out.

        Only the leases sent are judged: a job claimed while the heartbeat
        was in flight is not "left out". When the same job runs under two
        claims of this worker (reaped, then claimed again before the stale
        handler returned), only the newest claim is live: the older one is
        cancelled at once.
        """
        running, unflushed = self._leases.held()
        newest: dict[uuid.UUID, Job] = {}
        for job in [r.job for r in running] + unflushed:
            current = newest.get(job.id)
            # On a tie the later entry is the newer claim (held() lists claims
            # in order; a buffered claim counts no attempt yet).
            if current is None or job.attempts >= current.attempts:
                newest[job.id] = job
        for r in running:
            if newest[r.job.id] is not r.job and not r.ctx.is_cancelled:
                r.ctx.cancel("superseded by a newer claim of the same job")
        if not newest or not self.registered:
            # Idle (or not yet in the registry): the beat is the registration,
            # refreshed. Busy, HeartbeatJobs refreshes it in its statement.
            if self.info is not None:
                self.store.register_worker(self.info)
                self.registered = True
            if not newest:
                return
        leases = [(job.id, token(job)) for job in newest.values()]
        sent_at = time.monotonic()
        until = self.store.now() + self.config.lease_ttl
        kept = self._outcomes.call(
            "heartbeat", len(leases), lambda: self.store.heartbeat(self.owner, leases, until)
        )
        sent = {claim for _, claim in leases}
        lease_until = sent_at + self.config.lease_ttl.total_seconds()
        self._leases.extend((claim for job_id, claim in leases if job_id in kept), lease_until)
        for r in running:
            if token(r.job) in sent and r.job.id not in kept and not r.ctx.is_cancelled:
                r.ctx.logger.info("cancelling: cancel requested or lease lost")
                r.ctx.cancel("cancel requested or lease lost")
