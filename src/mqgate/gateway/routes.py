"""The HTTP API: one handler per route, each declared with what OpenAPI needs."""

from __future__ import annotations

import hmac
import os
from typing import Any

import msgspec

from mqgate.core.scheduling import MAX_PRIORITY
from mqgate.errors import BadRequest, Forbidden, Unauthorized
from mqgate.gateway.http import Request, Response, Route
from mqgate.gateway.inputs import (
    MAX_OFFSET,
    decode_batch,
    destination_list,
    float_param,
    int_param,
    new_message,
    offsets_param,
    optional_str,
    require_present,
    require_str,
)
from mqgate.gateway.openapi import build_openapi
from mqgate.gateway.service import FOUND, RATE_LIMITED, Gateway, PullResult
from mqgate.model import MODE_CLUSTER
from mqgate.names import INTERNAL_PREFIXES
from mqgate.registry.records import ConsumerRecord
from mqgate.settings import Settings

MAX_QUEUES = 256
MAX_LOCK_TIMEOUT_S = 12 * 3600.0
MAX_ATTEMPTS = 1000
MAX_READ_MESSAGES = 10_000


def found_body(result: PullResult, broker: str) -> bytes:
    """The FOUND answer, assembled from the stored JSON objects: each gets its delivery
    fields appended in place of its closing brace, nothing is decoded or re-encoded."""
    assert result.messages is not None and result.request_id is not None
    head = b',"broker":' + msgspec.json.encode(broker) + b',"queue":%d,"offset":' % result.queue
    tail = b',"reconsumeTimes":%d}' % result.reconsume_times
    items = b",".join([payload[:-1] + head + b"%d" % offset + tail for offset, payload in result.messages])
    ack = b',"ack":%b' % msgspec.json.encode(result.ack) if result.ack is not None else b""
    return b'{"status":200,"message":"ok","result":{"status":"FOUND","requestId":"%b"%b,"msgList":[%b]}}' % (
        result.request_id.encode(),
        ack,
        items,
    )


