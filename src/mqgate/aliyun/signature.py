"""The `MQ <AccessKeyId>:<Signature>` authentication of Alibaba Cloud MQ's HTTP API, verified
as the official SDKs sign (Python `mq-http-sdk` 1.0.3, Node `@aliyunmq/mq-http-sdk` 1.0.4).

Pure: the request's method, headers and resource (its path and query string exactly as they
came on the request line), a lookup of a secret by access key id and the time in; an
`AliyunError` with the service's code out. The body is never read here (`check_content_md5`
compares a Content-MD5 with it, separately).

The string to sign is

    METHOD \\n Content-MD5 \\n Content-Type \\n Date \\n CanonicalizedMQHeaders CanonicalizedResource

- METHOD as sent (upper case); Content-MD5, Content-Type and Date are the headers' values, the
  empty string for one the request lacks (the Python SDK sends neither Content-MD5 nor, on a GET,
  Content-Type; the Node SDK sends `text/xml;charset=utf-8` on every request and, but on a GET,
  a Content-MD5 that is the base64 of the body's *hex* MD5);
- CanonicalizedMQHeaders: every header whose lower-cased name starts with `x-mq-` (in practice
  `x-mq-version: 2015-06-06` alone), sorted by name, each as `name:value\\n`;
- CanonicalizedResource: the path and `?query` as the client put them on the request line, not
  decoded nor re-encoded (the SDKs sign the URI they send: `tag` is percent-encoded, the other
  parameters are not, in the SDK's own order).

The signature is `base64(HMAC-SHA1(secret, UTF-8 of the string to sign))`, compared in constant
time. The `security-token` header (STS) is sent after signing and is not part of it.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import hmac
from collections.abc import Callable, Iterable, Mapping
from email.utils import parsedate_tz
from typing import Final

import msgspec

from mqgate.aliyun import errors
from mqgate.aliyun.errors import AliyunError

SCHEME: Final = "MQ"
VERSION: Final = "2015-06-06"  # the x-mq-version every SDK sends
MQ_HEADER_PREFIX: Final = "x-mq-"
SECURITY_TOKEN_HEADER: Final = "security-token"
MAX_SKEW_S: Final = 15 * 60  # the service's window around its clock for the Date header
_SIGNATURE_LEN: Final = 28  # base64 of a 20-byte SHA-1 digest
_MAX_KEY_ID_LEN: Final = 128

# A secret by access key id; None for a key that is unknown or revoked.
Lookup = Callable[[str], str | None]
# Header name -> value (any case), or (name, value) pairs as an ASGI scope holds them.
Headers = Mapping[str, str] | Iterable[tuple[str, str]]


class Verified(msgspec.Struct, frozen=True):
    """Who signed a request that verified."""

    access_key_id: str
    signed_at: int  # epoch seconds, the request's Date
    version: str  # its x-mq-version ("" when absent)
    security_token: str  # its security-token header ("" when absent): not checked here


def normalize_headers(headers: Headers) -> dict[str, str]:
    """Lower-cased names; a header given more than once has its values joined by ","."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        key = name.lower()
        out[key] = f"{out[key]},{value}" if key in out else value
    return out


def string_to_sign(method: str, headers: Headers, resource: str) -> str:
    """What the SDKs sign for a request (see the module's docstring)."""
    h = normalize_headers(headers)
    mq_headers = "".join(f"{name}:{h[name]}\n" for name in sorted(h) if name.startswith(MQ_HEADER_PREFIX))
    return (
        f"{method}\n{h.get('content-md5', '')}\n{h.get('content-type', '')}\n{h.get('date', '')}\n"
        f"{mq_headers}{resource}"
    )


def signature(secret: str, to_sign: str) -> str:
    """base64(HMAC-SHA1(secret, to_sign)), both as UTF-8."""
    digest = hmac.new(secret.encode("utf-8"), to_sign.encode("utf-8"), hashlib.sha1).digest()
    return base64.b64encode(digest).decode("ascii")


def authorization(access_key_id: str, secret: str, method: str, headers: Headers, resource: str) -> str:
    """The Authorization header's value a client sends for this request."""
    return f"{SCHEME} {access_key_id}:{signature(secret, string_to_sign(method, headers, resource))}"


