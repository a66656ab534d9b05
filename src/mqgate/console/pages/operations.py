"""The overview and a consumer's page: progress per queue, reset with a confirmation that says
how many messages it skips or replays, pause and resume, rate limit, alert threshold (SPEC G9)."""

from __future__ import annotations

import asyncio
import heapq
import time
from datetime import datetime
from typing import Any, Final

import msgspec

from mqgate.alerts.service import ActiveAlert
from mqgate.console.app import Console, now_ms, principal, route
from mqgate.console.pages.charts import SPANS, charts
from mqgate.console.pages.common import consumer_for, plain, visible_consumers
from mqgate.console.pages.common import visible_topics as topics_of
from mqgate.errors import BadRequest, MqgateError
from mqgate.model import MODE_PUSH
from mqgate.offsets.interface import OffsetEntry
from mqgate.push.config import decode_config
from mqgate.registry.records import ConsumerRecord
from mqgate.services.operations import RESET_TARGETS, ConsumerProgress
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

# The overview reads the progress of at most this many consumers (each a few store reads): the
# ones with the most lag by the gauges the gateway keeps (Operations.keep_lag_gauges).
OVERVIEW_CONSUMERS = 25
GAUGES_FRESH_S = 1.0


class Move(msgspec.Struct, frozen=True):
    """What a reset does to one queue: from the committed offset to the target."""

    client_id: str | None
    source: str
    queue: int
    committed: int
    target: int

    @property
    def skipped(self) -> int:
        return max(self.target - self.committed, 0)

    @property
    def replayed(self) -> int:
        return max(self.committed - self.target, 0)


def parse_time(text: str) -> int:
    """Epoch milliseconds, or an ISO date-time (UTC unless it says otherwise)."""
    if text.isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise BadRequest("time must be epoch milliseconds or an ISO date-time", field="timestamp") from None
    if moment.tzinfo is None:
        from datetime import UTC

        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def active_alerts(c: Console, consumers: set[str]) -> list[ActiveAlert]:
    return [a for a in c.alerts.active if a.consumer in consumers] if c.alerts is not None else []


def gauged_lags(c: Console) -> dict[str, float]:
    """Every consumer's lag as the gateway's gauges have it (refreshed by a pass over every
    consumer, and at once after an ack; a produce shows at the next pass), read at most once a
    second: they only rank the consumers, whose figures are then read."""
    cached = c.cache.get("lag_gauges")
    if cached is not None and time.monotonic() - cached[0] < GAUGES_FRESH_S:
        found: dict[str, float] = cached[1]
        return found
    found = {s.labels["consumer"]: s.value for f in c.gateway.ctx.metrics.lag.collect() for s in f.samples}
    c.cache["lag_gauges"] = (time.monotonic(), found)
    return found


async def overview_figures(c: Console, v: Request) -> dict[str, Any]:
    """What the overview's live part shows: active alerts, and the consumers with the most lag
    (ranked by the gauges, their figures read now)."""
    ops = c.gateway.operations
    consumers = visible_consumers(c, v)
    lags = gauged_lags(c)
    # The first of sorted(...) without sorting thousands: by name where equal (stable, as sorted).
    shown = heapq.nsmallest(OVERVIEW_CONSUMERS, consumers, key=lambda x: -lags.get(x.name, 0.0))
    progress = await asyncio.gather(*(ops.progress(x.name) for x in shown), return_exceptions=True)
    rows = [(x, p) for x, p in zip(shown, progress, strict=True) if isinstance(p, ConsumerProgress)]
    rows.sort(key=lambda row: (-row[1].lag, row[0].name))
    return {
        "rows": rows,
        "more": len(consumers) - len(shown),
        "total_consumers": len(consumers),
        "total_lag": int(sum(lags.get(x.name, 0.0) for x in consumers)),
        "alerts": active_alerts(c, {x.name for x in consumers}),
        "checking": c.alerts is not None,
        "checked_ms": c.alerts.checked_ms if c.alerts is not None else 0,
    }


