"""Self-service (MQCloud): a member applies for a topic, producer or consumer; an owner or an
admin approves or rejects it with a comment; the applicant sees the new token once.

Between approval and the applicant's first look, the token is kept sealed with a key derived
from the gateway's secret (an HMAC-SHA256 keystream under a random nonce), then erased.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from typing import Any, Final

import msgspec
import sqlalchemy as sa

from mqgate.console import tables as t
from mqgate.errors import Conflict, NotFound

KINDS: Final = ("topic", "producer", "consumer")
PENDING: Final = "pending"
APPROVED: Final = "approved"
REJECTED: Final = "rejected"
FAILED: Final = "failed"  # approved, but the registration was refused (e.g. the name is taken)


class Application(msgspec.Struct, frozen=True):
    id: int
    kind: str
    name: str
    project: str
    settings: dict[str, Any]
    applicant: str
    state: str
    decided_by: str | None
    comment: str
    created_ms: int
    decided_ms: int | None
    token_waiting: bool


def _keystream(key: bytes, nonce: bytes, length: int) -> bytes:
    out = b""
    block = 0
    while len(out) < length:
        out += hmac.new(key, nonce + block.to_bytes(4, "big"), hashlib.sha256).digest()
        block += 1
    return out[:length]


def seal(key: bytes, text: str) -> str:
    nonce = secrets.token_bytes(16)
    raw = text.encode()
    body = bytes(a ^ b for a, b in zip(raw, _keystream(key, nonce, len(raw)), strict=True))
    tag = hmac.new(key, nonce + body, hashlib.sha256).hexdigest()[:32]
    return f"{nonce.hex()}.{body.hex()}.{tag}"


def unseal(key: bytes, sealed: str) -> str:
    nonce_hex, body_hex, tag = sealed.split(".")
    nonce, body = bytes.fromhex(nonce_hex), bytes.fromhex(body_hex)
    if not hmac.compare_digest(tag, hmac.new(key, nonce + body, hashlib.sha256).hexdigest()[:32]):
        raise ValueError("the sealed token was altered")
    return bytes(a ^ b for a, b in zip(body, _keystream(key, nonce, len(body)), strict=True)).decode()


def _row(r: Any) -> Application:
    return Application(
        r.id,
        r.kind,
        r.name,
        r.project,
        json.loads(r.settings),
        r.applicant,
        r.state,
        r.decided_by,
        r.comment,
        r.created_ms,
        r.decided_ms,
        r.sealed_token is not None,
    )


class Applications:
    def __init__(self, engine: sa.Engine, secret: bytes) -> None:
        self.engine = engine
        self._key = hmac.new(secret, b"mqgate console sealed tokens", hashlib.sha256).digest()

    def apply(self, kind: str, name: str, project: str, settings: dict[str, Any], applicant: str) -> int:
        with self.engine.begin() as conn:
            result = conn.execute(
                sa.insert(t.applications).values(
                    kind=kind,
                    name=name,
                    project=project,
                    settings=json.dumps(settings, sort_keys=True),
                    applicant=applicant,
                    state=PENDING,
                    created_ms=int(time.time() * 1000),
                )
            )
            key = result.inserted_primary_key
            assert key is not None
            return int(key[0])

    def get(self, app_id: int) -> Application:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(t.applications).where(t.applications.c.id == app_id)).first()
        if row is None:
            raise NotFound(f"application {app_id} does not exist", field="id")
        return _row(row)

    def pending_count(self, projects: list[str] | None) -> int:
        """Applications waiting for a decision in `projects` (None: every project)."""
        c = t.applications.c
        q = sa.select(sa.func.count()).select_from(t.applications).where(c.state == PENDING)
        if projects is not None:
            q = q.where(c.project.in_(projects))
        with self.engine.connect() as conn:
            return int(conn.execute(q).scalar_one())

    def list(self, *, applicant: str | None = None, projects: list[str] | None = None) -> list[Application]:
        q = sa.select(t.applications).order_by(t.applications.c.id.desc()).limit(500)
        if applicant is not None:
            q = q.where(t.applications.c.applicant == applicant)
        if projects is not None:
            q = q.where(t.applications.c.project.in_(projects))
        with self.engine.connect() as conn:
            return [_row(r) for r in conn.execute(q)]

    def decide(self, app_id: int, state: str, by: str, comment: str, token: str | None = None) -> None:
        """Record the decision, once: a second decision on the same application is refused."""
        values: dict[str, Any] = {
            "state": state,
            "decided_by": by,
            "comment": comment,
            "decided_ms": int(time.time() * 1000),
            "sealed_token": seal(self._key, token) if token else None,
        }
        stmt = sa.update(t.applications).where(
            t.applications.c.id == app_id, t.applications.c.state == PENDING
        )
        with self.engine.begin() as conn:
            if conn.execute(stmt.values(**values)).rowcount == 0:
                raise Conflict(f"application {app_id} was decided already", field="id")

    def claim(self, app_id: int) -> bool:
        """Mark a pending application as being decided (so two approvers do not both register
        it); False if it is not pending any more."""
        stmt = sa.update(t.applications).where(
            t.applications.c.id == app_id, t.applications.c.state == PENDING
        )
        with self.engine.begin() as conn:
            return bool(conn.execute(stmt.values(state="deciding")).rowcount)

    def settle(self, app_id: int, state: str, by: str, comment: str, token: str | None = None) -> None:
        """The outcome of a claimed application."""
        stmt = sa.update(t.applications).where(t.applications.c.id == app_id)
        with self.engine.begin() as conn:
            conn.execute(
                stmt.values(
                    state=state,
                    decided_by=by,
                    comment=comment,
                    decided_ms=int(time.time() * 1000),
                    sealed_token=seal(self._key, token) if token else None,
                )
            )

    def take_token(self, app_id: int, applicant: str) -> str | None:
        """The token, for its applicant, once: it is erased as it is read."""
        c = t.applications.c
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(c.sealed_token).where(c.id == app_id, c.applicant == applicant)
            ).first()
            if row is None or row.sealed_token is None:
                return None
            erased = conn.execute(
                sa.update(t.applications)
                .where(c.id == app_id, c.sealed_token == row.sealed_token)
                .values(sealed_token=None)
            ).rowcount
        return unseal(self._key, row.sealed_token) if erased else None

    def auto_approve(self, project: str) -> bool:
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(t.project_settings.c.auto_approve).where(t.project_settings.c.project == project)
            ).first()
        return bool(row and row.auto_approve)

    def set_auto_approve(self, project: str, on: bool) -> None:
        with self.engine.begin() as conn:
            stmt = sa.update(t.project_settings).where(t.project_settings.c.project == project)
            if conn.execute(stmt.values(auto_approve=on)).rowcount == 0:
                conn.execute(sa.insert(t.project_settings).values(project=project, auto_approve=on))
