"""core/mac.py: the kept-pads HMAC is RFC 2104 HMAC-SHA256, per key, and its cache bounded."""

from __future__ import annotations

import hashlib
import hmac
import os
import random

from mqgate.core import mac


def test_it_is_hmac_sha256_for_keys_and_messages_of_every_size() -> None:
    rng = random.Random(33)
    keys = [b"", b"k", bytes(32), bytes(range(64)), bytes(range(65)), bytes(200), os.urandom(32)]
    for key in keys:
        for size in (0, 1, 55, 64, 200, 3000):
            message = rng.randbytes(size)
            want = hmac.new(key, message, hashlib.sha256).digest()
            assert mac.hmac_sha256(key, message) == want
            assert mac.hmac_sha256(key, message) == want  # kept pads are copied, never consumed


def test_the_kept_pads_are_bounded_and_per_key() -> None:
    for i in range(mac.KEYS_KEPT + 10):
        key = b"secret-%d" % i
        assert mac.hmac_sha256(key, b"to sign") == hmac.new(key, b"to sign", hashlib.sha256).digest()
        assert len(mac._PADS) <= mac.KEYS_KEPT
    assert mac.hmac_sha256(b"other", b"to sign") != mac.hmac_sha256(b"secret-1", b"to sign")
