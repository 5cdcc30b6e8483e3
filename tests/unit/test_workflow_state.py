"""A workflow's state is derived from its jobs' by one rule (CLI, dashboard, metrics)."""

import datetime
import uuid

import pytest

from jobrun.job.model import State
from jobrun.job.workflow import WorkflowState, WorkflowSummary


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ({State.WAITING: 1, State.DEAD: 1}, WorkflowState.RUNNING),
        ({State.QUEUED: 1}, WorkflowState.RUNNING),
        ({State.LEASED: 1, State.SUCCEEDED: 3}, WorkflowState.RUNNING),
        ({State.SUCCEEDED: 2, State.CANCELLED: 1, State.DEAD: 1}, WorkflowState.FAILED),
        ({State.SUCCEEDED: 2, State.CANCELLED: 1}, WorkflowState.CANCELLED),
        ({State.SUCCEEDED: 2, State.QUEUED: 0}, WorkflowState.SUCCEEDED),
    ],
)
def test_a_workflow_runs_while_a_job_can_and_then_takes_its_worst_outcome(
    jobs: dict[State, int], expected: WorkflowState
) -> None:
    assert WorkflowState.of(jobs) is expected


def test_a_summary_counts_its_jobs_and_names_its_state() -> None:
    now = datetime.datetime.now(datetime.UTC)
    summary = WorkflowSummary(
        id=uuid.uuid4(),
        name="order",
        created_at=now,
        finished_at=None,
        jobs={State.SUCCEEDED: 3, State.WAITING: 1},
    )
    assert summary.total == 4
    assert summary.state is WorkflowState.RUNNING