async def consumer_figures(c: Console, v: Request) -> dict[str, Any]:
    """What a consumer's live part shows: its state, lag and progress per queue, its alerts."""
    rec, project = await consumer_for(c, v)
    progress = await c.gateway.operations.progress(rec.name)
    return {"c": rec, "p": progress, "project": project, "alerts": active_alerts(c, {rec.name}),
            "expires": await lock_deadlines(c, progress), "now": now_ms()}  # fmt: skip


async def lock_deadlines(c: Console, progress: ConsumerProgress) -> list[int | None]:
    """When each held lock of `progress.queues` runs out (None: not held), read from the
    consumer's tables as `Operations.progress` lists them (each client's entries in order), so
    the consumer page says "expires in 34.9 s" as the topic page does."""
    offsets = c.gateway.ctx.offsets
    tables: dict[str, list[OffsetEntry]] = {}
    seen: dict[str, int] = {}
    found: list[int | None] = []
    for q in progress.queues:
        client = q.client_id or ""
        if client not in tables:
            try:
                tables[client] = await offsets.table(progress.consumer, client) or []
            except MqgateError:
                tables[client] = []
        i = seen[client] = seen.get(client, -1) + 1
        entry = tables[client][i] if i < len(tables[client]) else None
        found.append(entry.lock_deadline_ms if q.locked and entry is not None else None)
    return found


PUSH_ATTEMPTS_SHOWN: Final = 20


def push_view(c: Console, rec: ConsumerRecord) -> dict[str, Any] | None:
    """A push consumer's endpoint, its state and this gateway's latest attempts (docs/PUSH.md)."""
    push = c.platform.push
    if rec.mode != MODE_PUSH or push is None:
        return None
    config = decode_config(rec.push)
    attempts = push.latest(rec.name, PUSH_ATTEMPTS_SHOWN)
    failed = sum(1 for a in attempts if a.outcome != "ok")
    state = "idle" if not attempts else "ok" if attempts[0].outcome == "ok" else "failing"
    return {"config": config, "attempts": attempts, "failed": failed, "state": state}


class OperationsPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def overview(self, v: Request) -> Response:
        span = v.arg("range", "hour")
        return self.c.page(
            v,
            "overview.html",
            charts=await charts(self.c, span),
            span=span,
            spans=SPANS,
            topics=topics_of(self.c, v),
            **await overview_figures(self.c, v),
        )

    async def _consumer(self, v: Request, change: bool) -> tuple[ConsumerRecord, str]:
        return await consumer_for(self.c, v, change)

    async def consumer(self, v: Request) -> Response:
        from mqgate.console.pages.topic import consumer_charts  # topic.py reads messages.py, which reads this

        figures = await consumer_figures(self.c, v)
        span = v.arg("range", "hour")
        if span not in SPANS:
            raise BadRequest(f"range must be one of {', '.join(SPANS)}", field="range")
        rec = figures["c"]
        topic = self.c.gateway.ctx.registry.snapshot.topics.get(rec.topic)
        return self.c.page(
            v,
            "consumer.html",
            push=push_view(self.c, rec),
            can_change=principal(v).can_change(figures["project"]),
            targets=RESET_TARGETS,
            charts=await consumer_charts(self.c, topic, rec, span) if topic is not None else [],
            span=span,
            spans=SPANS,
            **figures,
        )

    def _reset_args(self, v: Request) -> dict[str, Any]:
        to = v.arg("to")
        if to not in RESET_TARGETS:
            raise BadRequest("to must be earliest, latest, offset or timestamp", field="to")
        offset = v.int_arg("offset") if to == "offset" else None
        timestamp = parse_time(v.arg("timestamp")) if to == "timestamp" else None
        if to == "offset" and offset is None:
            raise BadRequest("give the offset to reset to", field="offset")
        if to == "timestamp" and timestamp is None:
            raise BadRequest("give the time to reset to", field="timestamp")
        return {"to": to, "offset": offset, "timestamp_ms": timestamp, "queue": v.int_arg("queue")}

    async def plan(self, rec: ConsumerRecord, args: dict[str, Any]) -> list[Move]:
        progress = await self.c.gateway.operations.progress(rec.name)
        store = self.c.gateway.ctx.store
        moves = []
        for q in progress.queues:
            if args["queue"] is not None and (q.source != rec.topic or q.queue != args["queue"]):
                continue
            to = args["to"]
            if to == "earliest":
                target = q.min
            elif to == "latest":
                target = q.max
            elif to == "offset":
                target = min(max(args["offset"], q.min), q.max)
            else:
                target = await store.offset_for_time(q.source, q.queue, args["timestamp_ms"])
            moves.append(Move(q.client_id, q.source, q.queue, max(q.committed, q.min), target))
        return moves

    async def reset_preview(self, v: Request) -> Response:
        rec, _ = await self._consumer(v, change=True)
        args = self._reset_args(v)
        moves = await self.plan(rec, args)
        return self.c.page(
            v,
            "reset_confirm.html",
            c=rec,
            args=args,
            raw={k: v.arg(k) for k in ("to", "offset", "timestamp", "queue")},
            moves=moves,
            skipped=sum(m.skipped for m in moves),
            replayed=sum(m.replayed for m in moves),
        )

    async def reset(self, v: Request) -> Response:
        rec, project = await self._consumer(v, change=True)
        if v.arg("confirmed") != "yes":
            raise BadRequest("a reset needs its confirmation: use the preview", field="confirmed")
        args = self._reset_args(v)
        before = await self.c.gateway.operations.progress(rec.name)
        outcome = await self.c.gateway.operations.reset(
            rec.name,
            args["to"],
            offset=args["offset"],
            timestamp_ms=args["timestamp_ms"],
            queue=args["queue"],
            client_id=None,
        )
        committed = [(q.client_id, q.source, q.queue, q.committed) for q in before.queues]
        after = [(q.client_id, q.source, q.queue, q.committed) for q in outcome.progress.queues]
        await self.c.audit_change(
            v, "consumer.reset", rec.name, project, {"committed": committed}, {"committed": after, **args}
        )
        return redirect(self.c.url(f"/consumers/{rec.name}?note=offsets reset to {args['to']}"))

    async def _update(self, v: Request, action: str, **changes: Any) -> Response:
        rec, project = await self._consumer(v, change=True)
        after = await self.c.gateway.topology.update_consumer(rec.name, **changes)
        await self.c.audit_change(v, f"consumer.{action}", rec.name, project, plain(rec), plain(after))
        return redirect(self.c.url(f"/consumers/{rec.name}?note={action} done"))

    async def pause(self, v: Request) -> Response:
        return await self._update(v, "pause", paused=True)

    async def resume(self, v: Request) -> Response:
        return await self._update(v, "resume", paused=False)

    async def rate_limit(self, v: Request) -> Response:
        rate = v.float_arg("messages_per_second", 0.0) or 0.0
        if rate < 0:
            raise BadRequest("the rate limit is 0 (none) or more", field="messages_per_second")
        return await self._update(v, "rate-limit", rate_limit_per_s=rate)

    async def alert(self, v: Request) -> Response:
        backlog = v.int_arg("backlog", 0) or 0
        if backlog < 0:
            raise BadRequest("the alert threshold is 0 (none) or more", field="backlog")
        return await self._update(v, "alert", alert_backlog=backlog)

    def routes(self) -> list[Route]:
        one = "/consumers/{name}"
        return [
            route("GET", "/", self.overview),
            route("GET", one, self.consumer),
            route("POST", one + "/reset/preview", self.reset_preview),
            route("POST", one + "/reset", self.reset),
            route("POST", one + "/pause", self.pause),
            route("POST", one + "/resume", self.resume),
            route("POST", one + "/rate-limit", self.rate_limit),
            route("POST", one + "/alert", self.alert),
        ]
