"""The SQS request path's shortcuts give what the long ways gave (issue 30's SendMessage cost):
the request time read by slicing against `time.strptime`, the signing keys kept per (secret,
day, region, service), the request ids, the decoder's header reading, the answers' text."""

from __future__ import annotations

import calendar
import datetime
import hashlib
import hmac
import os
import random
import re
import time
import uuid
from collections.abc import Mapping

import msgspec
import pytest

from mqgate.sqs import answers, protocol, sigv4
from mqgate.sqs.errors import SqsError

STAMP = "%Y%m%dT%H%M%SZ"


def strptime_stamp(stamp: str) -> int | None:
    """The request time as the gateway read it before the fast path."""
    if len(stamp) != 16:
        return None
    try:
        return calendar.timegm(time.strptime(stamp, STAMP))
    except ValueError:
        return None


def stamp_of(at: datetime.datetime) -> str:
    return at.strftime(STAMP)


# --- the request time -------------------------------------------------------------------


def test_random_stamps_from_1970_to_9999_read_as_strptime_reads_them() -> None:
    rng = random.Random(30)
    for _ in range(20_000):
        at = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=rng.randrange(0, 253_402_300_799))
        stamp = stamp_of(at)
        assert sigv4._parse_stamp(stamp) == strptime_stamp(stamp) == calendar.timegm(at.timetuple()), stamp


@pytest.mark.parametrize(
    "stamp",
    [
        "20240229T120000Z",  # a leap day
        "20000229T000000Z",  # a leap day of a year divisible by 400
        "19700101T000000Z",  # the epoch
        "99991231T235959Z",
        "20251231T235959Z",
        "20250101T000000Z",
    ],
)
def test_real_dates_read_as_strptime_reads_them(stamp: str) -> None:
    assert sigv4._parse_stamp(stamp) is not None
    assert sigv4._parse_stamp(stamp) == strptime_stamp(stamp)


@pytest.mark.parametrize(
    "stamp",
    [
        "20230229T120000Z",  # no leap day in 2023
        "19000229T120000Z",  # nor in 1900 (divisible by 100)
        "21000229T120000Z",
        "20250230T120000Z",
        "20250431T120000Z",
        "20251301T120000Z",
        "20250001T120000Z",
        "20250100T120000Z",
        "20250132T120000Z",
        "20250101T240000Z",
        "20250101T006000Z",
        "20250101T000099Z",
        "00000101T000000Z",
        "20250101 000000Z",
        "20250101T000000 ",
        "20250101T000000",
        "20250101T0000000Z",
        "2025-01-01T00:00Z",
        "2025010xT000000Z",
        "20250101T0000x0Z",
        "+2025010T000000Z",
        "20250101T00000-Z",
        "2025\u0661101T000000Z",  # an Arabic-Indic digit
        "",
    ],
)
def test_what_strptime_refuses_is_refused(stamp: str) -> None:
    assert strptime_stamp(stamp) is None
    assert sigv4._parse_stamp(stamp) is None


@pytest.mark.parametrize(
    "stamp",
    [
        "20250101t000000z",  # strptime matches case-insensitively
        "202501 1T000000Z",  # a space-padded day
        "20250101T000060Z",  # leap seconds
        "20250101T000061Z",
        "19691231T235959Z",  # before the epoch
        "00010101T000000Z",
        "20250101T0000\u06610Z",  # a digit of another script (a presigned URL's query is UTF-8)
    ],
)
def test_what_only_strptime_reads_is_read_as_before(stamp: str) -> None:
    assert sigv4._parse_stamp(stamp) == strptime_stamp(stamp)


def test_mangled_stamps_are_read_exactly_as_strptime_reads_them() -> None:
    rng = random.Random(31)
    alphabet = "0123456789TZtz -:+.\u0661\u00b2x"
    for _ in range(20_000):
        at = datetime.datetime(1960, 1, 1) + datetime.timedelta(seconds=rng.randrange(0, 4_000_000_000))
        chars = list(stamp_of(at))
        for _ in range(rng.randint(1, 3)):
            chars[rng.randrange(16)] = rng.choice(alphabet)
        stamp = "".join(chars)
        assert sigv4._parse_stamp(stamp) == strptime_stamp(stamp), stamp


