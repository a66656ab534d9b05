from mqgate.scheduler.backends.redis.scheduler import RedisScheduler

__all__ = ["RedisScheduler"]
