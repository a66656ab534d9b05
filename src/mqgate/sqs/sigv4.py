"""AWS Signature Version 4, verified as AWS verifies it, for the SQS-compatible API (issue 30).

`verify` is pure: the request as it came (method, path, raw query string, headers, body bytes),
a lookup of a secret by access key id and the time are all it takes; it never decodes the body.
It takes the signature from an `Authorization: AWS4-HMAC-SHA256 Credential=…, SignedHeaders=…,
Signature=…` header, or from a presigned URL's `X-Amz-Algorithm`, `X-Amz-Credential`,
`X-Amz-Date`, `X-Amz-Expires`, `X-Amz-SignedHeaders` and `X-Amz-Signature` query parameters, and
rebuilds what the client signed:

- the canonical request: the method; the path with its dot segments and empty segments removed,
  URI-encoded once more (as AWS does for every service but S3, so `%` becomes `%25`); the query
  parameters (but `X-Amz-Signature`) each decoded and encoded again with AWS's encoding (all but
  `A-Z a-z 0-9 - _ . ~` as `%XY`), sorted by name, then value; each signed header as
  `name:value` with the value trimmed and its runs of whitespace made one space; the signed
  header names; the body's SHA-256 (an `X-Amz-Content-SHA256` header must be that hash);
- the string to sign: the algorithm, the request time (`X-Amz-Date`, or the `Date` header),
  the credential scope `date/region/sqs/aws4_request` and the canonical request's SHA-256;
- the signing key HMAC-SHA256 chain `"AWS4" + secret` → date → region → service →
  `aws4_request`, kept per (secret, date, region) so that a request pays one HMAC for it.

The signatures are compared in constant time. Any region is accepted, and the credential
scope's region is the one the key is derived with; the service must be `sqs`. A request signed
more than 15 minutes before or after `now` is refused, as is a presigned URL past its
`X-Amz-Expires`. A session token (`X-Amz-Security-Token`) is signed like any header and not
otherwise checked: mqgate issues no temporary credentials.

The errors carry AWS's codes and statuses (AWS's "Common Errors" of the SQS API Reference; the
messages are those AWS SQS answers): no signature at all → `MissingAuthenticationToken` (403);
a signature that cannot be read → `IncompleteSignature` (400); a key that is unknown or revoked
→ `InvalidClientTokenId` (403); a wrong signature, a scope of another service or day, a signed
header the request lacks, an `X-Amz-Content-SHA256` that is not the body's SHA-256 (so
`UNSIGNED-PAYLOAD` is refused: SQS clients sign their bodies), and a request time out of the
window → `SignatureDoesNotMatch` (403; AWS SQS answers a skewed clock so, "Signature expired: …
is now earlier than …").
"""

from __future__ import annotations

import calendar
import datetime
import functools
import hashlib
import hmac
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_tz
from typing import Final, NamedTuple
from urllib.parse import quote, unquote_to_bytes

import msgspec

from mqgate.core.mac import hmac_sha256
from mqgate.errors import MqgateError
from mqgate.sqs.detect import SIGV4_ALGORITHM

ALGORITHM: Final = SIGV4_ALGORITHM
SERVICE: Final = "sqs"
TERMINATOR: Final = "aws4_request"
MAX_SKEW_S: Final = 15 * 60
MAX_EXPIRES_S: Final = 7 * 24 * 3600  # a presigned URL's longest validity, as AWS allows
_SAFE: Final = "-_.~"  # with letters and digits: what AWS's encoding leaves as it is
_STAMP: Final = "%Y%m%dT%H%M%SZ"
_SIGNING_KEYS_KEPT: Final = 1024  # (secret, day, region) triples: keys x regions x 2 days at midnight

# What a query string's authentication is made of (presigned URLs), by parameter name.
Q_ALGORITHM: Final = "X-Amz-Algorithm"
Q_CREDENTIAL: Final = "X-Amz-Credential"
Q_DATE: Final = "X-Amz-Date"
Q_EXPIRES: Final = "X-Amz-Expires"
Q_SIGNED_HEADERS: Final = "X-Amz-SignedHeaders"
Q_SIGNATURE: Final = "X-Amz-Signature"

# A secret by access key id; None for a key that is unknown or revoked.
Lookup = Callable[[str], str | None]


