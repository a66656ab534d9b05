"""The queue state history of the 8-hour load test (mqgate.analytics.generator's projects,
topics, queues and consumers, one-minute intervals), with faults whose intervals are known:
the ground truth of the queue fault timeline.

- failing gateway (the trace's gw-3, minutes 120-210): `unavailable` produce errors on every
  topic -> `store_fault` per topic, intervals 120-209;
- full queue: orders/1 at 96-100% of its 10,000 limit in minutes 250-260 -> `queue_full`
  orders/1, 250-259;
- unread messages dropped: retention removes 25 unread messages of clicks/0 a minute in
  270-275 -> `queue_full` clicks/0, 270-274;
- consumer down: `ledger` pulls nothing in minutes 420-450 (its last pull at 419:59.9) and its
  backlog grows -> `consumer_down` ledger on payments, 420-449;
- ... and its queue overflows: retention drops unread payments/2 messages in 440-450 ->
  `queue_full` payments/2, 440-449, so those intervals are queue and consumer faults.

Elsewhere every group pulls and acks each minute with a backlog of 0-5 (never growing by the
10 messages `consumers_too_slow` needs), queues stay far below their limits, and a client
error (`bad_request`) every 37 minutes must not count as a store fault.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np

from mqgate.analytics.generator import QUEUES, TOPICS, LoadSpec
from mqgate.queuestate.rows import ConsumerInterval, ProduceInterval, QueueInterval, Rollup

INTERVAL_MS: Final = 60_000
STORE_FAULT_MINUTES: Final = (120, 210)
LENGTH_LIMIT: Final = 10_000
FULL: Final = ("orders", 1, (250, 260))
DROPPED: Final = ("clicks", 0, (270, 275))
DOWN: Final = ("ledger", "payments", (420, 450))
DOWN_DROPPED: Final = ("payments", 2, (440, 450))
CLIENT_ERROR_EVERY: Final = 37


@dataclass(frozen=True)
class KnownFault:
    """A finding's run: [from_minute, to_minute) of the load."""

    rule: str
    side: str
    project: str
    topic: str
    queue: int | None
    consumer: str | None
    from_minute: int
    to_minute: int


def _project(topic: str) -> str:
    return next(t[0] for t in TOPICS if t[1] == topic)


def known_faults() -> list[KnownFault]:
    found = [
        KnownFault("store_fault", "queue", project, topic, None, None, *STORE_FAULT_MINUTES)
        for project, topic, *_ in TOPICS
    ]
    for topic, queue, (a, b) in (FULL, DROPPED, DOWN_DROPPED):
        found.append(KnownFault("queue_full", "queue", _project(topic), topic, queue, None, a, b))
    consumer, topic, (a, b) = DOWN
    found.append(KnownFault("consumer_down", "consumer", _project(topic), topic, None, consumer, a, b))
    return found


def _within(minute: int, span: tuple[int, int]) -> bool:
    return span[0] <= minute < span[1]


def queue_state_rows(spec: LoadSpec | None = None) -> Rollup:
    spec = spec or LoadSpec()
    rng = np.random.default_rng(spec.seed)
    rows = Rollup()
    down_consumer, down_topic, down_span = DOWN
    for minute in range(spec.minutes):
        start = spec.start_ms + minute * INTERVAL_MS
        for project, topic, _producer, consumer, _share in TOPICS:
            errors: dict[str, int] = {}
            if _within(minute, STORE_FAULT_MINUTES):
                errors["unavailable"] = int(rng.integers(5, 20))
            if minute % CLIENT_ERROR_EVERY == 0:
                errors["bad_request"] = 1
            produced = int(rng.integers(50, 100))
            rows.produce.append(ProduceInterval(project, topic, start, INTERVAL_MS, produced, errors))
            down = consumer == down_consumer and topic == down_topic
            for q in range(QUEUES):
                length = int(rng.integers(0, 50))
                dropped = 0
                if (topic, q) == FULL[:2] and _within(minute, FULL[2]):
                    length = int(rng.integers(9_600, LENGTH_LIMIT + 1))
                if (topic, q) == DROPPED[:2] and _within(minute, DROPPED[2]):
                    dropped = 25
                if (topic, q) == DOWN_DROPPED[:2] and _within(minute, DOWN_DROPPED[2]):
                    dropped = 40
                limit = LENGTH_LIMIT if topic == FULL[0] else None
                rows.queues.append(
                    QueueInterval(project, topic, q, start, INTERVAL_MS, length, length * INTERVAL_MS // 2,
                                  INTERVAL_MS, 60, limit, dropped)
                )  # fmt: skip
                rows.consumers.append(
                    _consumer_row(rng, project, consumer, topic, q, start, minute, down, down_span)
                )
    return rows


def _consumer_row(
    rng: np.random.Generator,
    project: str,
    consumer: str,
    topic: str,
    queue: int,
    start: int,
    minute: int,
    down: bool,
    down_span: tuple[int, int],
) -> ConsumerInterval:
    backlog = int(rng.integers(0, 6))
    if down and _within(minute, down_span):
        backlog = 100 * (minute - down_span[0] + 1)  # grows while no one pulls
        return ConsumerInterval(project, consumer, topic, queue, start, INTERVAL_MS, backlog,
                                backlog * INTERVAL_MS, INTERVAL_MS, 60, 0, 0, 0, 0, None)  # fmt: skip
    if down and down_span[1] <= minute < down_span[1] + 3:
        backlog = 100 * (down_span[1] - down_span[0]) // (minute - down_span[1] + 2)  # draining
    delivered = int(rng.integers(10, 40))
    return ConsumerInterval(project, consumer, topic, queue, start, INTERVAL_MS, backlog + 3,
                            backlog * INTERVAL_MS, INTERVAL_MS, 60, 30, delivered, 10, delivered,
                            start + INTERVAL_MS - 100)  # fmt: skip
