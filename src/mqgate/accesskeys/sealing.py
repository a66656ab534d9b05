"""A secret access key as the database keeps it: encrypted and authenticated with keys derived
from the gateway's secret (the one every gateway of a deployment shares through the registry).

Encryption is an HMAC-SHA256 keystream under a random nonce, then an HMAC-SHA256 tag over the
nonce, the ciphertext and what the secret belongs to (its access key id), so a sealed value
copied onto another key's row does not open. Only the standard library is needed; a hash would
not do, since verifying a signature needs the secret itself.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Final

_VERSION: Final = "s1"
_NONCE_BYTES: Final = 16


class Sealer:
    def __init__(self, gateway_secret: bytes) -> None:
        self._enc = hmac.new(gateway_secret, b"mqgate access keys: encryption", hashlib.sha256).digest()
        self._mac = hmac.new(gateway_secret, b"mqgate access keys: authentication", hashlib.sha256).digest()

    def _keystream(self, nonce: bytes, length: int) -> bytes:
        blocks = (length + 31) // 32
        stream = b"".join(
            hmac.new(self._enc, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest() for i in range(blocks)
        )
        return stream[:length]

    def _tag(self, nonce: bytes, body: bytes, bound_to: str) -> bytes:
        return hmac.new(self._mac, nonce + body + b"\0" + bound_to.encode(), hashlib.sha256).digest()

    def seal(self, text: str, bound_to: str) -> str:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        raw = text.encode()
        body = bytes(a ^ b for a, b in zip(raw, self._keystream(nonce, len(raw)), strict=True))
        return ".".join((_VERSION, nonce.hex(), body.hex(), self._tag(nonce, body, bound_to).hex()))

    def unseal(self, sealed: str, bound_to: str) -> str:
        """The text; ValueError if `sealed` was altered, belongs to another key, or was sealed
        with another gateway secret."""
        version, nonce_hex, body_hex, tag_hex = sealed.split(".")
        if version != _VERSION:
            raise ValueError(f"unknown sealing version {version!r}")
        nonce, body, tag = bytes.fromhex(nonce_hex), bytes.fromhex(body_hex), bytes.fromhex(tag_hex)
        if not hmac.compare_digest(tag, self._tag(nonce, body, bound_to)):
            raise ValueError("the sealed secret does not open with this gateway's secret")
        return bytes(a ^ b for a, b in zip(body, self._keystream(nonce, len(body)), strict=True)).decode()
