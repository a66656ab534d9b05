"""The limits that are settings (see `shapes.SETTINGS_LIMITS`), applied to decoded requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mqgate.api.shapes import SETTINGS_DEFAULTS, SETTINGS_LIMITS, HalfIn, Input, MessageIn, ProduceBatchIn
from mqgate.errors import BadRequest, PayloadTooLarge
from mqgate.settings import Settings


def utf8_size(text: str, field: str) -> int:
    if text.isascii():
        return len(text)
    try:
        return len(text.encode())
    except UnicodeEncodeError as exc:  # a lone surrogate from a JSON escape
        raise BadRequest(f"{field} is not valid Unicode text", field=field) from exc


def wire_name(shape: type[Input], attr: str) -> str:
    return next(f.encode_name for f in msgspec.structs.fields(shape) if f.name == attr)


class SettingsLimits:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._by_shape: dict[type[Input], list[tuple[str, str, str, Any]]] = {}
        for (shape, attr), (setting, kind) in SETTINGS_LIMITS.items():
            limit = getattr(settings, setting)
            self._by_shape.setdefault(shape, []).append((attr, wire_name(shape, attr), kind, limit))
        # A batch's messages: the body's size is taken once (its limit and the batch's total).
        self._message_limits = [x for x in self._by_shape.get(MessageIn, ()) if x[0] != "body"]
        self._body_limit: int = next(x[3] for x in self._by_shape[MessageIn] if x[0] == "body")

    def default(self, shape: type[Input], attr: str) -> Any:
        """The value a left-out field takes (see `shapes.SETTINGS_DEFAULTS`)."""
        return getattr(self.settings, SETTINGS_DEFAULTS[(shape, attr)])

    def check(self, value: Input, prefix: str = "") -> None:
        self._check_fields(value, self._by_shape.get(type(value), ()), prefix)
        if isinstance(value, (ProduceBatchIn, HalfIn)):
            self._check_batch(value.messages)

    def _check_fields(self, value: Input, limits: Sequence[tuple[str, str, str, Any]], prefix: str) -> None:
        for attr, name, kind, limit in limits:
            v = getattr(value, attr)
            if kind == "max" and v > limit:
                raise BadRequest(f"{prefix}{name} must be at most {limit:g}", field=prefix + name)
            if kind == "max_items" and len(v) > limit:
                field = prefix + name
                raise BadRequest(f"{field} has {len(v)} items, over the limit of {limit}", field=field)
            if kind == "max_bytes":
                size = len(v) if v.isascii() else utf8_size(v, prefix + name)
                if size > limit:
                    field = prefix + name
                    raise PayloadTooLarge(
                        f"{field} is {size} bytes, over the {limit}-byte limit", field=field
                    )

    def _check_batch(self, messages: list[MessageIn]) -> None:
        """Each message's limits and the batch's total, each body's size taken once (a batch of
        100 is checked on the request path; a field's name is made only for its error)."""
        total = 0
        limit = self.settings.max_batch_bytes
        body_limit = self._body_limit
        others = self._message_limits
        for i, m in enumerate(messages):
            if others:
                self._check_fields(m, others, f"messages[{i}].")
            body = m.body
            size = len(body) if body.isascii() else utf8_size(body, f"messages[{i}].body")
            if size > body_limit:
                field = f"messages[{i}].body"
                raise PayloadTooLarge(
                    f"{field} is {size} bytes, over the {body_limit}-byte limit", field=field
                )
            total += size
            if total > limit:
                raise PayloadTooLarge(f"messages total over the {limit}-byte batch limit", field="messages")