class SigV4Error(MqgateError):
    """A request AWS would refuse before looking at it: `code` is AWS's error code and
    `http_status` its status; the client is at fault (AWS's error type `Sender`)."""

    http_status = 403
    code = "SignatureDoesNotMatch"
    sender_fault: Final = True


class MissingAuthenticationToken(SigV4Error):
    http_status = 403
    code = "MissingAuthenticationToken"


class IncompleteSignature(SigV4Error):
    http_status = 400
    code = "IncompleteSignature"


class InvalidClientTokenId(SigV4Error):
    http_status = 403
    code = "InvalidClientTokenId"


class SignatureDoesNotMatch(SigV4Error):
    http_status = 403
    code = "SignatureDoesNotMatch"


MISSING_TOKEN: Final = "Request is missing Authentication Token"
INVALID_TOKEN: Final = "The security token included in the request is invalid."
MISMATCH: Final = (
    "The request signature we calculated does not match the signature you provided. Check your "
    "AWS Secret Access Key and signing method. Consult the service documentation for details."
)


class Verified(msgspec.Struct):
    """Who signed a request that verified, and how."""

    access_key_id: str
    region: str
    signed_at: int  # epoch seconds, the request time it was signed with
    signed_headers: tuple[str, ...]
    presigned: bool
    service: str = SERVICE  # the credential scope's service (`sts` for GetCallerIdentity)


class _Signature(NamedTuple):
    access_key_id: str
    day: str  # YYYYMMDD of the credential scope
    region: str
    service: str
    terminator: str
    signed_headers: tuple[str, ...]
    signature: str
    stamp: str  # the request time as signed, YYYYMMDDTHHMMSSZ
    signed_at: int
    expires_s: int | None  # a presigned URL's validity; None: the Authorization header


def access_key_id_of(headers: Mapping[bytes, bytes], query_string: bytes) -> str | None:
    """The access key id a request names, read cheaply and without checking anything, so that
    a caller can have the key at hand before `verify` (`AccessKeys.ready`)."""
    auth = headers.get(b"authorization")
    if auth is not None:
        text = auth.decode("latin-1")
        usual = _usual(text)
        if usual is not None:
            return usual[0].key_id
        return _first_key_id(text.partition(" ")[2])
    for name, value in _query_pairs(query_string):
        if name == Q_CREDENTIAL:
            return value.split("/", 1)[0] or None
    return None


def verify(
    method: str,
    path: str,
    query_string: bytes,
    headers: Mapping[bytes, bytes],
    body: bytes,
    lookup: Lookup,
    now: float,
    services: frozenset[str] = frozenset({SERVICE}),
) -> Verified:
    """Verify a request's signature (see the module); raises a `SigV4Error` if it does not.

    `path` is the request's path as it was sent (percent-encoded: ASGI's `raw_path`), `headers`
    by lower-case name, `now` in epoch seconds; `services`: the credential scopes' services
    accepted (SDKs sign STS's GetCallerIdentity for `sts`, at the same endpoint)."""
    pairs = _query_pairs(query_string)
    auth = headers.get(b"authorization")
    if auth is not None:
        sig = _from_header(auth.decode("latin-1"), headers)
    elif any(name == Q_ALGORITHM for name, _ in pairs):
        sig = _from_query(pairs)
    else:
        raise MissingAuthenticationToken(MISSING_TOKEN, field="Authorization")
    _check_scope(sig, services)
    _check_time(sig, now)
    secret = lookup(sig.access_key_id)
    if secret is None:
        raise InvalidClientTokenId(INVALID_TOKEN, field="Credential")
    presigned = sig.expires_s is not None
    canonical = canonical_request(method, path, pairs, headers, sig.signed_headers, body, presigned)
    scope = f"{sig.day}/{sig.region}/{sig.service}/{sig.terminator}"
    to_sign = "\n".join((ALGORITHM, sig.stamp, scope, _sha256_hex(canonical)))
    expected = _hmac_hex(signing_key(secret, sig.day, sig.region, sig.service), to_sign.encode())
    if not hmac.compare_digest(expected.encode(), sig.signature.encode("latin-1", "replace")):
        raise SignatureDoesNotMatch(MISMATCH, field="Signature")
    return Verified(sig.access_key_id, sig.region, sig.signed_at, sig.signed_headers, presigned, sig.service)


