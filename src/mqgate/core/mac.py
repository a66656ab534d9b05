"""HMAC-SHA256 of short messages for the paths that sign on every request: ack tokens, receipt
handles and stream tickets (`tokens.py`) and SigV4 signatures (`mqgate.sqs.sigv4`).

RFC 2104 over SHA-256 states primed with the key's inner and outer pads, kept per key, so that a
MAC is two copies, two updates and two digests. Not `hmac.new`, which builds its Python object
and pads each time (about twice the cost); nor `hmac.digest`, whose one-shot releases the GIL
around every HMAC, so that the event loop then waits to get it back from the store's threads."""

from __future__ import annotations

import hashlib
from typing import Final

BLOCK_BYTES: Final = 64  # SHA-256's block
KEYS_KEPT: Final = 1024  # a gateway's token secrets, and SigV4 signing keys: keys x regions x 2 days
_INNER: Final = bytes(b ^ 0x36 for b in range(256))
_OUTER: Final = bytes(b ^ 0x5C for b in range(256))
_PADS: dict[bytes, tuple[hashlib._Hash, hashlib._Hash]] = {}


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of `message` under `key` (as `hmac.new(key, message, sha256).digest()`)."""
    pads = _PADS.get(key)
    if pads is None:
        if len(_PADS) >= KEYS_KEPT:
            _PADS.clear()
        short = key if len(key) <= BLOCK_BYTES else hashlib.sha256(key).digest()
        block = short.ljust(BLOCK_BYTES, b"\0")
        pads = _PADS[key] = (hashlib.sha256(block.translate(_INNER)), hashlib.sha256(block.translate(_OUTER)))
    inner = pads[0].copy()
    inner.update(message)
    outer = pads[1].copy()
    outer.update(inner.digest())
    return outer.digest()
