"""`GET /admin/alerts`: the alerts active now (SPEC G9; mqgate.alerts.service), paged."""

from __future__ import annotations

import asyncio

from mqgate.alerts.rules import LAG
from mqgate.alerts.service import ActiveAlert, Alerts
from mqgate.api import answers as a
from mqgate.api.paging import Paging
from mqgate.api.shapes import PageIn
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route


class ActiveAlertOut(a.Output, kw_only=True):
    key: str
    kind: str  # lag, dead_letters
    consumer: str
    topic: str
    project: str
    value: int  # the lag, or the dead letters added within the window
    peak: int  # the highest value since it fired
    threshold: int
    window_s: float = 0.0  # dead_letters: the window
    summary: str
    since: int  # epoch ms it fired
    updated: int


class WebhookOut(a.Output, kw_only=True):
    configured: bool
    waiting: int  # notifications not sent yet


class AlertsAnswer(a.Output, kw_only=True):
    alerts: list[a.AlertOut]  # the backlog alerts, as before: {consumer, topic, lag, threshold}
    active: list[ActiveAlertOut]  # every active alert, each kind
    checked: int  # epoch ms of the check this answer comes from
    webhook: WebhookOut
    # The cursor of the next page (of `active`, and of `alerts` among them); absent on the last.
    next: str | None = None


def active_out(x: ActiveAlert) -> ActiveAlertOut:
    return ActiveAlertOut(
        key=x.key, kind=x.kind, consumer=x.consumer, topic=x.topic, project=x.project, value=x.value,
        peak=x.peak, threshold=x.threshold, window_s=x.window_s, summary=x.summary, since=x.since_ms,
        updated=x.updated_ms,
    )  # fmt: skip


def lag_out(x: ActiveAlert) -> a.AlertOut:
    return a.AlertOut(consumer=x.consumer, topic=x.topic, lag=x.value, threshold=x.threshold)


def _both(x: ActiveAlert) -> tuple[ActiveAlertOut, a.AlertOut | None]:
    """An alert as `active` lists it and, a backlog alert, as `alerts` does (a page's bytes
    count both)."""
    return active_out(x), lag_out(x) if x.kind == LAG else None


class AlertRoutes:
    def __init__(self, alerts: Alerts) -> None:
        self.alerts = alerts
        self.paging = Paging(alerts.gateway.ctx.settings.max_answer_bytes)

    async def active(self, req: Request) -> Response:
        """The active alerts by key, paged: a first page checks the rules now (not as of the
        last periodic check); a page after it reads the active alerts as recorded (every
        gateway's, in the shared table), so it may come from another gateway than the first."""
        inp: PageIn = req.input
        if inp.cursor is None:
            found = await self.alerts.check()
        else:
            found = await asyncio.to_thread(self.alerts.table.active)
        page, nxt = self.paging.listing(inp, "alerts", found, lambda x: (x.key,), _both)
        hook = self.alerts.webhook
        return Response(
            AlertsAnswer(
                alerts=[lag for _, lag in page if lag is not None],
                active=[x for x, _ in page],
                checked=self.alerts.checked_ms,
                webhook=WebhookOut(configured=hook is not None, waiting=hook.queue.qsize() if hook else 0),
                next=nxt,
            )
        )

    def routes(self) -> list[Route]:
        return [
            Route(
                "GET",
                "/admin/alerts",
                self.active,
                "admin",
                "Active alerts: backlog over threshold, dead letters growing (paged)",
                PageIn,
                AlertsAnswer,
                body="none",
            )
        ]
