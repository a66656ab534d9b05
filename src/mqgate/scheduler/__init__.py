"""The scheduler: messages held until their destinations are due (SPEC S1–S6)."""

from mqgate.scheduler.interface import Destination, Due, Scheduler, SchedulerStats

__all__ = ["Destination", "Due", "Scheduler", "SchedulerStats"]
