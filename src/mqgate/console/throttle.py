"""Sign-in attempts limited per user name and per client address, in the database so every
gateway behind a load balancer counts the same failures.

An attempt is counted before its password is checked, in the statement that reads the count:
however many attempts arrive at once, no more than the limit get to a password check. An
attempt refused for the limit is not counted; one whose password was right gives its count back.
"""

from __future__ import annotations

import msgspec
import sqlalchemy as sa

from mqgate.console import tables as t
from mqgate.sqlschema import upsert_insert


class Limits(msgspec.Struct, frozen=True):
    per_user: int = 5  # failures per window for one user name (known or not)
    per_ip: int = 20  # failures per window from one address
    window_ms: int = 15 * 60 * 1000


class Throttle:
    def __init__(self, engine: sa.Engine, limits: Limits) -> None:
        self.engine = engine
        self.limits = limits
        # Both dialects have INSERT ... ON CONFLICT DO UPDATE ... RETURNING: a count raised and
        # read in one statement, the row (SQLite: the database) locked until the transaction ends.
        self._insert = upsert_insert(engine)

    def _keys(self, user: str, ip: str) -> dict[str, int]:
        return {_user_key(user): self.limits.per_user, _ip_key(ip): self.limits.per_ip}

    def attempt(self, user: str, ip: str, now: int) -> int:
        """Count a sign-in attempt before its password is checked: 0 if it may be checked,
        else how long (ms) until another is let through (then nothing is counted).

        Each count is raised and read in one upsert, and the transaction holds the rows until
        it ends, so concurrent attempts queue on them and each sees the ones before it."""
        c = t.throttle.c
        expired = c.window_start_ms + self.limits.window_ms <= now
        wait = 0
        with self.engine.connect() as conn:
            # Every attempt takes the rows in one order, so two can never wait on each other.
            for key, limit in sorted(self._keys(user, ip).items()):
                stmt = self._insert(t.throttle).values(key=key, window_start_ms=now, failures=1)
                stmt = stmt.on_conflict_do_update(
                    index_elements=[c.key],
                    set_={  # both read the row as it was: a passed window starts again at 1
                        "window_start_ms": sa.case((expired, now), else_=c.window_start_ms),
                        "failures": sa.case((expired, 1), else_=c.failures + 1),
                    },
                ).returning(c.failures, c.window_start_ms)
                failures, started = conn.execute(stmt).one()
                if failures > limit:
                    wait = max(wait, started + self.limits.window_ms - now)
            if wait > 0:
                conn.rollback()
            else:
                conn.commit()
        return wait

    def succeeded(self, user: str, ip: str) -> None:
        """The password was right: the user's own count starts again, and the address gets back
        the count of this attempt (it was no failure); the address's failures stay (it may be
        guessing others)."""
        c = t.throttle.c
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t.throttle).where(c.key == _user_key(user)))
            conn.execute(
                sa.update(t.throttle)
                .where(c.key == _ip_key(ip), c.failures > 0)
                .values(failures=c.failures - 1)
            )


def _user_key(user: str) -> str:
    return f"user:{user.lower()[:150]}"


def _ip_key(ip: str) -> str:
    return f"ip:{ip}"