def test_the_day_cache_stays_small_and_right() -> None:
    start = datetime.date(2020, 1, 1)
    for offset in range(sigv4._DAYS_KEPT * 3):
        day = start + datetime.timedelta(days=offset)
        stamp = day.strftime("%Y%m%d") + "T010203Z"
        assert sigv4._parse_stamp(stamp) == strptime_stamp(stamp)
        assert len(sigv4._DAYS) <= sigv4._DAYS_KEPT
    # A day read again, from the cache, is still that day.
    again = (start + datetime.timedelta(days=sigv4._DAYS_KEPT * 3 - 1)).strftime("%Y%m%d") + "T235959Z"
    assert sigv4._parse_stamp(again) == strptime_stamp(again)
    assert sigv4._day_epoch("20230229") is None and "20230229" not in sigv4._DAYS


# --- the signing key --------------------------------------------------------------------


def chained_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = hmac.new(f"AWS4{secret}".encode(), day.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def test_the_signing_key_is_the_hmac_chain_of_its_own_secret_day_region_and_service() -> None:
    sigv4.signing_key.cache_clear()
    variants = [
        ("secret-a", "20250304", "us-east-1", "sqs"),
        ("secret-b", "20250304", "us-east-1", "sqs"),
        ("secret-a", "20250305", "us-east-1", "sqs"),
        ("secret-a", "20250304", "eu-west-3", "sqs"),
        ("secret-a", "20250304", "us-east-1", "sts"),
    ]
    keys = []
    for _ in range(2):  # the second round from the cache
        keys = [sigv4.signing_key(*variant) for variant in variants]
        assert keys == [chained_key(*variant) for variant in variants]
    assert len(set(keys)) == len(variants)
    info = sigv4.signing_key.cache_info()
    assert info.misses == len(variants) and info.hits == len(variants)


def test_a_key_of_another_secret_is_never_reused() -> None:
    sigv4.signing_key.cache_clear()
    assert sigv4.signing_key("one", "20250304", "us-east-1") != sigv4.signing_key(
        "two", "20250304", "us-east-1"
    )
    # An AWS4 prefix folded into the secret is not the same key either.
    assert sigv4.signing_key("AWS4x", "20250304", "r") == chained_key("AWS4x", "20250304", "r", "sqs")


# --- SignedHeaders ----------------------------------------------------------------------


def test_signed_header_lists_are_checked_each_time_even_once_kept() -> None:
    assert sigv4._signed_names("content-type;host;x-amz-date") == ("content-type", "host", "x-amz-date")
    assert sigv4._signed_names("content-type;host;x-amz-date") == ("content-type", "host", "x-amz-date")
    for bad in ("Content-Type;host", "host;;x-amz-date", "host; x-amz-date", "", "host;"):
        assert sigv4._signed_names(bad) is None
        assert bad not in sigv4._SIGNED_NAMES
    long = ";".join(f"x-h{i}" for i in range(200)) + ";host"
    assert sigv4._signed_names(long) == tuple(long.split(";"))
    assert long not in sigv4._SIGNED_NAMES  # too long to keep


def test_the_signed_names_cache_is_bounded() -> None:
    for i in range(sigv4._SIGNED_NAMES_KEPT * 2):
        assert sigv4._signed_names(f"host;x-{i}") == ("host", f"x-{i}")
        assert len(sigv4._SIGNED_NAMES) <= sigv4._SIGNED_NAMES_KEPT


def test_canonical_path_and_query_shortcuts() -> None:
    assert sigv4.canonical_path("/") == "/"
    assert sigv4.canonical_path("/a/../b//c/") == "/b/c/"
    assert sigv4.canonical_query([]) == ""


# --- the Authorization header ------------------------------------------------------------

CREDENTIAL = "AKIDEXAMPLE/20250101/us-east-1/sqs/aws4_request"


def general_parts(value: str) -> tuple[str, dict[str, str]]:
    """The header's algorithm and parts as the reading before the shortcut made them."""
    algorithm, _, rest = value.strip().partition(" ")
    parts: dict[str, str] = {}
    if algorithm == sigv4.ALGORITHM:
        for part in rest.split(","):
            name, eq, found = part.strip().partition("=")
            if eq and name in ("Credential", "SignedHeaders", "Signature"):
                parts[name] = found.strip()
    return algorithm, parts


def general_key_id(value: str) -> str | None:
    _, _, rest = value.partition(" ")
    for part in rest.split(","):
        name, _, found = part.strip().partition("=")
        if name == "Credential":
            return found.split("/", 1)[0] or None
    return None


def authorization_spellings() -> list[str]:
    """The SDKs' spelling and its near misses: spaces, order, case, repeated or missing parts."""
    parts = [
        f"Credential={CREDENTIAL}",
        "SignedHeaders=content-type;host;x-amz-date",
        "Signature=" + "a" * 64,
    ]
    usual = "AWS4-HMAC-SHA256 " + ", ".join(parts)
    out = [
        usual,
        usual + "  ",
        "  " + usual,
        "AWS4-HMAC-SHA256 " + ",".join(parts),
        "AWS4-HMAC-SHA256  " + ", ".join(parts),
        "AWS4-HMAC-SHA256 " + ", ".join(reversed(parts)),
        "AWS4-HMAC-SHA256 " + ", ".join([*parts, "Signature=" + "b" * 64]),
        "AWS4-HMAC-SHA256 " + ", ".join([parts[2], *parts]),
        "AWS4-HMAC-SHA256 " + ", ".join([parts[0], "Credential=other/x", *parts[1:]]),
        "AWS4-HMAC-SHA256 " + ", ".join(["Credential", *parts]),
        "AWS4-HMAC-SHA256 " + ", ".join(parts[:2]) + ", Signature=",
        "AWS4-HMAC-SHA256 " + ", ".join(parts[:2]) + ", Signature= a,b",
        "AWS4-HMAC-SHA256 " + ", ".join(parts[:2]) + ", Signature=a=b",
        "AWS4-HMAC-SHA256 , Signature=x",
        "AWS4-HMAC-SHA256 Credential=/x/y, SignedHeaders=host, Signature=x",
        "AWS4-HMAC-SHA1 " + ", ".join(parts),
        "AWS4-HMAC-SHA256\t" + ", ".join(parts),
    ]
    rng = random.Random(30)
    for _ in range(3_000):  # random damage to the usual spelling
        chars = list(usual)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(chars))
            if rng.random() < 0.5:
                chars[at] = rng.choice(" ,=/;\t\xa0aS-")
            else:
                chars.insert(at, rng.choice(" ,=/;\t\xa0aS-"))
        out.append("".join(chars))
    return out


