"""A worker process killed (SIGKILL) after a step's checkpoint: the step stays
done, and the retry, in another worker, skips it."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from jobrun.job.model import Backoff, NewJob, State
from jobrun.postgres.store import Store
from jobrun.testing import run_jobs
from tests.acceptance.apps.steps import registry
from tests.acceptance.conftest import WorkerProcess

APP = "tests.acceptance.apps.steps:registry"


def test_a_worker_killed_after_a_steps_checkpoint_leaves_it_done_for_the_retry(
    store: Store, conn: Any, tmp_path: Path, start_worker: Callable[..., WorkerProcess]
) -> None:
    out = tmp_path / "steps.log"
    job = store.enqueue(
        NewJob(
            type="resumable",
            payload={"path": str(out), "kill": True},
            backoff=Backoff(kind="constant", base=0.0, jitter=0.0),
        )
    )
    worker = start_worker("--app", APP, "--no-scheduler")
    assert worker.wait(60) == -signal.SIGKILL, worker.output()
    assert out.read_text().splitlines() == ["one 1"]
    assert store.get(job.id).state is State.LEASED  # nobody finished it
    # Its lease runs out; the reaper queues it again; another worker runs it.
    conn.execute(
        "UPDATE jobrun.jobs SET lease_expires_at = now() - interval '1 minute' WHERE id = %s",
        [job.id],
    )
    assert store.reap_expired(store.now(), 10).requeued == [job.id]
    report = run_jobs(store, registry)
    assert report.succeeded == 1
    done = store.get(job.id)
    assert done.attempts == 2 and done.result == "one+two"
    assert out.read_text().splitlines() == ["one 1", "two 2"]  # step one ran once
    rows = conn.execute(
        "SELECT name, attempt FROM jobrun.job_steps WHERE job_id = %s ORDER BY name", [job.id]
    ).fetchall()
    assert rows == [("one", 1), ("two", 2)]
