"""Who may call what: each route's role, checked by the app, never by a handler.

Who holds the bearer token is found before the body is read: no token, or a token that is no
one's, is refused (401) on every route without parsing anything, and so is a known token that
can never hold the route's role (403: a producer's or consumer's token on an admin route). Whose
call it is follows from the decoded request, which names the producer, the consumer or carries
an ack token.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TypeVar

from mqgate.core.tokens import AckToken
from mqgate.errors import Forbidden, Unauthorized
from mqgate.registry.records import ConsumerRecord, ProducerRecord, hash_token
from mqgate.services.consume import Consuming
from mqgate.services.topology import Topology
from mqgate.web.request import Request


@dataclass(slots=True, frozen=True)
class Admin:
    """The caller holds the admin token."""


@dataclass(slots=True, frozen=True)
class TokenCaller:
    consumer: ConsumerRecord
    token: AckToken


ADMIN = Admin()

# Who a bearer token belongs to: the admin, or the producer or consumer it was issued to.
Credential = Admin | ProducerRecord | ConsumerRecord
Holder = TypeVar("Holder", ProducerRecord, ConsumerRecord)


class RoleGuard:
    def __init__(self, admin_token: str, topology: Topology, consuming: Consuming) -> None:
        self._admin_token = admin_token.encode()
        self.topology = topology
        self.consuming = consuming
        self._holders: dict[str, ProducerRecord | ConsumerRecord] = {}
        self._holders_of: tuple[int, int] = (0, -1)  # (snapshot id, version) they were read from

    async def check_credential(self, role: str, request: Request) -> None:
        if role == "none":
            return
        request.credential = await self._credential(role, request)
        if role == "admin" and request.credential is not ADMIN:
            raise Forbidden(
                "this call needs the admin token, not a producer's or consumer's", field="Authorization"
            )

    async def caller(
        self, role: str, request: Request
    ) -> Admin | ProducerRecord | ConsumerRecord | TokenCaller | None:
        inp = request.input
        credential: Credential = request.credential
        if role == "admin":
            return ADMIN
        if role == "producer":
            if credential is ADMIN:
                return await self.topology.producer(inp.producer)
            return _own(credential, ProducerRecord, inp.producer)
        if role == "token":
            token = self.consuming.token(inp.request_id)
            if inp.consumer is not None and inp.consumer != token.consumer:
                raise Forbidden(
                    f"requestId belongs to another consumer than {inp.consumer}", field="consumer"
                )
            return TokenCaller(_own(credential, ConsumerRecord, token.consumer), token)
        if role == "reader" and credential is ADMIN:
            return ADMIN
        if inp.consumer is None:
            raise Forbidden("not the admin token: name the consumer whose token this is", field="consumer")
        consumer = _own(credential, ConsumerRecord, inp.consumer)
        topic = getattr(inp, "topic", None)
        if topic is not None and consumer.topic != topic:
            raise Forbidden(
                f"consumer {consumer.name} reads topic {consumer.topic}, not {topic}", field="topic"
            )
        return consumer

    async def _credential(self, role: str, request: Request) -> Credential:
        """Who holds the bearer token. No token, or a token that is no one's, is 401 whatever
        the call names, so names cannot be probed with made-up tokens."""
        bearer = request.bearer
        if not bearer:
            who = "admin token" if role == "admin" else "token"
            raise Unauthorized(f"Authorization: Bearer <{who}> is required", field="Authorization")
        if hmac.compare_digest(bearer.encode(), self._admin_token):
            return ADMIN
        token_hash = hash_token(bearer)
        holder = self._token_holders().get(token_hash)
        if holder is None and await self.topology.ctx.registry.refresh_on_miss():
            holder = self._token_holders().get(token_hash)  # registered meanwhile elsewhere
        if holder is None:
            raise Unauthorized("the token is not valid", field="Authorization")
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


def _own(credential: Credential, kind: type[Holder], name: str) -> Holder:
    """The producer or consumer `name`, if `credential` is its own token. Any other known token
    is refused (403) alike whether `name` exists or not, so names cannot be probed."""
    what = "producer" if kind is ProducerRecord else "consumer"
    if credential is ADMIN:
        raise Forbidden(f"the admin token is not {what} {name}'s: use its own token", field="Authorization")
    if not isinstance(credential, kind) or credential.name != name:
        raise Forbidden(f"the token is not {what} {name}'s", field="Authorization")
    return credential
