"""Throughput and lag over the last hour, day or week, from the gateway's metrics history
(mqgate.metrics_history): on the overview and on a page of their own."""

from __future__ import annotations

from typing import Final

from mqgate.console.app import Console, route
from mqgate.console.charts import Chart, line_chart
from mqgate.errors import BadRequest
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

SPANS: Final = ("hour", "day", "week")
FRESH_S: Final = 1.0  # a page shows what happened up to a second ago (sampled on the way)


async def charts(c: Console, span: str) -> list[Chart]:
    if span not in SPANS:
        raise BadRequest(f"range must be one of {', '.join(SPANS)}", field="range")
    history = c.platform.metrics_history
    await history.sample(at_least_s=FRESH_S)
    points = await history.series(span)
    return [
        line_chart("produce", "Messages produced per second", "msg/s",
                   [(p.at_ms, p.produce_rate) for p in points], span_label=span),
        line_chart("consume", "Messages consumed per second", "msg/s",
                   [(p.at_ms, p.consume_rate) for p in points], span_label=span),
        line_chart("lag", "Total consumer lag (average)", "messages",
                   [(p.at_ms, p.lag) for p in points], span_label=span),
    ]  # fmt: skip


class ChartPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    async def page(self, v: Request) -> Response:
        span = v.arg("range", "hour")
        return self.c.page(v, "charts.html", charts=await charts(self.c, span), span=span, spans=SPANS)

    def routes(self) -> list[Route]:
        return [route("GET", "/charts", self.page)]
