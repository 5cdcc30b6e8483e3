"""Inspect and administer jobs: get, list, events, cancel, retry, watch, wait.

The source of :mod:`jobrun.postgres.admin` (``make generate``): edit this
file, never the generated one. Reads are single statements on the pool;
cancel and retry are one transaction each (SELECT FOR UPDATE, UPDATE, event,
and for retry a wake-up).
"""

from __future__ import annotations

import builtins
import uuid

from jobrun.job.errors import InvalidState, NotFound
from jobrun.job.model import Event, EventKind, Job, State
from jobrun.postgres.convert import event_from_row, job_from_row
from jobrun.postgres.enqueue_async import AsyncEnqueue
from jobrun.postgres.events import EventRow
from jobrun.postgres.plans import check_id, list_args
from jobrun.postgres.sqlc import models
from jobrun.postgres.transactions_async import AsyncConn
from jobrun.postgres.wait_async import DEFAULT_POLL_INTERVAL, wait_finished


class AsyncAdmin(AsyncEnqueue):
    """The inspect-and-administer half of a store (see the module docstring)."""

    async def get(self, job_id: uuid.UUID) -> Job:
        check_id(job_id)
        row = await self._on_pool_read(lambda c: self.q.get_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    async def list(
        self,
        *,
        queue: str | None = None,
        state: State | str | None = None,
        type: str | None = None,
        after: uuid.UUID | None = None,
        limit: int = 100,
    ) -> builtins.list[Job]:
        """Jobs matching the filters, oldest first; pass a page's last id as ``after``."""
        args = list_args(queue=queue, state=state, type=type, after=after, limit=limit)
        rows = await self._on_pool_read(lambda c: self.q.list_jobs(c, **args))
        return [job_from_row(r) for r in rows]

    async def events(self, job_id: uuid.UUID) -> builtins.list[Event]:
        check_id(job_id)
        rows = await self._on_pool_read(lambda c: self.q.list_events(c, job_id=job_id))
        return [event_from_row(r) for r in rows]

    async def cancel(self, job_id: uuid.UUID) -> Job:
        """Queued: cancelled now. Leased: cancel requested (the next heartbeat
        drops it and the worker stops the handler). Terminal: unchanged."""
        check_id(job_id)

        async def run(c: AsyncConn) -> Job:
            row = await self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.QUEUED:
                done = await self.q.cancel_queued_job(
                    c, id=job_id, finish_channel=self.finish_channel
                )
                assert done is not None
                await self._record(
                    c, [EventRow(job_id, EventKind.CANCELLED, row.attempts, {"via": "cancel"})]
                )
                return job_from_row(done)
            if row.state == models.JobState.LEASED and not row.cancel_requested:
                done = await self.q.request_cancel(c, id=job_id)
                assert done is not None
                await self._record(c, [EventRow(job_id, EventKind.CANCEL_REQUESTED, row.attempts)])
                return job_from_row(done)
            return job_from_row(row)

        return await self._with_tx(run)

    async def retry(self, job_id: uuid.UUID) -> Job:
        """Make a job runnable now: from dead, cancelled or succeeded with attempts
        reset; a queued job just moves up to now. A leased job is InvalidState."""
        check_id(job_id)

        async def run(c: AsyncConn) -> Job:
            row = await self.q.lock_job(c, id=job_id)
            if row is None:
                raise NotFound("job", job_id)
            if row.state == models.JobState.LEASED:
                raise InvalidState(job_id, str(row.state), "retry")
            done = await self.q.requeue_job(c, id=job_id)
            assert done is not None
            await self._record(
                c, [EventRow(job_id, EventKind.RETRIED, done.attempts, {"from": str(row.state)})]
            )
            await self._notify(c, done.queue)
            return job_from_row(done)

        return await self._with_tx(run)

    async def watch(self, job_id: uuid.UUID) -> Job:
        """Ask for the end of the job to be announced on :attr:`finish_channel`; the job now.

        LISTEN on the channel *before* calling this: every transition that
        ends the job from now on sends its id there, in its own transaction.
        A job already finished is returned as it is (nothing will be sent).
        """
        check_id(job_id)
        row = await self._on_pool(lambda c: self.q.watch_job(c, id=job_id))
        if row is None:
            raise NotFound("job", job_id)
        return job_from_row(row)

    async def wait(
        self,
        job_id: uuid.UUID,
        timeout: float | None = None,
        *,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> Job:
        """The job once it has finished (succeeded, dead or cancelled), woken by a
        notification (see :mod:`jobrun.postgres.wait`); WaitTimeout after ``timeout`` s."""
        check_id(job_id)
        return await wait_finished(
            self.pool,
            job_id,
            timeout,
            finish_channel=self.finish_channel,
            direct_url=self.direct_url,
            watch=self.watch,
            get=self.get,
            poll_interval=poll_interval,
        )
