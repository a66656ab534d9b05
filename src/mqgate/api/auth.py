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
from mqgate.registry.records import ConsumerRecord, ProducerRecord, hash_token
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
        self._holders: dict[str, ProducerRecord | ConsumerRecord] = {}
        self._holders_of: tuple[int, int] = (0, -1)  # (snapshot id, version) they were read from

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
            if self.is_admin(request):
                return await self.topology.producer(inp.producer)
            return await self._holder(request, "producer", inp.producer)
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
        consumer = await self._holder(request, "consumer", name)
        assert isinstance(consumer, ConsumerRecord)
        return consumer

    async def _holder(self, request: Request, kind: str, name: str) -> ProducerRecord | ConsumerRecord:
        """The producer or consumer `name`, if the bearer token is its own. A token that is no
        one's is refused alike whether `name` exists or not (401), so names cannot be probed;
        a valid token of someone else is refused with 403."""
        bearer = request.bearer
        assert bearer is not None  # check_credential refused the call otherwise
        if self.is_admin(request):
            raise Forbidden(
                f"the admin token is not {kind} {name}'s: use its own token", field="Authorization"
            )
        token_hash = hash_token(bearer)
        holder = self._token_holders().get(token_hash)
        if holder is None and await self.topology.ctx.registry.refresh_on_miss():
            holder = self._token_holders().get(token_hash)  # registered meanwhile elsewhere
        if holder is None:
            raise Unauthorized("the token is not valid", field="Authorization")
        wanted = ProducerRecord if kind == "producer" else ConsumerRecord
        if not isinstance(holder, wanted) or holder.name != name:
            raise Forbidden(f"the token is not {kind} {name}'s", field="Authorization")
        return holder

    def _token_holders(self) -> dict[str, ProducerRecord | ConsumerRecord]:
        snapshot = self.topology.ctx.registry.snapshot
        if self._holders_of != (id(snapshot), snapshot.version):
            holders: dict[str, ProducerRecord | ConsumerRecord] = {
                p.token_hash: p for p in snapshot.producers.values()
            }
            holders.update((c.token_hash, c) for c in snapshot.consumers.values())
            self._holders, self._holders_of = holders, (id(snapshot), snapshot.version)
        return self._holders
