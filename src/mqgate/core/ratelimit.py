"""Token bucket for the per-consumer rate limit, in messages per second.

Time is integer milliseconds so elapsed time is exact however large the clock reading, and it
never runs backwards for the bucket (gateways' clocks differ a little: a late caller must not
drain it, nor an interval be counted twice). The Redis offset store's `rate.lua` is this same
rule.
"""

from __future__ import annotations

import msgspec


class TokenBucket(msgspec.Struct):
    rate_per_s: float
    tokens: float
    updated_ms: int

    @classmethod
    def full(cls, rate_per_s: float, now_ms: int) -> TokenBucket:
        return cls(rate_per_s, max(rate_per_s, 1.0), now_ms)

    @property
    def capacity(self) -> float:
        return max(self.rate_per_s, 1.0)

    def take(self, wanted: int, now_ms: int) -> int:
        """Grant up to `wanted` messages now; 0 means the caller must wait."""
        if now_ms > self.updated_ms:
            self.tokens = min(
                self.capacity, self.tokens + (now_ms - self.updated_ms) * self.rate_per_s / 1000
            )
            self.updated_ms = now_ms
        granted = max(min(wanted, int(self.tokens)), 0)
        self.tokens -= granted
        return granted

    def give_back(self, count: int) -> None:
        self.tokens = min(self.capacity, self.tokens + count)

    def retry_after_s(self) -> float:
        missing = 1.0 - self.tokens
        return max(missing / self.rate_per_s, 0.001) if self.rate_per_s > 0 else 1.0