# --- reading the signature --------------------------------------------------------------


def _first_key_id(rest: str) -> str | None:
    """The access key id of the first `Credential` part (`access_key_id_of`'s reading)."""
    for part in rest.split(","):
        name, _, value = part.strip().partition("=")
        if name == "Credential":
            return value.split("/", 1)[0] or None
    return None


def _parts(rest: str) -> dict[str, str]:
    """The signature's parts after the algorithm, the last of each name (`_from_header`'s reading)."""
    parts: dict[str, str] = {}
    for part in rest.split(","):
        name, eq, found = part.strip().partition("=")
        if eq and name in _PART_NAMES:
            parts[name] = found.strip()
    return parts


class _Head(NamedTuple):
    """What an Authorization header says before its signature, read once for every request
    that repeats it (an SDK's are the same all day but for the signature)."""

    parts: dict[str, str]  # as `_parts` reads them
    key_id: str | None  # as `_first_key_id` reads it


def _usual(value: str) -> tuple[_Head, str] | None:
    """(its head, its signature) of an Authorization header that starts with the algorithm and
    a space and ends with `, Signature=` and a signature without a comma (the way every SDK
    writes it); None for any other. Read so, it gives what the general reading gives: the
    signature is the last part, the head's parts come before it."""
    if not value.startswith(_ALGORITHM_SPACE):
        return None
    cut = value.rfind(_SIGNATURE_PART)
    if cut < 0:
        return None
    signature = value[cut + len(_SIGNATURE_PART) :]
    if "," in signature:
        return None
    text = value[len(_ALGORITHM_SPACE) : cut]
    head = _HEADS.get(text)
    if head is None:
        head = _Head(_parts(text), _first_key_id(text))
        if len(text) <= _HEAD_CHARS:
            if len(_HEADS) >= _HEADS_KEPT:
                _HEADS.clear()
            _HEADS[text] = head
    return head, signature


_PART_NAMES: Final = ("Credential", "SignedHeaders", "Signature")
_ALGORITHM_SPACE: Final = ALGORITHM + " "
_SIGNATURE_PART: Final = ", Signature="
_HEADS_KEPT: Final = 1024
_HEAD_CHARS: Final = 1024
_HEADS: dict[str, _Head] = {}


def _from_header(value: str, headers: Mapping[bytes, bytes]) -> _Signature:
    usual = _usual(value)
    if usual is not None:
        parts = {**usual[0].parts, "Signature": usual[1].strip()}
    else:
        algorithm, _, rest = value.strip().partition(" ")
        if algorithm != ALGORITHM and algorithm.startswith("AWS4-"):
            raise IncompleteSignature(f"Unsupported AWS 'algorithm': '{algorithm}'", field="Authorization")
        parts = _parts(rest) if algorithm == ALGORITHM else {}
    date = _date_header(headers)
    if date is not None and parts.get("Credential") and parts.get("Signature") and parts.get("SignedHeaders"):
        stamp, signed_at = date
        return _signature(
            parts["Credential"], parts["SignedHeaders"], parts["Signature"], stamp, signed_at, None
        )
    missing = [
        f"Authorization header requires '{name}' parameter."
        for name in ("Credential", "Signature", "SignedHeaders")
        if not parts.get(name)
    ]
    if date is None:
        missing.append("Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.")
    if missing:
        shown = value if len(value) <= 256 else value[:256] + "…"
        raise IncompleteSignature(" ".join([*missing, f"Authorization={shown}"]), field="Authorization")
    assert date is not None
    stamp, signed_at = date
    return _signature(parts["Credential"], parts["SignedHeaders"], parts["Signature"], stamp, signed_at, None)


