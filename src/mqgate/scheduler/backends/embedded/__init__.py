from mqgate.scheduler.backends.embedded.scheduler import EmbeddedScheduler

__all__ = ["EmbeddedScheduler"]
