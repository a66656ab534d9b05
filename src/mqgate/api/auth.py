"""Who may call what: each route's role, checked by the app, never by a handler.

Who holds the bearer token is found before the body is read: no token, or a token that is no
one's, is refused (401) on every route without parsing anything, and so is a known token that
can never hold the route's role (403: a producer's or consumer's token on an admin route). Whose
call it is follows from the decoded request, which names the producer, the consumer or carries
an ack token.

A stream ticket (core/tokens.py `StreamTicket`, in the `ticket` query parameter or as the
bearer) stands in for a consumer's token where a browser cannot send one: it opens that
consumer's stream (role `stream`) and acks its batches (role `token`), and nothing else.
"""

from __future__ import annotations

import hmac
import time
from typing import TypeVar

import msgspec

from mqgate.core.tokens import TICKET_PREFIX, TICKET_TOKEN_HASH_CHARS, AckToken, StreamTicket
from mqgate.errors import Forbidden, MqgateError, Unauthorized
from mqgate.registry.records import ConsumerRecord, ProducerRecord, hash_token
from mqgate.services.consume import Consuming
from mqgate.services.topology import Topology
from mqgate.web.request import Request


class Admin(msgspec.Struct, frozen=True):
    """The caller holds the admin token."""


class TokenCaller(msgspec.Struct, frozen=True):
    consumer: ConsumerRecord
    token: AckToken


class TicketHolder(msgspec.Struct, frozen=True):
    """The caller holds a stream ticket of `consumer` (and of its client `client_id`)."""

    consumer: ConsumerRecord
    client_id: str


ADMIN = Admin()
MAX_HASHES_KEPT = 16_384  # tokens' hashes kept (about 3 MB): past it, all are forgotten at once
TICKET_ROLES = frozenset({"stream", "token"})  # what a stream ticket may do

# Who a bearer token belongs to: the admin, or the producer or consumer it was issued to, or
# a consumer's stream ticket.
Credential = Admin | ProducerRecord | ConsumerRecord | TicketHolder
Holder = TypeVar("Holder", ProducerRecord, ConsumerRecord)


class RoleGuard:
    def __init__(self, admin_token: str, topology: Topology, consuming: Consuming) -> None:
        self._admin_token = admin_token.encode()
        self.topology = topology
        self.consuming = consuming
        self._holders: dict[str, ProducerRecord | ConsumerRecord] = {}
        self._holders_of: tuple[int, int] = (0, -1)  # (snapshot id, version) they were read from
        # The hash of each token that was someone's (SHA-256 and its hex: a tenth of a produce's
        # auth): kept only for tokens found, so unknown ones cannot grow it. A hash whose
        # holder is gone (rotated, revoked) finds no one in `_holders`, as before.
        self._hashes: dict[str, str] = {}

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
            return TokenCaller(
                _own(_ticket_for(credential, token.client_id), ConsumerRecord, token.consumer), token
            )
        if role == "stream":
            credential = _ticket_for(credential, getattr(inp, "client_id", None) or "")
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
        if not bearer and role == "stream":
            tickets = request.query.get("ticket")
            if tickets:
                return self._ticket(tickets[0], "ticket")
        if not bearer:
            who = "admin token" if role == "admin" else "token"
            raise Unauthorized(f"Authorization: Bearer <{who}> is required", field="Authorization")
        if bearer.startswith(TICKET_PREFIX):
            ticket_holder = self._ticket(bearer, "Authorization")  # no one's: 401, as any token
            if role not in TICKET_ROLES:
                raise Forbidden(
                    "a stream ticket opens its consumer's stream and acks its batches, nothing else",
                    field="Authorization",
                )
            return ticket_holder
        if hmac.compare_digest(bearer.encode(), self._admin_token):
            return ADMIN
        token_hash = self._hashes.get(bearer)
        if token_hash is None:
            token_hash = hash_token(bearer)
        holder = self._token_holders().get(token_hash)
        if holder is None and await self.topology.ctx.registry.refresh_on_miss():
            holder = self._token_holders().get(token_hash)  # registered meanwhile elsewhere
        if holder is None:
            raise Unauthorized("the token is not valid", field="Authorization")
        if bearer not in self._hashes:
            if len(self._hashes) >= MAX_HASHES_KEPT:
                self._hashes.clear()
            self._hashes[bearer] = token_hash
        return holder

    def _ticket(self, text: str, field: str) -> TicketHolder:
        """Whose stream ticket this is: 401 alike for one that is forged, expired, or of a
        token since rotated or revoked (nothing tells which names exist)."""
        try:
            ticket: StreamTicket = self.consuming.ticket(text)
        except MqgateError:
            raise Unauthorized("the stream ticket is not valid", field=field) from None
        if ticket.expires_ms <= time.time() * 1000:
            raise Unauthorized("the stream ticket has expired: ask for a new one", field=field)
        consumer = self.topology.ctx.registry.snapshot.consumers.get(ticket.consumer)
        if consumer is None or not hmac.compare_digest(
            consumer.token_hash[:TICKET_TOKEN_HASH_CHARS], ticket.token_hash
        ):
            raise Unauthorized("the stream ticket is not valid", field=field)
        return TicketHolder(consumer, ticket.client_id)

    def _token_holders(self) -> dict[str, ProducerRecord | ConsumerRecord]:
        snapshot = self.topology.ctx.registry.snapshot
        if self._holders_of != (id(snapshot), snapshot.version):
            holders: dict[str, ProducerRecord | ConsumerRecord] = {
                p.token_hash: p for p in snapshot.producers.values()
            }
            holders.update((c.token_hash, c) for c in snapshot.consumers.values())
            self._holders, self._holders_of = holders, (id(snapshot), snapshot.version)
        return self._holders


def _ticket_for(credential: Credential, client_id: str) -> Credential:
    """A ticket's consumer, if the call is of the ticket's client; other credentials as they are."""
    if not isinstance(credential, TicketHolder):
        return credential
    if credential.client_id != client_id:
        raise Forbidden("the stream ticket is another client's", field="clientId")
    return credential.consumer


def _own(credential: Credential, kind: type[Holder], name: str) -> Holder:
    """The producer or consumer `name`, if `credential` is its own token. Any other known token
    is refused (403) alike whether `name` exists or not, so names cannot be probed."""
    what = "producer" if kind is ProducerRecord else "consumer"
    if credential is ADMIN:
        raise Forbidden(f"the admin token is not {what} {name}'s: use its own token", field="Authorization")
    if not isinstance(credential, kind) or credential.name != name:
        raise Forbidden(f"the token is not {what} {name}'s", field="Authorization")
    return credential