def parse_authorization(value: str) -> tuple[str, str]:
    """`MQ <AccessKeyId>:<Signature>` -> (access key id, signature), or InvalidAuthorizationHeader."""
    scheme, space, rest = value.partition(" ")
    key_id, colon, sig = rest.partition(":")
    if (
        scheme != SCHEME
        or not space
        or not colon
        or not key_id
        or len(key_id) > _MAX_KEY_ID_LEN
        or not key_id.isascii()
        or not key_id.isprintable()
        or " " in key_id
        or len(sig) != _SIGNATURE_LEN
    ):
        raise AliyunError(
            errors.INVALID_AUTHORIZATION_HEADER,
            "The Authorization header format is invalid: expected 'MQ <AccessKeyId>:<Signature>'.",
        )
    try:
        base64.b64decode(sig, validate=True)
    except (binascii.Error, ValueError):
        raise AliyunError(
            errors.INVALID_AUTHORIZATION_HEADER, "The Authorization header's signature is not base64."
        ) from None
    return key_id, sig


def parse_date(value: str) -> int:
    """An RFC 1123 date in GMT (`Thu, 07 Mar 2012 18:49:58 GMT`) -> epoch seconds, or
    InvalidDateHeader."""
    parsed = parsedate_tz(value) if value.rstrip().endswith("GMT") else None
    if parsed is None or parsed[9] not in (0, None):
        raise AliyunError(errors.INVALID_DATE_HEADER, f"The Date header format is invalid: {value!r}.")
    return calendar.timegm(parsed[:6])


def verify(
    method: str,
    headers: Headers,
    resource: str,
    lookup: Lookup,
    now: float,
    *,
    max_skew_s: float = MAX_SKEW_S,
) -> Verified:
    """Checks a request's signature; raises `AliyunError` with the service's code:
    MissingAuthorizationHeader, InvalidAuthorizationHeader, MissingDateHeader, InvalidDateHeader
    (400), InvalidAccessKeyId, SignatureDoesNotMatch (403), TimeExpired (408: a Date more than
    `max_skew_s` from `now`, checked once the signature holds)."""
    h = normalize_headers(headers)
    header = h.get("authorization")
    if header is None or not header.strip():
        raise AliyunError(errors.MISSING_AUTHORIZATION_HEADER)
    key_id, presented = parse_authorization(header)
    date = h.get("date")
    if date is None or not date.strip():
        raise AliyunError(errors.MISSING_DATE_HEADER)
    signed_at = parse_date(date)
    secret = lookup(key_id)
    if secret is None:
        raise AliyunError(errors.INVALID_ACCESS_KEY_ID)
    expected = signature(secret, string_to_sign(method, h, resource))
    if not hmac.compare_digest(expected.encode("ascii"), presented.encode("ascii")):
        raise AliyunError(errors.SIGNATURE_DOES_NOT_MATCH)
    if abs(now - signed_at) > max_skew_s:
        raise AliyunError(
            errors.TIME_EXPIRED,
            f"The http request you sent is expired: its Date is {int(now - signed_at)} s from the "
            f"service's time (at most {int(max_skew_s)} s allowed).",
        )
    return Verified(key_id, signed_at, h.get("x-mq-version", ""), h.get(SECURITY_TOKEN_HEADER, ""))


def content_md5_forms(body: bytes) -> tuple[str, str]:
    """The two Content-MD5 values a body may come with: the Node SDK's base64 of the hex digest,
    and RFC 1864's base64 of the raw digest."""
    digest = hashlib.md5(body, usedforsecurity=False)
    return (
        base64.b64encode(digest.hexdigest().encode("ascii")).decode("ascii"),
        base64.b64encode(digest.digest()).decode("ascii"),
    )


def check_content_md5(value: str | None, body: bytes) -> None:
    """Raises InvalidDigest when a Content-MD5 header is present and is neither form of the body's
    MD5; an absent or empty one passes (the Python SDK sends none)."""
    if not value:
        return
    if value.strip() not in content_md5_forms(body):
        raise AliyunError(errors.INVALID_DIGEST)
