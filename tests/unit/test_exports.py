"""The public facade: a curated, sorted __all__ whose every name exists."""

from __future__ import annotations

import subprocess
import sys

import jobrun
from jobrun.job.errors import WaitTimeout
from jobrun.worker import Done


def test_all_is_sorted_and_complete() -> None:
    names = [n for n in jobrun.__all__ if n != "__version__"]
    assert names == sorted(names)
    for name in jobrun.__all__:
        assert hasattr(jobrun, name), name


def test_every_public_attribute_is_exported() -> None:
    modules = {
        "client",
        "producer",
        "workflow",
        "config",
        "job",
        "postgres",
        "runtime",
        "scheduler",
        "worker",
        "testing",
        "cli",
        "demo",
        "observe",  # subpackages: attributes of jobrun once some test imported them
        "web",
        "aio",  # loaded by jobrun.AsyncClient on first use
        "contrib",  # loaded by Client when conn= is an ORM's session or connection
        "pytest_plugin",  # loaded by pytest itself, through the pytest11 entry point
    }
    # pytest rewrites the asserts of a distribution that ships a pytest11
    # plugin, jobrun included: its helpers' names ("@py_builtins") are not ours.
    public = {n for n in vars(jobrun) if not n.startswith(("_", "@"))} - modules
    assert public <= set(jobrun.__all__)


def test_the_main_entry_points_are_exported() -> None:
    for name in (
        "Client",
        "Registry",
        "Worker",
        "SchedulerService",
        "NewJob",
        "ScheduleSpec",
        "PermanentFailure",
        "JobContext",
        "LeaseLost",
        "IdempotencyConflict",
    ):
        assert name in jobrun.__all__


def test_jobrun_testing_is_reachable_from_import_jobrun() -> None:
    # A fresh interpreter: in this one another test may have imported it already.
    script = "import jobrun; print(jobrun.testing.run_jobs.__name__)"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "run_jobs"


def test_what_an_embedding_program_needs_is_exported() -> None:
    for name in ("Runtime", "Settings", "SchemaMismatch", "migrate", "migration_sql"):
        assert name in jobrun.__all__, name


def test_what_a_waiting_caller_catches_and_returns_is_exported() -> None:
    assert "WaitTimeout" in jobrun.__all__
    assert jobrun.WaitTimeout is WaitTimeout
    assert issubclass(jobrun.WaitTimeout, TimeoutError)
    assert "Done" in jobrun.__all__
    assert jobrun.Done is Done
