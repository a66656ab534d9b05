"""/openapi.json is whole: every reference resolves to a schema of its own, two shapes of one
name are refused when the document is built, and each error status docs/PROTOCOL.md lists is
documented on every route that can answer it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import mqgate.api.openapi as openapi
from mqgate.api.answers import Output
from mqgate.api.openapi import build_openapi
from mqgate.app import build_site
from mqgate.settings import load_settings
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route
from tests.conftest import ROOT, Server

REF_PREFIX = "#/components/schemas/"
# The routes that write to the data directory (messages, the schedule log, the offsets journal,
# a topic's files), so a full disk or the free-space floor refuses them with 507.
WRITES: set[tuple[str, str]] = {
    ("POST", "/mq/produce"),  # the message log, the schedule log (delayed), the spool
    ("POST", "/mq/produce/batch"),
    # A pull: the offsets table of a first one, the ack it carries, the batches it settles into
    # the dead letters or the schedule log.
    ("GET", "/mq/message"),
    ("POST", "/mq/ack"),  # the offsets journal
    ("POST", "/mq/release"),  # the redelivery, through the schedule log
    ("POST", "/mq/commit"),  # the offsets journal
    ("POST", "/mq/receive"),  # the receipts, in the offsets journal; dead letters
    ("POST", "/mq/delete"),  # the offsets journal
    ("POST", "/mq/visibility"),  # the offsets journal
    ("POST", "/mq/half"),  # the half topic's log (and its records, made on the first)
    ("POST", "/mq/half/check"),  # the half consumer's receipts and visibility, in the offsets journal
    ("POST", "/mq/half/commit"),  # the topic's log, the op topic's, the half consumer's delete
    ("POST", "/mq/half/rollback"),  # the op topic's log, the half consumer's delete
    ("POST", "/admin/topics"),  # the topic's files
    ("PATCH", "/admin/topics/{name}"),  # the new queues' files
    ("POST", "/admin/consumers"),  # its dead-letter, retry and inbox topics, its offsets table
    ("DELETE", "/admin/consumers/{name}"),  # its offsets tables dropped, in the journal
    ("POST", "/admin/consumers/{name}/reset"),  # the offsets journal
    ("POST", "/admin/consumers/{name}/purge"),  # the offsets journal
    ("POST", "/admin/topics/{name}/purge"),  # the offsets journal
    ("GET", "/admin/consumers/{name}/dead-letters"),  # the redrive table made on a first look
    ("POST", "/admin/consumers/{name}/dead-letters/redrive"),  # the copies and the journal
    ("POST", "/admin/projects"),  # its trace topic
}
# The routes docs/PROTOCOL.md gives a 409: refused acks, taken names, topics and projects in
# use, redrives.
CONFLICTS: set[tuple[str, str]] = {
    ("POST", "/mq/ack"),
    ("POST", "/mq/half/commit"),  # already_decided
    ("POST", "/mq/half/rollback"),
    ("POST", "/mq/release"),
    ("POST", "/mq/extend"),
    ("POST", "/admin/topics"),
    ("POST", "/admin/producers"),
    ("POST", "/admin/consumers"),
    ("DELETE", "/admin/topics/{name}"),
    ("POST", "/admin/consumers/{name}/dead-letters/redrive"),
    ("POST", "/admin/projects"),
    ("DELETE", "/admin/projects/{name}"),
    ("POST", "/admin/clusters"),
    ("DELETE", "/admin/clusters/{name}"),
    ("POST", "/admin/access-keys"),
    ("POST", "/mq/visibility"),
}


@pytest.fixture(scope="module")
def document(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    srv = Server(tmp_path_factory.mktemp("openapi") / "data").start()
    try:
        yield httpx.get(srv.url + "/openapi.json", timeout=30).json()
    finally:
        srv.stop()


def references(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from references(value)
    elif isinstance(node, list):
        for item in node:
            yield from references(item)


def operations(doc: dict[str, Any]) -> Iterator[tuple[tuple[str, str], dict[str, Any]]]:
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield (method.upper(), path), op


def documented_statuses() -> set[int]:
    """The statuses of the error table of docs/PROTOCOL.md ("## Errors")."""
    text = (ROOT / "docs" / "PROTOCOL.md").read_text()
    table = text.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    return {int(m) for m in re.findall(r"^\| (\d{3}) \|", table, re.M)}


def test_every_reference_resolves_to_a_schema_named_by_its_own_shape(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    refs = set(references(document))
    assert refs and all(r.startswith(REF_PREFIX) for r in refs)
    dangling = sorted(r for r in refs if r.removeprefix(REF_PREFIX) not in schemas)
    assert not dangling
    # msgspec names a schema by its module path only when two shapes share a name.
    assert not [name for name in schemas if "." in name]
    healthz = document["paths"]["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]
    assert healthz["schema"]["properties"]["result"] == {"$ref": REF_PREFIX + "HealthOut"}
    assert {"healthy", "faults"} <= set(schemas["HealthOut"]["properties"])
    project = document["paths"]["/admin/projects/{name}/health"]["get"]["responses"]["200"]
    name = project["content"]["application/json"]["schema"]["properties"]["result"]["$ref"]
    assert {"verdict", "findings"} <= set(schemas[name.removeprefix(REF_PREFIX)]["properties"])


async def _handler(req: Request) -> Response:
    return Response()


def _clashing() -> type[Output]:
    class Twin(Output, kw_only=True):
        value: int

    return Twin


@pytest.mark.parametrize("nested", [False, True], ids=["answers", "nested"])
def test_two_shapes_of_one_name_are_refused_when_the_document_is_built(tmp_path: Path, nested: bool) -> None:
    first, second = _clashing(), _clashing()
    if nested:  # the second one only as a field of another answer
        second = type("Holder", (Output,), {"__annotations__": {"inner": second}}, kw_only=True)
    routes = [
        Route("GET", "/one", _handler, "none", "one", answer=first, body="none"),
        Route("GET", "/two", _handler, "none", "two", answer=second, body="none"),
    ]
    with pytest.raises(TypeError, match="Twin"):
        build_openapi(routes, load_settings(env={}, data_dir=tmp_path))


def test_each_documented_error_status_is_listed_by_every_route_that_can_answer_it(
    document: dict[str, Any],
) -> None:
    every = {key for key, _ in operations(document)}
    body = {key for key, op in operations(document) if "requestBody" in op}
    roles = {key: op["x-role"] for key, op in operations(document)}
    token = {key for key, role in roles.items() if role != "none"}
    naming = ("producer", "consumer", "token", "reader")  # roles whose call names who it is for
    named = {key for key in every if "{" in key[1] or roles[key] in naming}
    answered_by: dict[int, set[tuple[str, str]]] = {
        400: every,  # an unknown parameter, two Authorization headers
        401: token | {("GET", "/metrics")},
        403: token,
        404: named,
        405: every,  # the path with another method
        408: every,  # headers too slow, before any route is chosen
        409: CONFLICTS,
        413: body,
        415: body,
        429: {("GET", "/mq/message")},
        431: every,  # headers too large, before any route is chosen
        500: every,
        503: every,
        507: WRITES,
    }
    assert documented_statuses() == set(answered_by), "classify each status of the error table here"
    assert every >= WRITES | CONFLICTS
    missing = sorted(
        (status, method, path)
        for status, routes in answered_by.items()
        for method, path in routes
        if str(status) not in document["paths"][path][method.lower()]["responses"]
    )
    assert not missing
    disk_full = {key for key, op in operations(document) if "507" in op["responses"]}
    assert disk_full == WRITES  # no route that cannot write says it may find the disk full
    for _, op in operations(document):
        for status, answer in op["responses"].items():
            assert answer["description"], status


def test_the_document_is_built_at_its_first_request_once_not_at_the_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Built at the start, it was a third of a second of every gateway's start (issue 28)."""
    built: list[int] = []
    real = openapi.build_openapi

    def counted(routes: list[Route], settings: Any) -> dict[str, Any]:
        built.append(len(routes))
        return real(routes, settings)

    monkeypatch.setattr(openapi, "build_openapi", counted)
    settings = load_settings(env={}, data_dir=tmp_path)
    site = build_site(settings).site
    assert built == []

    async def fetch_twice() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=site)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            return list(await asyncio.gather(*(client.get("/openapi.json") for _ in range(2))))

    first, second = asyncio.run(fetch_twice())
    assert first.status_code == second.status_code == 200 and first.content == second.content
    assert len(built) == 1 and first.json()["paths"]["/openapi.json"]["get"]["x-role"] == "none"
