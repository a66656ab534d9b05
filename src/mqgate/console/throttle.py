"""Sign-in attempts limited per user name and per client address, in the database so every
gateway behind a load balancer counts the same failures."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from mqgate.console import tables as t


@dataclass(slots=True, frozen=True)
class Limits:
    per_user: int = 5  # failures per window for one user name (known or not)
    per_ip: int = 20  # failures per window from one address
    window_ms: int = 15 * 60 * 1000


class Throttle:
    def __init__(self, engine: sa.Engine, limits: Limits) -> None:
        self.engine = engine
        self.limits = limits

    def _keys(self, user: str, ip: str) -> dict[str, int]:
        return {f"user:{user.lower()[:150]}": self.limits.per_user, f"ip:{ip}": self.limits.per_ip}

    def blocked_for_ms(self, user: str, ip: str, now: int) -> int:
        """0, or how long until another attempt is let through."""
        keys = self._keys(user, ip)
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(t.throttle).where(t.throttle.c.key.in_(list(keys)))).all()
        wait = 0
        for row in rows:
            left = row.window_start_ms + self.limits.window_ms - now
            if left > 0 and row.failures >= keys[row.key]:
                wait = max(wait, left)
        return wait

    def failed(self, user: str, ip: str, now: int) -> None:
        for key in self._keys(user, ip):
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(t.throttle).where(t.throttle.c.key == key)).first()
                if row is None:
                    try:
                        with conn.begin_nested():
                            conn.execute(
                                sa.insert(t.throttle).values(key=key, window_start_ms=now, failures=1)
                            )
                        continue
                    except IntegrityError:  # another gateway counted the first one
                        row = conn.execute(sa.select(t.throttle).where(t.throttle.c.key == key)).one()
                stmt = sa.update(t.throttle).where(t.throttle.c.key == key)
                if row.window_start_ms + self.limits.window_ms <= now:
                    conn.execute(stmt.values(window_start_ms=now, failures=1))
                else:
                    conn.execute(stmt.values(failures=t.throttle.c.failures + 1))

    def succeeded(self, user: str) -> None:
        """The user's own count starts again; the address's stays (it may be guessing others)."""
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t.throttle).where(t.throttle.c.key == f"user:{user.lower()[:150]}"))
