"""The XML of Alibaba Cloud MQ's HTTP API: the request bodies decoded, the answers encoded, as
the official SDKs write and read them (Python `mq-http-sdk` 1.0.3, Node `@aliyunmq/mq-http-sdk`
1.0.4).

Decoding runs expat (the parser under `xml.etree`) with its handlers set here, so that nothing
but elements and text gets through: a DOCTYPE is refused as it starts, so no entity is ever
declared (no billion laughs, no external entity, no DTD fetched), and an undefined entity
reference is a well-formedness error. The documents are flat (a root, its children, their
text), their size, element count and text lengths are bounded, and every refusal is an
`AliyunError` naming the element: MalformedXML for what is not well-formed XML (or declares a
DTD), InvalidArgument for XML that is not the document the operation takes,
MissingReceiptHandle for an empty receipt handle.

Text comes as the SDKs send it: escaped (Python, minidom) or in CDATA sections (Node). XML
turns a CR or CRLF into LF in any text, so a body's CRs do not survive a publish (as at the
service); answers write CR as `&#13;`, so a body stored with one (through the native API) is
read back exactly. Characters XML 1.0 cannot carry at all (most C0 controls, U+FFFE, U+FFFF,
lone surrogates) cannot be answered: the encoders raise `NotXmlText` for them.

Message properties travel as one string, `key:value|key:value` (the Python SDK ends it with a
`|`): neither a key nor a value may hold `:` or `|` (the SDKs refuse them, and also `& " ' < >`
in user properties, which XML escaping carries anyway). The service's own properties are `KEYS`
(the message keys, separated by spaces), `__STARTDELIVERTIME` (epoch milliseconds: a delayed
message), `__TransCheckT` (seconds before the first transaction check: a transactional half
message) and `__SHARDINGKEY` (the ordered messages' partition key); a consume answers them in
`Properties` too, where the SDKs read them back.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Final, NoReturn
from xml.parsers import expat

import msgspec

from mqgate.aliyun import errors
from mqgate.aliyun.errors import AliyunError, ErrorKind

XMLNS: Final = "http://mq.aliyuncs.com/doc/v1/"
CONTENT_TYPE: Final = (
    "text/xml;charset=utf-8"  # the Node SDK parses answers only of text/xml or application/xml
)
REQUEST_ID_HEADER: Final = "x-mq-request-id"  # lower case: the Python SDK looks it up so in a plain dict
_DECLARATION: Final = '<?xml version="1.0" encoding="UTF-8"?>\n'

KEYS: Final = "KEYS"
START_DELIVER_TIME: Final = "__STARTDELIVERTIME"
TRANS_CHECK_IMMUNITY_TIME: Final = "__TransCheckT"
SHARDING_KEY: Final = "__SHARDINGKEY"
SYSTEM_PROPERTIES: Final = frozenset({KEYS, START_DELIVER_TIME, TRANS_CHECK_IMMUNITY_TIME, SHARDING_KEY})

MAX_DOCUMENT_BYTES: Final = 16 * 1024 * 1024  # a publish's whole XML, escapes included
MAX_MESSAGE_BODY_BYTES: Final = 4 * 1024 * 1024  # the service's limit for a normal message (UTF-8)
MAX_TAG_CHARS: Final = 64  # what both SDKs allow a tag
MAX_PROPERTIES_CHARS: Final = 32 * 1024
MAX_RECEIPT_HANDLES: Final = 16  # per ack, as the service allows
MAX_RECEIPT_HANDLE_CHARS: Final = 1024
MAX_ACK_DOCUMENT_BYTES: Final = 64 * 1024
_MAX_ELEMENTS: Final = 64  # children of a publish's root: three are enough, a few repeats refused later

PUBLISH_ELEMENTS: Final = ("MessageBody", "MessageTag", "Properties")

# Characters XML 1.0 can carry (its Char production), even as character references.
_NOT_XML_CHAR: Final = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ESCAPES: Final = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#13;"})
_DIGITS: Final = re.compile(r"[0-9]{1,19}")


class NotXmlText(ValueError):
    """A value holds a character XML 1.0 cannot carry; `element` is where it was to go."""

    def __init__(self, element: str) -> None:
        super().__init__(f"{element} holds a character XML 1.0 cannot carry")
        self.element = element


# ---------------------------------------------------------------------------------------------
# Decoding


class PublishRequest(msgspec.Struct, frozen=True):
    """A publish's body, decoded and checked."""

    body: str
    tag: str  # "" for none
    properties: dict[str, str]  # every pair, the service's own (KEYS, __…) included, in order
    keys: tuple[str, ...]  # KEYS split on spaces
    start_deliver_time_ms: int | None  # __STARTDELIVERTIME
    trans_check_immunity_s: int | None  # __TransCheckT: set on (and only on) a transactional message
    sharding_key: str | None  # __SHARDINGKEY

    @property
    def transactional(self) -> bool:
        return self.trans_check_immunity_s is not None

    @property
    def user_properties(self) -> dict[str, str]:
        return {k: v for k, v in self.properties.items() if k not in SYSTEM_PROPERTIES}


