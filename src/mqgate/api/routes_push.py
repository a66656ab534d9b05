"""A push consumer's state and its signing secret's rotation (issue 31, docs/PUSH.md)."""

from __future__ import annotations

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.errors import BadRequest
from mqgate.model import MODE_PUSH
from mqgate.push.config import PushConfig, decode_config, encode_config, rotated
from mqgate.push.service import PushService
from mqgate.push.signing import new_secret
from mqgate.registry.records import ConsumerRecord
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


class PushRoutes:
    def __init__(self, gateway: Gateway, push: PushService) -> None:
        self.gw = gateway
        self.push = push

    async def _push_consumer(self, name: str) -> tuple[ConsumerRecord, PushConfig]:
        c = await self.gw.topology.consumer(name)
        config = decode_config(c.push) if c.mode == MODE_PUSH else None
        if config is None:
            raise BadRequest(f"consumer {name} is a {c.mode} consumer, not a push one", field="name")
        return c, config

    async def status(self, req: Request) -> Response:
        inp: s.NamedIn = req.input
        c, config = await self._push_consumer(inp.name)
        attempts = list(reversed(self.push.attempts.get(c.name, ())))
        state = "idle" if not attempts else "ok" if attempts[0].outcome == "ok" else "failing"
        return Response(
            a.PushStatusOut(
                name=c.name,
                endpoint=config.endpoint,
                headers=sorted(config.headers),
                max_in_flight=config.max_in_flight,
                timeout_s=config.timeout_s,
                ordering=config.ordering,
                backoff_initial_ms=config.backoff_initial_ms,
                backoff_max_ms=config.backoff_max_ms,
                envelope=config.envelope,
                previous_secret_until=config.previous_until_ms if config.sealed_previous else 0,
                state=state,
                attempts=[
                    a.PushAttemptOut(
                        at=t.at_ms,
                        message_id=t.msg_id,
                        attempt=t.attempt,
                        outcome=t.outcome,
                        latency_ms=round(t.latency_ms, 3),
                        error=t.error,
                    )
                    for t in attempts
                ],
            )
        )

    async def rotate(self, req: Request) -> Response:
        inp: s.NamedIn = req.input
        c, config = await self._push_consumer(inp.name)
        secret = new_secret()
        changed = rotated(config, c.name, self.gw.ctx.secret, secret, now_ms())
        await self.gw.topology.update_consumer(c.name, push=encode_config(changed))
        return Response(
            a.PushSecretOut(
                name=c.name, signing_secret=secret, previous_secret_until=changed.previous_until_ms
            )
        )

    def routes(self) -> list[Route]:
        path = "/admin/consumers/{name}/push"
        return [
            Route("GET", path, self.status, "admin",
                  "A push consumer's settings and this gateway's latest delivery attempts",
                  s.NamedIn, a.PushStatusOut, (400, 404)),
            Route("POST", path + "/rotate-secret", self.rotate, "admin",
                  "A new signing secret for a push consumer; the old one signs too for 24 hours",
                  s.NamedIn, a.PushSecretOut, (400, 404)),
        ]  # fmt: skip
