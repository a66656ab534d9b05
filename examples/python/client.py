#!/usr/bin/env python3
"""mqgate example client: Python, httpx (sync API).

Produces MQGATE_COUNT messages (one with POST /mq/produce, the rest with
POST /mq/produce/batch), consumes them with GET /mq/message (long poll,
wait=1, at most 50 pulls), acks every batch but the last by passing its
requestId on the next pull, acks the last batch with POST /mq/ack, checks
that every produced body came back and prints

    OK produced=<n> consumed=<n>

Configuration comes from the environment only:

    MQGATE_URL              e.g. http://127.0.0.1:8080
    MQGATE_TOPIC            topic (registered beforehand)
    MQGATE_PRODUCER         producer name (registered on the topic)
    MQGATE_PRODUCER_TOKEN   token returned by POST /admin/producers
    MQGATE_CONSUMER         consumer name (registered on the topic)
    MQGATE_CONSUMER_TOKEN   token returned by POST /admin/consumers
    MQGATE_COUNT            number of messages (default 10)

On any failure the reason goes to stderr and the exit status is 1.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from typing import Any

import httpx

MAX_PULLS = 50  # every loop is bounded
WAIT_S = 1  # long-poll seconds per pull
BATCH_LIMIT = 1000  # messages per POST /mq/produce/batch


class Failure(Exception):
    pass


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if value is None or value == "":
        raise Failure(f"environment variable {name} is not set")
    return value


def call(
    client: httpx.Client,
    method: str,
    path: str,
    token: str,
    *,
    params: dict[str, Any] | None = None,
    json: Any = None,
    ok: tuple[int, ...] = (200,),
) -> tuple[int, dict[str, Any], httpx.Response]:
    """One API call; returns (HTTP status, envelope, response). Raises Failure
    on a transport error, a non-envelope answer or an unexpected status."""
    try:
        resp = client.request(
            method,
            path,
            params=params,
            json=json,
            headers={"Authorization": f"Bearer {token}"},
        )
    except httpx.HTTPError as exc:
        raise Failure(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
    try:
        envelope = resp.json()
    except ValueError:
        raise Failure(
            f"{method} {path}: HTTP {resp.status_code}, answer is not JSON: {resp.text[:300]!r}"
        ) from None
    if not isinstance(envelope, dict) or "result" not in envelope or "message" not in envelope:
        raise Failure(f"{method} {path}: HTTP {resp.status_code}, not an envelope: {envelope!r}")
    if envelope.get("status") != resp.status_code:
        raise Failure(
            f"{method} {path}: envelope status {envelope.get('status')!r} != HTTP {resp.status_code}"
        )
    if resp.status_code not in ok:
        result = envelope.get("result") or {}
        code = result.get("code") if isinstance(result, dict) else None
        raise Failure(
            f"{method} {path}: HTTP {resp.status_code} code={code} message={envelope.get('message')!r}"
        )
    return resp.status_code, envelope, resp


def main() -> int:
    base_url = env("MQGATE_URL").rstrip("/")
    topic = env("MQGATE_TOPIC")
    producer = env("MQGATE_PRODUCER")
    producer_token = env("MQGATE_PRODUCER_TOKEN")
    consumer = env("MQGATE_CONSUMER")
    consumer_token = env("MQGATE_CONSUMER_TOKEN")
    try:
        count = int(env("MQGATE_COUNT", "10"))
    except ValueError:
        raise Failure("MQGATE_COUNT must be an integer") from None
    if count < 1:
        raise Failure("MQGATE_COUNT must be at least 1")

    # A unique prefix: the topic may hold other messages, only ours count.
    prefix = f"mqgate-example-python-{uuid.uuid4().hex}-"
    bodies = [f"{prefix}{i}" for i in range(count)]
    # Small batches, so that there are several of them and both ack styles are used.
    max_per_pull = min(1024, max(1, (count + 1) // 2))

    with httpx.Client(base_url=base_url, timeout=httpx.Timeout(WAIT_S + 15)) as client:
        # ---- produce: the first message alone, the rest in batches ----------
        _, env1, _ = call(
            client,
            "POST",
            "/mq/produce",
            producer_token,
            json={
                "producer": producer,
                "message": bodies[0],
                "keys": ["example-0"],
                "tags": ["example"],
                "properties": {"lang": "python"},
            },
        )
        if not isinstance(env1["result"], dict) or not env1["result"].get("msgId"):
            raise Failure(f"POST /mq/produce: no msgId in result {env1['result']!r}")
        produced = 1

        for start in range(1, count, BATCH_LIMIT):
            chunk = bodies[start : start + BATCH_LIMIT]
            messages = [
                {
                    "message": body,
                    "keys": [f"example-{start + j}"],
                    "tags": ["example"],
                    "properties": {"lang": "python"},
                }
                for j, body in enumerate(chunk)
            ]
            _, envb, _ = call(
                client,
                "POST",
                "/mq/produce/batch",
                producer_token,
                json={"producer": producer, "messages": messages},
            )
            receipts = envb["result"].get("receipts") if isinstance(envb["result"], dict) else None
            if not isinstance(receipts, list) or len(receipts) != len(chunk):
                raise Failure(f"POST /mq/produce/batch: expected {len(chunk)} receipts, got {receipts!r}")
            produced += len(chunk)

        # ---- consume ---------------------------------------------------------
        expected = set(bodies)
        received: set[str] = set()
        pending: str | None = None  # requestId of the batch not yet acked
        piggyback_acks = 0

        for _ in range(MAX_PULLS):
            params: dict[str, Any] = {
                "topic": topic,
                "consumer": consumer,
                "max": max_per_pull,
                "wait": WAIT_S,
            }
            if pending is not None:
                params["requestId"] = pending  # acks the previous batch first
            status, envp, resp = call(
                client, "GET", "/mq/message", consumer_token, params=params, ok=(200, 429)
            )
            result = envp["result"] if isinstance(envp["result"], dict) else {}

            if pending is not None:
                ack = result.get("ack")
                if ack == "ok":
                    piggyback_acks += 1
                    pending = None
                elif status == 429 and ack is None:
                    pass  # rate limited before the ack was looked at: send it again
                else:
                    raise Failure(f"ack of the previous batch via requestId failed: ack={ack!r}")

            if status == 429:
                try:
                    delay = float(resp.headers.get("Retry-After", "1"))
                except ValueError:
                    delay = 1.0
                time.sleep(min(max(delay, 0.1), 5.0))
                continue

            kind = result.get("status")
            if kind == "FOUND":
                request_id = result.get("requestId")
                msg_list = result.get("msgList")
                if not request_id or not isinstance(msg_list, list):
                    raise Failure(f"FOUND without requestId or msgList: {result!r}")
                for item in msg_list:
                    body = item.get("message") if isinstance(item, dict) else None
                    if isinstance(body, str) and body.startswith(prefix):
                        if body not in expected:
                            raise Failure(f"received a body that was never produced: {body!r}")
                        received.add(body)
                pending = request_id
                if received == expected:
                    break
            elif kind == "NO_NEW_MSG":
                continue
            elif kind == "PAUSED":
                time.sleep(WAIT_S)
            else:
                raise Failure(f"GET /mq/message: unexpected result.status {kind!r}")

        # ---- explicit ack of the last batch ----------------------------------
        if pending is not None:
            call(client, "POST", "/mq/ack", consumer_token, json={"requestId": pending})
            pending = None

        missing = expected - received
        if missing:
            raise Failure(
                f"{len(missing)} of {count} messages not received after {MAX_PULLS} pulls, "
                f"e.g. {sorted(missing)[:3]!r}"
            )
        if count > max_per_pull and piggyback_acks == 0:
            raise Failure("no batch was acked by passing requestId on the next pull")

    print(f"OK produced={produced} consumed={len(received)}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Failure as exc:
        print(f"FAIL: {exc}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("FAIL: interrupted", file=sys.stderr)
        sys.exit(130)