def test_the_usual_authorization_is_read_as_the_general_reading_reads_it() -> None:
    usual = 0
    for value in authorization_spellings():
        assert sigv4.access_key_id_of({b"authorization": value.encode("latin-1")}, b"") == general_key_id(
            value
        )
        read = sigv4._usual(value)
        if read is None:
            continue
        usual += 1
        head, signature = read
        algorithm, parts = general_parts(value)
        assert algorithm == sigv4.ALGORITHM, value
        assert {**head.parts, "Signature": signature.strip()} == parts, value
    assert usual > 1000
    assert len(sigv4._HEADS) <= sigv4._HEADS_KEPT


# --- the canonical header lines ---------------------------------------------------------


def test_canonical_header_lines_kept_are_those_made_and_bounded() -> None:
    signed = ("content-type", "host", "x-amz-date", "x-amz-target")
    rng = random.Random(30)
    for i in range(sigv4._LINES_KEPT * 2):
        values = {
            b"content-type": b"application/x-amz-json-1.0",
            b"host": f"h{rng.randrange(50)}:80".encode(),
            b"x-amz-date": f"  2025  0101T{i:06d}Z ".encode(),
            b"x-amz-target": b"AmazonSQS.SendMessage" + b" " * rng.randrange(3) + b"x" * rng.randrange(300),
        }
        made = sigv4.canonical_request("POST", "/", [], values, signed, b"{}")
        lines = [f"{n}:{' '.join(values[n.encode()].decode().split())}" for n in signed]
        assert made.split("\n")[3:7] == lines
        assert len(sigv4._LINES) <= sigv4._LINES_KEPT
    assert all(len(value) <= sigv4._LINE_VALUE_CHARS for _, value in sigv4._LINES)


# --- request ids ------------------------------------------------------------------------