class _Refused(Exception):
    """Raised from an expat handler to stop the parse; carries the error to answer."""

    def __init__(self, error: AliyunError) -> None:
        super().__init__(error.message)
        self.error = error


def _invalid(message: str, element: str) -> AliyunError:
    return AliyunError(errors.INVALID_ARGUMENT, message, element=element)


class _FlatDocument:
    """A root and its children's text, from expat with everything but elements and text refused."""

    def __init__(self, max_elements: int, max_text_chars: Mapping[str, int], default_max_chars: int) -> None:
        self.root = ""
        self.children: list[tuple[str, str]] = []
        self._depth = 0
        self._text: list[str] = []
        self._text_len = 0
        self._max_elements = max_elements
        self._max_text_chars = max_text_chars
        self._default_max_chars = default_max_chars
        self._current = ""

    def parse(self, data: bytes) -> None:
        parser = expat.ParserCreate()
        parser.buffer_text = True
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartDoctypeDeclHandler = self._doctype
        parser.EntityDeclHandler = self._entity
        parser.UnparsedEntityDeclHandler = self._entity
        parser.NotationDeclHandler = self._entity
        parser.ExternalEntityRefHandler = self._entity
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        parser.CharacterDataHandler = self._chars
        try:
            parser.Parse(data, True)
        except _Refused as refused:
            raise refused.error from None
        except expat.ExpatError as e:
            raise AliyunError(
                errors.MALFORMED_XML, f"The XML you provided was not well-formed: {e}."
            ) from None

    @staticmethod
    def _doctype(*_: object) -> NoReturn:
        raise _Refused(
            AliyunError(errors.MALFORMED_XML, "The XML you provided declares a DOCTYPE: not allowed.")
        )

    @staticmethod
    def _entity(*_: object) -> NoReturn:
        raise _Refused(
            AliyunError(errors.MALFORMED_XML, "The XML you provided declares entities: not allowed.")
        )

    def _start(self, name: str, _attrs: object) -> None:
        self._depth += 1
        if self._depth == 1:
            self.root = name
        elif self._depth == 2:
            if len(self.children) >= self._max_elements:
                raise _Refused(_invalid(f"{self.root} has more than {self._max_elements} elements.", name))
            self._current = name
            self._text = []
            self._text_len = 0
        else:
            raise _Refused(_invalid(f"{self._current} may hold text only, not the element {name}.", name))

    def _end(self, _name: str) -> None:
        if self._depth == 2:
            self.children.append((self._current, "".join(self._text)))
        self._depth -= 1

    def _chars(self, data: str) -> None:
        if self._depth == 2:
            self._text_len += len(data)
            limit = self._max_text_chars.get(self._current, self._default_max_chars)
            if self._text_len > limit:
                raise _Refused(_invalid(f"{self._current} is longer than {limit} characters.", self._current))
            self._text.append(data)
        elif self._depth == 1 and data.strip():
            raise _Refused(_invalid(f"{self.root} may hold elements only, not text.", self.root))


def _parse(
    data: bytes,
    root: str,
    *,
    max_bytes: int,
    max_elements: int,
    max_text_chars: Mapping[str, int],
    default_max_chars: int,
) -> list[tuple[str, str]]:
    if len(data) > max_bytes:
        raise _invalid(f"The XML you provided is larger than {max_bytes} bytes.", root)
    if not data.strip():
        raise AliyunError(errors.MALFORMED_XML, "The request has no XML body.")
    doc = _FlatDocument(max_elements, max_text_chars, default_max_chars)
    doc.parse(data)
    if doc.root != root:
        raise _invalid(f"The XML's root element must be {root}, not {doc.root}.", doc.root)
    return doc.children


