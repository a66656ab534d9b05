"""The alert webhook: notifications POSTed one after another by a task of their own, never in a
request's path, each attempt with a timeout, bounded retries, failures logged and counted."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from typing import Any, Final

from mqgate.metrics import Metrics
from mqgate.settings import Settings

log = logging.getLogger(__name__)

QUEUE_SIZE: Final = 1000  # notifications waiting for the webhook; more are dropped (and counted)
FIRST_PAUSE_S: Final = 0.5  # between attempts: 0.5 s, 1 s, 2 s, ...


def _post(url: str, body: bytes, headers: dict[str, str], timeout_s: float) -> int:
    """One POST; its status (a redirect is not followed: it is a failure)."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with _OPENER.open(request, timeout=timeout_s) as answer:
        answer.read(64 * 1024)
        return int(answer.status)


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER: Final = urllib.request.build_opener(_NoRedirects())


def failure_reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"http_{exc.code}"
    if isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return "timeout"
    return "connection"


class Webhook:
    """Notifications, POSTed one after another by a task of their own."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.url = settings.alert_webhook_url
        self.timeout_s = settings.alert_webhook_timeout_s
        self.attempts = settings.alert_webhook_attempts
        self.secret = settings.alert_webhook_secret.encode()
        self.metrics = metrics
        self.queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)

    def send(self, body: dict[str, Any]) -> None:
        try:
            self.queue.put_nowait(body)
        except asyncio.QueueFull:
            log.error("alert webhook: %d notifications waiting; dropped: %s", QUEUE_SIZE, body["summary"])
            self._count(body, "dropped")

    def _count(self, body: dict[str, Any], outcome: str) -> None:
        m = self.metrics
        m.child(m.alert_notifications, body["status"], outcome).inc()

    async def run(self) -> None:
        while True:
            body = await self.queue.get()
            await self.deliver(body)

    async def deliver(self, body: dict[str, Any]) -> bool:
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "mqgate-alerts"}
        if self.secret:
            digest = hmac.new(self.secret, data, hashlib.sha256).hexdigest()
            headers["X-Mqgate-Signature"] = "sha256=" + digest
        pause = FIRST_PAUSE_S
        for attempt in range(1, self.attempts + 1):
            try:
                status = await asyncio.to_thread(_post, self.url, data, headers, self.timeout_s)
                self._count(body, "sent")
                log.info("alert webhook: %s %s (HTTP %d)", body["status"], body["key"], status)
                return True
            except Exception as exc:
                reason = failure_reason(exc)
                self.metrics.child(self.metrics.alert_webhook_errors, reason).inc()
                log.warning("alert webhook: attempt %d/%d for %s %s: %s (%s)", attempt, self.attempts,
                            body["status"], body["key"], reason, exc)  # fmt: skip
                permanent = reason.startswith("http_4") and reason not in ("http_408", "http_429")
                if permanent or attempt == self.attempts:
                    break
                await asyncio.sleep(pause)
                pause *= 2
        self._count(body, "failed")
        log.error("alert webhook: gave up on %s %s: %s", body["status"], body["key"], body["summary"])
        return False
