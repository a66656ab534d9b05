"""OpenAPI 3.1 built from the route table itself, so the document and the API cannot drift."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from mqgate import __version__

if TYPE_CHECKING:
    from mqgate.gateway.http import Route

_SCHEMAS: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "number": {"type": "number"},
    "array": {"type": "array", "items": {"type": "string"}},
    "object": {"type": "object", "additionalProperties": {"type": "string"}},
}

_ENVELOPE = {
    "type": "object",
    "required": ["status", "message", "result"],
    "properties": {
        "status": {"type": "integer"},
        "message": {"type": "string"},
        "result": {},
    },
}


def build_openapi(routes: list[Route]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        path_names = {seg[1:-1] for seg in r.path.split("/") if seg.startswith("{")}
        op: dict[str, Any] = {
            "summary": r.summary,
            "operationId": r.method.lower() + "_" + re.sub(r"[^A-Za-z0-9]+", "_", r.path).strip("_"),
            "responses": {
                "200": {
                    "description": "ok",
                    "content": {"application/json": {"schema": _ENVELOPE}},
                },
                "4XX": {
                    "description": "error naming the field",
                    "content": {"application/json": {"schema": _ENVELOPE}},
                },
            },
        }
        if r.auth != "none":
            op["security"] = [{"bearer": []}]
        parameters = [
            {"name": n, "in": "path", "required": True, "schema": _SCHEMAS[t], "description": d}
            for n, t, _, d in r.params
            if n in path_names
        ]
        fields = [p for p in r.params if p[0] not in path_names]
        if r.body == "none":
            parameters += [
                {"name": n, "in": "query", "required": req, "schema": _SCHEMAS[t], "description": d}
                for n, t, req, d in fields
            ]
        elif fields:
            schema = {
                "type": "object",
                "required": [n for n, _, req, _ in fields if req],
                "properties": {n: {**_SCHEMAS[t], "description": d} for n, t, _, d in fields},
            }
            content = {"application/json": {"schema": schema}}
            if r.body == "any":
                content["application/x-www-form-urlencoded"] = {"schema": schema}
            op["requestBody"] = {"required": True, "content": content}
        if parameters:
            op["parameters"] = parameters
        paths.setdefault(r.path, {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "mqgate", "version": __version__},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }
