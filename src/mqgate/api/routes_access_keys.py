"""Access keys (issue 30): issued to a project, listed without their secrets, revoked by name."""

from __future__ import annotations

from mqgate.accesskeys.service import AccessKey, AccessKeys
from mqgate.api import shapes_access_keys as sk
from mqgate.api.paging import Paging
from mqgate.errors import NotFound
from mqgate.services.gateway import Gateway
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


def access_key_out(key: AccessKey) -> sk.AccessKeyOut:
    return sk.AccessKeyOut(
        name=key.name,
        project=key.project,
        account=key.account,
        access_key_id=key.access_key_id,
        created_ms=key.created_ms,
        revoked=key.revoked,
        revoked_ms=key.revoked_ms,
    )


class AccessKeyRoutes:
    def __init__(self, keys: AccessKeys, gateway: Gateway) -> None:
        self.keys = keys
        self.registry = gateway.ctx.registry
        self.paging = Paging(gateway.ctx.settings.max_answer_bytes)

    async def _existing(self, project: str) -> None:
        if self.registry.project(project) is None:
            await self.registry.refresh_on_miss()  # created meanwhile through another gateway
            if self.registry.project(project) is None:
                raise NotFound(f"project {project} does not exist", field="project")

    async def create(self, req: Request) -> Response:
        inp: sk.AccessKeyIn = req.input
        await self._existing(inp.project)
        issued = await self.keys.create(inp.name, inp.project)
        key = issued.key
        return Response(
            sk.AccessKeyCreatedOut(
                name=key.name,
                project=key.project,
                account=key.account,
                access_key_id=key.access_key_id,
                secret_access_key=issued.secret_access_key,
                created_ms=key.created_ms,
            )
        )

    async def listing(self, req: Request) -> Response:
        inp: sk.AccessKeysIn = req.input
        if inp.project is not None:
            await self._existing(inp.project)
        keys = await self.keys.keys(inp.project)
        found, nxt = self.paging.listing(inp, "access-keys", keys, lambda k: (k.name,), access_key_out)
        return Response(sk.AccessKeysOut(access_keys=found, next=nxt))

    async def revoke(self, req: Request) -> Response:
        inp: sk.AccessKeyNameIn = req.input
        return Response(access_key_out(await self.keys.revoke(inp.name)))

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/admin/access-keys", self.create, "admin",
                  "Issue an access key to a project for the SQS API (its secret is shown once)",
                  sk.AccessKeyIn, sk.AccessKeyCreatedOut, (404, 409)),
            Route("GET", "/admin/access-keys", self.listing, "admin",
                  "List access keys, without their secrets (paged)", sk.AccessKeysIn, sk.AccessKeysOut,
                  (404,), body="none"),
            Route("DELETE", "/admin/access-keys/{name}", self.revoke, "admin",
                  "Revoke an access key: its signatures are refused from now on", sk.AccessKeyNameIn,
                  sk.AccessKeyOut, (404,), body="none"),
        ]  # fmt: skip
