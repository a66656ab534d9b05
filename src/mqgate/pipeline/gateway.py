"""The gateway calls the pipeline makes itself: idempotent setup, hot/retry produce, progress.

Reads and offset commits go through mqgate.spark. Produce is retried on transient failures
(the gateway restarting, 503): a produce repeated after an unanswered attempt may store a
message twice, which the sink's ledger absorbs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Final

import httpx

from mqgate.errors import MqgateError
from mqgate.spark.client import batch_ranges

TIMEOUT_S: Final = 30.0
RETRY_FOR_S: Final = 30.0
BATCH_MESSAGES: Final = 1000
# Under the gateway's 4 MiB of message text per batch, with room for keys and properties.
BATCH_BYTES: Final = 3 * 1024 * 1024
TRANSIENT_STATUS: Final = (429, 502, 503, 504)


class PipelineGatewayError(MqgateError):
    code = "gateway"


class GatewayClient:
    def __init__(self, url: str, admin_token: str) -> None:
        self.url = url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.url, timeout=TIMEOUT_S, headers={"Authorization": f"Bearer {admin_token}"}
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        ok: Sequence[int] = (200,),
        retry_for_s: float = RETRY_FOR_S,
    ) -> tuple[int, Any]:
        """(status, result) of one call, retried with backoff while the gateway is unreachable
        or answers a transient status, for up to `retry_for_s`."""
        deadline = time.monotonic() + retry_for_s
        delay = 0.1
        content = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        headers = {"Content-Type": "application/json"} if content is not None else {}
        while True:
            try:
                r = self._http.request(method, path, content=content, params=params, headers=headers)
            except httpx.HTTPError as exc:
                if time.monotonic() > deadline:
                    raise PipelineGatewayError(f"{method} {path}: cannot reach {self.url}: {exc}") from exc
            else:
                if r.status_code in ok:
                    payload = r.json() if r.content else {}
                    return r.status_code, payload.get("result") if isinstance(payload, dict) else None
                if r.status_code not in TRANSIENT_STATUS or time.monotonic() > deadline:
                    raise PipelineGatewayError(f"{method} {path}: HTTP {r.status_code}: {r.text[:500]}")
            time.sleep(delay)
            delay = min(delay * 2, 2.0)

    # --- setup (SPEC: the job registers what it needs; 409 means it is there already) --

    def ensure_topic(self, name: str, queues: int) -> None:
        self.call("POST", "/admin/topics", {"name": name, "queues": queues}, ok=(200, 409))

    def ensure_producer(self, name: str, topic: str) -> None:
        self.call("POST", "/admin/producers", {"name": name, "topic": topic}, ok=(200, 409))

    def ensure_consumer(self, name: str, topic: str) -> None:
        self.call(
            "POST", "/admin/consumers", {"name": name, "topic": topic, "mode": "cluster"}, ok=(200, 409)
        )

    def topic_exists(self, name: str) -> bool:
        _, result = self.call("GET", "/admin/topics")
        return any(t.get("name") == name for t in result.get("topics", []))

    def lag(self, consumer: str) -> int:
        _, result = self.call("GET", f"/admin/consumers/{consumer}/progress")
        return int(result["lag"])

    # --- data path -------------------------------------------------------------------

    def produce(self, producer: str, messages: Sequence[dict[str, Any]]) -> int:
        """Produce `messages` (produce-API objects) in batches within the gateway's limits;
        returns once every batch is acknowledged (durable)."""
        # Worst case for the gateway's count: 4 UTF-8 bytes per character, plus keys and properties.
        sizes = [len(m["message"]) * 4 + 256 for m in messages]
        for i, j in batch_ranges(sizes, BATCH_MESSAGES, BATCH_BYTES):
            self.call("POST", "/mq/produce/batch", {"producer": producer, "messages": list(messages[i:j])})
        return len(messages)
