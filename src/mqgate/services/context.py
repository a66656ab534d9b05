"""What every service shares: the backends, the registry copy, metrics and the clock."""

from __future__ import annotations

import time

import msgspec

from mqgate.health import Health
from mqgate.metrics import Metrics
from mqgate.offsets.interface import OffsetStore
from mqgate.registry.cache import RegistryCache
from mqgate.scheduler.interface import Scheduler
from mqgate.settings import Settings
from mqgate.store.interface import MessageStore


def now_ms() -> int:
    return int(time.time() * 1000)


class Context(msgspec.Struct, frozen=True):
    settings: Settings
    store: MessageStore
    offsets: OffsetStore
    scheduler: Scheduler
    registry: RegistryCache
    metrics: Metrics
    secret: bytes  # signs ack tokens
    health: Health = msgspec.field(default_factory=Health)  # storage faults and degraded states
