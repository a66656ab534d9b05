"""A topic as the Redis store knows it (its keys, wake channel and local waiters), and the
small helpers of the store's replies."""

from __future__ import annotations

from typing import Any

from mqgate.store.interface import TopicConfig
from mqgate.store.waiters import TopicWaiters


def unparsed(response: Any, **options: Any) -> Any:
    return response


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


class StoreTopic:
    """A topic's Redis keys and wake channel, and this gateway's waiters on it."""

    __slots__ = ("channel", "config", "meta", "name", "streams", "waiters")

    def __init__(self, prefix: str, config: TopicConfig) -> None:
        self.name = config.name
        self.config = config
        tag = f"{prefix}:{{t:{config.name}}}"
        self.meta = f"{tag}:meta".encode()
        self.channel = f"{prefix}:wake:{config.name}".encode()
        self.streams = [f"{tag}:q:{q}".encode() for q in range(config.queues)]
        self.waiters = TopicWaiters()

    def resize(self, config: TopicConfig) -> None:
        tag = self.meta[: -len(b":meta")]
        self.config = config
        self.streams += [b"%s:q:%d" % (tag, q) for q in range(len(self.streams), config.queues)]

    @property
    def epoch(self) -> int:
        return self.waiters.epoch

    def notify(self, count: int | None = None, consumer: str | None = None) -> None:
        self.waiters.wake(count, consumer)
