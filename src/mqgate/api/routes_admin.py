"""Administration: topics, producers and consumers (SPEC G2) and their operation (SPEC G9)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final

import msgspec

from mqgate.api import answers as a
from mqgate.api import shapes as s
from mqgate.api.limits import SettingsLimits
from mqgate.api.paging import KeyInt, KeyText, Paging
from mqgate.api.push_settings import push_settings
from mqgate.errors import BadRequest, NotFound
from mqgate.names import INTERNAL_PREFIXES, TRACE_PREFIX
from mqgate.registry.records import DEFAULT_PROJECT, ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.services.gateway import Gateway
from mqgate.services.topology import REVOKED
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

# A row of a consumer's progress: its clientId ("" for a cluster consumer) and its position
# among that client's rows.
_PROGRESS_KEY: Final = (KeyText, KeyInt)


def topic_out(t: TopicRecord) -> a.TopicOut:
    return msgspec.convert(t, a.TopicOut, from_attributes=True)


def consumer_out(c: ConsumerRecord) -> a.ConsumerOut:
    return a.ConsumerOut(
        name=c.name,
        topic=c.topic,
        mode=c.mode,
        paused=c.paused,
        rate_limit=c.rate_limit_per_s,
        alert_backlog=c.alert_backlog,
        lock_timeout_s=c.lock_timeout_s,
        max_attempts=c.max_attempts,
        token_revoked=c.token_hash == REVOKED,
    )


def producer_out(p: ProducerRecord) -> a.ProducerListedOut:
    return a.ProducerListedOut(
        name=p.name, topic=p.topic, destinations=p.allowed(), token_revoked=p.token_hash == REVOKED
    )


def out(value: Any, shape: type[a.Output]) -> Any:
    """A service's answer (a dataclass) as its wire shape."""
    return msgspec.convert(value, shape, from_attributes=True)


