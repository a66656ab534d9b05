"""The message browser (without consuming: by offset, time, key or message id; body as JSON,
text or hex; export as JSON or CSV) and a consumer's dead letters with redrive."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Final
from urllib.parse import urlencode

import msgspec

from mqgate.api.shapes import MAX_READ_MESSAGES
from mqgate.console.app import Console, principal, route
from mqgate.console.pages.common import consumer_for, fragment, require_view, snapshot, visible_topics
from mqgate.console.pages.operations import parse_time
from mqgate.console.projects import project_of, topic_project
from mqgate.errors import BadRequest
from mqgate.model import decode_stored
from mqgate.names import DLQ_PREFIX, dlq_topic
from mqgate.registry.records import ConsumerRecord
from mqgate.services.browse import Query
from mqgate.services.deadletters import MAX_RATE_PER_S, Selection, source_of
from mqgate.services.qos import INBOX_TARGET, RETRY_TARGET, target_topic
from mqgate.services.redelivery import DLQ_REASON_ATTEMPTS, DLQ_REASON_EXPIRED
from mqgate.web.request import Request
from mqgate.web.response import Response, download, redirect
from mqgate.web.route import Route

MAX_ROWS: Final = 500
# Of each body, the table shows this many characters (its hex view: this many bytes); an export
# has the whole body. 500 rows of 1 MiB bodies in hex were a 900 MiB page.
PREVIEW_CHARS: Final = 1024
BY: Final = ("offset", "time", "key", "id")
VIEWS: Final = ("json", "text", "hex")
FILTER_FIELDS: Final = ("reason", "source", "queue", "since", "until")
REDRIVE_MODES: Final = ("move", "copy")
DLQ_REASONS: Final = (DLQ_REASON_ATTEMPTS, DLQ_REASON_EXPIRED)


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


def dead_letter_filters(v: Request) -> dict[str, Any]:
    """The dead-letter page's filters as `Selection` fields (only those given)."""
    found: dict[str, Any] = {}
    if v.arg("reason"):
        found["reason"] = v.arg("reason")
    if v.arg("source"):
        found["source"] = v.arg("source")
    queue = v.int_arg("queue")
    if queue is not None:
        if queue < 0:
            raise BadRequest("queue is a store queue number, 0 or more", field="queue")
        found["queue"] = queue
    for name, attr in (("since", "since_ms"), ("until", "until_ms")):
        if v.arg(name):
            try:
                found[attr] = parse_time(v.arg(name))
            except BadRequest:
                raise BadRequest(
                    f"{name} must be epoch milliseconds or an ISO date-time", field=name
                ) from None
    if "since_ms" in found and "until_ms" in found and found["until_ms"] <= found["since_ms"]:
        raise BadRequest("until must be after since", field="until")
    return found


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

    async def _dead_letter_consumer(self, v: Request, change: bool) -> tuple[ConsumerRecord, str]:
        return await consumer_for(self.c, v, change)

    async def dead_letters(self, v: Request) -> Response:
        rec, project = await self._dead_letter_consumer(v, change=False)
        name = rec.name
        filters = dead_letter_filters(v)
        state = await self.c.gateway.dead_letters.state(name)
        start = state.min if v.arg("from") == "start" else state.position
        page = await self.c.gateway.browsing.browse(
            dlq_topic(name), 0, Query(offset=start, max_count=MAX_ROWS)
        )
        sel = Selection(**filters) if filters else None
        rows = []
        reasons: set[str] = set()
        sources: set[str] = set()
        for o, raw in page.records:
            m = decode_stored(raw)
            reasons.add(m.properties.get("dlq.reason", ""))
            sources.add(source_of(m))
            if o in state.claimed and v.arg("from") != "start":
                continue  # redriven
            if sel is None or sel.matches(m, o):
                rows.append(message_row(0, o, raw))
        for r in rows:
            r["source"] = dead_letter_source(r["properties"], rec)
        return self.c.page(
            v,
            "deadletters.html",
            c=rec,
            state=state,
            rows=rows,
            read=len(page.records),
            more=page.next < state.max,
            can_change=principal(v).can_change(project),
            f={k: v.arg(k) for k in FILTER_FIELDS},
            filtered=bool(filters),
            from_start=v.arg("from") == "start",
            go_on=v.int_arg("start"),  # where a paced copy left off: the next one goes on there
            reasons=sorted(reasons | set(DLQ_REASONS) - {""}),
            sources=sorted(sources - {""}),
            max_rate=MAX_RATE_PER_S,
            job=self.c.redrives.of(name),
        )

    def _selection(self, v: Request, state_min: int) -> tuple[Selection, str]:
        """The dead letters a redrive form names: the rows ticked ("selected"), or every one
        the filter matches ("filter", from the position, or from the oldest with from=start)."""
        mode = v.arg("mode", "move")
        if mode not in REDRIVE_MODES:
            raise BadRequest("mode must be move or copy", field="mode")
        rate = v.float_arg("rate")
        common: dict[str, Any] = {"copy": mode == "copy", "rate_per_s": rate}
        scope = v.arg("scope", "selected")
        if scope == "selected":
            offsets = sorted({int(o) for o in v.args("offset") if o.isdigit()})
            if not offsets:
                raise BadRequest("choose the dead letters to redrive", field="offset")
            span = offsets[-1] - offsets[0] + 1
            if span > MAX_READ_MESSAGES:
                raise BadRequest(
                    f"the chosen dead letters span {span} offsets, over {MAX_READ_MESSAGES}: "
                    "redrive fewer at once",
                    field="offset",
                )
            return Selection(offsets=frozenset(offsets), scan=span, **common), scope
        if scope != "filter":
            raise BadRequest("scope must be selected or filter", field="scope")
        filters = dead_letter_filters(v)
        start = v.int_arg("start")  # a paced copy going on where the last one left off
        if start is None and v.arg("from") == "start":
            start = state_min
        # A copy takes what the list shows: past the position, without the ones moved on their
        # own; from the oldest, the redriven ones too.
        skip = v.arg("from") != "start"
        chosen = Selection(**filters, everything=not filters, scan=MAX_READ_MESSAGES, start=start,
                           skip_redriven=skip, **common)  # fmt: skip
        return chosen, scope

    async def redrive_preview(self, v: Request) -> Response:
        rec, _ = await self._dead_letter_consumer(v, change=True)
        dl = self.c.gateway.dead_letters
        state = await dl.state(rec.name)
        sel, scope = self._selection(v, state.min)
        preview = await dl.preview(rec.name, sel)
        carried = [
            (k, x) for k in (*FILTER_FIELDS, "from", "start", "mode", "rate", "scope") for x in v.args(k)
        ]
        carried += [("offset", x) for x in v.args("offset")]
        paced_s = preview.matched / sel.rate_per_s if sel.rate_per_s else 0.0
        return self.c.page(
            v,
            "deadletters_confirm.html",
            c=rec,
            p=preview,
            sel=sel,
            scope=scope,
            carried=carried,
            paced_s=paced_s,
        )

    async def redrive(self, v: Request) -> Response:
        rec, project = await self._dead_letter_consumer(v, change=True)
        dl = self.c.gateway.dead_letters
        state = await dl.state(rec.name)
        sel, scope = self._selection(v, state.min)
        if scope == "filter" and v.arg("confirmed") != "yes":
            raise BadRequest("a redrive by filter needs its confirmation: use the preview", field="confirmed")
        # Back to the list as it was: its filter, and from the oldest if it was.
        kept = {k: v.arg(k) for k in (*FILTER_FIELDS, "from") if v.arg(k)}
        if sel.rate_per_s is not None:  # paced: a task in the background, slice after slice
            await self.c.redrives.start(rec.name, project, principal(v).name, sel, scope, kept)
            note = f"redrive at {sel.rate_per_s:g} a second started in the background: its progress is below"
            return redirect(
                self.c.url(f"/consumers/{rec.name}/dead-letters?" + urlencode({"note": note, **kept}))
            )
        result = await dl.redrive(rec.name, sel)
        copies = [msgspec.to_builtins(c) for c in result.redriven]
        after = {"mode": "copy" if sel.copy else "move", "scope": scope, "rate": sel.rate_per_s,
                 "filter": {k: v.arg(k) for k in (*FILTER_FIELDS, "from") if v.arg(k)},
                 "redriven": copies, "left": result.left}  # fmt: skip
        await self.c.audit_change(v, "deadletter.redrive", rec.name, project, after=after)
        verb = "copied back" if sel.copy else "redriven"
        note = f"{len(copies)} {verb}" + (
            f"; {result.left} left for the next (rate limit)" if result.left else ""
        )
        back: dict[str, Any] = {"note": note, **kept}
        if result.left and sel.copy:  # copying records nothing: the next copy starts where this ended
            back["start"] = result.next
        return redirect(self.c.url(f"/consumers/{rec.name}/dead-letters?" + urlencode(back)))

    async def redrive_cancel(self, v: Request) -> Response:
        rec, _ = await self._dead_letter_consumer(v, change=True)
        await self.c.redrives.cancel(rec.name, principal(v).name)
        note = "the background redrive stops at its next step: what it copied stays recorded"
        return redirect(self.c.url(f"/consumers/{rec.name}/dead-letters?" + urlencode({"note": note})))

    async def redrive_progress(self, v: Request) -> Response:
        rec, project = await self._dead_letter_consumer(v, change=False)
        return fragment(self.c, v, "redrive_task.html", c=rec, job=self.c.redrives.of(rec.name),
                        can_change=principal(v).can_change(project))  # fmt: skip

    def routes(self) -> list[Route]:
        return [
            route("GET", "/messages", self.browse),
            route("POST", "/consumers/{name}/dead-letters/redrive/cancel", self.redrive_cancel),
            route("GET", "/live/consumers/{name}/redrive", self.redrive_progress, "fragment"),
            route("GET", "/consumers/{name}/dead-letters", self.dead_letters),
            route("POST", "/consumers/{name}/dead-letters/redrive", self.redrive),
            route("POST", "/consumers/{name}/dead-letters/preview", self.redrive_preview),
        ]
