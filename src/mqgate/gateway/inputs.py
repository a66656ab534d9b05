"""Turning request fields into validated values; every refusal names its field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from mqgate.core.scheduling import MAX_PRIORITY
from mqgate.errors import BadRequest, PayloadTooLarge
from mqgate.gateway.http import parse_body
from mqgate.model import DestinationSpec, NewMessage
from mqgate.names import validate_name, validate_topic_name
from mqgate.settings import Settings

MAX_LIST_ITEMS: Final = 32
MAX_ITEM_CHARS: Final = 256
MAX_PROPERTIES: Final = 64
MAX_PROPERTY_NAME_CHARS: Final = 256
MAX_PROPERTY_VALUE_CHARS: Final = 4096
MAX_DESTINATIONS: Final = 16
DAY_MS: Final = 24 * 3600 * 1000
MAX_DELAY_MS: Final = 365 * DAY_MS  # how far ahead a message may be scheduled
MAX_TTL_MS: Final = 10 * 365 * DAY_MS
MAX_EPOCH_MS: Final = 2**47 - 1
MAX_OFFSET: Final = 2**62
DESTINATION_FIELDS: Final = frozenset({"topic", "consumer", "deliverAt", "delayMs", "ttlMs", "priority"})


def require_str(params: Mapping[str, Any], name: str) -> str:
    value = params.get(name)
    if value is None or value == "":
        raise BadRequest(f"{name} is required", field=name)
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string", field=name)
    return value


def require_present(params: Mapping[str, Any], name: str) -> None:
    if params.get(name) in (None, ""):
        raise BadRequest(f"{name} is required", field=name)


def optional_str(params: Mapping[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{name} must be a string", field=name)
    return value


def int_param(params: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise BadRequest(f"{name} must be an integer", field=name)
    try:
        number = int(value)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{name} must be an integer", field=name) from exc
    if not low <= number <= high:
        raise BadRequest(f"{name} must be between {low} and {high}", field=name)
    return number


def offsets_param(params: Mapping[str, Any], name: str, max_entries: int) -> dict[int, int]:
    """A JSON object of queue number (as a string) to offset, e.g. {"0": 120, "3": 77}."""
    value = params.get(name)
    if not isinstance(value, dict) or not value:
        raise BadRequest(f'{name} must be a non-empty object such as {{"0": 120}}', field=name)
    if len(value) > max_entries:
        raise BadRequest(f"{name} names at most {max_entries} queues", field=name)
    out: dict[int, int] = {}
    for key, offset in value.items():
        where = f"{name}.{key}"
        if not (isinstance(key, str) and key.isdigit() and len(key) <= 6):
            raise BadRequest("queue numbers must be decimal strings", field=where)
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= MAX_OFFSET:
            raise BadRequest(f"offset must be an integer between 0 and {MAX_OFFSET}", field=where)
        out[int(key)] = offset
    return out


def float_param(params: Mapping[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = params.get(name)
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        raise BadRequest(f"{name} must be a number", field=name)
    try:
        number = float(value)
    except (TypeError, ValueError) as exc:
        raise BadRequest(f"{name} must be a number", field=name) from exc
    if not low <= number <= high:  # also refuses NaN
        raise BadRequest(f"{name} must be between {low:g} and {high:g}", field=name)
    return number


def _string_list(value: Any, field: str) -> list[str]:
    if value is None or value == "":
        return []
    if isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        items = value
    else:
        raise BadRequest(f"{field} must be a list of strings", field=field)
    if len(items) > MAX_LIST_ITEMS:
        raise BadRequest(f"{field} has more than {MAX_LIST_ITEMS} items", field=field)
    if any(len(v) > MAX_ITEM_CHARS for v in items):
        raise BadRequest(f"{field} items are limited to {MAX_ITEM_CHARS} characters", field=field)
    return items


def _properties(value: Any, field: str) -> dict[str, str]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = msgspec.json.decode(value)
        except msgspec.DecodeError as exc:
            raise BadRequest(f"{field} must be a JSON object", field=field) from exc
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadRequest(f"{field} must be an object of string values", field=field)
    if len(value) > MAX_PROPERTIES:
        raise BadRequest(f"{field} has more than {MAX_PROPERTIES} entries", field=field)
    for k, v in value.items():
        if not k or len(k) > MAX_PROPERTY_NAME_CHARS or len(v) > MAX_PROPERTY_VALUE_CHARS:
            raise BadRequest(
                f"{field} names are 1–{MAX_PROPERTY_NAME_CHARS} characters and values up to "
                f"{MAX_PROPERTY_VALUE_CHARS}",
                field=field,
            )
    return value


def _utf8_size(text: str, field: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate from a JSON escape
        raise BadRequest(f"{field} is not valid Unicode text", field=field) from exc


def new_message(params: Mapping[str, Any], settings: Settings, prefix: str = "") -> NewMessage:
    """Validate one message; `prefix` locates it inside a batch (e.g. `messages[3].`)."""
    text = params.get("message")
    if not isinstance(text, str):
        raise BadRequest(f"{prefix}message is required and must be a string", field=f"{prefix}message")
    size = len(text) if text.isascii() else _utf8_size(text, f"{prefix}message")
    if size > settings.max_message_bytes:
        raise PayloadTooLarge(
            f"{prefix}message is {size} bytes, over the {settings.max_message_bytes}-byte limit",
            field=f"{prefix}message",
        )
    order_key = params.get("orderKey")
    if order_key is not None and not isinstance(order_key, str):
        raise BadRequest(f"{prefix}orderKey must be a string", field=f"{prefix}orderKey")
    return NewMessage(
        body=text,
        keys=_string_list(params.get("keys"), f"{prefix}keys"),
        tags=_string_list(params.get("tags"), f"{prefix}tags"),
        properties=_properties(params.get("properties"), f"{prefix}properties"),
        order_key=order_key or None,
        **_qos(params, prefix),
        destinations=_destinations(params.get("destinations"), prefix),
    )


def _int_text(value: str, field: str, low: int, high: int) -> int:
    try:
        number = int(value)
    except ValueError as exc:
        raise BadRequest(f"{field} must be an integer", field=field) from exc
    if not low <= number <= high:
        raise BadRequest(f"{field} must be between {low} and {high}", field=field)
    return number


def _qos(params: Mapping[str, Any], prefix: str) -> dict[str, int | None]:
    """deliverAt / delayMs / ttlMs / priority of a message or a destination, range-checked;
    each refusal names the field with its place (e.g. `messages[2].destinations[0].ttlMs`)."""
    out: dict[str, int | None] = {}
    for wire, name, low, high in (
        ("deliverAt", "deliver_at", 0, MAX_EPOCH_MS),
        ("delayMs", "delay_ms", 0, MAX_DELAY_MS),
        ("ttlMs", "ttl_ms", 1, MAX_TTL_MS),
        ("priority", "priority", 0, MAX_PRIORITY),
    ):
        field = f"{prefix}{wire}"
        value = params.get(wire)
        if isinstance(value, bool) or (value is not None and not isinstance(value, int | str)):
            raise BadRequest(f"{field} must be an integer", field=field)
        out[name] = None if value in (None, "") else _int_text(str(value), field, low, high)
    if out["deliver_at"] is not None and out["delay_ms"] is not None:
        raise BadRequest(f"give {prefix}deliverAt or {prefix}delayMs, not both", field=f"{prefix}delayMs")
    return out


def _destinations(value: Any, prefix: str) -> list[DestinationSpec] | None:
    field = f"{prefix}destinations"
    if value is None:
        return None
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_DESTINATIONS:
        raise BadRequest(f"{field} must be a list of 1 to {MAX_DESTINATIONS} objects", field=field)
    out = []
    for i, item in enumerate(value):
        where = f"{field}[{i}]."
        if not isinstance(item, dict):
            raise BadRequest(f"{field}[{i}] must be an object", field=f"{field}[{i}]")
        unknown = set(item) - DESTINATION_FIELDS
        if unknown:
            raise BadRequest(f"{where}{sorted(unknown)[0]} is not a destination field", field=f"{field}[{i}]")
        topic, consumer = item.get("topic"), item.get("consumer")
        if (topic is None) == (consumer is None):
            raise BadRequest(f"{field}[{i}] needs exactly one of topic or consumer", field=f"{field}[{i}]")
        if topic is not None:
            validate_topic_name(topic, f"{where}topic")
        if consumer is not None:
            validate_name(consumer, f"{where}consumer")
        out.append(DestinationSpec(topic=topic, consumer=consumer, **_qos(item, where)))
    return out


class _Batch(msgspec.Struct):
    producer: str
    messages: list[NewMessage]


_decode_batch = msgspec.json.Decoder(_Batch).decode


def _within_limits(m: NewMessage, settings: Settings) -> int:
    """The message's UTF-8 size if every per-message limit holds, else -1 (also for a message
    with QoS fields: those take the validating path)."""
    if not m.plain:
        return -1
    size = len(m.body) if m.body.isascii() else -1
    if size < 0 or size > settings.max_message_bytes:
        return -1
    if len(m.keys) > MAX_LIST_ITEMS or len(m.tags) > MAX_LIST_ITEMS or len(m.properties) > MAX_PROPERTIES:
        return -1
    for items in (m.keys, m.tags):
        for v in items:
            if len(v) > MAX_ITEM_CHARS:
                return -1
    for k, v in m.properties.items():
        if not k or len(k) > MAX_PROPERTY_NAME_CHARS or len(v) > MAX_PROPERTY_VALUE_CHARS:
            return -1
    return size


def decode_batch(
    body: bytes, content_type: bytes, query: Mapping[str, Any], settings: Settings
) -> tuple[str, list[NewMessage]]:
    """The batch produce body: a typed decode for the common case of a valid batch; anything
    it does not accept goes through `new_messages`, which names the field at fault."""
    try:
        batch = _decode_batch(body)
    except msgspec.DecodeError:
        batch = None
    if batch is not None and 0 < len(batch.messages) <= settings.max_batch_messages:
        total = 0
        for m in batch.messages:
            size = _within_limits(m, settings)
            if size < 0 or m.order_key == "":
                break
            total += size
        else:
            if total <= settings.max_batch_bytes:
                return batch.producer, batch.messages
    params = {**query, **(parse_body(body, content_type, "json") if body else {})}
    return require_str(params, "producer"), new_messages(params, settings)


def new_messages(params: Mapping[str, Any], settings: Settings) -> list[NewMessage]:
    items = params.get("messages")
    if not isinstance(items, list) or not items:
        raise BadRequest("messages must be a non-empty list", field="messages")
    if len(items) > settings.max_batch_messages:
        raise BadRequest(
            f"messages has {len(items)} items, over the limit of {settings.max_batch_messages}",
            field="messages",
        )
    out = []
    total = 0
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise BadRequest(f"messages[{i}] must be an object", field=f"messages[{i}]")
        msg = new_message(item, settings, prefix=f"messages[{i}].")
        total += len(msg.body) if msg.body.isascii() else _utf8_size(msg.body, "messages")
        if total > settings.max_batch_bytes:
            raise PayloadTooLarge(
                f"messages total over the {settings.max_batch_bytes}-byte batch limit",
                field="messages",
            )
        out.append(msg)
    return out


def destination_list(value: Any) -> list[str]:
    """A producer's further destinations: topic names, `inbox:<consumer>` or `inbox:*`."""
    items = _string_list(value, "destinations")
    for item in items:
        if item.startswith("inbox:"):
            if item != "inbox:*":
                validate_name(item[len("inbox:") :], "destinations")
        else:
            validate_name(item, "destinations")
    return items
