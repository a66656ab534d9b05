"""Console sessions: a random cookie value (only its hash is stored), a CSRF token per
session, an idle timeout and an absolute lifetime."""

from __future__ import annotations

import hashlib
import secrets

import msgspec
import sqlalchemy as sa

from mqgate.console import tables as t


class SessionPolicy(msgspec.Struct, frozen=True):
    idle_ms: int = 60 * 60 * 1000  # an hour without a request ends it
    lifetime_ms: int = 12 * 60 * 60 * 1000  # and it never outlives a working day
    touch_every_ms: int = 60 * 1000  # `seen` is written at most this often


class Session(msgspec.Struct, frozen=True):
    user: str
    csrf: str
    created_ms: int


def _hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


class Sessions:
    def __init__(self, engine: sa.Engine, policy: SessionPolicy) -> None:
        self.engine = engine
        self.policy = policy

    def create(self, user: str, now: int) -> tuple[str, Session]:
        """A new session: (the cookie value, the session)."""
        value = secrets.token_urlsafe(32)
        session = Session(user, secrets.token_urlsafe(32), now)
        with self.engine.begin() as conn:
            conn.execute(
                sa.insert(t.sessions).values(
                    id_hash=_hash(value), user_name=user, csrf=session.csrf, created_ms=now, seen_ms=now
                )
            )
            # Ended sessions of anyone go now and then: no table grows without bound.
            if secrets.randbelow(20) == 0:
                conn.execute(
                    sa.delete(t.sessions).where(
                        (t.sessions.c.seen_ms < now - self.policy.idle_ms)
                        | (t.sessions.c.created_ms < now - self.policy.lifetime_ms)
                    )
                )
        return value, session

    def find(self, value: str, now: int) -> Session | None:
        key = _hash(value)
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.sessions).where(t.sessions.c.id_hash == key)).first()
        if row is None:
            return None
        if row.seen_ms + self.policy.idle_ms <= now or row.created_ms + self.policy.lifetime_ms <= now:
            self.end(value)
            return None
        if now - row.seen_ms >= self.policy.touch_every_ms:
            with self.engine.begin() as conn:
                conn.execute(sa.update(t.sessions).where(t.sessions.c.id_hash == key).values(seen_ms=now))
        return Session(row.user_name, row.csrf, row.created_ms)

    def end(self, value: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.delete(t.sessions).where(t.sessions.c.id_hash == _hash(value)))
