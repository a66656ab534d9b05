"""Ack tokens (`requestId`): an opaque, URL-safe, HMAC-signed description of one batch."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from typing import Final

import msgspec

from mqgate.errors import BadRequest, Forbidden

MAC_BYTES: Final = 16
_FIELD: Final = "requestId"
# Unpadded URL-safe base64 as `encode_token` writes it, and nothing else: no padding, spaces,
# or characters the lenient decoder would skip.
_TOKEN_TEXT: Final = re.compile(r"[A-Za-z0-9_-]+")


class AckToken(msgspec.Struct, array_like=True, frozen=True):
    consumer: str
    client_id: str  # "" in cluster mode
    broker: str
    queue: int
    offset: int
    next_offset: int
    lock_ts: int


_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(AckToken)


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac.new(secret, payload, hashlib.sha256).digest()[:MAC_BYTES]


def encode_token(token: AckToken, secret: bytes) -> str:
    payload = _encoder.encode(token)
    raw = payload + _mac(secret, payload)
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def decode_token(text: str, secret: bytes) -> AckToken:
    """Verify and decode; 400 if it is not a token at all, 403 if its signature is wrong."""
    if not text or len(text) > 1024:
        raise BadRequest("requestId is missing or too long", field=_FIELD)
    if _TOKEN_TEXT.fullmatch(text) is None or len(text) % 4 == 1:
        raise BadRequest("requestId is not a valid ack token", field=_FIELD)
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError) as exc:
        raise BadRequest("requestId is not a valid ack token", field=_FIELD) from exc
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != text:
        raise BadRequest("requestId is not a valid ack token", field=_FIELD)  # non-zero spare bits
    if len(raw) <= MAC_BYTES:
        raise BadRequest("requestId is not a valid ack token", field=_FIELD)
    payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise Forbidden("requestId signature does not match: forged or altered token", field=_FIELD)
    try:
        return _decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise BadRequest("requestId is not a valid ack token", field=_FIELD) from exc
