"""What the registry holds, as plain values."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from typing import Final

import msgspec

from mqgate.core.layout import QueueGrid, Shape, grid_for

TOKEN_BYTES: Final = 32
DEFAULT_PROJECT: Final = "default"


def new_token(prefix: str) -> str:
    return f"{prefix}_{secrets.token_urlsafe(TOKEN_BYTES)}"


def hash_token(token: str) -> str:
    """Tokens are 256 random bits, so one SHA-256 is enough to store them safely."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, token_hash: str) -> bool:
    return hmac.compare_digest(hash_token(token), token_hash)


class TopicRecord(msgspec.Struct, frozen=True):
    name: str
    queues: int
    retention_ms: int
    retention_bytes: int | None
    created_ms: int
    # Priorities 0..max_priority get a lane of `queues` queues each (0 = no priority lanes).
    max_priority: int = 0
    # The shapes the topic had before it grew, oldest first: "QUEUESxLANES" joined by ",".
    grown_from: str = ""
    project: str = DEFAULT_PROJECT

    @property
    def shapes(self) -> tuple[Shape, ...]:
        return _shapes(self.grown_from, self.queues, self.max_priority + 1)

    @property
    def grid(self) -> QueueGrid:
        """How its (lane, queue) cells are numbered as store queues (cached: on every produce)."""
        return grid_for(self.shapes)

    @property
    def store_queues(self) -> int:
        return self.queues * (self.max_priority + 1)


class ProjectRecord(msgspec.Struct, frozen=True):
    """A group of related services (SPEC P1); every topic belongs to one."""

    name: str
    description: str
    created_ms: int


class PolicyRecord(msgspec.Struct, frozen=True):
    """A trace policy as stored (SPEC P2): mode, its selector, level."""

    id: str
    mode: str
    level: str
    project: str | None
    topic: str | None
    queue: int | None
    service: str | None
    created_ms: int


@functools.lru_cache(maxsize=4096)
def _shapes(grown_from: str, queues: int, lanes: int) -> tuple[Shape, ...]:
    earlier = [tuple(map(int, s.split("x"))) for s in grown_from.split(",") if s]
    return (*[(q, n) for q, n in earlier], (queues, lanes))


class ProducerRecord(msgspec.Struct, frozen=True):
    name: str
    topic: str
    token_hash: str
    created_ms: int
    # Further destinations it may write besides `topic`: topic names and "inbox:<consumer>"
    # ("inbox:*" for every consumer's inbox), comma-separated.
    destinations: str = ""

    def allowed(self) -> list[str]:
        return self.destinations.split(",") if self.destinations else []

    def may_write(self, destination: str) -> bool:
        if destination == self.topic:
            return True
        allowed = self.allowed()
        return destination in allowed or (destination.startswith("inbox:") and "inbox:*" in allowed)


class ConsumerRecord(msgspec.Struct, frozen=True):
    name: str
    topic: str
    mode: str  # "cluster" | "broadcast" | "message" | "push"
    start: str  # "earliest" | "latest" | epoch ms as text
    lock_timeout_s: float
    max_attempts: int
    paused: bool
    rate_limit_per_s: float  # 0 = unlimited
    alert_backlog: int  # 0 = no alert
    token_hash: str
    created_ms: int
    push: str = ""  # a push consumer's settings, JSON (push/config.py); "" for the others


class Snapshot(msgspec.Struct, frozen=True):
    version: int
    topics: dict[str, TopicRecord]
    producers: dict[str, ProducerRecord]
    consumers: dict[str, ConsumerRecord]
    projects: dict[str, ProjectRecord] = msgspec.field(default_factory=dict)
    policies: dict[str, PolicyRecord] = msgspec.field(default_factory=dict)
