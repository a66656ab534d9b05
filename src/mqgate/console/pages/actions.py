"""Actions on a topic or a consumer that change what consumers get (issue 29): send a test
message through the gateway's produce path as one of the topic's producers, and purge a
topic's queue or a consumer's backlog after a plan that counts what it skips, confirmed by
typing the name. The API's shapes and limits check the input (api/shapes.py, the settings'
limits), and the services do the work (Producing.produce, Operations.purge)."""

from __future__ import annotations

import heapq
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from mqgate.api.decoding import convert
from mqgate.api.limits import SettingsLimits
from mqgate.api.shapes import MAX_ITEM_CHARS, ProduceIn
from mqgate.console.app import Console, principal, route
from mqgate.console.pages.common import consumer_for, require_change, snapshot
from mqgate.console.pages.operations import parse_time
from mqgate.console.pages.topic import by_topic, missing
from mqgate.console.projects import topic_project
from mqgate.errors import BadRequest, MqgateError
from mqgate.names import INTERNAL_PREFIXES
from mqgate.registry.records import ProducerRecord, TopicRecord
from mqgate.services.operations import PurgePlan
from mqgate.web.request import Request
from mqgate.web.response import Response, redirect
from mqgate.web.route import Route

# The send form's fields, as the produce API names them (errors name these).
SEND_FIELDS: Final = ("producer", "message", "keys", "tags", "properties", "orderKey", "delayMs",
                      "deliverAt", "ttlMs", "priority")  # fmt: skip


def lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def parse_properties(text: str) -> dict[str, str]:
    """`name=value`, one a line (a value may hold `=`; the API's limits apply after)."""
    found: dict[str, str] = {}
    for i, line in enumerate(lines(text), 1):
        name, sep, value = line.partition("=")
        if not sep or not name.strip():
            raise BadRequest(f"properties line {i} is not name=value", field="properties")
        found[name.strip()] = value.strip()
    return found


def send_input(c: Console, v: Request) -> ProduceIn:
    """The form as the produce API's request, checked by its shape and the settings' limits."""
    body = v.args("message")
    fields: dict[str, Any] = {
        "producer": v.arg("producer"),
        "message": body[0] if body else "",  # as typed: not stripped
        "keys": lines(v.arg("keys")),
        "tags": lines(v.arg("tags")),
        "properties": parse_properties(v.args("properties")[0] if v.args("properties") else ""),
        "orderKey": v.arg("orderKey") or None,
        "delayMs": v.arg("delayMs"),
        "ttlMs": v.arg("ttlMs"),
        "priority": v.arg("priority"),
    }
    if not fields["message"]:
        raise BadRequest("message is required", field="message")
    at = v.arg("deliverAt")
    if at:
        try:
            fields["deliverAt"] = parse_time(at)
        except BadRequest:
            raise BadRequest(
                "deliverAt must be epoch milliseconds or an ISO date-time", field="deliverAt"
            ) from None
    value = convert({k: x for k, x in fields.items() if x is not None}, ProduceIn)
    SettingsLimits(c.settings).check(value)
    return value


MOVES_SHOWN: Final = 200  # moves a purge's preview lists (the largest); every one is in its totals
CONSUMERS_SHOWN: Final = 200


class ActionPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    def _topic(self, v: Request) -> tuple[TopicRecord, str]:
        """The topic the path names, if the user may change its project; one the user may not
        see answers as one that does not exist (its name and project stay hidden)."""
        name = v.params["name"]
        t = snapshot(self.c).topics.get(name)
        if t is None or name.startswith(INTERNAL_PREFIXES) or not principal(v).can_view(topic_project(t)):
            raise missing(name)
        project = topic_project(t)
        require_change(v, project)
        return t, project

    def _producers(self, t: TopicRecord) -> list[ProducerRecord]:
        """The producers whose own topic this is: a produce goes to the producer's topic, so one
        that only lists it among its destinations would write elsewhere."""
        return sorted(by_topic(self.c).producers.get(t.name, []), key=lambda p: p.name)

    # --- send ---------------------------------------------------------------------------

    def _send_page(
        self, v: Request, t: TopicRecord, status: int = 200, error: MqgateError | None = None
    ) -> Response:
        values = {name: (v.args(name)[0] if v.args(name) else "") for name in SEND_FIELDS}
        sent = {k: v.query.get(k, [""])[0] for k in ("sent", "status", "queue", "offset", "deliver")}
        return self.c.page(
            v,
            "send.html",
            status,
            t=t,
            producers=self._producers(t),
            values=values,
            error=error,
            sent=sent,
            limit=self.c.settings.max_message_bytes,
            item_chars=MAX_ITEM_CHARS,
        )

    async def send_form(self, v: Request) -> Response:
        t, _ = self._topic(v)
        return self._send_page(v, t)

    async def send(self, v: Request) -> Response:
        t, project = self._topic(v)
        try:
            value = send_input(self.c, v)
            producer = snapshot(self.c).producers.get(value.producer)
            if producer is None or producer.topic != t.name:
                raise BadRequest(f"choose a producer of {t.name}", field="producer")
            (receipt, *_) = await self.c.gateway.producing.produce(producer, [value])
        except MqgateError as exc:
            if exc.http_status >= 500:
                raise
            return self._send_page(v, t, exc.http_status, exc)  # the form kept, the field named
        request = msgspec.to_builtins(value)
        request["message"] = request["message"][:1000]
        await self.c.audit_change(
            v,
            "topic.send",
            t.name,
            project,
            after={"request": request, "receipt": msgspec.to_builtins(receipt)},
        )
        r = receipt
        query = {
            "sent": r.msg_id,
            "status": r.status,
            "queue": r.queue,
            "offset": r.offset,
            "deliver": r.deliver_at,
        }
        kept = urlencode({k: x for k, x in query.items() if x is not None})
        return redirect(self.c.url(f"/topics/{t.name}/send?{kept}"))

    # --- purge --------------------------------------------------------------------------

    def _purge_page(self, v: Request, plan: PurgePlan, kind: str, name: str, action: str) -> Response:
        per_queue: dict[tuple[str, int], int] = {}
        per_consumer: dict[str, int] = {}
        for m in plan.moves:
            per_queue[(m.source, m.queue)] = per_queue.get((m.source, m.queue), 0) + m.skipped
            per_consumer[m.consumer] = per_consumer.get(m.consumer, 0) + m.skipped
        grid = snapshot(self.c).topics[plan.topic].grid
        # A topic of thousands of queues and consumers plans millions of moves: the page shows
        # the largest, and the totals of all of them.
        moves = heapq.nlargest(MOVES_SHOWN, plan.moves, key=lambda m: m.skipped)
        return self.c.page(
            v,
            "purge_confirm.html",
            plan=plan,
            moves=moves,
            consumers_shown=CONSUMERS_SHOWN,
            kind=kind,
            name=name,
            action=action,
            per_queue=sorted(per_queue.items()),
            per_consumer=heapq.nlargest(CONSUMERS_SHOWN, per_consumer.items(), key=lambda kv: (kv[1], kv[0])),
            consumer_count=len(per_consumer),
            queues=range(grid.size),
            can_change=principal(v).can_change(topic_project(snapshot(self.c).topics[plan.topic])),
        )

    async def topic_purge_preview(self, v: Request) -> Response:
        t, _ = self._topic(v)
        plan = await self.c.gateway.operations.purge_plan(topic=t.name, queue=v.int_arg("queue"))
        return self._purge_page(v, plan, "topic", t.name, self.c.url(f"/topics/{t.name}/purge"))

    async def topic_purge(self, v: Request) -> Response:
        t, project = self._topic(v)
        plan = await self.c.gateway.operations.purge(
            topic=t.name, queue=v.int_arg("queue"), confirm=v.arg("confirm")
        )
        await self.c.audit_change(v, "topic.purge", t.name, project, after=purge_entry(plan))
        return redirect(self.c.url(f"/topics/{t.name}/purge?{purge_note(plan)}"))

    async def consumer_purge_preview(self, v: Request) -> Response:
        rec, _ = await consumer_for(self.c, v, change=True)
        plan = await self.c.gateway.operations.purge_plan(consumer=rec.name, queue=v.int_arg("queue"))
        return self._purge_page(v, plan, "consumer", rec.name, self.c.url(f"/consumers/{rec.name}/purge"))

    async def consumer_purge(self, v: Request) -> Response:
        rec, project = await consumer_for(self.c, v, change=True)
        queue = v.int_arg("queue")
        plan = await self.c.gateway.operations.purge(consumer=rec.name, queue=queue, confirm=v.arg("confirm"))
        await self.c.audit_change(v, "consumer.purge", rec.name, project, after=purge_entry(plan))
        return redirect(self.c.url(f"/consumers/{rec.name}/purge?{purge_note(plan)}"))

    def routes(self) -> list[Route]:
        return [
            route("GET", "/topics/{name}/send", self.send_form),
            route("POST", "/topics/{name}/send", self.send),
            route("GET", "/topics/{name}/purge", self.topic_purge_preview),
            route("POST", "/topics/{name}/purge", self.topic_purge),
            route("GET", "/consumers/{name}/purge", self.consumer_purge_preview),
            route("POST", "/consumers/{name}/purge", self.consumer_purge),
        ]


def purge_entry(plan: PurgePlan) -> dict[str, Any]:
    """What the audit keeps of a purge: its scope, the total, each move (the audit cuts long lists)."""
    moves = [[m.consumer, m.client_id, m.source, m.queue, m.committed, m.end] for m in plan.moves]
    return {"queue": plan.queue, "skipped": plan.skipped, "moves": moves}


def purge_note(plan: PurgePlan) -> str:
    queue = "" if plan.queue is None else f"&queue={plan.queue}"
    return urlencode({"note": f"purged: {plan.skipped} messages skipped"}) + queue
