"""The scheduler: leader election, cron materialisation, reaper, retention."""

from jobrun.scheduler.service import SchedulerConfig, SchedulerService, TickReport

__all__ = ["SchedulerConfig", "SchedulerService", "TickReport"]
