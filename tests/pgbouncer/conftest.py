"""The pooler suite: jobrun through a real PgBouncer (Debian's ``pgbouncer``).

Two PgBouncers per session in front of the test PostgreSQL: one in
transaction pooling mode, one in session mode (:mod:`tests.support.pgbouncer`).
In this directory the ``dsn`` fixture is the test database **through the
transaction-mode PgBouncer**, so every fixture built on it (``pool``,
``store``, ...) and every Store test re-run here (the ``test_via_*``
modules import tests/postgres' tests) goes through it; ``conn`` and
``admin_dsn`` stay direct, for setup and assertions. ``direct_dsn`` is the
database reached directly, as ``JOBRUN_DIRECT_URL`` would.

Without pgbouncer installed these tests skip, except with ``CI=true``,
where they fail: the CI installs it (``.ci/run``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from tests.support.database import RUNTIME_ROLE, TestServer
from tests.support.pgbouncer import PgBouncer, ci, pgbouncer_binary


def _users(server: TestServer) -> dict[str, str]:
    users = {}
    admin = psycopg.conninfo.conninfo_to_dict(server.admin_dsn)
    users[str(admin.get("user") or "postgres")] = str(admin.get("password") or "")
    if server.runtime_role:
        users[RUNTIME_ROLE] = server._runtime_password
    return users


def require_pgbouncer() -> None:
    """Skip the test when pgbouncer is not installed (fail it under CI=true)."""
    if pgbouncer_binary() is None:
        message = "pgbouncer is not installed (apt-get install pgbouncer)"
        if ci():
            pytest.fail(f"{message}; CI=true: the pooler suite must run", pytrace=False)
        pytest.skip(message)


def _bouncer(server: TestServer, mode: str) -> Iterator[PgBouncer]:
    require_pgbouncer()
    bouncer = PgBouncer(server.admin_dsn, pool_mode=mode, users=_users(server))
    bouncer.start()
    try:
        yield bouncer
    finally:
        bouncer.destroy()


@pytest.fixture(scope="session")
def pgbouncer(pg_server: TestServer) -> Iterator[PgBouncer]:
    """A PgBouncer in transaction pooling mode, for the whole session."""
    yield from _bouncer(pg_server, "transaction")


@pytest.fixture(scope="session")
def pgbouncer_session(pg_server: TestServer) -> Iterator[PgBouncer]:
    """A PgBouncer in session pooling mode, for the whole session."""
    yield from _bouncer(pg_server, "session")


@pytest.fixture
def direct_dsn(pg_server: TestServer, database: str) -> str:
    """The test database reached directly (the app role's DSN), as JOBRUN_DIRECT_URL."""
    return pg_server.app_dsn(database)


@pytest.fixture
def dsn(pgbouncer: PgBouncer, direct_dsn: str) -> str:
    """The test database through the transaction-mode PgBouncer (overrides the root one)."""
    return pgbouncer.dsn(direct_dsn)


SESSION_ONLY = {
    "test_via_pgbouncer_admin.py": (
        "test_retry_of_a_finished_job_queues_it_now_with_attempts_reset",
        "test_resume_queue_sends_its_wake_up_in_the_transaction_that_lifts_the_pause",
        "test_retry_sends_its_wake_up_in_the_transaction_that_requeues_the_job",
        "test_a_paused_queue_is_not_claimed_from_but_accepts_jobs",
    ),
    "test_via_pgbouncer_enqueue.py": (
        "test_enqueue_notifies_the_queue_name_on_the_store_channel",
        "test_notify_channel_option_changes_the_channel",
        "test_transactional_enqueue_exists_and_notifies_only_after_the_caller_commits",
        "test_enqueue_batch_inserts_every_job_with_events_and_one_notification_per_queue",
        "test_enqueue_of_a_delayed_job_notifies_its_queue_with_the_delay_left",
        "test_a_delayed_job_enqueued_in_a_callers_transaction_notifies_at_its_commit",
        "test_enqueue_batch_wakes_each_queue_for_its_due_jobs_and_its_soonest_delayed_one",
        "test_enqueue_many_of_delayed_jobs_notifies_their_delay",
    ),
    "test_via_pgbouncer_results.py": (
        "test_only_watched_jobs_are_announced_on_the_finish_channel",
    ),
}
"""Re-run tests that LISTEN on ``dsn`` themselves to check a notification.

A LISTEN through a transaction pooler is left on whichever server session
ran it, so these cannot pass through one, by design: jobrun itself never
LISTENs there (the direct URL, or polling; test_pgbouncer.py covers both),
and the notifications they check are sent by the same statements, which
the rest of the re-run executes through PgBouncer. They run directly in
tests/postgres.
"""


SERVER_SIDE_ONLY = {
    "test_via_pgbouncer_leases.py": ("test_heartbeats_are_hot_updates",),
}
"""Re-run tests that check what the server does with a statement, not how it got there.

Whether a heartbeat's UPDATE is HOT depends on the columns it changes and
the room on the page, the same through a pooler. Through PgBouncer this one
also waited out the server sessions' statistics flush (the pooler keeps
them open, so they report up to 10 s late): 10 s of ``make test`` spent on
a wait. The heartbeats themselves run through PgBouncer in the rest of the
re-run; the HOT check runs directly in tests/postgres.
"""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    keep, dropped = [], []
    for item in items:
        module = item.path.name
        name = getattr(item, "originalname", item.name)
        if name in SESSION_ONLY.get(module, ()) or name in SERVER_SIDE_ONLY.get(module, ()):
            dropped.append(item)
            continue
        keep.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
