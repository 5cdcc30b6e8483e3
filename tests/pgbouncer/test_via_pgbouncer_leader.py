"""tests/postgres/test_leader.py again, the lease-row leader through PgBouncer in transaction mode.

The session lock of the deference test is taken directly (a session lock
through a transaction pooler is exactly what must never be done).
"""

import pytest

from tests.postgres.test_leader import *  # noqa: F403


@pytest.fixture
def session_dsn(direct_dsn: str) -> str:
    return direct_dsn
