"""A push consumer's settings, kept as JSON in its registry record (`ConsumerRecord.push`): the
endpoint, its extra headers, how many messages may be in flight, the attempt timeout, ordering,
the backoff between attempts, the body's form, and the signing secrets (sealed with the
gateway secret, so the registry's database alone does not give them away)."""

from __future__ import annotations

import hashlib
import hmac
import random
from typing import Final, Literal

import msgspec

from mqgate.accesskeys.sealing import Sealer

DEFAULT_MAX_IN_FLIGHT: Final = 10
MAX_IN_FLIGHT: Final = 1000
DEFAULT_TIMEOUT_S: Final = 10.0
MAX_TIMEOUT_S: Final = 60.0
DEFAULT_BACKOFF_INITIAL_MS: Final = 1_000
DEFAULT_BACKOFF_MAX_MS: Final = 60_000
MAX_BACKOFF_MS: Final = 3_600_000
ROTATION_OVERLAP_MS: Final = 24 * 3600 * 1000  # the old secret signs too, this long after a rotation


class PushConfig(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    endpoint: str
    headers: dict[str, str] = {}
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    timeout_s: float = DEFAULT_TIMEOUT_S
    ordering: Literal["none", "key"] = "none"
    backoff_initial_ms: int = DEFAULT_BACKOFF_INITIAL_MS
    backoff_max_ms: int = DEFAULT_BACKOFF_MAX_MS
    envelope: bool = False  # the body as sent (False) or a JSON envelope with the message's fields
    sealed_secret: str = ""
    sealed_previous: str = ""  # the secret before the last rotation, while it overlaps
    previous_until_ms: int = 0


_decode = msgspec.json.Decoder(PushConfig).decode


def encode_config(config: PushConfig) -> str:
    return msgspec.json.encode(config).decode()


def decode_config(text: str) -> PushConfig | None:
    """The settings a record holds (None: not a push consumer, or settings this version cannot
    read, which the push service logs)."""
    if not text:
        return None
    return _decode(text)


def sealer(gateway_secret: bytes) -> Sealer:
    """Sealing keys of their own, derived from the gateway secret (not the access keys')."""
    return Sealer(hmac.new(gateway_secret, b"mqgate push: signing secrets", hashlib.sha256).digest())


def secrets_in_force(config: PushConfig, consumer: str, seal: Sealer, now_ms: int) -> list[str]:
    """The secrets each request is signed with: the current one, and the previous one while the
    rotation's overlap lasts."""
    out = [seal.unseal(config.sealed_secret, consumer)]
    if config.sealed_previous and now_ms < config.previous_until_ms:
        out.append(seal.unseal(config.sealed_previous, consumer))
    return out


def backoff_ms(config: PushConfig, attempt: int, retry_after_s: float | None) -> int:
    """How long a failed attempt's message waits: exponential from `backoff_initial_ms`, capped
    at `backoff_max_ms`, with jitter (a random half to whole of it, so retries of a failing
    endpoint spread out); an endpoint's Retry-After is honoured up to the cap."""
    if retry_after_s is not None:
        return min(int(retry_after_s * 1000), config.backoff_max_ms)
    full = min(config.backoff_initial_ms * 2 ** min(max(attempt - 1, 0), 30), config.backoff_max_ms)
    return int(full * random.uniform(0.5, 1.0))  # jitter, not a secret


def new_config(
    consumer: str,
    endpoint: str,
    gateway_secret: bytes,
    secret: str,
    *,
    headers: dict[str, str] | None = None,
    max_in_flight: int | None = None,
    timeout_s: float | None = None,
    ordering: Literal["none", "key"] | None = None,
    backoff_initial_ms: int | None = None,
    backoff_max_ms: int | None = None,
    envelope: bool | None = None,
) -> PushConfig:
    """A push consumer's settings, the defaults where none is given, its secret sealed."""
    initial = backoff_initial_ms or DEFAULT_BACKOFF_INITIAL_MS
    return PushConfig(
        endpoint=endpoint,
        headers=dict(headers or {}),
        max_in_flight=max_in_flight or DEFAULT_MAX_IN_FLIGHT,
        timeout_s=timeout_s or DEFAULT_TIMEOUT_S,
        ordering=ordering or "none",
        backoff_initial_ms=initial,
        backoff_max_ms=max(backoff_max_ms or DEFAULT_BACKOFF_MAX_MS, initial),
        envelope=bool(envelope),
        sealed_secret=sealer(gateway_secret).seal(secret, consumer),
    )


def rotated(config: PushConfig, consumer: str, gateway_secret: bytes, secret: str, now_ms: int) -> PushConfig:
    """A new signing secret; the current one signs too for ROTATION_OVERLAP_MS."""
    return msgspec.structs.replace(
        config,
        sealed_secret=sealer(gateway_secret).seal(secret, consumer),
        sealed_previous=config.sealed_secret,
        previous_until_ms=now_ms + ROTATION_OVERLAP_MS,
    )
