"""The message browser (without consuming: by offset, time, key or message id; body as JSON,
text or hex; export as JSON or CSV) and a consumer's dead letters with redrive."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from mqgate.console.app import Console, principal, route
from mqgate.console.pages.common import require_change, require_view, snapshot, visible_topics
from mqgate.console.pages.operations import parse_time
from mqgate.console.projects import project_of, topic_project
from mqgate.errors import BadRequest
from mqgate.model import decode_stored
from mqgate.names import DLQ_PREFIX, dlq_topic
from mqgate.registry.records import ConsumerRecord
from mqgate.services.browse import Query
from mqgate.services.deadletters import Selection
from mqgate.services.qos import INBOX_TARGET, RETRY_TARGET, target_topic
from mqgate.web.request import Request
from mqgate.web.response import Response, download, redirect
from mqgate.web.route import Route

MAX_ROWS: Final = 500
# Of each body, the table shows this many characters (its hex view: this many bytes); an export
# has the whole body. 500 rows of 1 MiB bodies in hex were a 900 MiB page.
PREVIEW_CHARS: Final = 1024
BY: Final = ("offset", "time", "key", "id")
VIEWS: Final = ("json", "text", "hex")


def shown(body: str, view: str) -> str:
    """A body as the table shows it: its first PREVIEW_CHARS in the view, and what is left out."""
    if len(body) <= PREVIEW_CHARS:
        return body_view(body, view)
    cut = body[:PREVIEW_CHARS]
    left = len(body.encode()) - len(cut.encode())
    more = f"\n… {left:,} more bytes (export for all of it)"
    return body_view(cut, "text" if view == "json" else view) + more


def body_view(body: str, view: str) -> str:
    if view == "hex":
        raw = body.encode()
        return "\n".join(raw[i : i + 16].hex(" ") for i in range(0, len(raw), 16))
    if view == "json":
        try:
            return json.dumps(json.loads(body), indent=2, ensure_ascii=False)
        except ValueError:
            return body + "\n(not JSON: shown as text)"
    return body


def message_row(queue: int, offset: int, raw: bytes) -> dict[str, Any]:
    m = decode_stored(raw)
    return {
        "queue": queue,
        "offset": offset,
        "messageId": m.msg_id,
        "timestamp": m.timestamp_ms,
        "producer": m.producer,
        "keys": m.keys,
        "tags": m.tags,
        "properties": m.properties,
        "priority": m.priority,
        "deliverAt": m.deliver_at_ms,
        "deadline": m.deadline_ms,
        "body": m.body,
    }


def dead_letter_source(properties: dict[str, str], c: ConsumerRecord) -> str:
    """Where a dead letter of `c` was read, from the `dlq.*` properties it was moved with
    (services/redelivery.py): a store queue of `c`'s topic, or queue 0 of `c`'s retry queue or
    inbox, which `dlq.source` names (`dlq.queue` alone would read as a queue of the topic)."""
    queue, offset = properties.get("dlq.queue", "?"), properties.get("dlq.offset", "?")
    source = properties.get("dlq.source")
    if source is None:
        return f"{properties.get('dlq.topic', c.topic)} queue {queue} · offset {offset}"
    kinds = {target_topic(RETRY_TARGET + c.name): "retry: ", target_topic(INBOX_TARGET + c.name): "inbox: "}
    return f"{kinds.get(source, '')}{source} queue {queue} · offset {offset}"


def csv_bytes(rows: list[dict[str, Any]]) -> bytes:
    out = io.StringIO()
    columns = ["queue", "offset", "messageId", "timestamp", "producer", "keys", "tags", "properties", "body"]
    writer = csv.DictWriter(out, columns, extrasaction="ignore")
    writer.writeheader()
    for r in rows:
        writer.writerow(
            {
                **r,
                "keys": " ".join(r["keys"]),
                "tags": " ".join(r["tags"]),
                "properties": json.dumps(r["properties"]),
            }
        )
    return out.getvalue().encode()


class MessagePages:
    def __init__(self, c: Console) -> None:
        self.c = c

    def _project(self, topic: str) -> str:
        snap = snapshot(self.c)
        if topic.startswith(DLQ_PREFIX):
            consumer = snap.consumers.get(topic[len(DLQ_PREFIX) :])
            if consumer is not None:
                return project_of(snap, consumer)
        t = snap.topics.get(topic)
        return topic_project(t) if t is not None else "default"

    async def find(self, v: Request, topic: str) -> tuple[list[dict[str, Any]], int, bool]:
        """The messages the browser's form asks for: (rows, records scanned, whether the rows
        stopped at the answer's byte budget, `max_answer_bytes`, as the API's reads do)."""
        by, value = v.arg("by", "offset"), v.arg("value")
        count = min(max(v.int_arg("count", 50) or 50, 1), MAX_ROWS)
        if by not in BY:
            raise BadRequest(f"by must be one of {', '.join(BY)}", field="by")
        q = Query(max_count=count)
        if by == "offset" and value:
            q = Query(offset=v.int_arg("value"), max_count=count)
        elif by == "time" and value:
            q = Query(timestamp_ms=parse_time(value), max_count=count)
        elif by == "key" and value:
            q = Query(key=value, max_count=count)
        elif by == "id" and value:
            q = Query(message_id=value, max_count=1)
        bounds = await self.c.gateway.log_reading.bounds(topic)
        queue = v.int_arg("queue")
        queues = [queue] if queue is not None else [b.queue for b in bounds]
        rows: list[dict[str, Any]] = []
        scanned = size = 0
        budget = self.c.settings.max_answer_bytes  # over every queue, not each
        for qn in queues:
            page = await self.c.gateway.browsing.browse(topic, qn, q)
            scanned += page.scanned
            for o, raw in page.records:
                if rows and size + len(raw) > budget:
                    return rows, scanned, True
                size += len(raw)
                rows.append(message_row(qn, o, raw))
            if (by == "id" and rows) or len(rows) >= count:
                break
        return rows[:count], scanned, False

    async def browse(self, v: Request) -> Response:
        topic = v.arg("topic")
        view = v.arg("as", "json")
        if view not in VIEWS:
            raise BadRequest(f"as must be one of {', '.join(VIEWS)}", field="as")
        rows: list[dict[str, Any]] = []
        scanned = 0
        cut = False
        tail_from = ""
        if topic:
            require_view(v, self._project(topic))
            rows, scanned, cut = await self.find(v, topic)
            queue = v.int_arg("queue")
            ends = await self.c.gateway.log_reading.bounds(topic)  # a tail starts at the end now
            tail_from = ",".join(f"{b.queue}:{b.max}" for b in ends if queue is None or b.queue == queue)
            fmt = v.arg("format")
            if fmt == "json":
                body = json.dumps(rows, indent=2, ensure_ascii=False).encode()
                return download(body, f"{topic}-messages.json", "application/json")
            if fmt == "csv":
                return download(csv_bytes(rows), f"{topic}-messages.csv", "text/csv; charset=utf-8")
        for r in rows:
            r["shown"] = shown(r["body"], view)
        query = {k: v.arg(k) for k in ("topic", "queue", "by", "value", "count", "as")}
        return self.c.page(
            v,
            "messages.html",
            topics=visible_topics(self.c, v),
            rows=rows,
            scanned=scanned,
            cut=cut,
            budget=self.c.settings.max_answer_bytes,
            q=query,
            views=VIEWS,
            export_query=urlencode({k: val for k, val in query.items() if val}),
            tail_query=urlencode({k: query[k] for k in ("topic", "queue", "as") if query[k]}),
            tail_from=tail_from,
        )

    async def dead_letters(self, v: Request) -> Response:
        name = v.params["name"]
        rec = await self.c.gateway.topology.consumer(name)
        project = project_of(snapshot(self.c), rec)
        require_view(v, project)
        state = await self.c.gateway.dead_letters.state(name)
        start = state.min if v.arg("from") == "start" else state.position
        page = await self.c.gateway.browsing.browse(
            dlq_topic(name), 0, Query(offset=start, max_count=MAX_ROWS)
        )
        rows = [message_row(0, o, raw) for o, raw in page.records]
        for r in rows:
            r["source"] = dead_letter_source(r["properties"], rec)
        return self.c.page(
            v, "deadletters.html", c=rec, state=state, rows=rows, can_change=principal(v).can_change(project)
        )

    async def redrive(self, v: Request) -> Response:
        name = v.params["name"]
        rec = await self.c.gateway.topology.consumer(name)
        project = project_of(snapshot(self.c), rec)
        require_change(v, project)
        dl = self.c.gateway.dead_letters
        if v.arg("all") == "yes":
            results = [await dl.redrive(name, Selection(everything=True, scan=10_000))]
        else:
            offsets = sorted({int(o) for o in v.args("offset") if o.isdigit()})
            if not offsets:
                raise BadRequest("choose the dead letters to redrive", field="offset")
            results = [await dl.redrive(name, Selection(offset=o)) for o in offsets]
        copies = [msgspec.to_builtins(c) for r in results for c in r.redriven]
        await self.c.audit_change(v, "deadletter.redrive", name, project, after={"redriven": copies})
        return redirect(self.c.url(f"/consumers/{name}/dead-letters?note={len(copies)} redriven"))

    def routes(self) -> list[Route]:
        return [
            route("GET", "/messages", self.browse),
            route("GET", "/consumers/{name}/dead-letters", self.dead_letters),
            route("POST", "/consumers/{name}/dead-letters/redrive", self.redrive),
        ]
