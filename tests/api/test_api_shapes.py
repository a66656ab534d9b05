"""The request shapes are the one source of decoding, validation and the OpenAPI document;
roles are enforced by the router, with the credential checked before the body is read."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from mqgate.api import shapes
from mqgate.api.openapi import build_openapi
from mqgate.app import build_site
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import NotFound
from mqgate.metrics import Metrics
from mqgate.offsets.backends.embedded import EmbeddedOffsetStore
from mqgate.registry.cache import RegistryCache
from mqgate.registry.records import ConsumerRecord, TopicRecord
from mqgate.registry.sql import SqlRegistry
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.services.context import Context
from mqgate.services.gateway import Gateway
from mqgate.settings import load_settings
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig
from tests.api.test_http_api import unique
from tests.conftest import Server

QOS_FIELDS = {"deliverAt", "delayMs", "ttlMs", "priority", "destinations"}


def wire_fields(shape: type[Any]) -> set[str]:
    return {f.encode_name for f in msgspec.structs.fields(shape)}


def documented_fields(op: dict[str, Any]) -> set[str]:
    names = {p["name"] for p in op.get("parameters", [])}
    for content in op.get("requestBody", {}).get("content", {}).values():
        names |= set(content["schema"]["properties"])
    return names


def test_the_document_has_every_route_and_every_field_of_its_shape(tmp_path: Path) -> None:
    settings = load_settings(env={}, data_dir=tmp_path, max_pull_messages=77, default_queues=5)
    routes = build_site(settings).api.router.routes
    doc = build_openapi(routes, settings)
    listed = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert listed == {(r.method, r.path) for r in routes}
    assert {("POST", "/mq/produce"), ("GET", "/mq/message"), ("POST", "/mq/commit")} <= listed
    for r in routes:
        op = doc["paths"][r.path][r.method.lower()]
        expected = wire_fields(r.shape) if r.shape is not None else set()
        assert documented_fields(op) == expected, (r.method, r.path)
        assert op["x-role"] == r.role
    produce = doc["paths"]["/mq/produce"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert set(produce["properties"]) >= QOS_FIELDS
    # Limits and defaults that are settings are written in from the settings in force.
    pull = {p["name"]: p for p in doc["paths"]["/mq/message"]["get"]["parameters"]}
    assert pull["max"]["schema"]["maximum"] == 77
    topic = doc["components"]["schemas"]["TopicIn"]["properties"]["queues"]
    assert topic["default"] == 5
    release = doc["paths"]["/mq/release"]["post"]
    assert "again after a backoff" in release["summary"] and "409" in release["responses"]


def test_the_served_document_is_the_built_one(shared_server: Server) -> None:
    doc = httpx.get(shared_server.url + "/openapi.json").json()
    produce = doc["paths"]["/mq/produce"]["post"]
    assert QOS_FIELDS | {"producer", "message"} <= documented_fields(produce)
    assert produce["security"] == [{"bearer": []}]


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/admin/consumers", {"lock_timeout_s": 3}, "lock_timeout_s"),
        ("POST", "/admin/topics", {"partitions": 3}, "partitions"),
        ("GET", "/admin/topics", {"verbose": "1"}, "verbose"),
    ],
)
def test_unknown_parameters_are_refused_by_name(
    shared_server: Server, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    topic = unique("u")
    shared_server.setup_topic(topic)
    fields = {"name": unique("n"), **({"topic": topic} if path == "/admin/consumers" else {}), **body}
    kwargs: dict[str, Any] = {"params": body} if method == "GET" else {"json": fields}
    r = httpx.request(
        method,
        shared_server.url + path,
        headers={"Authorization": f"Bearer {shared_server.admin_token}"},
        **kwargs,
    )
    assert r.status_code == 400, r.text
    assert r.json()["result"]["field"] == field and field in r.json()["message"]


def test_a_pull_with_an_unknown_query_parameter_is_refused(shared_server: Server) -> None:
    topic = unique("q")
    _, ctoken = shared_server.setup_topic(topic)
    r = httpx.get(
        shared_server.url + "/mq/message",
        params={"topic": topic, "consumer": f"{topic}-c", "maxMessages": 5},
        headers={"Authorization": f"Bearer {ctoken}"},
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "maxMessages"


@pytest.mark.parametrize("path", ["/admin/topics", "/mq/produce", "/mq/ack", "/mq/commit"])
def test_the_credential_is_checked_before_the_body_is_parsed(shared_server: Server, path: str) -> None:
    r = httpx.post(
        shared_server.url + path, content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 401 and r.json()["result"]["field"] == "Authorization"
    wrong = {"Content-Type": "application/json", "Authorization": "Bearer nope"}
    if path.startswith("/admin"):
        r = httpx.post(shared_server.url + path, content=b"{not json", headers=wrong)
        assert r.status_code == 401  # a token that is no one's, before the body is read


def test_errors_name_the_field_path(shared_server: Server) -> None:
    topic = unique("e")
    ptoken, _ = shared_server.setup_topic(topic)
    h = {"Authorization": f"Bearer {ptoken}"}
    body = {"producer": f"{topic}-p", "messages": [{"message": "a"}, {"message": "b", "destinations": [{}]}]}
    r = httpx.post(shared_server.url + "/mq/produce/batch", json=body, headers=h)
    assert r.status_code == 400 and r.json()["result"]["field"] == "messages[1].destinations[0]"
    body = {"producer": f"{topic}-p", "messages": [{"message": "a", "colour": "red"}]}
    r = httpx.post(shared_server.url + "/mq/produce/batch", json=body, headers=h)
    assert r.status_code == 400 and "messages[0].colour" in r.json()["message"]
    r = httpx.post(
        shared_server.url + "/mq/produce/batch", json={"producer": f"{topic}-p", "messages": [{}]}, headers=h
    )
    assert r.status_code == 400 and r.json()["result"]["field"] == "messages[0].message"


def test_reads_never_create_store_topics(tmp_path: Path) -> None:
    """A consumer whose side topics are missing is an error to a read, not a write."""

    async def scenario() -> None:
        settings = load_settings(env={}, data_dir=tmp_path)
        sql = SqlRegistry(settings.resolved_registry_url())
        sql.create_schema()
        sql.add_topic(TopicRecord("t", 1, 60_000, None, 0))
        sql.add_consumer(ConsumerRecord("c", "t", "cluster", "earliest", 60.0, 16, False, 0.0, 0, "x", 0))
        committer = GroupCommitter(None)
        committer.start()
        store = EmbeddedStore(tmp_path, broker="local", segment_bytes=1 << 20, committer=committer)
        await store.open()
        await store.create_topic(TopicConfig("t", 1, 60_000))
        offsets = EmbeddedOffsetStore(tmp_path, committer)
        await offsets.open()
        registry = RegistryCache(sql, 60.0)
        await registry.refresh(force=True)
        gateway = Gateway(
            Context(
                settings,
                store,
                offsets,
                EmbeddedScheduler(tmp_path / "s", committer),
                registry,
                Metrics(),
                b"k",
            )
        )
        with pytest.raises(NotFound):
            await gateway.operations.progress("c")
        assert not store.has_topic("%RETRY%c") and not store.has_topic("%INBOX%c")
        await gateway.topology.sync(registry.snapshot)  # start-up and registry changes make them
        assert store.has_topic("%RETRY%c") and store.has_topic("%INBOX%c")
        assert (await gateway.operations.progress("c")).lag == 0
        await offsets.close()
        await store.close()
        await committer.stop()
        sql.dispose()

    asyncio.run(scenario())


def test_shapes_refuse_unknown_fields_everywhere() -> None:
    for shape in vars(shapes).values():
        if isinstance(shape, type) and issubclass(shape, shapes.Input) and shape is not shapes.Input:
            with pytest.raises(msgspec.ValidationError, match="unknown field"):
                msgspec.convert({"noSuchField": 1}, shape)
