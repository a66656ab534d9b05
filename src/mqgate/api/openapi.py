"""OpenAPI 3.1 built from the routes' own request and answer shapes (msgspec's JSON Schema),
with the limits and defaults that are settings written in: the document cannot drift from
what the gateway decodes and checks."""

from __future__ import annotations

import re
from typing import Any, Final

import msgspec

from mqgate import __version__
from mqgate.api.answers import ErrorOut
from mqgate.api.http import Route
from mqgate.api.limits import wire_name
from mqgate.api.shapes import SETTINGS_DEFAULTS, SETTINGS_LIMITS
from mqgate.settings import Settings

_REF: Final = "#/components/schemas/{name}"
_ROLE_STATUSES: Final = {
    "none": (),
    "admin": (401, 403),
    "producer": (401, 403, 404),
    "consumer": (401, 403, 404),
    "token": (401, 403, 404),
    "reader": (401, 403, 404),
}
_STATUS_TEXT: Final = {
    400: "a parameter is missing, unknown or invalid (result.field names it)",
    401: "no bearer token",
    403: "the token does not give this right",
    404: "a named topic, producer or consumer does not exist",
    409: "a conflict (result.code says which): the lock moved on, or the name exists",
    413: "a message, batch or body is over its size limit",
    415: "the body is not JSON (or form, where accepted)",
    429: "rate limited: try again after Retry-After seconds",
    503: "a server the gateway depends on is down: try again after Retry-After seconds",
}
_LIMIT_KEYS: Final = {"max": "maximum", "max_items": "maxItems", "max_bytes": "x-maxBytes"}


def _envelope(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "required": ["status", "message", "result"],
        "properties": {"status": {"type": "integer"}, "message": {"type": "string"}, "result": result},
    }


def _apply_settings(components: dict[str, Any], settings: Settings) -> None:
    for (shape, attr), (setting, kind) in SETTINGS_LIMITS.items():
        prop = components[shape.__name__]["properties"][wire_name(shape, attr)]
        prop[_LIMIT_KEYS[kind]] = getattr(settings, setting)
        prop["description"] = (prop.get("description", "") + f" (limit: setting {setting})").strip()
    for (shape, attr), setting in SETTINGS_DEFAULTS.items():
        prop = components[shape.__name__]["properties"][wire_name(shape, attr)]
        prop["default"] = getattr(settings, setting)
        prop["description"] = (prop.get("description", "") + f" (default: setting {setting})").strip()


def _parameters(route: Route, schema: dict[str, Any]) -> list[dict[str, Any]]:
    path_names = {seg[1:-1] for seg in route.path.split("/") if seg.startswith("{")}
    required = set(schema.get("required", ()))
    out = []
    for name, prop in schema["properties"].items():
        where = "path" if name in path_names else "query"
        if where == "query" and route.body != "none":
            continue
        item = {"name": name, "in": where, "required": where == "path" or name in required, "schema": prop}
        if "description" in prop:
            item["description"] = prop["description"]
        out.append(item)
    return out


def _body_schema(route: Route, schema: dict[str, Any]) -> dict[str, Any]:
    path_names = {seg[1:-1] for seg in route.path.split("/") if seg.startswith("{")}
    props = {k: v for k, v in schema["properties"].items() if k not in path_names}
    required = [k for k in schema.get("required", ()) if k not in path_names]
    return {"type": "object", "properties": props, "required": required, "additionalProperties": False}


def build_openapi(routes: list[Route], settings: Settings) -> dict[str, Any]:
    shapes: list[type[msgspec.Struct]] = [ErrorOut]
    for r in routes:
        shapes += [t for t in (r.shape, r.answer) if t is not None]
    (_, components) = msgspec.json.schema_components(
        sorted(set(shapes), key=lambda t: t.__name__), ref_template=_REF
    )
    _apply_settings(components, settings)
    error = {"content": {"application/json": {"schema": _envelope({"$ref": _REF.format(name="ErrorOut")})}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.method.lower() + "_" + re.sub(r"[^A-Za-z0-9]+", "_", r.path).strip("_"),
            "x-role": r.role,
        }
        if r.role != "none":
            op["security"] = [{"bearer": []}]
        if r.shape is not None:
            schema = components[r.shape.__name__]
            if params := _parameters(r, schema):
                op["parameters"] = params
            if r.body != "none":
                body = _body_schema(r, schema)
                content = {"application/json": {"schema": body}}
                if r.body == "any":
                    content["application/x-www-form-urlencoded"] = {"schema": body}
                op["requestBody"] = {"required": True, "content": content}
        if r.answer is not None:
            ok: dict[str, Any] = {"schema": _envelope({"$ref": _REF.format(name=r.answer.__name__)})}
            op["responses"] = {"200": {"description": "ok", "content": {"application/json": ok}}}
        else:
            op["responses"] = {"200": {"description": "ok", "content": {"text/plain": {}}}}
        statuses = sorted({*([400] if r.shape is not None else []), *_ROLE_STATUSES[r.role], *r.errors, 503})
        for status in statuses:
            op["responses"][str(status)] = {"description": _STATUS_TEXT[status], **error}
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "mqgate", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
