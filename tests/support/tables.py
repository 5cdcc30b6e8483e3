"""jobrun's tables, as a least-privilege role must be granted them one by one.

The fault suite's runtime role (``tests/faults/test_security.py``) is
granted exactly these, so that a table a release adds but a role granted
table by table lacks shows up as a real failure there. That suite runs
only in CI, where a missing name cost whole runs twice; so the list is
checked against a freshly migrated schema in ``make test`` too
(``tests/migration/test_migrate.py``).
"""

JOBRUN_TABLES = (
    "jobs",
    "job_events",
    "processed_effects",
    "schedules",
    "queue_pauses",
    "schema_version",
    "queue_limits",
    "queue_starts",
    "leader",
    "workers",
    "job_steps",
    "job_fences",
    "workflows",
    "job_dependencies",
    "job_waits",
    "job_signals",
    "workflow_signals",
    "workflow_signal_deliveries",
    "workflow_jobs",
)
"""jobrun's tables (schema jobrun); the fault suite's handlers also write public.effects."""
