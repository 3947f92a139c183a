"""Schedule primitives on the loop IR and the default schedule."""

from ember.schedule.primitives import Schedule, ScheduleError, Step, Trace

__all__ = ["Schedule", "ScheduleError", "Step", "Trace"]
