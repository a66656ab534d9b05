"""Password hashing with scrypt (memory-hard, in the standard library).

A stored hash names its parameters ("scrypt$n$r$p$salt$hash"), so the cost can be raised later
and old hashes still verify. An unknown user is checked against a dummy hash of the same cost,
so a sign-in takes as long whether the name exists or not.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import secrets
from typing import Final

# 2**15 x 8 x 128 bytes = 32 MiB per hash, about 0.1 s on one core.
SCRYPT_N: Final = 2**15
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
HASH_BYTES: Final = 32
MIN_PASSWORD_CHARS: Final = 8


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _scrypt(password: str, salt: bytes, n: int, r: int, p: int) -> bytes:
    return hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=HASH_BYTES, maxmem=256 * n * r + 2**20
    )


def hash_password(password: str, n: int = SCRYPT_N) -> str:
    salt = secrets.token_bytes(16)
    digest = _scrypt(password, salt, n, SCRYPT_R, SCRYPT_P)
    return f"scrypt${n}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(digest)}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
        if scheme != "scrypt":
            return False
        found = _scrypt(password, _unb64(salt), int(n), int(r), int(p))
    except ValueError:  # "" (no password: another provider) or a damaged hash
        return False
    return hmac.compare_digest(found, _unb64(digest))


@functools.cache
def dummy_hash() -> str:
    """Checked when the user does not exist, at the same cost as a real one. Made at the first
    sign-in, not at import: a hash costs about 0.1 s, and the gateway's start waited for it."""
    return hash_password(secrets.token_urlsafe(16))


def check_new_password(password: str) -> str | None:
    """Why `password` is refused, or None."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"a password needs at least {MIN_PASSWORD_CHARS} characters"
    return None
