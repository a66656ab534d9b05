"""Parsing of stored messages into events (SPEC E2): four formats, one key per event.

Every event gets an id that survives re-routing: the message id, or `<messageId>#<i>` for the
i-th item of a batch message. Hot and retry messages carry that id (and the event already
parsed) in the internal format, so the sink's ledger recognises the event whichever path it
arrives by.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from mqgate.pipeline.config import EventType

PROP_EVENT_ID: Final = "mq.event-id"
PROP_ATTEMPTS: Final = "mq.attempts"
PROP_TYPE: Final = "mq.type"
PROP_ORIGIN: Final = "mq.origin-topic"
PROP_ERROR: Final = "mq.error"
MAX_ERROR_CHARS: Final = 1000


class SourceMessage(msgspec.Struct):
    """One stored message as the mqgate data source delivers it."""

    message_id: str
    body: str
    topic: str
    queue: int
    offset: int
    timestamp_ms: int = 0
    keys: Sequence[str] = ()
    properties: Mapping[str, str] = msgspec.field(default_factory=dict)


class Event(msgspec.Struct):
    event_id: str
    type: str
    key: str
    # Column -> value as text (None when the path is missing); PostgreSQL casts it.
    fields: dict[str, str | None]
    # The event as received: a JSON object's text, the string, or the base64 of the bytes.
    payload: str
    event_ms: int
    source: str
    # The attempt this processing is: 1 for the first, raised by each trip through retry.
    attempts: int = 1
    # The topic the event was first read from, kept across hot and retry trips.
    origin: str = ""


class ParseFailure(msgspec.Struct):
    event_id: str
    type: str
    payload: str
    error: str
    source: str


class ParseError(ValueError):
    pass


_MISSING: Final = object()


def lookup(doc: Any, path: str) -> Any:
    """The value at a dotted path (`video.id`), or _MISSING; list items by index (`tags.0`)."""
    value = doc
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def as_text(value: Any) -> str | None:
    """How a JSON value is handed to PostgreSQL: scalars as their text, containers as JSON."""
    if value is None or value is _MISSING:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def key_text(value: Any, where: str) -> str:
    # A key selects a worker and a row: only strings and integers are stable enough.
    if isinstance(value, bool) or not isinstance(value, str | int):
        if value is _MISSING:
            raise ParseError(f"no key at {where}")
        raise ParseError(f"key at {where} is {type(value).__name__}, not a string or integer")
    text = str(value)
    if not text:
        raise ParseError(f"key at {where} is empty")
    return text


def _message_key(message: SourceMessage) -> str:
    if not message.keys:
        raise ParseError("the message has no keys (keys[0] is the event key)")
    return key_text(message.keys[0], "keys[0]")


def _from_object(et: EventType, doc: Any, event_id: str, message: SourceMessage, text: str) -> Event:
    if not isinstance(doc, dict):
        raise ParseError(f"expected a JSON object, got {type(doc).__name__}")
    key = key_text(lookup(doc, et.key), et.key) if et.key else _message_key(message)
    fields = {column: as_text(lookup(doc, path)) for column, path in et.fields.items()}
    return Event(event_id, et.type, key, fields, text, message.timestamp_ms, message.topic, 1, message.topic)


def parse_message(et: EventType, message: SourceMessage) -> tuple[list[Event], list[ParseFailure]]:
    """The events of one message. A malformed message (or batch item) becomes a failure of its
    own instead of failing the batch: it goes to the dead letters, the others go on."""
    mid = message.message_id

    def failure(event_id: str, payload: str, exc: Exception) -> ParseFailure:
        return ParseFailure(event_id, et.type, payload, f"parse: {exc}"[:MAX_ERROR_CHARS], message.topic)

    try:
        if et.format == "string":
            key = _message_key(message)
            return [Event(mid, et.type, key, {}, message.body, message.timestamp_ms, message.topic, 1,
                          message.topic)], []  # fmt: skip
        if et.format == "bytes":
            try:
                base64.b64decode(message.body, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ParseError(f"body is not base64: {exc}") from exc
            key = _message_key(message)
            return [Event(mid, et.type, key, {}, message.body, message.timestamp_ms, message.topic, 1,
                          message.topic)], []  # fmt: skip
        try:
            doc = json.loads(message.body)
        except ValueError as exc:
            raise ParseError(f"body is not JSON: {exc}") from exc
        if et.format == "json":
            return [_from_object(et, doc, mid, message, message.body)], []
    except ParseError as exc:
        return [], [failure(mid, message.body, exc)]

    if not isinstance(doc, list):
        return [], [
            failure(mid, message.body, ParseError(f"expected a JSON array, got {type(doc).__name__}"))
        ]
    events: list[Event] = []
    failures: list[ParseFailure] = []
    for i, item in enumerate(doc):
        event_id = f"{mid}#{i}"
        text = json.dumps(item, separators=(",", ":"), ensure_ascii=False)
        try:
            events.append(_from_object(et, item, event_id, message, text))
        except ParseError as exc:
            failures.append(failure(event_id, text, exc))
    return events, failures


def encode_internal(event: Event, attempts: int | None = None, error: str | None = None) -> dict[str, Any]:
    """A produce item carrying an already parsed event to the hot or the retry topic."""
    body = {
        "type": event.type,
        "key": event.key,
        "fields": event.fields,
        "payload": event.payload,
        "eventMs": event.event_ms,
    }
    properties = {
        PROP_EVENT_ID: event.event_id,
        PROP_TYPE: event.type,
        PROP_ATTEMPTS: str(event.attempts if attempts is None else attempts),
        PROP_ORIGIN: event.origin or event.source,
    }
    if error is not None:
        properties[PROP_ERROR] = error[:MAX_ERROR_CHARS]
    return {
        "message": json.dumps(body, separators=(",", ":"), ensure_ascii=False),
        "keys": [event.key[:256]],
        "properties": properties,
    }


def parse_internal(
    message: SourceMessage, types: Mapping[str, EventType], next_attempt: bool
) -> tuple[list[Event], list[ParseFailure]]:
    """An event from the hot topic (same attempt) or the retry topic (the next attempt)."""
    event_id = message.properties.get(PROP_EVENT_ID) or message.message_id
    try:
        doc = json.loads(message.body)
        type_name = doc["type"]
        if type_name not in types:
            raise ParseError(f"unknown event type {type_name!r}")
        raw_fields = doc.get("fields") or {}
        fields = {str(k): (None if v is None else str(v)) for k, v in raw_fields.items()}
        attempts = int(message.properties.get(PROP_ATTEMPTS, "1")) + (1 if next_attempt else 0)
        event = Event(
            event_id=event_id,
            type=type_name,
            key=key_text(doc["key"], "key"),
            fields=fields,
            payload=str(doc["payload"]),
            event_ms=int(doc.get("eventMs") or message.timestamp_ms),
            source=message.topic,
            attempts=attempts,
            origin=message.properties.get(PROP_ORIGIN, ""),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        type_name = message.properties.get(PROP_TYPE, "")
        return [], [ParseFailure(event_id, type_name, message.body, f"parse: {exc!r}"[:MAX_ERROR_CHARS],
                                 message.topic)]  # fmt: skip
    return [event], []
