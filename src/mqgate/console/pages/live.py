"""Live parts of pages (issue 13): the overview's figures, a consumer's progress and the charts
as HTML fragments that `static/console.js` fetches again every few seconds (with the ETag of the
last one, so an unchanged part is a bodiless 304), and the tail of a topic in the message
browser (new messages, read from the log without consuming)."""

from __future__ import annotations

import json
from typing import Any, Final

from mqgate.console.app import Console, route
from mqgate.console.pages.charts import SPANS, charts
from mqgate.console.pages.common import fragment, require_view
from mqgate.console.pages.messages import VIEWS, MessagePages, message_row, shown
from mqgate.console.pages.operations import consumer_figures, overview_figures
from mqgate.errors import BadRequest
from mqgate.services.browse import Query
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.response import page as web_page
from mqgate.web.route import Route

TAIL_ROWS: Final = 200  # new messages one poll of a tail returns at most


def parse_positions(text: str) -> dict[int, int]:
    """ "queue:offset,queue:offset" → {queue: offset}."""
    out: dict[int, int] = {}
    for part in filter(None, text.split(",")):
        queue, _, offset = part.partition(":")
        if not (queue.isdigit() and offset.isdigit()):
            raise BadRequest("from is queue:offset pairs separated by commas", field="from")
        out[int(queue)] = int(offset)
    return out


def positions_text(positions: dict[int, int]) -> str:
    return ",".join(f"{q}:{o}" for q, o in sorted(positions.items()))


class LivePages:
    def __init__(self, c: Console) -> None:
        self.c = c
        self.messages = MessagePages(c)

    async def overview(self, v: Request) -> Response:
        return fragment(self.c, v, "overview_live.html", **await overview_figures(self.c, v))

    async def consumer(self, v: Request) -> Response:
        return fragment(self.c, v, "consumer_live.html", **await consumer_figures(self.c, v))

    async def charts(self, v: Request) -> Response:
        span = v.arg("range", "hour")
        drawn = await charts(self.c, span)
        return fragment(self.c, v, "charts_part.html", charts=drawn, span=span, spans=SPANS)

    async def tail(self, v: Request) -> Response:
        """Messages of a topic past `from` (queue:offset pairs; empty: the end now, so only
        what comes next is shown), as table rows, and where to go on from. Nothing is consumed."""
        topic = v.arg("topic")
        if not topic:
            raise BadRequest("topic is required", field="topic")
        require_view(v, self.messages._project(topic))
        view = v.arg("as", "json")
        if view not in VIEWS:
            raise BadRequest(f"as must be one of {', '.join(VIEWS)}", field="as")
        bounds = await self.c.gateway.log_reading.bounds(topic)
        only = v.int_arg("queue")
        if only is not None and not 0 <= only < len(bounds):
            raise BadRequest(f"queue must be between 0 and {len(bounds) - 1}", field="queue")
        given = parse_positions(v.arg("from"))
        positions = {b.queue: given.get(b.queue, b.max if not given else b.min) for b in bounds
                     if only is None or b.queue == only}  # fmt: skip
        rows: list[dict[str, Any]] = []
        if given:
            for queue, offset in positions.items():
                if len(rows) >= TAIL_ROWS or offset >= bounds[queue].max:
                    continue
                page = await self.c.gateway.browsing.browse(
                    topic, queue, Query(offset=offset, max_count=TAIL_ROWS - len(rows))
                )
                rows += [message_row(queue, o, raw) for o, raw in page.records]
                positions[queue] = page.next
        rows.sort(key=lambda r: (r["timestamp"], r["queue"], r["offset"]))
        for r in rows:
            r["shown"] = shown(r["body"], view)
        html = self.c.templates.get_template("message_rows.html").render(rows=rows)
        body = {"next": positions_text(positions), "count": len(rows), "rows": html}
        return web_page(json.dumps(body).encode(), 200, b"application/json")

    def routes(self) -> list[Route]:
        return [
            route("GET", "/live/overview", self.overview, "fragment"),
            route("GET", "/live/consumers/{name}", self.consumer, "fragment"),
            route("GET", "/live/charts", self.charts, "fragment"),
            route("GET", "/live/tail", self.tail, "fragment"),
        ]