def _from_query(pairs: list[tuple[str, str]]) -> _Signature:
    params = dict(pairs)
    if params.get(Q_ALGORITHM) != ALGORITHM:
        raise IncompleteSignature(
            f"Unsupported AWS 'algorithm': '{params.get(Q_ALGORITHM)}'", field=Q_ALGORITHM
        )
    required = (Q_CREDENTIAL, Q_SIGNATURE, Q_SIGNED_HEADERS, Q_DATE, Q_EXPIRES)
    missing = [name for name in required if not params.get(name)]
    if missing:
        raise IncompleteSignature(
            " ".join(f"AWS query-string parameters must include '{name}'." for name in missing),
            field=missing[0],
        )
    stamp = params[Q_DATE]
    signed_at = _parse_stamp(stamp)
    if signed_at is None:
        raise IncompleteSignature(f"X-Amz-Date must be in the ISO8601 Long Format: '{stamp}'", field=Q_DATE)
    expires = params[Q_EXPIRES]
    if not (expires.isascii() and expires.isdigit()) or not 1 <= int(expires) <= MAX_EXPIRES_S:
        raise IncompleteSignature(
            f"X-Amz-Expires must be a number of seconds from 1 to {MAX_EXPIRES_S}: '{expires}'",
            field=Q_EXPIRES,
        )
    return _signature(
        params[Q_CREDENTIAL], params[Q_SIGNED_HEADERS], params[Q_SIGNATURE], stamp, signed_at, int(expires)
    )


def _signature(
    credential: str, signed: str, signature: str, stamp: str, signed_at: int, expires_s: int | None
) -> _Signature:
    scope = _SCOPES.get(credential)
    if scope is None:
        scope = tuple(credential.split("/"))
        if len(scope) != 5 or not all(scope):
            raise IncompleteSignature(
                "Credential must have exactly 5 slash-delimited elements, e.g. "
                f"keyid/date/region/service/term, got '{credential}'",
                field="Credential",
            )
        if len(credential) <= _SIGNED_NAMES_CHARS:
            if len(_SCOPES) >= _SCOPES_KEPT:
                _SCOPES.clear()
            _SCOPES[credential] = scope
    names = _signed_names(signed)
    if names is None:
        raise IncompleteSignature(
            f"SignedHeaders is not a list of lower-case header names: '{signed}'", field="SignedHeaders"
        )
    if "host" not in names:
        raise IncompleteSignature(
            "'Host' must be a 'SignedHeader' in the AWS Authorization.", field="SignedHeaders"
        )
    key_id, day, region, service, terminator = scope
    return _Signature(key_id, day, region, service, terminator, names, signature, stamp, signed_at, expires_s)


def _signed_names(signed: str) -> tuple[str, ...] | None:
    """SignedHeaders as names, None unless each is a non-empty, lower-case and unpadded name;
    the valid lists kept (clients send a handful)."""
    names = _SIGNED_NAMES.get(signed)
    if names is not None:
        return names
    names = tuple(signed.split(";"))
    if not all(names) or any(n != n.lower() or n != n.strip() for n in names):
        return None
    if len(signed) <= _SIGNED_NAMES_CHARS:
        if len(_SIGNED_NAMES) >= _SIGNED_NAMES_KEPT:
            _SIGNED_NAMES.clear()
        _SIGNED_NAMES[signed] = names
    return names


_SIGNED_NAMES_KEPT: Final = 256
# Credentials split (a key's is the same all day), only the well-formed ones.
_SCOPES_KEPT: Final = 1024
_SCOPES: dict[str, tuple[str, ...]] = {}
_SIGNED_NAMES_CHARS: Final = 512
_SIGNED_NAMES: dict[str, tuple[str, ...]] = {}


def _check_scope(sig: _Signature, services: frozenset[str]) -> None:
    if sig.terminator != TERMINATOR:
        raise SignatureDoesNotMatch(
            f"Credential should be scoped with a valid terminator: '{TERMINATOR}', not '{sig.terminator}'.",
            field="Credential",
        )
    if sig.service not in services:
        raise SignatureDoesNotMatch(
            f"Credential should be scoped to correct service: '{SERVICE}'.", field="Credential"
        )
    if sig.day != sig.stamp[:8]:
        raise SignatureDoesNotMatch(
            "Date in Credential scope does not match YYYYMMDD from ISO-8601 version of date from HTTP: "
            f"'{sig.day}' != '{sig.stamp[:8]}', from '{sig.stamp}'.",
            field="Credential",
        )


