"""Token bucket for the per-consumer rate limit, in messages per second."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    rate_per_s: float
    tokens: float
    updated_s: float

    @classmethod
    def full(cls, rate_per_s: float, now_s: float) -> TokenBucket:
        return cls(rate_per_s, max(rate_per_s, 1.0), now_s)

    def take(self, wanted: int, now_s: float) -> int:
        """Grant up to `wanted` messages now; 0 means the caller must wait."""
        capacity = max(self.rate_per_s, 1.0)
        self.tokens = min(capacity, self.tokens + (now_s - self.updated_s) * self.rate_per_s)
        self.updated_s = now_s
        granted = min(wanted, int(self.tokens))
        self.tokens -= granted
        return granted

    def retry_after_s(self) -> float:
        missing = 1.0 - self.tokens
        return max(missing / self.rate_per_s, 0.001) if self.rate_per_s > 0 else 1.0
