"""Push delivery (issue 31, docs/PUSH.md): the gateway POSTs each message of a push consumer to
its endpoint; a 2xx deletes it, anything else (or no answer within the timeout) shows it again
after a backoff with jitter, or after the endpoint's Retry-After; a message received
`maxAttempts` times goes to the dead-letter topic.

A push consumer is a message-level consumer (services/messages.py) whose receives the gateway
makes. Every gateway runs a delivery loop for each push consumer; the loops of several gateways
share its messages through the mode's visibility: a message one receives is hidden from the
others for the attempt's timeout and a margin, so two gateways push the same message at once
only after that has passed (at least once). Delivery survives kill -9 as the mode's receipts
do: a message in flight at the kill comes back when its visibility ends.

Each loop keeps at most `maxInFlight` attempts going, paced by the consumer's rate limit (per
gateway). With `ordering=key` it receives in order (a store queue, where a key's messages are,
gives nothing more while any of its messages is in flight) and delivers each queue's batch one
message after another, the rest of the batch waiting behind a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from typing import Final

import msgspec

from mqgate.core.ratelimit import TokenBucket
from mqgate.errors import MqgateError
from mqgate.metrics import Metrics
from mqgate.model import MODE_PUSH
from mqgate.push import client, signing
from mqgate.push.config import PushConfig, backoff_ms, decode_config, sealer, secrets_in_force
from mqgate.push.endpoints import Endpoint, EndpointRefused, parse_endpoint, resolve
from mqgate.registry.records import ConsumerRecord
from mqgate.services.gateway import Gateway
from mqgate.services.messages import Delivery
from mqgate.settings import Settings

log = logging.getLogger(__name__)

VISIBILITY_MARGIN_S: Final = 5.0  # beyond the attempt's timeout, before another may take it
RECEIVE_WAIT_S: Final = 5.0  # a loop's long poll
RECEIVE_MAX: Final = 100  # messages one receive takes at most
WATCH_S: Final = 1.0  # how often the push consumers are looked up again
RESOLVE_KEEP_S: Final = 5.0  # an endpoint's checked addresses are used this long
ATTEMPTS_KEPT: Final = 100  # recent attempts shown per consumer
ERROR_PAUSE_S: Final = 1.0  # after a loop's own failure (a store away), before it goes on
INTERNAL_PROPERTIES: Final = ("sqs.", "dlq.", "mq.")
_HEADER_NAME: Final = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,64}")
_HEADER_VALUE: Final = re.compile(r"[\t\x20-\x7e]{0,1024}")


class Attempt(msgspec.Struct, frozen=True):
    at_ms: int
    msg_id: str
    attempt: int
    outcome: str  # ok, http_<status>, timeout, connection, tls, protocol, refused
    latency_ms: float
    error: str = ""


class Envelope(msgspec.Struct, rename="camel", kw_only=True):
    message_id: str
    topic: str
    consumer: str
    attempt: int
    timestamp: int
    body: str
    keys: list[str]
    tags: list[str]
    properties: dict[str, str]


def _message_headers(c: ConsumerRecord, d: Delivery) -> dict[str, str]:
    m = d.message
    out = {
        "mq-message-id": m.msg_id,
        "mq-topic": c.topic,
        "mq-consumer": c.name,
        "mq-attempt": str(d.receives),
        "mq-timestamp": str(m.timestamp_ms),
    }
    keys = ",".join(m.keys)
    if m.keys and _HEADER_VALUE.fullmatch(keys):
        out["mq-keys"] = keys
    for name, value in m.properties.items():
        # A property that cannot be a header (or is the gateway's own) is in the envelope only.
        if (
            not name.startswith(INTERNAL_PROPERTIES)
            and _HEADER_NAME.fullmatch(name)
            and _HEADER_VALUE.fullmatch(value)
        ):
            out[f"mq-property-{name}"] = value
    return out


class PushService:
    def __init__(self, gateway: Gateway, settings: Settings, metrics: Metrics) -> None:
        self.gw = gateway
        self.settings = settings
        self.metrics = metrics
        self.attempts: dict[str, deque[Attempt]] = {}
        self._seal = sealer(gateway.ctx.secret)
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._resolved: dict[str, tuple[float, list[str]]] = {}  # endpoint URL → (when, addresses)
        self._watcher: asyncio.Task[None] | None = None
        self._pool = client.Pool()  # connections kept between attempts
        self._unsealed: dict[tuple[str, str, str], list[str]] = {}

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        tasks = [t for t in (self._watcher, *self._loops.values()) if t is not None]
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._loops.clear()
        self._pool.close()

    async def _watch(self) -> None:
        while True:
            self.sync()
            await asyncio.sleep(WATCH_S)

    def sync(self) -> None:
        """A loop for each push consumer in the registry, none for any other."""
        wanted = sorted(
            c.name for c in self.gw.ctx.registry.snapshot.consumers.values() if c.mode == MODE_PUSH
        )
        if len(wanted) > self.settings.push_max_consumers:
            log.warning(
                "%d push consumers; this gateway delivers for the first %d (push_max_consumers)",
                len(wanted),
                self.settings.push_max_consumers,
            )
            wanted = wanted[: self.settings.push_max_consumers]
        for name in set(self._loops) - set(wanted):
            self._loops.pop(name).cancel()
        for name in wanted:
            loop = self._loops.get(name)
            if loop is None or loop.done():
                self._loops[name] = asyncio.get_running_loop().create_task(self._loop(name))

    def latest(self, name: str, count: int) -> list[Attempt]:
        """This gateway's latest `count` attempts for consumer `name`, newest first."""
        kept = self.attempts.get(name, ())
        return list(reversed(list(kept)[-count:])) if kept else []

    # --- delivery -------------------------------------------------------------------------

    async def _loop(self, name: str) -> None:
        inflight: set[asyncio.Task[None]] = set()
        bucket: TokenBucket | None = None
        try:
            while True:
                c = self.gw.ctx.registry.consumer(name)
                if c is None or c.mode != MODE_PUSH:
                    return
                config = decode_config(c.push)
                if config is None or c.paused:
                    await asyncio.sleep(WATCH_S)
                    continue
                room = config.max_in_flight - len(inflight)
                if room <= 0:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
                    continue
                if c.rate_limit_per_s > 0:
                    if bucket is None or bucket.rate_per_s != c.rate_limit_per_s:
                        bucket = TokenBucket.full(c.rate_limit_per_s, _now_ms())
                    room = bucket.take(min(room, RECEIVE_MAX), _now_ms())
                    if room == 0:
                        await asyncio.sleep(bucket.retry_after_s())
                        continue
                try:
                    got = await self.gw.messages.receive(
                        c,
                        max_count=min(room, RECEIVE_MAX),
                        wait_s=RECEIVE_WAIT_S,
                        visibility_s=config.timeout_s + VISIBILITY_MARGIN_S,
                        ordered=config.ordering == "key",
                    )
                except MqgateError as exc:
                    log.warning(
                        "push consumer %s: receive failed, again in %g s: %s", name, ERROR_PAUSE_S, exc
                    )
                    await asyncio.sleep(ERROR_PAUSE_S)
                    continue
                except Exception:  # a defect: logged with its trace, and the loop goes on
                    log.exception("push consumer %s: receive failed unexpectedly", name)
                    await asyncio.sleep(ERROR_PAUSE_S)
                    continue
                if bucket is not None and len(got) < room:
                    bucket.give_back(room - len(got))
                for batch in self._batches(got, config):
                    task = asyncio.get_running_loop().create_task(self._deliver_batch(c, config, batch))
                    inflight.add(task)
                    task.add_done_callback(inflight.discard)
        finally:
            for task in inflight:
                task.cancel()

    @staticmethod
    def _batches(got: list[Delivery], config: PushConfig) -> list[list[Delivery]]:
        """Each message on its own; with ordering, each store queue's messages in order."""
        if config.ordering != "key":
            return [[d] for d in got]
        runs: dict[tuple[str, int], list[Delivery]] = {}
        for d in got:
            runs.setdefault((d.source, d.queue), []).append(d)
        return [sorted(run, key=lambda d: d.offset) for run in runs.values()]

    async def _deliver_batch(self, c: ConsumerRecord, config: PushConfig, batch: list[Delivery]) -> None:
        try:
            for i, d in enumerate(batch):
                delay_ms = await self._deliver(c, config, d)
                if delay_ms is not None:
                    for later in batch[i + 1 :]:  # behind the failure, in order
                        await self.gw.messages.change_visibility(c, later.receipt, delay_ms / 1000)
                    return
        except MqgateError as exc:  # the store, not the endpoint: the visibility brings it back
            log.warning("push consumer %s: settling a delivery failed: %s", c.name, exc)
        except Exception:  # a defect: logged with its trace; the visibility brings the message back
            log.exception("push consumer %s: a delivery failed unexpectedly", c.name)

    async def _addresses(self, endpoint: Endpoint) -> list[str]:
        now = time.monotonic()
        kept = self._resolved.get(endpoint.url)
        if kept is not None and now - kept[0] < RESOLVE_KEEP_S:
            return kept[1]
        addresses = await resolve(endpoint, self.settings.push_allow_private_endpoints)
        if len(self._resolved) > 4 * len(self._loops) + 64:
            self._resolved.clear()
        self._resolved[endpoint.url] = (now, addresses)
        return addresses

    def _secrets(self, name: str, config: PushConfig, now_ms: int) -> list[str]:
        """The secrets in force, unsealed once per sealed value (an unseal costs tens of µs)."""
        key = (
            name,
            config.sealed_secret,
            config.sealed_previous if now_ms < config.previous_until_ms else "",
        )
        found = self._unsealed.get(key)
        if found is None:
            if len(self._unsealed) > 4 * len(self._loops) + 64:
                self._unsealed.clear()
            found = self._unsealed[key] = secrets_in_force(config, name, self._seal, now_ms)
        return found

    def _body(self, c: ConsumerRecord, config: PushConfig, d: Delivery) -> tuple[bytes, str]:
        m = d.message
        if not config.envelope:
            return m.body.encode(), "text/plain; charset=utf-8"
        envelope = Envelope(
            message_id=m.msg_id,
            topic=c.topic,
            consumer=c.name,
            attempt=d.receives,
            timestamp=m.timestamp_ms,
            body=m.body,
            keys=list(m.keys),
            tags=list(m.tags),
            properties={k: v for k, v in m.properties.items() if not k.startswith(INTERNAL_PROPERTIES)},
        )
        return msgspec.json.encode(envelope), "application/json"

    async def _deliver(self, c: ConsumerRecord, config: PushConfig, d: Delivery) -> int | None:
        """One attempt: None when delivered (and deleted), else how long (ms) until the next."""
        current = self.gw.ctx.registry.consumer(c.name)  # settings changed since the receive apply
        if current is not None and current.push and current.push != c.push:
            c, config = current, decode_config(current.push) or config
        body, content_type = self._body(c, config, d)
        now_ms = _now_ms()
        headers = {"Content-Type": content_type, **_message_headers(c, d), **config.headers}
        headers.update(
            signing.headers(self._secrets(c.name, config, now_ms), d.message.msg_id, now_ms // 1000, body)
        )
        started = time.monotonic()
        retry_after: float | None = None
        error = ""
        try:
            endpoint = parse_endpoint(config.endpoint)
            addresses = await self._addresses(endpoint)
            answer = await self._pool.post(endpoint, addresses, body, headers, config.timeout_s)
            outcome = "ok" if 200 <= answer.status < 300 else f"http_{answer.status}"
            retry_after = answer.retry_after_s
        except client.AttemptFailed as exc:
            outcome, error = exc.reason, str(exc)
        except (EndpointRefused, MqgateError) as exc:
            outcome, error = "refused", str(exc)
        latency_ms = (time.monotonic() - started) * 1000
        self._record(c, Attempt(now_ms, d.message.msg_id, d.receives, outcome, latency_ms, error[:300]))
        if outcome == "ok":
            await self.gw.messages.delete(c, d.receipt)
            return None
        delay_ms = backoff_ms(config, d.receives, retry_after)
        await self.gw.messages.change_visibility(c, d.receipt, delay_ms / 1000)
        return delay_ms

    def _record(self, c: ConsumerRecord, attempt: Attempt) -> None:
        kept = self.attempts.get(c.name)
        if kept is None:
            kept = self.attempts[c.name] = deque(maxlen=ATTEMPTS_KEPT)
        kept.append(attempt)
        self.metrics.child(self.metrics.push_attempts, c.name, attempt.outcome).inc()
        self.metrics.child(self.metrics.push_latency, c.name).observe(attempt.latency_ms / 1000)
        if attempt.outcome != "ok":
            log.info(
                "push consumer %s: attempt %d of %s failed (%s) %s",
                c.name,
                attempt.attempt,
                attempt.msg_id,
                attempt.outcome,
                attempt.error,
            )


def _now_ms() -> int:
    return int(time.time() * 1000)