def _check_time(sig: _Signature, now: float) -> None:
    """Within 15 minutes of `now` either way; a presigned URL until it expires."""
    at = sig.signed_at
    if at > now + MAX_SKEW_S:
        raise SignatureDoesNotMatch(
            f"Signature not yet current: {sig.stamp} is still later than {_stamp(now + MAX_SKEW_S)} "
            f"({_stamp(now)} + 15 min.)",
            field="X-Amz-Date",
        )
    if sig.expires_s is not None:
        if now > at + sig.expires_s:
            raise SignatureDoesNotMatch(
                f"Signature expired: {_stamp(at + sig.expires_s)} is now earlier than {_stamp(now)} "
                f"({sig.stamp} + {sig.expires_s} s.)",
                field=Q_EXPIRES,
            )
    elif at < now - MAX_SKEW_S:
        raise SignatureDoesNotMatch(
            f"Signature expired: {sig.stamp} is now earlier than {_stamp(now - MAX_SKEW_S)} "
            f"({_stamp(now)} - 15 min.)",
            field="X-Amz-Date",
        )


def _date_header(headers: Mapping[bytes, bytes]) -> tuple[str, int] | None:
    """(the request time as signed, in epoch seconds) from X-Amz-Date, else from Date."""
    raw = headers.get(b"x-amz-date")
    if raw is not None:
        found = _DATES.get(raw)  # a client's requests of one second share it
        if found is None:
            stamp = raw.decode("latin-1").strip()
            at = _parse_stamp(stamp)
            if at is None:
                return None
            found = (stamp, at)
            if len(raw) <= _DATE_CHARS_KEPT:
                if len(_DATES) >= _DATES_KEPT:
                    _DATES.clear()
                _DATES[raw] = found
        return found
    raw = headers.get(b"date")
    if raw is None:
        return None
    parsed = parsedate_tz(raw.decode("latin-1"))
    if parsed is None:
        return None
    at = calendar.timegm(parsed[:6]) - (parsed[9] or 0)
    return _stamp(at), at


def _parse_stamp(stamp: str) -> int | None:
    """`stamp` (YYYYMMDDTHHMMSSZ) in epoch seconds, None when it is not one.

    The usual form (ASCII digits, `T`, `Z`, a real date, a time within 00:00:00–23:59:59) is
    read by slicing, its day's epoch from a small cache; whatever else (lower-case `t`/`z`, a
    leap second, a space-padded day, a year before 1970…) is left to `time.strptime`, which
    decides as it always has: the fast path accepts nothing strptime refuses."""
    if len(stamp) != 16:
        return None
    if stamp[8] == "T" and stamp[15] == "Z":
        day = _day_epoch(stamp[:8])
        clock = stamp[9:15]
        if day is not None and clock.isdigit() and clock.isascii():
            hours, minutes, seconds = int(clock[:2]), int(clock[2:4]), int(clock[4:])
            if hours < 24 and minutes < 60 and seconds < 60:
                return day + hours * 3600 + minutes * 60 + seconds
    return _strptime_stamp(stamp)


def _strptime_stamp(stamp: str) -> int | None:
    try:
        return calendar.timegm(time.strptime(stamp, _STAMP))
    except ValueError:
        return None


def _day_epoch(day: str) -> int | None:
    """The epoch seconds of a YYYYMMDD day's midnight (UTC), for the days from 1970 to 9999 in
    ASCII digits; None for anything else (the caller then asks strptime). Cached: a request
    names today, or yesterday or tomorrow near midnight."""
    found = _DAYS.get(day)
    if found is not None:
        return found
    if not (day.isdigit() and day.isascii()):
        return None
    year, month, mday = int(day[:4]), int(day[4:6]), int(day[6:])
    if year < 1970 or not 1 <= month <= 12 or not 1 <= mday <= calendar.monthrange(year, month)[1]:
        return None
    at = (datetime.date(year, month, mday) - _EPOCH_DAY).days * 86400
    if len(_DAYS) >= _DAYS_KEPT:
        _DAYS.clear()
    _DAYS[day] = at
    return at


_EPOCH_DAY: Final = datetime.date(1970, 1, 1)
# X-Amz-Date values read, with what they say (only those that are a request time).
_DATES_KEPT: Final = 256
_DATE_CHARS_KEPT: Final = 64
_DATES: dict[bytes, tuple[str, int]] = {}
_DAYS_KEPT: Final = 64
_DAYS: dict[str, int] = {}


def _stamp(epoch_s: float) -> str:
    return time.strftime(_STAMP, time.gmtime(epoch_s))


# --- the canonical request --------------------------------------------------------------