# The publish documents the SDKs write, matched whole: the declaration, the root with its
# namespace, then MessageBody, MessageTag and Properties in this order, each once at most, their
# text plain (no markup, no reference, no CR: nothing XML would change) or one CDATA section (the
# Node SDK's). Anything else is parsed by expat; what this matches, expat reads the same.
_TEXT: Final = r"(?:([^<&\r]*)|<!\[CDATA\[([^\r]*?)\]\]>)"
_FAST_PUBLISH: Final = re.compile(
    r'(?:<\?xml version="1\.0" encoding="(?i:UTF-8)"\?>)?\n?'
    rf'<Message xmlns="{re.escape(XMLNS)}">'
    rf"<MessageBody>{_TEXT}</MessageBody>"
    rf"(?:<MessageTag>{_TEXT}</MessageTag>)?"
    rf"(?:<Properties>{_TEXT}</Properties>)?"
    r"</Message>\s*",
    re.DOTALL,
)


def _fast_publish(data: bytes) -> list[tuple[str, str]] | None:
    """The children of a publish document the SDKs wrote, without a parser; None for any other."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    m = _FAST_PUBLISH.fullmatch(text)
    if m is None or _NOT_XML_CHAR.search(text):
        return None
    groups = m.groups()
    children: list[tuple[str, str]] = []
    for i, name in enumerate(PUBLISH_ELEMENTS):
        plain, cdata = groups[2 * i], groups[2 * i + 1]
        if plain is not None:
            if "]]>" in plain:  # not well-formed in text: expat says so
                return None
            children.append((name, plain))
        elif cdata is not None:
            if "]]>" in cdata:  # the section ended before: text with "]]>" after it, not well-formed
                return None
            children.append((name, cdata))
    return children


def decode_publish(
    data: bytes,
    *,
    max_document_bytes: int = MAX_DOCUMENT_BYTES,
    max_body_bytes: int = MAX_MESSAGE_BODY_BYTES,
    max_tag_chars: int = MAX_TAG_CHARS,
    max_properties_chars: int = MAX_PROPERTIES_CHARS,
) -> PublishRequest:
    """`<Message><MessageBody/><MessageTag/><Properties/></Message>` -> PublishRequest.

    MessageBody is required and not empty (at most `max_body_bytes` in UTF-8); MessageTag and
    Properties are optional, each element at most once, no other element."""
    fast = _fast_publish(data) if len(data) <= max_document_bytes else None
    if fast is not None:
        limits = {
            "MessageBody": max_body_bytes,
            "MessageTag": max_tag_chars,
            "Properties": max_properties_chars,
        }
        for name, text in fast:
            if len(text) > limits[name]:
                raise _invalid(f"{name} is longer than {limits[name]} characters.", name)
    children = (
        fast
        if fast is not None
        else _parse(
            data,
            "Message",
            max_bytes=max_document_bytes,
            max_elements=_MAX_ELEMENTS,
            # A body's characters are at most its UTF-8 bytes: a first bound, its bytes checked below.
            max_text_chars={
                "MessageBody": max_body_bytes,
                "MessageTag": max_tag_chars,
                "Properties": max_properties_chars,
            },
            default_max_chars=max_properties_chars,
        )
    )
    found: dict[str, str] = {}
    for name, text in children:
        if name not in PUBLISH_ELEMENTS:
            raise _invalid(f"Message may hold {', '.join(PUBLISH_ELEMENTS)}, not {name}.", name)
        if name in found:
            raise _invalid(f"{name} is given more than once.", name)
        found[name] = text
    body = found.get("MessageBody", "")
    if not body:
        raise _invalid("MessageBody is required and may not be empty.", "MessageBody")
    if len(body.encode("utf-8", "surrogatepass")) > max_body_bytes:
        raise _invalid(f"MessageBody is longer than {max_body_bytes} bytes.", "MessageBody")
    tag = found.get("MessageTag", "")
    if tag and (not tag.strip() or "|" in tag):
        raise _invalid("MessageTag may be neither blank nor hold '|'.", "MessageTag")
    properties = parse_properties(found.get("Properties", ""))
    return PublishRequest(
        body=body,
        tag=tag,
        properties=properties,
        keys=tuple(properties.get(KEYS, "").split()),
        start_deliver_time_ms=_whole(properties, START_DELIVER_TIME),
        trans_check_immunity_s=_whole(properties, TRANS_CHECK_IMMUNITY_TIME),
        sharding_key=properties.get(SHARDING_KEY),
    )


def _whole(properties: Mapping[str, str], name: str) -> int | None:
    value = properties.get(name)
    if value is None:
        return None
    if not _DIGITS.fullmatch(value):
        raise _invalid(f"The property {name} must be a whole number, not {value!r}.", "Properties")
    return int(value)


def parse_properties(text: str) -> dict[str, str]:
    """`k:v|k:v|` -> {k: v}: empty segments are skipped (the Python SDK ends with `|`); a
    segment that is not one non-empty key, `:`, one non-empty value is InvalidArgument; a key
    given twice keeps its last value (as the SDKs' own readers do)."""
    out: dict[str, str] = {}
    for segment in text.split("|"):
        if not segment:
            continue
        key, colon, value = segment.partition(":")
        if not colon or not key or not value or ":" in value:
            raise _invalid(
                f"Properties must be key:value pairs separated by '|', each key and value neither "
                f"empty nor holding ':' or '|': {segment!r} is not.",
                "Properties",
            )
        out[key] = value
    return out


def decode_ack(
    data: bytes,
    *,
    max_handles: int = MAX_RECEIPT_HANDLES,
    max_handle_chars: int = MAX_RECEIPT_HANDLE_CHARS,
    max_document_bytes: int = MAX_ACK_DOCUMENT_BYTES,
) -> tuple[str, ...]:
    """`<ReceiptHandles><ReceiptHandle/>…</ReceiptHandles>` -> the handles in order (1 to
    `max_handles`; repeats kept). An empty handle is MissingReceiptHandle."""
    children = _parse(
        data,
        "ReceiptHandles",
        max_bytes=max_document_bytes,
        max_elements=max_handles,
        max_text_chars={},
        default_max_chars=max_handle_chars,
    )
    handles: list[str] = []
    for name, text in children:
        if name != "ReceiptHandle":
            raise _invalid(f"ReceiptHandles may hold ReceiptHandle elements only, not {name}.", name)
        if not text:
            raise AliyunError(errors.MISSING_RECEIPT_HANDLE, element="ReceiptHandle")
        handles.append(text)
    if not handles:
        raise _invalid(f"ReceiptHandles must hold 1 to {max_handles} ReceiptHandle.", "ReceiptHandles")
    return tuple(handles)


# ---------------------------------------------------------------------------------------------
# Encoding


def message_body_md5(body: str) -> str:
    """MessageBodyMD5: the MD5 of the body's UTF-8, in upper-case hex (as MNS and MQ answer it;
    no SDK checks it)."""
    return hashlib.md5(body.encode("utf-8", "surrogatepass"), usedforsecurity=False).hexdigest().upper()


def representable(key: str, value: str) -> bool:
    """Whether a property can travel in `Properties` (SDKs split on `|` then `:`)."""
    return bool(key) and bool(value) and not any(c in key or c in value for c in ":|")


def encode_properties(properties: Mapping[str, str]) -> str:
    """{k: v} -> `k:v|k:v`; pairs that cannot travel (`representable`) are left out."""
    return "|".join(f"{k}:{v}" for k, v in properties.items() if representable(k, v))


def _text(value: str, element: str) -> str:
    if _NOT_XML_CHAR.search(value):
        raise NotXmlText(element)
    return value.translate(_ESCAPES)


def _element(name: str, value: str) -> str:
    return f"<{name}>{_text(value, name)}</{name}>"


def _document(root: str, inner: str) -> bytes:
    return f'{_DECLARATION}<{root} xmlns="{XMLNS}">{inner}</{root}>'.encode()


def encode_publish_result(message_id: str, body_md5: str, receipt_handle: str = "") -> bytes:
    """A publish's answer (status 201). `receipt_handle` only for a transactional half message:
    the handle its producer commits or rolls back with until TransCheckImmunityTime."""
    inner = _element("MessageId", message_id) + _element("MessageBodyMD5", body_md5)
    if receipt_handle:
        inner += _element("ReceiptHandle", receipt_handle)
    return _document("Message", inner)


class ConsumedMessage(msgspec.Struct, frozen=True):
    """One message of a consume's answer (also of a `trans=pop` of half messages)."""

    message_id: str
    receipt_handle: str
    body: str
    publish_time_ms: int
    first_consume_time_ms: int
    next_consume_time_ms: int
    consumed_times: int
    tag: str = ""
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)
    body_md5: str = ""  # "" -> computed from body