def test_request_ids_are_unique_version_4_uuids() -> None:
    ids = [protocol.new_request_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)
    for text in ids[:1000] + ids[-1000:]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert protocol.SqsRequest("SendMessage", {}, "json").request_id not in ids


def test_the_request_id_counter_wraps_within_its_bits() -> None:
    ids = protocol._RequestIds()
    ids.low = 2**62 - 2
    seen = [ids.next() for _ in range(4)]
    assert len(set(seen)) == 4
    assert all(uuid.UUID(text).variant == uuid.RFC_4122 for text in seen)


def test_another_process_draws_its_own_request_ids() -> None:
    fresh = protocol._RequestIds()
    assert fresh.prefix != protocol._REQUEST_IDS.prefix
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids come from a new draw
        try:
            os.write(write, protocol.new_request_id().encode())
        finally:
            os._exit(0)
    os.close(write)
    child_id = os.read(read, 100).decode()
    os.close(read)
    os.waitpid(pid, 0)
    assert uuid.UUID(child_id).version == 4
    assert child_id[:19] != protocol.new_request_id()[:19]


# --- a plain SendMessage --------------------------------------------------------------------


def general_send(body: bytes) -> object:
    """SendMessage's params as the general JSON reading makes them, or its error."""
    try:
        return protocol._json_struct(protocol.INPUTS["SendMessage"], msgspec.json.decode(body), "")
    except SqsError as exc:
        return (exc.kind, exc.message)


def send_bodies() -> list[bytes]:
    url = '"QueueUrl":"http://h:1/000000000000/q"'
    out = [
        b"{" + url.encode() + b',"MessageBody":"x"}',
        b'{"MessageBody":"x",' + url.encode() + b"}",
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":5}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":null}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":5.0}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":"5"}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":true}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":2147483648}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":-2147483649}',
        b"{" + url.encode() + b',"MessageBody":"x","DelaySeconds":-2147483648}',
        b"{" + url.encode() + b',"MessageBody":"x","MessageGroupId":"g","MessageDeduplicationId":"d"}',
        b"{" + url.encode() + b',"MessageBody":"x","MessageGroupId":7}',
        b"{" + url.encode() + b',"MessageBody":"x","MessageAttributes":{"a":{"DataType":"String"}}}',
        b"{" + url.encode() + b',"MessageBody":"x","MessageAttributes":null}',
        b"{" + url.encode() + b',"MessageBody":"x","Unknown":[1,2,{"deep":[[[]]]}]}',
        b"{" + url.encode() + b',"MessageBody":"a","MessageBody":"b"}',
        b"{" + url.encode() + b',"MessageBody":null}',
        b"{" + url.encode() + b',"MessageBody":""}',
        b"{" + url.encode() + b"}",
        b'{"QueueUrl":5,"MessageBody":"x"}',
        b"{" + url.encode() + b',"MessageBody":"\\ud800 \\u00e9 \\u0000"}',
    ]
    rng = random.Random(30)
    members = ["QueueUrl", "MessageBody", "DelaySeconds", "MessageGroupId", "MessageDeduplicationId", "X"]
    values = ['"s"', '""', "0", "-1", "900", "1.5", "1e3", "null", "true", "[]", "{}", '"\\u00e9"']
    for _ in range(3_000):
        picked = rng.sample(members, rng.randrange(0, len(members) + 1))
        if rng.random() < 0.7:  # the two required ones, as strings: the plain sends' shape
            picked = ["QueueUrl", "MessageBody", *(m for m in picked if m not in ("QueueUrl", "MessageBody"))]
        required = ("QueueUrl", "MessageBody")
        parts = [
            f'"{m}":{rng.choice(values[:2] if m in required and rng.random() < 0.9 else values)}'
            for m in picked
        ]
        out.append(("{" + ",".join(parts) + "}").encode())
    return out


def test_a_plain_send_is_read_as_the_general_reading_reads_it() -> None:
    fast = 0
    for body in send_bodies():
        plain = protocol._plain_send(body)
        if plain is None:
            continue  # the general reading's, and its error if any
        fast += 1
        assert plain == general_send(body), body
        assert list(plain) == list(general_send(body)), body  # type: ignore[call-overload]
    assert fast > 300


