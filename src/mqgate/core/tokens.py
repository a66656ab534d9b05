"""Ack tokens (`requestId`): an opaque, URL-safe, HMAC-signed description of one batch."""

from __future__ import annotations

import binascii
import hmac
import re
from typing import Final, TypeVar

import msgspec

from mqgate.core.mac import hmac_sha256
from mqgate.errors import BadRequest, Forbidden

T = TypeVar("T")
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


class Receipt(msgspec.Struct, array_like=True, frozen=True, tag="m"):
    """A message-level receive's receipt handle (core/message_window.py): one message, named by
    its receive (the count and the first receive's time), so a handle from before it was
    received again no longer deletes it."""

    consumer: str
    broker: str
    queue: int
    offset: int
    receives: int
    first_ms: int


class StreamTicket(msgspec.Struct, array_like=True, frozen=True):
    """A short-lived credential for one consumer's stream (docs/STREAM.md), for a browser's
    `EventSource` and `WebSocket`, which cannot send an Authorization header: it opens that
    consumer's (and client's) stream and acks its batches, nothing else. It names the consumer's
    token by a prefix of its hash, so a rotated or revoked token's tickets no longer open."""

    consumer: str
    client_id: str  # "" in cluster mode
    token_hash: str  # the first TICKET_TOKEN_HASH_CHARS of the consumer's token hash
    expires_ms: int


TICKET_PREFIX: Final = "mqt_"  # tells a ticket from a token in an Authorization header
TICKET_TOKEN_HASH_CHARS: Final = 16

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(AckToken)
_receipt_decoder: Final = msgspec.msgpack.Decoder(Receipt)
_ticket_decoder: Final = msgspec.msgpack.Decoder(StreamTicket)


# Unpadded URL-safe base64 by binascii directly: base64's functions are Python around it.
_TO_URLSAFE: Final = bytes.maketrans(b"+/", b"-_")
_FROM_URLSAFE: Final = bytes.maketrans(b"-_", b"+/")


def _b64(raw: bytes) -> str:
    return binascii.b2a_base64(raw, newline=False).translate(_TO_URLSAFE).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    """The bytes of text `_TOKEN_TEXT` matched (so ASCII, of the URL-safe alphabet)."""
    return binascii.a2b_base64((text + "=" * (-len(text) % 4)).encode("ascii").translate(_FROM_URLSAFE))


def _mac(secret: bytes, payload: bytes) -> bytes:
    return hmac_sha256(secret, payload)[:MAC_BYTES]


def encode_token(token: AckToken, secret: bytes) -> str:
    payload = _encoder.encode(token)
    return _b64(payload + _mac(secret, payload))


def decode_token(text: str, secret: bytes) -> AckToken:
    """Verify and decode; 400 if it is not a token at all, 403 if its signature is wrong."""
    return _decode_signed(text, secret, _decoder, _FIELD, "ack token")


# Receipts are signed under their own key (domain separation): a receipt handle is never taken
# for an ack token, nor the other way round, however their fields line up.
_RECEIPT_DOMAIN: Final = b"mqgate receipt handle\x00"


def encode_receipt(receipt: Receipt, secret: bytes) -> str:
    payload = _encoder.encode(receipt)
    mac = _mac(_RECEIPT_DOMAIN + secret, payload)
    return _b64(payload + mac)


def decode_receipt(text: str, secret: bytes) -> Receipt:
    """A receipt handle, verified: 400 if it is not one, 403 if its signature is wrong."""
    return _decode_signed(text, _RECEIPT_DOMAIN + secret, _receipt_decoder, "receiptHandle", "receipt handle")


_TICKET_DOMAIN: Final = b"mqgate stream ticket\x00"


def encode_ticket(ticket: StreamTicket, secret: bytes) -> str:
    payload = _encoder.encode(ticket)
    mac = _mac(_TICKET_DOMAIN + secret, payload)
    return TICKET_PREFIX + _b64(payload + mac)


def decode_ticket(text: str, secret: bytes) -> StreamTicket:
    """A stream ticket, verified (not yet for its expiry or token: the guard's): 400 if it is
    not one, 403 if its signature is wrong."""
    if not text.startswith(TICKET_PREFIX):
        raise BadRequest("ticket is not a stream ticket", field="ticket")
    return _decode_signed(
        text[len(TICKET_PREFIX) :], _TICKET_DOMAIN + secret, _ticket_decoder, "ticket", "stream ticket"
    )


def _decode_signed(text: str, secret: bytes, decoder: msgspec.msgpack.Decoder[T], field: str, what: str) -> T:
    if not text or len(text) > 1024:
        raise BadRequest(f"{field} is missing or too long", field=field)
    if _TOKEN_TEXT.fullmatch(text) is None or len(text) % 4 == 1:
        raise BadRequest(f"{field} is not a valid {what}", field=field)
    try:
        raw = _unb64(text)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"{field} is not a valid {what}", field=field) from exc
    if _b64(raw) != text:
        raise BadRequest(f"{field} is not a valid {what}", field=field)  # non-zero spare bits
    if len(raw) <= MAC_BYTES:
        raise BadRequest(f"{field} is not a valid {what}", field=field)
    payload, mac = raw[:-MAC_BYTES], raw[-MAC_BYTES:]
    if not hmac.compare_digest(mac, _mac(secret, payload)):
        raise Forbidden(f"{field} signature does not match: forged or altered {what}", field=field)
    try:
        return decoder.decode(payload)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"{field} is not a valid {what}", field=field) from exc
