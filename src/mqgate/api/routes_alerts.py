"""`GET /admin/alerts`: the alerts active now (SPEC G9; mqgate.alerts.service)."""

from __future__ import annotations

from mqgate.alerts.rules import LAG
from mqgate.alerts.service import ActiveAlert, Alerts
from mqgate.api import answers as a
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


def active_out(x: ActiveAlert) -> ActiveAlertOut:
    return ActiveAlertOut(
        key=x.key, kind=x.kind, consumer=x.consumer, topic=x.topic, project=x.project, value=x.value,
        peak=x.peak, threshold=x.threshold, window_s=x.window_s, summary=x.summary, since=x.since_ms,
        updated=x.updated_ms,
    )  # fmt: skip


def lag_out(x: ActiveAlert) -> a.AlertOut:
    return a.AlertOut(consumer=x.consumer, topic=x.topic, lag=x.value, threshold=x.threshold)


class AlertRoutes:
    def __init__(self, alerts: Alerts) -> None:
        self.alerts = alerts

    async def active(self, req: Request) -> Response:
        found = await self.alerts.check()  # now, not as of the last periodic check
        hook = self.alerts.webhook
        backlog = [x for x in found if x.kind == LAG]
        return Response(
            AlertsAnswer(
                alerts=[lag_out(x) for x in backlog],
                active=[active_out(x) for x in found],
                checked=self.alerts.checked_ms,
                webhook=WebhookOut(configured=hook is not None, waiting=hook.queue.qsize() if hook else 0),
            )
        )

    def routes(self) -> list[Route]:
        return [
            Route(
                "GET",
                "/admin/alerts",
                self.active,
                "admin",
                "Active alerts: backlog over threshold, dead letters growing",
                None,
                AlertsAnswer,
                body="none",
            )
        ]