def encode_consume_result(messages: Sequence[ConsumedMessage]) -> bytes:
    """A consume's answer (status 200): `<Messages>` with one `<Message>` each. At least one:
    a consume that found nothing answers the MessageNotExist error (404) instead, as the service
    does (the Node SDK cannot read an empty `<Messages/>`). No element carries attributes (the
    Node SDK's reader fails on them) and empty MessageTag / Properties are left out."""
    if not messages:
        raise ValueError("a consume that found nothing answers MessageNotExist, not an empty list")
    parts: list[str] = []
    for m in messages:
        if not m.body:
            # The Python SDK needs MessageBody's text (an empty element reads as "damaged").
            raise NotXmlText("MessageBody")
        parts.append("<Message>")
        parts.append(_element("MessageId", m.message_id))
        parts.append(_element("ReceiptHandle", m.receipt_handle))
        parts.append(_element("MessageBodyMD5", m.body_md5 or message_body_md5(m.body)))
        parts.append(_element("MessageBody", m.body))
        parts.append(f"<PublishTime>{int(m.publish_time_ms)}</PublishTime>")
        parts.append(f"<FirstConsumeTime>{int(m.first_consume_time_ms)}</FirstConsumeTime>")
        parts.append(f"<NextConsumeTime>{int(m.next_consume_time_ms)}</NextConsumeTime>")
        parts.append(f"<ConsumedTimes>{int(m.consumed_times)}</ConsumedTimes>")
        if m.tag:
            parts.append(_element("MessageTag", m.tag))
        properties = encode_properties(m.properties)
        if properties:
            parts.append(_element("Properties", properties))
        parts.append("</Message>")
    return _document("Messages", "".join(parts))


