"""Request fields (query, form or JSON) into a request shape; every refusal names its field.

A JSON body with no other parameters decodes straight into the shape. Query strings and form
bodies hold text, so numbers are read from text, lists from comma-separated text and objects
from JSON text before the shape is checked (as the same fields in JSON would be).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl

import msgspec
from msgspec import inspect as mi

from mqgate.api.shapes import Input
from mqgate.errors import BadRequest, UnsupportedMediaType

JSON_TYPE: Final = b"application/json"
FORM_TYPE: Final = b"application/x-www-form-urlencoded"
# Text fields where an empty value is a value, not an absent field.
_EMPTY_IS_A_VALUE: Final = frozenset({"message"})
_AT = re.compile(r"^(?P<what>.*?)(?: - at `(?P<path>[^`]*)`)?(?: in `(?P<where>[^`]*)`)?$", re.S)
_FIELD = re.compile(r"field `(?P<name>[^`]+)`")
_NAMED = re.compile(r"^(?P<name>[A-Za-z][A-Za-z0-9]*): (?P<why>.*)$", re.S)
_REGEX = re.compile(r"matching regex '.*'", re.S)
_json_decode = msgspec.json.Decoder().decode
_KINDS: dict[type[Any], dict[str, Any]] = {}

S = TypeVar("S", bound=Input)


def content_kind(content_type: bytes) -> bytes:
    return content_type.split(b";", 1)[0].strip().lower()


def body_fields(body: bytes, content_type: bytes, json_only: bool) -> dict[str, Any]:
    """The fields of a JSON object or (unless `json_only`) a form body."""
    kind = content_kind(content_type)
    if kind == JSON_TYPE or (not kind and body[:1] in (b"{", b"[")):
        try:
            data = _json_decode(body)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"body is not valid JSON (UTF-8): {exc}", field="body") from exc
        except RecursionError as exc:
            raise BadRequest("body is nested too deeply", field="body") from exc
        if not isinstance(data, dict):
            raise BadRequest("body must be a JSON object", field="body")
        return data
    if json_only:
        raise UnsupportedMediaType(
            "this call takes a JSON body (Content-Type: application/json)", field="body"
        )
    if kind in (FORM_TYPE, b""):
        try:
            return dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, errors="strict"))
        except UnicodeDecodeError as exc:  # raw bytes or %-escapes: one rule, UTF-8 or refused
            raise BadRequest("form body is not UTF-8", field="body") from exc
    raise UnsupportedMediaType(
        "body must be application/json or application/x-www-form-urlencoded", field="body"
    )


def query_fields(query_string: bytes) -> dict[str, Any]:
    if not query_string:
        return {}
    try:
        text = query_string.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadRequest("query string is not UTF-8", field="query") from exc
    if "%" in text or "+" in text:
        try:
            return dict(parse_qsl(text, errors="strict"))
        except UnicodeDecodeError as exc:  # a %-escape of bytes that are not UTF-8
            raise BadRequest("query string is not UTF-8", field="query") from exc
    # Nothing to unquote (a pull's query, every time): parse_qsl's result without its Python
    # calls a field. As parse_qsl: the last of a repeated name, no field without a value.
    fields = {}
    for part in text.split("&"):
        name, _, value = part.partition("=")
        if value:
            fields[name] = value
    return fields


def decode_json(body: bytes, shape: type[S]) -> S | None:
    """The typed decode of a JSON body: None when it does not fit (the caller then takes the
    field-by-field path, which accepts text forms and names the field at fault)."""
    try:
        return msgspec.json.decode(body, type=shape, strict=False)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return None


def convert(fields: Mapping[str, Any], shape: type[S]) -> S:
    """Fields from any source into `shape`, or a BadRequest naming the field."""
    try:
        return msgspec.convert(_prepared(fields, shape, ""), shape, strict=False)
    except msgspec.ValidationError as exc:
        raise refusal(exc) from exc


def _prepared(fields: Mapping[str, Any], shape: type[Any], prefix: str) -> dict[str, Any]:
    """Text turned into what the shape's fields hold, also in a list of nested objects."""
    kinds = _field_kinds(shape)
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if value == "" and name not in _EMPTY_IS_A_VALUE:
            continue  # an empty form or query field is an absent one
        kind = kinds.get(name)
        if isinstance(value, str) and isinstance(kind, str):
            value = _from_text(value, kind, prefix + name)
        elif isinstance(kind, type) and isinstance(value, list):
            value = [
                _prepared(v, kind, f"{prefix}{name}[{i}].") if isinstance(v, dict) else v
                for i, v in enumerate(value)
            ]
        out[name] = value
    return out


def refusal(exc: msgspec.ValidationError) -> BadRequest:
    """A BadRequest naming the field a msgspec validation error is about, e.g. `max` or
    `messages[3].keys` (an item of a list of text is named by its list)."""
    m = _AT.match(str(exc))
    assert m is not None  # the pattern matches any text
    what, path = m["what"], m["path"] or m["where"] or "$"
    where = _dotted(path)
    named_field = _FIELD.search(what)
    named = _NAMED.match(what)
    if named is not None:  # a check of the shape's own, naming the field it is about
        field = f"{where}.{named['name']}" if where else named["name"]
        return BadRequest(f"{field}: {named['why']}", field=field)
    if named_field is not None and "missing required" in what:
        field = f"{where}.{named_field['name']}" if where else named_field["name"]
        return BadRequest(f"{field} is required", field=field)
    if named_field is not None:  # an unknown field: named in the message, its object as the field
        field = where or named_field["name"]
        full = f"{where}.{named_field['name']}" if where else named_field["name"]
        return BadRequest(f"{full} is not a parameter of this call", field=field)
    # A dict key is named by its dict; an item of a list or map by its list or map.
    field = (
        where if m["where"] or not what.startswith("Expected") else re.sub(r"\[(\d+|\.\.\.)\]$", "", where)
    )
    what = _REGEX.sub("made of letters, digits, '.', '_' and '-' (1-128 characters)", what)
    return BadRequest(f"{field or 'body'}: {what}", field=field or "body")


def _dotted(path: str) -> str:
    return path.removeprefix("$").removeprefix(".")


def _field_kinds(shape: type[Any]) -> dict[str, Any]:
    """Wire name -> "list" | "dict" for the fields that text must be turned into, or the
    shape of the objects a list holds."""
    known = _KINDS.get(shape)
    if known is not None:
        return known
    info = mi.type_info(shape)
    assert isinstance(info, mi.StructType)
    out = {}
    for f in info.fields:
        t = f.type
        if isinstance(t, mi.UnionType):
            t = next((x for x in t.types if not isinstance(x, mi.NoneType)), t)
        if isinstance(t, mi.Metadata):
            t = t.type
        if isinstance(t, mi.ListType):
            item = t.item_type
            out[f.encode_name] = item.cls if isinstance(item, mi.StructType) else "list"
        elif isinstance(t, mi.DictType):
            out[f.encode_name] = "dict"
    _KINDS[shape] = out
    return out


def _from_text(value: str, kind: str, name: str) -> Any:
    if kind == "list":
        return [v.strip() for v in value.split(",") if v.strip()]
    try:
        return _json_decode(value)
    except msgspec.DecodeError as exc:
        raise BadRequest(f"{name} must be a JSON object", field=name) from exc