class Api:
    def __init__(self, gateway: Gateway, settings: Settings, admin_token: str) -> None:
        self.gw = gateway
        self.settings = settings
        self.admin_token = admin_token
        self.openapi_bytes: bytes = b""

    def _admin(self, req: Request) -> None:
        bearer = req.bearer
        if not bearer:
            raise Unauthorized("Authorization: Bearer <admin token> is required", field="Authorization")
        if not self._is_admin(req):
            raise Forbidden("the admin token is wrong", field="Authorization")

    def _is_admin(self, req: Request) -> bool:
        bearer = req.bearer
        return bearer is not None and hmac.compare_digest(bearer.encode(), self.admin_token.encode())

    async def _log_reader(self, req: Request) -> str:
        """The topic a log read names, if the caller holds the admin token or the token of
        a consumer (named by `consumer`) of that topic."""
        topic = require_str(req.params, "topic")
        if self._is_admin(req):
            return topic
        if not req.bearer:
            raise Unauthorized(
                "Authorization: Bearer <consumer or admin token> is required", field="Authorization"
            )
        name = optional_str(req.params, "consumer")
        if name is None:
            raise Forbidden("not the admin token: name the consumer whose token this is", field="consumer")
        await self._consumer_of(topic, name, req)
        return topic

    async def _consumer_of(self, topic: str, name: str, req: Request) -> ConsumerRecord:
        """Consumer `name`, if the bearer is its token and it reads `topic`."""
        consumer = await self.gw.consumer_for(name, req.bearer)
        if consumer.topic != topic:
            raise Forbidden(f"consumer {name} reads topic {consumer.topic}, not {topic}", field="topic")
        return consumer

    # --- data path ----------------------------------------------------------------------

    async def produce(self, req: Request) -> Response:
        name = require_str(req.params, "producer")
        producer = await self.gw.producer_for(name, req.bearer, admin=self._is_admin(req))
        receipts = await self.gw.produce(producer, [new_message(req.params, self.settings)])
        # One destination: its receipt, as always; several: one receipt per destination.
        return Response(receipts[0] if len(receipts) == 1 else {"receipts": receipts})

    async def produce_batch(self, req: Request) -> Response:
        content_type = req.headers.get(b"content-type", b"")
        name, messages = decode_batch(req.body, content_type, req.params, self.settings)
        producer = await self.gw.producer_for(name, req.bearer, admin=self._is_admin(req))
        receipts = await self.gw.produce(producer, messages)
        return Response({"receipts": receipts})

    async def pull(self, req: Request) -> Response:
        p = req.params
        topic = require_str(p, "topic")
        consumer = await self._consumer_of(topic, require_str(p, "consumer"), req)
        max_count = int_param(p, "max", 32, 1, self.settings.max_pull_messages)
        wait_s = float_param(p, "wait", 0.0, 0.0, self.settings.max_wait_s)
        client_id = optional_str(p, "clientId")
        result = await self.gw.pull(
            consumer,
            client_id=client_id,
            max_count=max_count,
            wait_s=wait_s,
            request_id=optional_str(p, "requestId"),
            owner=f"{req.client_host}/{client_id}" if client_id else req.client_host,
        )
        if result.status == RATE_LIMITED:
            body: dict[str, Any] = {
                "status": result.status,
                "requestId": None,
                "msgList": [],
                "ack": result.ack,
            }
            retry = max(1, round(result.retry_after_s + 0.5))
            return Response(
                body, status=429, message="rate limited", headers=[(b"retry-after", str(retry).encode())]
            )
        if result.status == FOUND and result.messages:
            return Response(raw_body=found_body(result, self.gw.store.broker))
        body = {"status": result.status, "requestId": None, "msgList": []}
        if result.ack is not None:
            body["ack"] = result.ack
        return Response(body, message="ok" if result.status == FOUND else result.status.lower())

    async def ack(self, req: Request) -> Response:
        consumer, token = await self.gw.token_for(require_str(req.params, "requestId"), req.bearer)
        await self.gw.ack(consumer, token)
        return Response({"queue": token.queue, "committed": token.next_offset})

    async def release(self, req: Request) -> Response:
        consumer, token = await self.gw.token_for(require_str(req.params, "requestId"), req.bearer)
        await self.gw.release(consumer, token)
        return Response({"queue": token.queue, "committed": token.offset})

    async def extend(self, req: Request) -> Response:
        consumer, token = await self.gw.token_for(require_str(req.params, "requestId"), req.bearer)
        seconds = float_param(req.params, "seconds", consumer.lock_timeout_s, 1.0, 3600.0)
        await self.gw.extend(consumer, token, seconds)
        return Response({"queue": token.queue, "extendedBySeconds": seconds})

    # --- admin --------------------------------------------------------------------------

    async def create_topic(self, req: Request) -> Response:
        self._admin(req)
        p = req.params
        retention_bytes = int_param(p, "retentionBytes", 0, 0, 2**62)
        name = require_str(p, "name")
        if name.startswith(INTERNAL_PREFIXES):
            raise BadRequest(f"topic names starting with {name[0]} are the gateway's own", field="name")
        rec = await self.gw.create_topic(
            name,
            int_param(p, "queues", self.settings.default_queues, 1, MAX_QUEUES),
            int_param(p, "retentionMs", self.settings.default_retention_ms, 1000, 2**62),
            retention_bytes or None,
            int_param(p, "maxPriority", 0, 0, MAX_PRIORITY),
        )
        return Response(_topic_json(rec))

    async def list_topics(self, req: Request) -> Response:
        self._admin(req)
        return Response({"topics": [_topic_json(t) for t in self.gw.registry.snapshot.topics.values()]})

    async def register_producer(self, req: Request) -> Response:
        self._admin(req)
        rec, token = await self.gw.register_producer(
            require_str(req.params, "name"),
            require_str(req.params, "topic"),
            destination_list(req.params.get("destinations")),
        )
        return Response({"name": rec.name, "topic": rec.topic, "destinations": rec.allowed(), "token": token})

    async def register_consumer(self, req: Request) -> Response:
        self._admin(req)
        p = req.params
        rec, token = await self.gw.register_consumer(
            require_str(p, "name"),
            require_str(p, "topic"),
            optional_str(p, "mode") or MODE_CLUSTER,
            str(p.get("start") or "earliest"),
            float_param(p, "lockTimeoutS", self.settings.default_lock_timeout_s, 1.0, MAX_LOCK_TIMEOUT_S),
            int_param(p, "maxAttempts", self.settings.default_max_attempts, 1, MAX_ATTEMPTS),
        )
        return Response(
            {
                "name": rec.name,
                "topic": rec.topic,
                "mode": rec.mode,
                "start": rec.start,
                "token": token,
            }
        )

    async def list_consumers(self, req: Request) -> Response:
        self._admin(req)
        return Response(
            {
                "consumers": [
                    {
                        "name": c.name,
                        "topic": c.topic,
                        "mode": c.mode,
                        "paused": c.paused,
                        "rateLimit": c.rate_limit_per_s,
                        "alertBacklog": c.alert_backlog,
                    }
                    for c in self.gw.registry.snapshot.consumers.values()
                ]
            }
        )

    async def progress(self, req: Request) -> Response:
        self._admin(req)
        return Response(await self.gw.progress(req.path_params["name"]))

    async def reset(self, req: Request) -> Response:
        self._admin(req)
        p = req.params
        queue = p.get("queue")
        return Response(
            await self.gw.reset(
                req.path_params["name"],
                require_str(p, "to"),
                offset=int_param(p, "offset", 0, 0, 2**62) if p.get("offset") not in (None, "") else None,
                timestamp_ms=int_param(p, "timestamp", 0, 0, 2**62)
                if p.get("timestamp") not in (None, "")
                else None,
                queue=int_param(p, "queue", 0, 0, MAX_QUEUES) if queue not in (None, "") else None,
                client_id=optional_str(p, "clientId"),
            )
        )

    async def pause(self, req: Request) -> Response:
        self._admin(req)
        c = await self.gw.update_consumer(req.path_params["name"], paused=True)
        return Response({"name": c.name, "paused": c.paused})

    async def resume(self, req: Request) -> Response:
        self._admin(req)
        c = await self.gw.update_consumer(req.path_params["name"], paused=False)
        return Response({"name": c.name, "paused": c.paused})

    async def rate_limit(self, req: Request) -> Response:
        self._admin(req)
        require_present(req.params, "messagesPerSecond")
        rate = float_param(req.params, "messagesPerSecond", 0.0, 0.0, 1e9)
        c = await self.gw.update_consumer(req.path_params["name"], rate_limit_per_s=rate)
        return Response({"name": c.name, "messagesPerSecond": c.rate_limit_per_s})

    async def alert(self, req: Request) -> Response:
        self._admin(req)
        require_present(req.params, "backlog")
        backlog = int_param(req.params, "backlog", 0, 0, 2**62)
        c = await self.gw.update_consumer(req.path_params["name"], alert_backlog=backlog)
        return Response({"name": c.name, "backlog": c.alert_backlog})

    async def alerts(self, req: Request) -> Response:
        self._admin(req)
        return Response({"alerts": await self.gw.alerts()})

    # --- service ------------------------------------------------------------------------

    async def healthz(self, req: Request) -> Response:
        return Response({"healthy": True, "broker": self.gw.store.broker, "pid": os.getpid()})

    async def metrics(self, req: Request) -> Response:
        await self.gw.refresh_lag_metrics()
        return Response(raw_body=self.gw.metrics.render(), content_type=b"text/plain; version=0.0.4")

    async def log_bounds(self, req: Request) -> Response:
        topic = await self._log_reader(req)
        bounds = await self.gw.log_bounds(topic)
        queues = [{"queue": b.queue, "min": b.min, "max": b.max} for b in bounds]
        return Response({"topic": topic, "broker": self.gw.store.broker, "queues": queues})

    async def read_log(self, req: Request) -> Response:
        topic = await self._log_reader(req)
        p = req.params
        queue = int_param(p, "queue", 0, 0, MAX_QUEUES * (MAX_PRIORITY + 1))
        offset = int_param(p, "offset", 0, 0, MAX_OFFSET)
        max_count = int_param(p, "max", 1000, 1, MAX_READ_MESSAGES)
        start, raw = await self.gw.read_log(topic, queue, offset, max_count)
        broker = self.gw.store.broker
        head = b',"broker":' + msgspec.json.encode(broker) + b',"queue":%d,"offset":' % queue
        items = b",".join([payload[:-1] + head + b"%d}" % o for o, payload in raw])
        end = raw[-1][0] + 1 if raw else start
        return Response(
            raw_body=b'{"status":200,"message":"ok","result":{"topic":%b,"broker":%b,"queue":%d,'
            b'"offset":%d,"next":%d,"msgList":[%b]}}'
            % (msgspec.json.encode(topic), msgspec.json.encode(broker), queue, start, end, items)
        )

    async def commit(self, req: Request) -> Response:
        name = require_str(req.params, "consumer")
        admin = self._is_admin(req)
        consumer = await self.gw.consumer(name) if admin else await self.gw.consumer_for(name, req.bearer)
        offsets = offsets_param(req.params, "offsets", MAX_QUEUES * (MAX_PRIORITY + 1))
        committed = await self.gw.commit_offsets(consumer, offsets)
        queues = [{"queue": q, "committed": c} for q, c in committed.items()]
        return Response({"consumer": name, "queues": queues})

    async def openapi(self, req: Request) -> Response:
        return Response(raw_body=self.openapi_bytes)

    # --- the table ----------------------------------------------------------------------

    def routes(self) -> list[Route]:
        name = ("name", "string", True, "consumer name (path)")
        routes = [
            Route(
                "POST",
                "/mq/produce",
                self.produce,
                "producer",
                "Produce one message",
                (
                    ("producer", "string", True, "registered producer name"),
                    ("message", "string", True, "message body (UTF-8, up to 1 MiB)"),
                    ("keys", "array", False, "message keys"),
                    ("tags", "array", False, "message tags"),
                    ("properties", "object", False, "string to string map"),
                    ("orderKey", "string", False, "messages with one order key keep their order"),
                ),
            ),
            Route(
                "POST",
                "/mq/produce/batch",
                self.produce_batch,
                "producer",
                "Produce up to 1,000 messages",
                (
                    ("producer", "string", True, "registered producer name"),
                    (
                        "messages",
                        "array",
                        True,
                        "objects with message, keys, tags, properties, orderKey",
                    ),
                ),
                body="raw",
            ),
            Route(
                "GET",
                "/mq/message",
                self.pull,
                "consumer",
                "Pull a batch from one locked queue",
                (
                    ("topic", "string", True, "the consumer's topic"),
                    ("consumer", "string", True, "registered consumer name"),
                    ("requestId", "string", False, "ack token of the previous batch, acked first"),
                    ("clientId", "string", False, "required for broadcast consumers"),
                    ("max", "integer", False, "1–1024, default 32"),
                    ("wait", "number", False, "long-poll seconds, 0–30"),
                ),
                body="none",
            ),
            Route(
                "POST",
                "/mq/ack",
                self.ack,
                "consumer",
                "Commit a batch",
                (("requestId", "string", True, "ack token from the pull"),),
            ),
            Route(
                "POST",
                "/mq/release",
                self.release,
                "consumer",
                "Unlock a batch without commit",
                (("requestId", "string", True, "ack token from the pull"),),
            ),
            Route(
                "POST",
                "/mq/extend",
                self.extend,
                "consumer",
                "Keep a batch's lock longer",
                (
                    ("requestId", "string", True, "ack token from the pull"),
                    ("seconds", "number", False, "1–3600, default the consumer's lock timeout"),
                ),
            ),
            Route(
                "GET",
                "/mq/bounds",
                self.log_bounds,
                "consumer",
                "Oldest and next offset of each of a topic's queues (admin or consumer token)",
                (
                    ("topic", "string", True, "the topic"),
                    ("consumer", "string", False, "whose token it is, unless it is the admin token"),
                ),
                body="none",
            ),
            Route(
                "GET",
                "/mq/read",
                self.read_log,
                "consumer",
                "Read a queue by offset, without locks or commits (admin or consumer token)",
                (
                    ("topic", "string", True, "the topic"),
                    ("queue", "integer", True, "store queue number, as in /mq/bounds"),
                    ("offset", "integer", True, "first offset to read"),
                    ("max", "integer", False, f"1–{MAX_READ_MESSAGES}, default 1000"),
                    ("consumer", "string", False, "whose token it is, unless it is the admin token"),
                ),
                body="none",
            ),
            Route(
                "POST",
                "/mq/commit",
                self.commit,
                "consumer",
                "Raise a cluster consumer's committed offsets (never lowers them)",
                (
                    ("consumer", "string", True, "the consumer group"),
                    ("offsets", "object", True, 'store queue -> next offset to read, e.g. {"0": 120}'),
                ),
            ),
            Route(
                "POST",
                "/admin/topics",
                self.create_topic,
                "admin",
                "Create a topic",
                (
                    ("name", "string", True, "topic name"),
                    ("queues", "integer", False, "1–256, default 8"),
                    ("retentionMs", "integer", False, "default 7 days"),
                    ("retentionBytes", "integer", False, "per queue, default unlimited"),
                    ("maxPriority", "integer", False, "0–9: priority lanes 0..maxPriority, default 0"),
                ),
            ),
            Route("GET", "/admin/topics", self.list_topics, "admin", "List topics", body="none"),
            Route(
                "POST",
                "/admin/producers",
                self.register_producer,
                "admin",
                "Register a producer",
                (
                    ("name", "string", True, "producer name"),
                    ("topic", "string", True, "the topic it writes"),
                    (
                        "destinations",
                        "array",
                        False,
                        "further topics and inbox:<consumer> (or inbox:*) it may write",
                    ),
                ),
            ),
            Route(
                "POST",
                "/admin/consumers",
                self.register_consumer,
                "admin",
                "Register a consumer",
                (
                    ("name", "string", True, "consumer name"),
                    ("topic", "string", True, "the topic it reads"),
                    ("mode", "string", False, "cluster (default) or broadcast"),
                    ("start", "string", False, "earliest (default), latest or epoch ms"),
                    ("lockTimeoutS", "number", False, "default 60"),
                    ("maxAttempts", "integer", False, "default 16"),
                ),
            ),
            Route(
                "GET",
                "/admin/consumers",
                self.list_consumers,
                "admin",
                "List consumers",
                body="none",
            ),
            Route(
                "GET",
                "/admin/consumers/{name}/progress",
                self.progress,
                "admin",
                "Per-queue progress",
                (name,),
                body="none",
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/reset",
                self.reset,
                "admin",
                "Reset offsets",
                (
                    name,
                    ("to", "string", True, "earliest, latest, offset or timestamp"),
                    ("offset", "integer", False, "with to=offset"),
                    ("timestamp", "integer", False, "epoch ms, with to=timestamp"),
                    ("queue", "integer", False, "only this queue"),
                    ("clientId", "string", False, "only this broadcast client"),
                ),
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/pause",
                self.pause,
                "admin",
                "Pause a consumer",
                (name,),
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/resume",
                self.resume,
                "admin",
                "Resume a consumer",
                (name,),
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/rate-limit",
                self.rate_limit,
                "admin",
                "Set a rate limit",
                (
                    name,
                    ("messagesPerSecond", "number", True, "0 = unlimited"),
                ),
            ),
            Route(
                "POST",
                "/admin/consumers/{name}/alert",
                self.alert,
                "admin",
                "Set a backlog alert",
                (
                    name,
                    ("backlog", "integer", True, "0 = off"),
                ),
            ),
            Route("GET", "/admin/alerts", self.alerts, "admin", "Active backlog alerts", body="none"),
            Route("GET", "/healthz", self.healthz, "none", "Liveness", body="none"),
            Route("GET", "/metrics", self.metrics, "none", "Prometheus metrics", body="none"),
            Route("GET", "/openapi.json", self.openapi, "none", "This document", body="none"),
        ]
        self.openapi_bytes = msgspec.json.encode(build_openapi(routes))
        return routes


def _topic_json(t: Any) -> dict[str, Any]:
    return {
        "name": t.name,
        "queues": t.queues,
        "retentionMs": t.retention_ms,
        "retentionBytes": t.retention_bytes,
        "maxPriority": t.max_priority,
    }