# --- flat answers ---------------------------------------------------------------------------


def test_flat_answers_are_what_the_shape_walk_makes() -> None:
    rng = random.Random(30)
    texts = ["abc", "", "é\x00\ud800x", "0" * 32, None, 7]
    assert "SendMessage" in answers._FLAT_OUTPUTS
    for action, names in answers._FLAT_OUTPUTS.items():
        shape = answers.OUTPUTS[action]
        assert shape is not None
        for _ in range(200):
            result = {n: rng.choice(texts) for n in names if rng.random() < 0.8}
            request = protocol.SqsRequest(action, {}, "json")
            _, _, body = answers.encode_result(request, action, result)
            assert msgspec.json.decode(body) == answers._json_struct(shape, result), result


# --- the decoder's headers ----------------------------------------------------------------


def old_header_map(headers: Mapping[bytes, bytes] | Mapping[str, str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in headers.items():
        name = key.decode("latin-1") if isinstance(key, bytes) else key
        out[name.lower()] = value.decode("latin-1") if isinstance(value, bytes) else value
    return out


def old_detect(headers: Mapping[bytes, bytes] | Mapping[str, str]) -> str:
    h = old_header_map(headers)
    if "x-amz-target" in h or h.get("content-type", "").lower().startswith("application/x-amz-json"):
        return "json"
    return "query"


HEADER_SETS: list[Mapping[bytes, bytes] | Mapping[str, str]] = [
    {
        b"x-amz-target": b"AmazonSQS.SendMessage",
        b"content-type": b"application/x-amz-json-1.0",
        b"host": b"h",
    },
    {b"X-Amz-Target": b"AmazonSQS.SendMessage", b"Host": b"h:1", b"x-other": b"y"},
    {b"content-type": b"Application/X-Amz-Json-1.0"},
    {b"content-type": b"application/x-www-form-urlencoded", b"host": b"h"},
    {"Content-Type": "application/x-amz-json-1.0", "HOST": "x", "host": "y"},
    {"x-amz-target": "", "Authorization": "AWS4-HMAC-SHA256 ..."},
    {"Content-TYPE": "text/plain"},
    {b"h\xc4st": b"not the host", b"host": b"\xe9t\xe9"},
    {},
]


@pytest.mark.parametrize("headers", HEADER_SETS)
def test_the_decoder_reads_the_headers_it_reads_as_before(
    headers: Mapping[bytes, bytes] | Mapping[str, str],
) -> None:
    assert protocol.detect_protocol(headers) == old_detect(headers)
    wanted = {
        k: v for k, v in old_header_map(headers).items() if k in ("x-amz-target", "content-type", "host")
    }
    assert protocol._header_map(headers) == wanted
    if all(isinstance(k, bytes) and k == k.lower() for k in headers):  # as ASGI gives them
        asgi: Mapping[bytes, bytes] = headers  # type: ignore[assignment]
        assert protocol.read_asgi_headers(asgi) == (wanted, old_detect(headers))


# --- the answers' text --------------------------------------------------------------------

NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def test_clean_text_is_what_the_xml_rule_makes_of_it() -> None:
    rng = random.Random(32)
    pool = "abc <&>\t\n\r\x00\x01\x7f\x1f é\ud800\ufffe\U0001f680" + "".join(map(chr, range(32, 127)))
    samples = ["", "plain", "0123456789abcdef", "http://h/1/q", "\x7f", "tab\there"]
    samples += ["".join(rng.choice(pool) for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    for text in samples:
        assert answers._clean(text) == NOT_XML.sub("\ufffd", text), repr(text)


def test_required_lists_are_those_of_each_output_shape() -> None:
    for action, shape in answers.OUTPUTS.items():
        expected = set() if shape is None else answers._REQUIRED_LISTS & shape.members.keys()
        assert set(answers._REQUIRED_LISTS_OF.get(action, ())) == expected


def test_the_signature_hmac_is_rfc_2104_hmac_sha256() -> None:
    rng = random.Random(33)
    key = sigv4.signing_key("s", "20250304", "us-east-1")
    for size in (0, 1, 55, 64, 200, 3000):
        message = rng.randbytes(size)
        assert sigv4._hmac_hex(key, message) == hmac.new(key, message, hashlib.sha256).hexdigest()
