"""The integrations stay optional: the core imports no ORM, even with ``conn=``."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import psycopg
import jobrun
from jobrun.contrib import caller_connection
with psycopg.connect(sys.argv[1]) as conn, caller_connection(conn) as lent:
    assert lent is conn
try:
    with caller_connection(object()):
        pass
except jobrun.ValidationError:
    pass
print(sorted({m.split(".")[0] for m in sys.modules} & {"django", "django_tasks", "sqlalchemy"}))
"""


def test_importing_jobrun_and_resolving_a_psycopg_conn_imports_no_orm(dsn: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, dsn], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
