"""tests/postgres/test_schedules.py again through PgBouncer (transaction mode).

The tests are imported, not copied: the dsn fixture of this directory
points them at the transaction-mode PgBouncer (see conftest.py).
"""

from tests.postgres.test_schedules import *  # noqa: F403
