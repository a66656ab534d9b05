from mqgate.store.backends.redis.store import RedisStore

__all__ = ["RedisStore"]
