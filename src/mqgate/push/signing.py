"""Push requests signed the Standard Webhooks way (standardwebhooks.com): `webhook-id`,
`webhook-timestamp` (seconds) and `webhook-signature`, `v1,<base64 HMAC-SHA256>` of
`<id>.<timestamp>.<body>` under each secret in force (the new one and, while a rotation
overlaps, the old one), space-separated. A secret is `whsec_` + base64 of 24 random bytes, as
the Standard Webhooks libraries make and read them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Final

SECRET_PREFIX: Final = "whsec_"
SECRET_BYTES: Final = 24


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def _key(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(SECRET_PREFIX))


def signature(secret: str, msg_id: str, timestamp_s: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp_s}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(_key(secret), signed, hashlib.sha256).digest()).decode()


def headers(secrets_in_force: list[str], msg_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp_s, body) for s in secrets_in_force),
    }