def canonical_request(
    method: str,
    path: str,
    pairs: list[tuple[str, str]],
    headers: Mapping[bytes, bytes],
    signed: tuple[str, ...],
    body: bytes,
    presigned: bool = False,
) -> str:
    lines = []
    names = _SIGNED_BYTES.get(signed)
    if names is None:
        names = tuple(name.encode("utf-8", "surrogateescape") for name in signed)
        if sum(map(len, names)) <= _SIGNED_NAMES_CHARS:
            if len(_SIGNED_BYTES) >= _SIGNED_NAMES_KEPT:
                _SIGNED_BYTES.clear()
            _SIGNED_BYTES[signed] = names
    kept = _LINES
    for name, raw_name in zip(signed, names, strict=True):
        value = headers.get(raw_name)
        if value is None:
            raise SignatureDoesNotMatch(
                f"{MISMATCH} The signed header '{name}' is not in the request.", field=name
            )
        line = kept.get((raw_name, value))
        if line is None:
            # Kept as bytes (surrogates for what is not UTF-8), so the hash sees what was sent.
            text = value.decode("utf-8", "surrogateescape")
            line = f"{name}:{' '.join(text.split())}"
            if len(value) <= _LINE_VALUE_CHARS:
                if len(kept) >= _LINES_KEPT:
                    kept.clear()
                kept[raw_name, value] = line
        lines.append(line)
    hashed = hashlib.sha256(body).hexdigest()
    claimed = headers.get(b"x-amz-content-sha256")
    if claimed is not None and claimed.decode("latin-1").strip().lower() != hashed:
        # The header is what the client signed in place of the body: it must be the body's hash,
        # else the body could be changed under a valid signature (so no UNSIGNED-PAYLOAD).
        raise SignatureDoesNotMatch(
            "The provided 'x-amz-content-sha256' header does not match what was computed.",
            field="x-amz-content-sha256",
        )
    query = pairs if not presigned else [(k, v) for k, v in pairs if k != Q_SIGNATURE]
    return "\n".join(
        (
            method.upper(),
            canonical_path(path),
            canonical_query(query),
            "\n".join(lines) + "\n",
            ";".join(signed),
            hashed,
        )
    )


_SIGNED_BYTES: dict[tuple[str, ...], tuple[bytes, ...]] = {}
# Canonical header lines by (name, value) as sent: a client repeats its host, content type,
# target and (for a second) its date on every request; a value unique to each request (an SDK's
# invocation id) takes a place until the next clearing.
_LINES_KEPT: Final = 4096
_LINE_VALUE_CHARS: Final = 256
_LINES: dict[tuple[bytes, bytes], str] = {}


def canonical_path(path: str) -> str:
    """Dot segments and empty segments removed (a trailing slash kept), then URI-encoded once
    more: what AWS signs for every service but S3."""
    if path == "/":
        return path
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    normal = "/" + "/".join(kept) + ("/" if kept and path.endswith("/") else "")
    return quote(normal, safe="/~")


def canonical_query(pairs: list[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    encoded = sorted((_encode(k), _encode(v)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _encode(text: str) -> str:
    return quote(text.encode("utf-8", "surrogateescape"), safe=_SAFE)


def _query_pairs(query_string: bytes) -> list[tuple[str, str]]:
    """The query's parameters, decoded (`%XY`, and `+` as a space: botocore signs a space as
    %20 but sends it as `+`, and a `+` as %2B), in order; UTF-8, with surrogates for other bytes
    so nothing is lost."""
    if not query_string:
        return []
    pairs = []
    for part in query_string.replace(b"+", b" ").split(b"&"):
        name, _, value = part.partition(b"=")
        pairs.append(
            (
                unquote_to_bytes(name).decode("utf-8", "surrogateescape"),
                unquote_to_bytes(value).decode("utf-8", "surrogateescape"),
            )
        )
    return pairs


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def _hmac_hex(key: bytes, message: bytes) -> str:
    return hmac_sha256(key, message).hex()


@functools.lru_cache(maxsize=_SIGNING_KEYS_KEPT)
def signing_key(secret: str, day: str, region: str, service: str = SERVICE) -> bytes:
    """kSigning for a secret, day and region: four HMACs, made once per day and region."""
    key = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, TERMINATOR):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key
