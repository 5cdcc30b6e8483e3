"""The workers' registry (``jobrun.workers``, migration 0013) on the Store.

A worker registers at start (:meth:`Workers.register_worker`, an upsert that
also prunes the rows of workers gone for long), its heartbeat keeps
``last_seen_at`` fresh (riding in ``HeartbeatJobs``; an idle beat registers
again), and a clean stop unregisters. The claims read the table to take only
the types a worker knows (``ClaimJobs``). Single statements on the pool, the
database clock throughout: see :mod:`jobrun.job.workers` and
docs/workers-registry.md.
"""

from __future__ import annotations

import datetime as dt

from jobrun.job import validate
from jobrun.job.workers import WorkerInfo, WorkerStatus
from jobrun.postgres.admin import Admin
from jobrun.postgres.convert import utc

LeaderElection = tuple[tuple[int, int], str]
"""The scheduler's election: its advisory lock key and its lease row's name."""


class Workers(Admin):
    """The registry half of the Store (see the module docstring)."""

    def register_worker(self, info: WorkerInfo) -> int:
        """Insert or refresh ``info``'s row (last seen: now); prune workers gone
        for long. Returns how many rows were pruned."""
        if not isinstance(info, WorkerInfo):
            raise TypeError("register_worker() takes a WorkerInfo")
        row = self._on_pool(
            lambda c: self.q.register_worker(
                c,
                id=info.id,
                host=info.host,
                pid=info.pid,
                version=info.version,
                queues=list(info.queues),
                concurrency=info.concurrency,
                types=list(info.types),
                lease_ttl_seconds=info.lease_ttl.total_seconds(),
            )
        )
        return 0 if row is None else row.pruned

    def unregister_worker(self, worker_id: str) -> None:
        """Take a worker's row away (a clean stop)."""
        validate.owner(worker_id)
        self._on_pool(lambda c: self.q.unregister_worker(c, id=worker_id))

    def mark_leader(self, worker_id: str, session_pid: int | None) -> bool:
        """Note that worker ``worker_id``'s scheduler was elected on the session
        ``session_pid`` (the advisory lock's backend); believed only while that
        session holds the lock (:meth:`workers`). False: the worker has no row
        (yet), nothing was noted."""
        validate.owner(worker_id)
        row = self._on_pool(
            lambda c: self.q.mark_worker_leader(c, id=worker_id, leader_pid=session_pid)
        )
        return row is not None and row.marked > 0

    def workers(self, leader: LeaderElection | None = None) -> list[WorkerStatus]:
        """Every registered worker, idle ones included, oldest first.

        ``leader`` names the scheduler's election (its lock key and lease
        row's name: :func:`jobrun.postgres.leader.leader_election` of the
        schema); a worker leading it is marked. None: no one is marked.
        """
        (lock_class, lock_object), election = leader or ((0, 0), "")
        rows = self._on_pool_read(
            lambda c: self.q.list_workers(
                c, lock_class=lock_class, lock_object=lock_object, election=election
            )
        )
        return [
            WorkerStatus(
                info=WorkerInfo(
                    id=r.id,
                    host=r.host,
                    pid=r.pid,
                    version=r.version,
                    queues=tuple(r.queues),
                    concurrency=r.concurrency,
                    types=tuple(r.types),
                    lease_ttl=dt.timedelta(seconds=r.lease_ttl_seconds),
                ),
                started_at=utc(r.started_at),
                last_seen_at=utc(r.last_seen_at),
                live=r.live,
                leased=r.leased,
                leader=bool(r.leader),
                db_now=utc(r.db_now),
            )
            for r in rows
        ]
