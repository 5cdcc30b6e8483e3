"""The job.Schedules half of the Store (filled in by the Schedules issue)."""

from __future__ import annotations


class SchedulesMixin:
    """Cron schedules stored next to the jobs."""
