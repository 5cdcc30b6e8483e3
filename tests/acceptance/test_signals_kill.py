"""Worker processes killed (SIGKILL) around a durable signal wait lose nothing:
a parked job holds no lease (no reaper needed), and a payload delivered
before the crash is replayed, never delivered twice."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobrun.job.model import Backoff, EventKind, NewJob, State
from jobrun.postgres.store import Store
from jobrun.testing import run_jobs
from tests.acceptance.apps.signals import registry
from tests.acceptance.conftest import WorkerProcess
from tests.support.waiting import wait_for

APP = "tests.acceptance.apps.signals:registry"
NOW = Backoff(kind="constant", base=0.0, jitter=0.0)


def test_a_worker_killed_while_its_job_waits_for_a_signal_loses_nothing(
    store: Store, conn: Any, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    out = tmp_path / "signup.log"
    job = store.enqueue(NewJob(type="signup", payload={"path": str(out)}, backoff=NOW))
    worker = start_worker("--app", APP, "--no-scheduler")
    wait_for(lambda: EventKind.PARKED in [e.kind for e in store.events(job.id)])
    worker.signal(signal.SIGKILL)
    assert worker.wait(60) == -signal.SIGKILL
    # Parked, it held nothing: no lease to expire, nothing for the reaper.
    row = conn.execute(
        "SELECT state, lease_owner, lease_expires_at FROM jobrun.jobs WHERE id = %s", [job.id]
    ).fetchone()
    assert row == ("queued", None, None)
    assert store.signal(job.id, "confirmed", {"email": "ada@example.com"}).woke
    assert run_jobs(store, registry).succeeded == 1
    assert store.get(job.id).result == {"email": "ada@example.com"}
    assert out.read_text().splitlines() == [
        "welcome 1",
        'confirmed {"email": "ada@example.com"} 1',
    ]


def test_a_worker_killed_after_the_signal_was_delivered_replays_it_on_the_retry(
    store: Store, conn: Any, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    out = tmp_path / "signup.log"
    job = store.enqueue(
        NewJob(type="signup", payload={"path": str(out), "kill": True}, backoff=NOW)
    )
    store.signal(job.id, "confirmed", "yes", key="click-1")
    worker = start_worker("--app", APP, "--no-scheduler")
    assert worker.wait(60) == -signal.SIGKILL, worker.output()
    assert store.get(job.id).state is State.LEASED  # nobody finished it
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [job.id],
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    assert not store.signal(job.id, "confirmed", "yes", key="click-1").sent  # a second click
    assert run_jobs(store, registry).succeeded == 1
    done = store.get(job.id)
    assert done.result == "yes" and done.attempts == 2
    assert out.read_text().splitlines() == ["welcome 1", 'confirmed "yes" 1', 'confirmed "yes" 2']
    kinds = [e.kind for e in store.events(job.id)]
    assert kinds.count(EventKind.SIGNAL_DELIVERED) == 1 and EventKind.PARKED not in kinds
