"""The limits that are settings (see `shapes.SETTINGS_LIMITS`), applied to decoded requests."""

from __future__ import annotations

from typing import Any

import msgspec

from mqgate.api.shapes import SETTINGS_DEFAULTS, SETTINGS_LIMITS, Input, MessageIn, ProduceBatchIn
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

    def default(self, shape: type[Input], attr: str) -> Any:
        """The value a left-out field takes (see `shapes.SETTINGS_DEFAULTS`)."""
        return getattr(self.settings, SETTINGS_DEFAULTS[(shape, attr)])

    def check(self, value: Input, prefix: str = "") -> None:
        for attr, name, kind, limit in self._by_shape.get(type(value), ()):
            v = getattr(value, attr)
            field = prefix + name
            if kind == "max" and v > limit:
                raise BadRequest(f"{field} must be at most {limit:g}", field=field)
            if kind == "max_items" and len(v) > limit:
                raise BadRequest(f"{field} has {len(v)} items, over the limit of {limit}", field=field)
            if kind == "max_bytes":
                size = utf8_size(v, field)
                if size > limit:
                    raise PayloadTooLarge(
                        f"{field} is {size} bytes, over the {limit}-byte limit", field=field
                    )
        if isinstance(value, ProduceBatchIn):
            self._check_batch(value.messages)

    def _check_batch(self, messages: list[MessageIn]) -> None:
        total = 0
        limit = self.settings.max_batch_bytes
        for i, m in enumerate(messages):
            self.check(m, f"messages[{i}].")
            total += utf8_size(m.body, "messages")
            if total > limit:
                raise PayloadTooLarge(f"messages total over the {limit}-byte batch limit", field="messages")