class AckFailure(msgspec.Struct, frozen=True):
    """A receipt handle an ack (or commit / rollback) could not apply."""

    receipt_handle: str
    kind: ErrorKind  # ReceiptHandleError (malformed, another group's) or MessageNotExist (expired)
    message: str = ""


def encode_ack_errors(failures: Sequence[AckFailure]) -> bytes:
    """A partly (or wholly) failed ack's answer, status `errors.ACK_PARTIAL_FAILURE_STATUS`:
    `<Errors>` with an `<Error><ErrorCode/><ErrorMessage/><ReceiptHandle/></Error>` per failed
    handle, all three not empty (the Python SDK requires exactly these three, each with text).
    A fully successful ack answers 204 with no body."""
    if not failures:
        raise ValueError("an ack with no failure answers 204 with no body")
    parts: list[str] = []
    for f in failures:
        if not f.receipt_handle:
            raise ValueError("a failed ack entry needs its receipt handle")
        parts.append(
            "<Error>"
            + _element("ErrorCode", f.kind.code)
            + _element("ErrorMessage", f.message or f.kind.message)
            + _element("ReceiptHandle", f.receipt_handle)
            + "</Error>"
        )
    return _document("Errors", "".join(parts))


def encode_error(kind: ErrorKind, message: str, request_id: str, host_id: str) -> bytes:
    """The Error document, with `kind.http_status`. All four elements are written (the Python
    SDK requires them present)."""
    return _document(
        "Error",
        _element("Code", kind.code)
        + _element("Message", _NOT_XML_CHAR.sub("?", message or kind.message))
        + _element("RequestId", request_id)
        + _element("HostId", host_id),
    )


def encode_aliyun_error(error: AliyunError, request_id: str, host_id: str) -> bytes:
    """`encode_error` for a raised AliyunError."""
    return encode_error(error.kind, error.message, request_id, host_id)
