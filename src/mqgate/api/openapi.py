"""OpenAPI 3.1 built from the routes' own request and answer shapes (msgspec's JSON Schema),
with the limits and defaults that are settings written in: the document cannot drift from
what the gateway decodes and checks."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from typing import Any, Final

import msgspec
from msgspec import inspect as mi

from mqgate import __version__
from mqgate.api.answers import ErrorOut
from mqgate.api.limits import wire_name
from mqgate.api.shapes import SETTINGS_DEFAULTS, SETTINGS_LIMITS
from mqgate.settings import Settings
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

_REF: Final = "#/components/schemas/{name}"
_ROLE_STATUSES: Final = {
    "none": (),
    "admin": (401, 403, 429),  # 429: more admin calls at once than max_concurrent_admin_requests
    "producer": (401, 403, 404),
    "consumer": (401, 403, 404),
    "token": (401, 403, 404),
    "reader": (401, 403, 404, 429),  # 429: over max_concurrent_read_requests
    "stream": (401, 403, 404),  # a consumer's token, or a stream ticket of it
}
# What any route may answer: a bad parameter or header (400), a method its path does not have
# (405), headers too slow or too large (408, 431: refused before a route is chosen), a fault of
# the gateway (500) or of a server it depends on (503).
_EVERY_ROUTE: Final = (400, 405, 408, 431, 500, 503)
# And a route that reads a body: too large (413), neither JSON nor form where accepted (415).
_BODY_ROUTE: Final = (413, 415)
_STATUS_TEXT: Final = {
    400: "a parameter or a header is missing, unknown or invalid (result.field names it)",
    401: "no bearer token, or a token that is no one's",
    403: "the token does not give this right",
    404: "a named topic, producer or consumer does not exist",
    405: "the path takes other methods, named in Allow",
    408: "the request line and headers did not arrive within header_timeout_s",
    409: "a conflict (result.code says which): the lock moved on, or the name exists",
    413: "a message, batch or body is over its size limit",
    415: "the body is not JSON (or form, where accepted)",
    429: "rate limited: try again after Retry-After seconds",
    431: "more header fields than max_header_count, or more bytes than max_header_bytes",
    500: "a fault of the gateway (code internal), or a stored record failed its checksum (corrupt_record)",
    503: "a server the gateway depends on is down: try again after Retry-After seconds",
    507: "the disk is full or below disk_free_floor_bytes: nothing was written; "
    "try again after Retry-After seconds",
}
_LIMIT_KEYS: Final = {"max": "maximum", "max_items": "maxItems", "max_bytes": "x-maxBytes"}
# The kinds of type msgspec describes once, as a named schema in components.
_NAMED_KINDS: Final = (mi.StructType, mi.DataclassType, mi.TypedDictType, mi.NamedTupleType, mi.EnumType)


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


def _check_names(shapes: Iterable[type]) -> None:
    """Refuse two different types of one name, among the shapes and every type within them:
    schemas are named, and referred to, by the type's name, so one of them would have no
    schema of its own (msgspec names both by module path then, and each reference dangles)."""
    named: dict[str, type] = {}
    pending = list(mi.multi_type_info(list(shapes)))
    seen: set[int] = set()
    while pending:
        t = pending.pop()
        if id(t) in seen:  # a recursive shape
            continue
        seen.add(id(t))
        if isinstance(t, _NAMED_KINDS):
            first = named.setdefault(t.cls.__name__, t.cls)
            if first is not t.cls:
                raise TypeError(
                    f"two shapes are named {first.__name__}: {first.__module__}.{first.__qualname__} "
                    f"and {t.cls.__module__}.{t.cls.__qualname__}; the OpenAPI document needs one each"
                )
        for f in msgspec.structs.fields(t):
            value = getattr(t, f.name)
            for item in value if isinstance(value, tuple) else (value,):
                inner = item.type if isinstance(item, mi.Field) else item
                if isinstance(inner, mi.Type):
                    pending.append(inner)


def build_openapi(routes: list[Route], settings: Settings) -> dict[str, Any]:
    shapes: list[type[msgspec.Struct]] = [ErrorOut]
    for r in routes:
        shapes += [t for t in (r.shape, r.answer) if t is not None]
    unique = sorted(set(shapes), key=lambda t: t.__name__)
    _check_names(unique)
    (_, components) = msgspec.json.schema_components(unique, ref_template=_REF)
    _apply_settings(components, settings)
    error = {"content": {"application/json": {"schema": _envelope({"$ref": _REF.format(name="ErrorOut")})}}}
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.method.lower() + "_" + re.sub(r"[^A-Za-z0-9]+", "_", r.path).strip("_"),
            "x-role": r.role,
        }
        if r.role == "stream":
            op["security"] = [{"bearer": []}, {"ticket": []}]
        elif r.role != "none":
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
        reads_body = _BODY_ROUTE if r.body != "none" else ()
        statuses = sorted({*_EVERY_ROUTE, *reads_body, *_ROLE_STATUSES[r.role], *r.errors})
        for status in statuses:
            op["responses"][str(status)] = {"description": _STATUS_TEXT[status], **error}
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "mqgate", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                # A consumer's stream ticket (POST /mq/stream/tickets), for browsers: also a bearer.
                "ticket": {"type": "apiKey", "in": "query", "name": "ticket"},
            },
        },
    }


def with_document(routes: list[Route], settings: Settings) -> list[Route]:
    """`routes` and `GET /openapi.json`, which answers the document of them all (itself
    included). Built at its first request, off the event loop, not at the start (a third of a
    second of it: issue 28); tests/api/test_api_shapes.py builds it from the gateway's own
    routes, so a clash of names fails the suite rather than that request."""
    document: bytes | None = None
    building = asyncio.Lock()

    async def serve(req: Request) -> Response:
        nonlocal document
        async with building:
            if document is None:
                document = await asyncio.to_thread(
                    lambda: msgspec.json.encode(build_openapi(every, settings))
                )
        return Response(body=document)

    every = [
        *routes,
        Route("GET", "/openapi.json", serve, "none", "This document (OpenAPI 3.1)", body="none"),
    ]
    return every