class AdminRoutes:
    def __init__(
        self,
        gateway: Gateway,
        limits: SettingsLimits,
        stranded: Callable[[str], Awaitable[Sequence[object]]] | None = None,
    ) -> None:
        self.gw = gateway
        self.limits = limits
        self.stranded = stranded  # a consumer's backlog on clusters its project left (failover)
        self.paging = Paging(gateway.ctx.settings.max_answer_bytes)

    async def create_topic(self, req: Request) -> Response:
        inp: s.TopicIn = req.input
        if inp.name.startswith(INTERNAL_PREFIXES):
            raise BadRequest(f"topic names starting with {inp.name[0]} are the gateway's own", field="name")
        rec = await self.gw.topology.create_topic(
            inp.name,
            inp.queues or self.limits.default(s.TopicIn, "queues"),
            inp.retention_ms or self.limits.default(s.TopicIn, "retention_ms"),
            inp.retention_bytes or None,
            inp.max_priority,
            project=inp.project or DEFAULT_PROJECT,
        )
        return Response(topic_out(rec))

    async def change_topic(self, req: Request) -> Response:
        inp: s.TopicChangeIn = req.input
        rec = await self.gw.topology.change_topic(
            inp.name,
            queues=inp.queues,
            max_priority=inp.max_priority,
            retention_ms=inp.retention_ms,
            retention_bytes=inp.retention_bytes,
        )
        return Response(topic_out(rec))

    async def show_topic(self, req: Request) -> Response:
        return Response(topic_out(await self.gw.topology.topic(req.input.name)))

    async def delete_topic(self, req: Request) -> Response:
        await self.gw.topology.delete_topic(req.input.name)
        return Response(a.DeletedOut(name=req.input.name, deleted=True))

    async def delete_producer(self, req: Request) -> Response:
        await self.gw.topology.delete_producer(req.input.name)
        return Response(a.DeletedOut(name=req.input.name, deleted=True))

    async def delete_consumer(self, req: Request) -> Response:
        inp: s.ConsumerDeleteIn = req.input
        await self.gw.topology.delete_consumer(inp.name, inp.keep_dead_letters)
        return Response(a.DeletedOut(name=inp.name, deleted=True))

    async def list_topics(self, req: Request) -> Response:
        inp: s.TopicsIn = req.input
        registry = self.gw.ctx.registry
        topics: Iterable[TopicRecord] = registry.snapshot.topics.values()
        if inp.project is not None:
            project = inp.project
            if registry.project(project) is None:
                raise NotFound(f"project {project} does not exist", field="project")
            topics = [t for t in registry.topics_in(project) if t.name != TRACE_PREFIX + project]
        found, nxt = self.paging.listing(req.input, "topics", topics, lambda t: (t.name,), topic_out)
        return Response(a.TopicsOut(topics=found, next=nxt))

    async def register_producer(self, req: Request) -> Response:
        inp: s.ProducerIn = req.input
        rec, token = await self.gw.topology.register_producer(inp.name, inp.topic, inp.destinations)
        return Response(
            a.ProducerOut(name=rec.name, topic=rec.topic, destinations=rec.allowed(), token=token)
        )

    async def register_consumer(self, req: Request) -> Response:
        inp: s.ConsumerIn = req.input
        push, secret = await push_settings(inp, self.gw.ctx.secret, self.gw.ctx.settings)
        rec, token = await self.gw.topology.register_consumer(
            inp.name,
            inp.topic,
            inp.mode,
            inp.start,
            inp.lock_timeout_s or self.limits.default(s.ConsumerIn, "lock_timeout_s"),
            inp.max_attempts or self.limits.default(s.ConsumerIn, "max_attempts"),
            push=push,
        )
        return Response(
            a.ConsumerRegisteredOut(
                name=rec.name,
                topic=rec.topic,
                mode=rec.mode,
                start=rec.start,
                token=token,
                signing_secret=secret,
            )
        )

    async def list_consumers(self, req: Request) -> Response:
        consumers = self.gw.ctx.registry.snapshot.consumers.values()
        found, nxt = self.paging.listing(req.input, "consumers", consumers, lambda c: (c.name,), consumer_out)
        return Response(a.ConsumersOut(consumers=found, next=nxt))

    async def list_producers(self, req: Request) -> Response:
        producers = self.gw.ctx.registry.snapshot.producers.values()
        found, nxt = self.paging.listing(req.input, "producers", producers, lambda p: (p.name,), producer_out)
        return Response(a.ProducersOut(producers=found, next=nxt))

    async def change_consumer(self, req: Request) -> Response:
        inp: s.ConsumerSettingsIn = req.input
        changes = {"lock_timeout_s": inp.lock_timeout_s, "max_attempts": inp.max_attempts}
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            raise BadRequest("name a setting to change: lockTimeoutS or maxAttempts", field="body")
        return Response(consumer_out(await self.gw.topology.update_consumer(inp.name, **changes)))

    def _token_routes(self, kind: str) -> list[Route]:
        """A new token (`POST …/token`) and a revoked one (`DELETE …/token`) for producers or
        consumers."""

        async def issue(req: Request) -> Response:
            rec, token = await self.gw.topology.new_token(kind, req.input.name)
            return Response(a.TokenOut(name=rec.name, token=token))

        async def revoke(req: Request) -> Response:
            rec = await self.gw.topology.revoke_token(kind, req.input.name)
            return Response(a.TokenOut(name=rec.name, token=None))

        path = f"/admin/{kind}s/{{name}}/token"
        issued = f"Issue a new token to a {kind} (shown once); the old one is refused from now on"
        revoked = f"Revoke a {kind}'s token: refused until a new one is issued"
        return [
            Route("POST", path, issue, "admin", issued, s.NamedIn, a.TokenOut, (404,)),
            Route("DELETE", path, revoke, "admin", revoked, s.NamedIn, a.TokenOut, (404,)),
        ]

    async def progress(self, req: Request) -> Response:
        """A consumer's progress, its `queues` paged: a broadcast consumer has a row per clientId
        and queue. In clientId order, each client's queues in the order progress gives them;
        the totals (`lag`, `deadLettered`) are over every row."""
        inp: s.ProgressIn = req.input
        progress: a.ProgressOut = out(await self.gw.operations.progress(inp.name), a.ProgressOut)
        self._page_progress(inp, progress)
        if self.stranded is not None:
            progress.stranded = [out(s, a.StrandedOut) for s in await self.stranded(inp.name)]
        return Response(progress)

    def _page_progress(self, inp: s.ProgressIn, progress: a.ProgressOut) -> None:
        """Keep a page of `progress.queues`, with the cursor of the next."""
        by_client: dict[str, list[a.QueueProgressOut]] = {}
        for q in progress.queues:
            by_client.setdefault(q.client_id or "", []).append(q)
        rows = [((client, i), q) for client, qs in by_client.items() for i, q in enumerate(qs)]
        progress.queues, progress.next = self.paging.listing(
            inp, "progress", rows, lambda r: r[0], lambda r: r[1], _PROGRESS_KEY
        )

    async def reset(self, req: Request) -> Response:
        inp: s.ResetIn = req.input
        outcome = await self.gw.operations.reset(
            inp.name,
            inp.to,
            offset=inp.offset,
            timestamp_ms=inp.timestamp,
            queue=inp.queue,
            client_id=inp.client_id,
        )
        # The progress after it as its first page (`next` goes on with GET .../progress), and
        # the first of the offsets that were clamped: a broadcast consumer has a row per clientId.
        progress = out(outcome.progress, a.ProgressOut)
        self._page_progress(s.ProgressIn(name=inp.name), progress)
        clamped = self.paging.fitting((out(c, a.ClampedOut) for c in outcome.clamped), a.CLAMPED_NAMED)
        return Response(
            a.ResetOut(
                **msgspec.structs.asdict(progress), clamped=clamped, clamped_count=len(outcome.clamped)
            )
        )

    async def pause(self, req: Request) -> Response:
        c = await self.gw.topology.update_consumer(req.input.name, paused=True)
        return Response(a.PausedOut(name=c.name, paused=c.paused))

    async def resume(self, req: Request) -> Response:
        c = await self.gw.topology.update_consumer(req.input.name, paused=False)
        return Response(a.PausedOut(name=c.name, paused=c.paused))

    async def rate_limit(self, req: Request) -> Response:
        inp: s.RateLimitIn = req.input
        c = await self.gw.topology.update_consumer(inp.name, rate_limit_per_s=inp.messages_per_second)
        return Response(a.RateLimitOut(name=c.name, messages_per_second=c.rate_limit_per_s))

    async def alert(self, req: Request) -> Response:
        inp: s.AlertIn = req.input
        c = await self.gw.topology.update_consumer(inp.name, alert_backlog=inp.backlog)
        return Response(a.AlertSetOut(name=c.name, backlog=c.alert_backlog))

    def routes(self) -> list[Route]:
        consumer = "/admin/consumers/{name}"
        return [
            Route(
                "POST",
                "/admin/topics",
                self.create_topic,
                "admin",
                "Create a topic",
                s.TopicIn,
                a.TopicOut,
                (404, 409, 507),
            ),
            Route(
                "GET",
                "/admin/topics",
                self.list_topics,
                "admin",
                "List topics (paged), or a project's",
                s.TopicsIn,
                a.TopicsOut,
                (404,),
                body="none",
            ),
            Route(
                "GET",
                "/admin/topics/{name}",
                self.show_topic,
                "admin",
                "Show a topic",
                s.TopicNameIn,
                a.TopicOut,
                (404,),
                body="none",
            ),
            Route(
                "PATCH",
                "/admin/topics/{name}",
                self.change_topic,
                "admin",
                "Grow a topic (queues, priority lanes) or change its retention, live",
                s.TopicChangeIn,
                a.TopicOut,
                (404, 507),
            ),
            Route(
                "DELETE",
                "/admin/topics/{name}",
                self.delete_topic,
                "admin",
                "Delete a topic and its messages (refused while producers or consumers use it)",
                s.TopicNameIn,
                a.DeletedOut,
                (404, 409),
                body="none",
            ),
            Route(
                "DELETE",
                "/admin/producers/{name}",
                self.delete_producer,
                "admin",
                "Delete a producer: its token is refused from now on; its messages stay",
                s.NamedIn,
                a.DeletedOut,
                (404,),
                body="none",
            ),
            Route(
                "DELETE",
                consumer,
                self.delete_consumer,
                "admin",
                "Delete a consumer: its offsets, retry queue, inbox and (unless kept) dead letters",
                s.ConsumerDeleteIn,
                a.DeletedOut,
                (404, 507),
                body="none",
            ),
            Route(
                "POST",
                "/admin/producers",
                self.register_producer,
                "admin",
                "Register a producer; its token is shown once (SPEC G2)",
                s.ProducerIn,
                a.ProducerOut,
                (404, 409),
            ),
            Route(
                "POST",
                "/admin/consumers",
                self.register_consumer,
                "admin",
                "Register a consumer; its token is shown once (SPEC G2)",
                s.ConsumerIn,
                a.ConsumerRegisteredOut,
                (404, 409, 507),
            ),
            Route(
                "GET",
                "/admin/consumers",
                self.list_consumers,
                "admin",
                "List consumers (paged)",
                s.PageIn,
                a.ConsumersOut,
                body="none",
            ),
            Route(
                "GET",
                "/admin/producers",
                self.list_producers,
                "admin",
                "List producers (paged)",
                s.PageIn,
                a.ProducersOut,
                body="none",
            ),
            Route(
                "PATCH",
                consumer,
                self.change_consumer,
                "admin",
                "Change a consumer's lock timeout or max attempts (from its next pull)",
                s.ConsumerSettingsIn,
                a.ConsumerOut,
                (404,),
            ),
            Route(
                "GET",
                consumer + "/progress",
                self.progress,
                "admin",
                "Per-queue progress, lag, locks and dead letters of a consumer (SPEC G9; queues paged)",
                s.ProgressIn,
                a.ProgressOut,
                (404,),
                body="none",
            ),
            Route(
                "POST",
                consumer + "/reset",
                self.reset,
                "admin",
                "Reset committed offsets: re-consume or skip backlog (SPEC G9)",
                s.ResetIn,
                a.ResetOut,
                (404, 507),
            ),
            Route(
                "POST",
                consumer + "/pause",
                self.pause,
                "admin",
                "Pause a consumer",
                s.NamedIn,
                a.PausedOut,
                (404,),
            ),
            Route(
                "POST",
                consumer + "/resume",
                self.resume,
                "admin",
                "Resume a consumer",
                s.NamedIn,
                a.PausedOut,
                (404,),
            ),
            Route(
                "POST",
                consumer + "/rate-limit",
                self.rate_limit,
                "admin",
                "Limit a consumer's pull rate",
                s.RateLimitIn,
                a.RateLimitOut,
                (404,),
            ),
            Route(
                "POST",
                consumer + "/alert",
                self.alert,
                "admin",
                "Alert when a consumer's backlog passes a threshold",
                s.AlertIn,
                a.AlertSetOut,
                (404,),
            ),
            *self._token_routes("producer"),
            *self._token_routes("consumer"),
        ]  # GET /admin/alerts: routes_alerts.py
