"""Who may call what: each route's role, checked by the app, never by a handler.

The credential a role needs is checked before the body is read (a missing bearer token, or a
wrong admin token, is refused without parsing anything); who the caller is follows from the
decoded request, which names the producer, the consumer or carries an ack token.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from mqgate.api.http import Request, Role
from mqgate.core.tokens import AckToken
from mqgate.errors import Forbidden, Unauthorized
from mqgate.registry.records import ConsumerRecord, ProducerRecord, token_matches
from mqgate.services.consume import Consuming
from mqgate.services.topology import Topology


@dataclass(slots=True, frozen=True)
class Admin:
    """The caller holds the admin token."""


@dataclass(slots=True, frozen=True)
class TokenCaller:
    consumer: ConsumerRecord
    token: AckToken


ADMIN = Admin()


class RoleGuard:
    def __init__(self, admin_token: str, topology: Topology, consuming: Consuming) -> None:
        self._admin_token = admin_token.encode()
        self.topology = topology
        self.consuming = consuming

    def is_admin(self, request: Request) -> bool:
        bearer = request.bearer
        return bearer is not None and hmac.compare_digest(bearer.encode(), self._admin_token)

    def check_credential(self, role: Role, request: Request) -> None:
        if role == "none":
            return
        if not request.bearer:
            who = "admin token" if role == "admin" else "token"
            raise Unauthorized(f"Authorization: Bearer <{who}> is required", field="Authorization")
        if role == "admin" and not self.is_admin(request):
            raise Forbidden("the admin token is wrong", field="Authorization")

    async def caller(
        self, role: Role, request: Request
    ) -> Admin | ProducerRecord | ConsumerRecord | TokenCaller | None:
        inp = request.input
        if role == "admin":
            return ADMIN
        if role == "producer":
            producer = await self.topology.producer(inp.producer)
            if not self.is_admin(request):
                _check_bearer(request.bearer, producer.token_hash, f"producer {producer.name}")
            return producer
        if role == "token":
            token = self.consuming.token(inp.request_id)
            if inp.consumer is not None and inp.consumer != token.consumer:
                raise Forbidden(
                    f"requestId belongs to another consumer than {inp.consumer}", field="consumer"
                )
            return TokenCaller(await self._consumer(token.consumer, request), token)
        if role == "reader" and self.is_admin(request):
            return ADMIN
        if inp.consumer is None:
            raise Forbidden("not the admin token: name the consumer whose token this is", field="consumer")
        consumer = await self._consumer(inp.consumer, request)
        topic = getattr(inp, "topic", None)
        if topic is not None and consumer.topic != topic:
            raise Forbidden(
                f"consumer {consumer.name} reads topic {consumer.topic}, not {topic}", field="topic"
            )
        return consumer

    async def _consumer(self, name: str, request: Request) -> ConsumerRecord:
        consumer = await self.topology.consumer(name)
        _check_bearer(request.bearer, consumer.token_hash, f"consumer {name}")
        return consumer


def _check_bearer(bearer: str | None, token_hash: str, who: str) -> None:
    if not bearer:
        raise Unauthorized(f"Authorization: Bearer <token> of {who} is required", field="Authorization")
    if not token_matches(bearer, token_hash):
        raise Forbidden(f"the token is not {who}'s", field="Authorization")
