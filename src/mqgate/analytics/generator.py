"""A load-test trace whose figures are known: 8 hours of traffic (time-compressed: written in
seconds), three topics in two projects, three gateways, and three injected faults.

- **failing gateway**: `gw-3` refuses produces (`failed`, `unavailable`) with probability
  0.6 between minutes 120 and 210;
- **slow consumer**: client `stats-2@10.0.2.2` of consumer `stats` (topic `clicks`) takes
  ~3.5 s a message; past the 5 s lock it expires (`lock_expired`), the message is redelivered,
  and after 3 attempts it is dead-lettered (`max_attempts`);
- **dead queue**: queue 2 of `payments` (project `pay`) stops delivering at minute 300; its
  messages expire 10 minutes after they were stored (`expired`, `ttl`, node `broker-a`).

Everything is drawn with numpy from one seed; `events()` gives one row per trace event as
arrays (mqgate.analytics.tracefile turns them into JSON records) and `truth()` computes,
from the same arrays and independently of Spark, every figure the report must show.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

Ints = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

MINUTE_MS: Final = 60_000
# (project, topic, producer, consumer, share of the messages)
TOPICS: Final = (
    ("shop", "orders", "order-api", "billing", 0.40),
    ("shop", "clicks", "web", "stats", 0.35),
    ("pay", "payments", "pay-api", "ledger", 0.25),
)
QUEUES: Final = 4
GATEWAYS: Final = ("gw-1", "gw-2", "gw-3")
BROKER: Final = "broker-a"
CLIENTS_PER_CONSUMER: Final = 2
HOPS: Final = (
    "accepted",
    "stored",
    "delivered",
    "acked",
    "failed",
    "expired",
    "lock_expired",
    "redelivered",
    "dead_lettered",
)
ERROR_TYPES: Final = ("unavailable", "ttl", "lock_expired", "max_attempts")
# The faults.
FAILING_GATEWAY: Final = 2
FAILING_MINUTES: Final = (120, 210)
FAILING_PROBABILITY: Final = 0.6
SLOW_TOPIC: Final = 1
SLOW_CLIENT: Final = 1
LOCK_MS: Final = 5_000
MAX_ATTEMPTS: Final = 3
DEAD_TOPIC: Final = 2
DEAD_QUEUE: Final = 2
DEAD_FROM_MINUTE: Final = 300
TTL_MS: Final = 600_000
BURST_MINUTES: Final = (330, 340)  # the load triples for these ten minutes
# Latency medians (ms) and log-normal sigmas.
STORE_LAT: Final = (2.0, 0.5)
DELIVER_LAT: Final = (25.0, 1.0)
PROCESS_LAT: Final = (12.0, 0.6)
SLOW_PROCESS_LAT: Final = (3_500.0, 0.5)
DEFAULT_START_MS: Final = int(dt.datetime(2026, 1, 5, 20, tzinfo=dt.UTC).timestamp() * 1000)


def client_name(topic: int, client: int) -> str:
    consumer = TOPICS[topic][3]
    return f"{consumer}-{client + 1}@10.0.{topic + 1}.{client + 1}"


# Every node an event may name: gateways, the broker, then each topic's clients.
NODES: Final = (
    *GATEWAYS,
    BROKER,
    *(client_name(t, c) for t in range(len(TOPICS)) for c in range(CLIENTS_PER_CONSUMER)),
)
_CLIENT_NODE0: Final = len(GATEWAYS) + 1


def hop_code(name: str) -> int:
    return HOPS.index(name)


@dataclass(frozen=True)
class LoadSpec:
    messages: int = 20_000
    hours: int = 8
    start_ms: int = DEFAULT_START_MS  # 20:00 UTC: the run crosses midnight (two dates)
    seed: int = 14
    malformed: int = 7

    @property
    def minutes(self) -> int:
        return self.hours * 60

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.minutes * MINUTE_MS


@dataclass
class EventArrays:
    """One entry per trace event; codes index HOPS, GATEWAYS, NODES, ERROR_TYPES (-1: none)."""

    msg: Ints
    hop: Ints
    time: Ints
    gateway: Ints
    error_type: Ints
    error_node: Ints
    client: Ints  # the consumer's client (-1 for producer-side hops)
    attempt: Ints  # 0: none
    topic: Ints
    queue: Ints  # the message's queue, -1 before it is stored
    offset: Ints  # the message's offset in that queue, -1 before it is stored
    has_consumer: Bools

    def __len__(self) -> int:
        return len(self.msg)


@dataclass
class LoadTrace:
    spec: LoadSpec
    topic: Ints  # per message
    accepted: Ints
    events: EventArrays
    extras: dict[str, Any] = field(default_factory=dict)


def _lognormal(rng: np.random.Generator, size: int, median_sigma: tuple[float, float]) -> Ints:
    median, sigma = median_sigma
    return np.ceil(rng.lognormal(np.log(median), sigma, size)).astype(np.int64)


def load_profile(minutes: int) -> npt.NDArray[np.float64]:
    """Relative load per minute: a 30-minute ramp up and down, a plateau, a 3x burst."""
    m = np.arange(minutes, dtype=np.float64)
    rate = np.minimum(1.0, np.minimum((m + 1) / 30, (minutes - m) / 30))
    rate[BURST_MINUTES[0] : BURST_MINUTES[1]] *= 3
    return rate


class _Events:
    def __init__(self) -> None:
        self.parts: list[dict[str, Ints]] = []

    def add(self, msg: Ints, hop: str, time: Ints, gateway: Ints, **optional: Ints | int) -> None:
        n = len(msg)
        part: dict[str, Ints] = {
            "msg": msg,
            "hop": np.full(n, hop_code(hop)),
            "time": time,
            "gateway": gateway,
        }
        defaults = {"error_type": -1, "error_node": -1, "client": -1, "attempt": 0, "queue": -1, "offset": -1}
        for name, default in defaults.items():
            value = optional.get(name, default)
            part[name] = np.broadcast_to(np.asarray(value, dtype=np.int64), (n,)).copy()
        self.parts.append(part)

    def arrays(self, topic_of_msg: Ints, consumer_hops: set[str]) -> EventArrays:
        cols = {k: np.concatenate([p[k] for p in self.parts]) for k in self.parts[0]}
        consumer_codes = np.array([hop_code(h) for h in consumer_hops])
        return EventArrays(
            topic=topic_of_msg[cols["msg"]],
            has_consumer=np.isin(cols["hop"], consumer_codes),
            **cols,
        )


def generate(spec: LoadSpec) -> LoadTrace:
    rng = np.random.default_rng(spec.seed)
    n = spec.messages
    msg = np.arange(n, dtype=np.int64)
    topic = rng.choice(len(TOPICS), size=n, p=[t[4] for t in TOPICS]).astype(np.int64)
    profile = load_profile(spec.minutes)
    minute = rng.choice(spec.minutes, size=n, p=profile / profile.sum()).astype(np.int64)
    accepted = spec.start_ms + minute * MINUTE_MS + rng.integers(0, MINUTE_MS, n)
    ev = _Events()
    gw_accept = rng.integers(0, len(GATEWAYS), n)
    ev.add(msg, "accepted", accepted, gw_accept)

    failing = (
        (gw_accept == FAILING_GATEWAY)
        & (minute >= FAILING_MINUTES[0])
        & (minute < FAILING_MINUTES[1])
        & (rng.random(n) < FAILING_PROBABILITY)
    )
    f = msg[failing]
    ev.add(
        f,
        "failed",
        accepted[f],
        gw_accept[f],
        error_type=ERROR_TYPES.index("unavailable"),
        error_node=FAILING_GATEWAY,
    )

    s = msg[~failing]
    stored = accepted[s] + _lognormal(rng, len(s), STORE_LAT)
    queue = rng.integers(0, QUEUES, len(s))
    # Offsets: a message's position in its topic queue, in the order the queue stored them.
    order = np.lexsort((stored, queue, topic[s]))
    group = topic[s][order] * QUEUES + queue[order]
    starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1]
    ranks = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    offset = np.empty(len(s), dtype=np.int64)
    offset[order] = ranks
    queue_of = np.full(n, -1, dtype=np.int64)
    offset_of = np.full(n, -1, dtype=np.int64)
    queue_of[s], offset_of[s] = queue, offset
    stored_at = np.full(n, -1, dtype=np.int64)
    stored_at[s] = stored
    ev.add(s, "stored", stored, rng.integers(0, len(GATEWAYS), len(s)), queue=queue, offset=offset)

    dead_start = spec.start_ms + DEAD_FROM_MINUTE * MINUTE_MS
    dead = (topic[s] == DEAD_TOPIC) & (queue == DEAD_QUEUE) & (stored >= dead_start)
    d = s[dead]
    ev.add(
        d,
        "expired",
        stored_at[d] + TTL_MS,
        rng.integers(0, len(GATEWAYS), len(d)),
        error_type=ERROR_TYPES.index("ttl"),
        error_node=len(GATEWAYS),
        queue=queue_of[d],
        offset=offset_of[d],
    )

    pending = s[~dead]
    when = stored_at[pending] + _lognormal(rng, len(pending), DELIVER_LAT)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        k = len(pending)
        client = rng.integers(0, CLIENTS_PER_CONSUMER, k)
        where = {"queue": queue_of[pending], "offset": offset_of[pending]}
        node = _CLIENT_NODE0 + topic[pending] * CLIENTS_PER_CONSUMER + client
        ev.add(
            pending,
            "delivered",
            when,
            rng.integers(0, len(GATEWAYS), k),
            client=client,
            attempt=attempt,
            **where,
        )
        slow = (topic[pending] == SLOW_TOPIC) & (client == SLOW_CLIENT)
        took = np.where(slow, _lognormal(rng, k, SLOW_PROCESS_LAT), _lognormal(rng, k, PROCESS_LAT))
        lost = took > LOCK_MS
        ok = ~lost
        ev.add(
            pending[ok],
            "acked",
            when[ok] + took[ok],
            rng.integers(0, len(GATEWAYS), int(ok.sum())),
            client=client[ok],
            attempt=attempt,
            queue=where["queue"][ok],
            offset=where["offset"][ok],
        )
        expiry = when[lost] + LOCK_MS
        lost_msgs = pending[lost]
        common: dict[str, Ints | int] = {
            "client": client[lost],
            "attempt": attempt,
            "error_node": node[lost],
            "queue": where["queue"][lost],
            "offset": where["offset"][lost],
        }
        gws = rng.integers(0, len(GATEWAYS), len(lost_msgs))
        ev.add(lost_msgs, "lock_expired", expiry, gws, error_type=ERROR_TYPES.index("lock_expired"), **common)
        if attempt < MAX_ATTEMPTS:
            ev.add(lost_msgs, "redelivered", expiry, gws, **{**common, "error_node": -1})
            pending = lost_msgs
            when = expiry + _lognormal(rng, len(lost_msgs), DELIVER_LAT)
        else:
            ev.add(
                lost_msgs,
                "dead_lettered",
                expiry,
                gws,
                error_type=ERROR_TYPES.index("max_attempts"),
                **common,
            )
    consumer_hops = {"delivered", "acked", "expired", "lock_expired", "redelivered", "dead_lettered"}
    return LoadTrace(spec, topic, accepted, ev.arrays(topic, consumer_hops))
