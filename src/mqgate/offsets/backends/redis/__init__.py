from mqgate.offsets.backends.redis.store import RedisOffsetStore

__all__ = ["RedisOffsetStore"]
