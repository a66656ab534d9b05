"""A topic's page and a queue's page (issue 29): per queue its offsets, size (messages and
bytes) and rates, each
consumer's committed offset, lag and lock, the newest messages (each linked to its trace), the
retention, and charts from the queue-state history (SPEC P1).

Every table is a page of its list, and every figure is read for the rows shown only: a topic of
256 queues and 2,000 consumers costs a page of each, not all of them. The charts add up the
history's rows in the database, grouped by interval (a steady run is one group, spread over its
intervals here), so a week of a busy topic is a few thousand groups, not millions of rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
import sqlalchemy as sa

from mqgate.console.app import Console, now_ms, principal, route
from mqgate.console.charts import Chart, ChartNote, line_chart, percentile
from mqgate.console.pages.common import fragment, listing, matching, paginate
from mqgate.console.pages.messages import message_row
from mqgate.console.projects import topic_project
from mqgate.core.queue_choice import lock_is_held
from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import QueueBounds
from mqgate.names import INTERNAL_PREFIXES, dlq_topic
from mqgate.queuestate.rows import MAX_RUN_MS
from mqgate.registry.records import ConsumerRecord, ProducerRecord, Snapshot, TopicRecord
from mqgate.web.request import Request
from mqgate.web.response import Response
from mqgate.web.route import Route

QUEUES_PER_PAGE: Final = 50
CONSUMERS_PER_PAGE: Final = 25  # on the topic page: each row reads the consumer's offset tables
QUEUE_CONSUMERS_PER_PAGE: Final = 50  # on a queue's page: one entry of each table
LAST_MESSAGES: Final = 10  # the topic's newest messages on its page
QUEUE_MESSAGES: Final = 20  # a page of a queue's messages
BODY_CHARS: Final = 200  # of each body, the tables show this many characters
RATE_WINDOW_MS: Final = 5 * 60_000  # the rates in the tables are over the last five minutes
LOCKS_SHOWN: Final = 3  # locks named in a consumer's row (the rest counted)
BEHIND_SHOWN: Final = 20  # queues listed in a consumer's per-queue details
BACKLOG_CHARTS: Final = 4  # a queue's consumers with the most backlog get a chart each
DEAD_LETTER_SOURCES: Final = 50  # consumers whose dead letters the chart counts, at most
# Consumers whose dead-letter topics the chart looks at, at most (a read of bounds each: on Redis a
# round trip, so a topic with thousands of consumers must not cost thousands of them per view).
DEAD_LETTER_LOOKS: Final = 200
SPANS: Final = ("hour", "day", "week")
# A latency chart reads at most this many trace index rows over its range (tracing/query.py);
# its points closed this long ago are kept (their hops are indexed by then), for this many
# (topic, consumer, step) series at most.
LATENCY_SCAN_ROWS: Final = 12_000
LATENCY_SETTLED_MS: Final = 5 * 60_000
LATENCY_SERIES_KEPT: Final = 1_000
LATENCY_QUANTILES: Final = ((0.5, "latency-p50", "median"), (0.99, "latency-p99", "99th percentile"))
LatencyKey = tuple[str, int, str | None, int]  # a kept latency series: topic, made at, consumer, step
# A chart's range: (its span, one point per this many seconds), as the gateway's charts have it.
RANGES: Final = {"hour": (3600, 60), "day": (86_400, 600), "week": (7 * 86_400, 3600)}


def missing(name: str) -> NotFound:
    """The answer for a topic that is not there or not the user's to see: the same, so that
    names in other projects cannot be found out."""
    return NotFound(f"topic {name} does not exist", field="topic")


# --- who reads the topic ----------------------------------------------------------------------


class ByTopic(msgspec.Struct, frozen=True):
    """The consumers and producers of each topic, made once per registry snapshot (a page of
    a topic must not pass over every consumer of the gateway)."""

    snap: Snapshot
    consumers: dict[str, list[ConsumerRecord]]
    producers: dict[str, list[ProducerRecord]]


def by_topic(c: Console) -> ByTopic:
    known = listing(c)
    found: ByTopic | None = c.cache.get("by_topic")
    if found is None or found.snap is not known.snap:
        consumers: dict[str, list[ConsumerRecord]] = {}
        for x, _ in known.consumers:
            consumers.setdefault(x.topic, []).append(x)
        producers: dict[str, list[ProducerRecord]] = {}
        for p, _ in known.producers:
            producers.setdefault(p.topic, []).append(p)
        found = c.cache["by_topic"] = ByTopic(known.snap, consumers, producers)
    return found


class Hold(msgspec.Struct, frozen=True):
    """One consumer (one broadcast client) on one queue of the topic."""

    consumer: str
    client_id: str | None
    queue: int
    lane: int
    committed: int
    lag: int
    locked: bool
    lock_owner: str | None
    lock_expires_ms: int | None  # when the lock runs out, if held
    last_access_ms: int | None
    attempts: int
    dead_lettered: int


class ConsumerRow(msgspec.Struct, frozen=True):
    rec: ConsumerRecord
    holds: list[Hold]
    read: bool  # whether its offset tables could be read

    @property
    def lag(self) -> int:
        return sum(h.lag for h in self.holds)

    @property
    def locks(self) -> list[Hold]:
        return [h for h in self.holds if h.locked]

    @property
    def behind(self) -> list[Hold]:
        return [h for h in self.holds if h.lag > 0 or h.locked]

    @property
    def dead_lettered(self) -> int:
        return sum(h.dead_lettered for h in self.holds)

    @property
    def last_access_ms(self) -> int | None:
        return max((h.last_access_ms for h in self.holds if h.last_access_ms), default=None)


async def holds_of(
    c: Console, x: ConsumerRecord, t: TopicRecord, bounds: Sequence[QueueBounds]
) -> ConsumerRow:
    """`x`'s committed offset, lag and lock on each of `bounds`' queues of its topic, as
    `Operations.progress` reads them (a queue its table does not list yet is read from its
    beginning), without reading the bounds again for every consumer."""
    offsets = c.gateway.ctx.offsets
    grid = t.grid
    now = now_ms()
    holds = []
    try:
        clients = await offsets.clients(x.name)
        tables = await asyncio.gather(*(offsets.table(x.name, client) for client in clients))
    except MqgateError:
        return ConsumerRow(x, [], read=False)
    for client, table in zip(clients, tables, strict=True):
        entries = table or []
        for b in bounds:
            i = grid.table_index(b.queue)
            e = entries[i] if i < len(entries) else None
            committed = e.committed if e is not None else b.min
            locked = e is not None and lock_is_held(e.lock_ts, e.lock_deadline_ms, now)
            holds.append(
                Hold(
                    consumer=x.name,
                    client_id=client or None,
                    queue=b.queue,
                    lane=b.lane,
                    committed=committed,
                    lag=max(b.max - max(committed, b.min), 0),
                    locked=locked,
                    lock_owner=(e.lock_owner or None) if e is not None and locked else None,
                    lock_expires_ms=e.lock_deadline_ms if e is not None and locked else None,
                    last_access_ms=(e.last_access_ms or None) if e is not None else None,
                    attempts=e.attempts if e is not None else 0,
                    dead_lettered=e.dead_lettered if e is not None else 0,
                )
            )
    return ConsumerRow(x, holds, read=True)


# --- the history, added up per interval -------------------------------------------------------


class Window(msgspec.Struct, frozen=True):
    """The points of a chart: `first` to `last` (epoch ms), one every `step` ms."""

    span: str
    first: int
    last: int
    step: int

    @property
    def since(self) -> int:
        return self.first

    @property
    def until(self) -> int:
        return self.last + self.step

    @property
    def starts(self) -> range:
        return range(self.first, self.last + 1, self.step)


def window_of(span: str, now: int, interval_ms: int) -> Window:
    if span not in RANGES:
        raise BadRequest(f"range must be one of {', '.join(SPANS)}", field="range")
    span_s, step_s = RANGES[span]
    step = max(step_s * 1000, interval_ms)
    last = now - now % step
    return Window(span, last - (span_s * 1000 // step - 1) * step, last, step)


# Per (group key, interval start): the summed values. A run's sums are shared out over its
# intervals (`additive`), its averages hold in each of them (the others).
Spread = dict[tuple[Any, int], list[float]]


def spread(rows: Iterable[Any], keys: int, additive: Sequence[bool], since: int, until: int) -> Spread:
    """Rows of (group key..., start_ms, interval_ms, intervals, value...), as the database grouped
    them, given back per single interval starting in [since, until)."""
    out: Spread = {}
    for r in rows:
        key = tuple(r[:keys]) if keys else ()
        start, span, runs = int(r[keys]), int(r[keys + 1]), max(int(r[keys + 2] or 1), 1)
        values = [float(x or 0) for x in r[keys + 3 :]]
        step = span // runs
        for i in range(runs):
            at = start + i * step
            if not since <= at < until:
                continue
            have = out.setdefault((key, at), [0.0] * len(values))
            for j, x in enumerate(values):
                have[j] += x / runs if additive[j] else x
    return out


class TopicHistory:
    """The queue-state history of one topic, added up by the database per interval."""

    def __init__(self, c: Console, t: TopicRecord) -> None:
        h = c.platform.queue_state.history
        self.engine = h.engine
        self.queues, self.consumers, self.produce = h.queues, h.consumers, h.produce
        self.project = topic_project(t)
        self.topic = t.name

    def _grouped(
        self, table: sa.Table, values: list[Any], group: list[Any], since: int, until: int, *where: Any
    ) -> list[Any]:
        c = table.c
        runs = c.intervals if "intervals" in c else sa.literal(1)
        query = (
            sa.select(*group, c.start_ms, c.interval_ms, runs.label("runs"), *values)
            .where(c.project == self.project, c.topic == self.topic, *where)
            .where(c.start_ms >= since - MAX_RUN_MS, c.start_ms < until)
            .group_by(*group, c.start_ms, c.interval_ms, runs)
        )
        with self.engine.connect() as conn:
            return list(conn.execute(query).all())

    def coverage(self, since: int, until: int, queue: int | None = None) -> set[int]:
        """The intervals some gateway sampled the topic in (its queue rows say it was watched:
        nothing produced there is a rate of 0, not a gap)."""
        c = self.queues.c
        where = [c.queue == queue] if queue is not None else []
        rows = self._grouped(self.queues, [], [], since, until, *where)
        return {at for _, at in spread(rows, 0, [], since, until)}

    def produced(self, since: int, until: int) -> Spread:
        rows = self._grouped(self.produce, [sa.func.sum(self.produce.c.produced)], [], since, until)
        return spread(rows, 0, [True], since, until)

    def consumed(self, since: int, until: int, queues: Sequence[int] | None = None) -> Spread:
        """Messages delivered, and the summed average backlog of every consumer and queue,
        per interval (by queue when `queues` are named)."""
        c = self.consumers.c
        backlog = sa.func.sum(sa.case((c.covered_ms > 0, c.backlog_area * 1.0 / c.covered_ms), else_=0.0))
        group = [c.queue] if queues is not None else []
        where = [c.queue.in_(list(queues))] if queues is not None else [c.queue >= 0]
        rows = self._grouped(self.consumers, [sa.func.sum(c.delivered), backlog], group, since, until, *where)
        return spread(rows, len(group), [True, False], since, until)

    def lengths(self, queue: int, since: int, until: int) -> Spread:
        c = self.queues.c
        average = sa.func.sum(sa.case((c.covered_ms > 0, c.length_area * 1.0 / c.covered_ms), else_=0.0))
        rows = self._grouped(self.queues, [average], [], since, until, c.queue == queue)
        return spread(rows, 0, [False], since, until)

    def most_backlog(self, queue: int, since: int, until: int, limit: int) -> list[str]:
        """The consumers with the highest backlog on `queue` in the window."""
        c = self.consumers.c
        query = (
            sa.select(c.consumer)
            .where(c.project == self.project, c.topic == self.topic, c.queue == queue)
            .where(c.start_ms >= since - MAX_RUN_MS, c.start_ms < until, c.max_backlog.is_not(None))
            .group_by(c.consumer)
            .order_by(sa.func.max(c.max_backlog).desc(), c.consumer)
            .limit(limit)
        )
        with self.engine.connect() as conn:
            return [str(r[0]) for r in conn.execute(query)]

    def consumer_activity(self, consumer: str, since: int, until: int) -> Spread:
        """One consumer's messages delivered and acked, and its backlog (the average of each of
        the topic's queues, summed), per interval."""
        c = self.consumers.c
        backlog = sa.func.sum(sa.case((c.covered_ms > 0, c.backlog_area * 1.0 / c.covered_ms), else_=0.0))
        values = [sa.func.sum(c.delivered), sa.func.sum(c.acked), backlog]
        rows = self._grouped(self.consumers, values, [], since, until, c.consumer == consumer, c.queue >= 0)
        return spread(rows, 0, [True, True, False], since, until)

    def backlog_of(self, consumers: list[str], queue: int, since: int, until: int) -> Spread:
        c = self.consumers.c
        average = sa.func.sum(sa.case((c.covered_ms > 0, c.backlog_area * 1.0 / c.covered_ms), else_=0.0))
        rows = self._grouped(
            self.consumers, [average], [c.consumer], since, until, c.queue == queue, c.consumer.in_(consumers)
        )
        return spread(rows, 1, [False], since, until)


def per_point(
    w: Window, covered: set[int], per_interval: dict[int, float], interval_ms: int, rate: bool
) -> list[tuple[int, float | None]]:
    """One value per point of `w`: a rate (the sum over the covered time) or the average over
    its covered intervals; None where no interval was covered (a gap)."""
    buckets: dict[int, list[int]] = {}
    for at in covered:
        buckets.setdefault(at - at % w.step, []).append(at)
    out: list[tuple[int, float | None]] = []
    for point in w.starts:
        mine = buckets.get(point)
        if not mine:
            out.append((point, None))
            continue
        total = sum(per_interval.get(at, 0.0) for at in mine)
        out.append((point, total * 1000 / (len(mine) * interval_ms) if rate else total / len(mine)))
    return out


def column(found: Spread, j: int, key: tuple[Any, ...] = ()) -> dict[int, float]:
    return {at: values[j] for (k, at), values in found.items() if k == key}


async def flushed(c: Console) -> None:
    await c.platform.queue_state.recorder.flush()  # closed intervals this gateway still holds


def interval_of(c: Console) -> int:
    return max(int(c.settings.queue_state_interval_s * 1000), 1)


async def dead_letter_points(
    c: Console, t: TopicRecord, w: Window, only: ConsumerRecord | None = None
) -> tuple[list[tuple[int, float | None]], int]:
    """Messages moved to the dead letters of the topic's consumers per point, counted from
    the dead-letter topics (each letter carries the time it was moved, in order, so a point's
    count is the distance between two offsets found by time); and how many consumers with
    letters in the window were left out (past DEAD_LETTER_SOURCES), or not looked at (past
    DEAD_LETTER_LOOKS)."""
    store = c.gateway.ctx.store
    counts = [0] * len(w.starts)
    sources = 0
    skipped = 0
    consumers = by_topic(c).consumers.get(t.name, []) if only is None else [only]
    skipped = max(len(consumers) - DEAD_LETTER_LOOKS, 0)  # not looked at: said on the page
    for x in consumers[:DEAD_LETTER_LOOKS]:
        name = dlq_topic(x.name)
        try:
            bounds = await store.bounds(name)
            if not bounds or bounds[0].max <= bounds[0].min:
                continue
            first = await store.offset_for_time(name, 0, w.since)
            if first >= bounds[0].max:
                continue
            if sources >= DEAD_LETTER_SOURCES:
                skipped += 1
                continue
            sources += 1
            edges = [first] + [await store.offset_for_time(name, 0, at) for at in w.starts[1:]]
            edges.append(bounds[0].max)
        except MqgateError:
            continue
        for i in range(len(counts)):
            counts[i] += edges[i + 1] - edges[i]
    # Before the topic was made there was nothing to count: a gap, as the other charts have.
    made = t.created_ms - w.step
    return [(at, float(n) if at > made else None) for at, n in zip(w.starts, counts, strict=True)], skipped


def delivery_traced(c: Console, t: TopicRecord, consumer: str | None = None) -> bool:
    """Whether a trace policy now records the delivered hops of `t` (those of `consumer`
    only, if named): one for its project, the topic or a queue of it, or for a consumer of it
    by name (a producer's policy traces its produces, not their deliveries)."""
    project = topic_project(t)
    names = {consumer} if consumer is not None else {x.name for x in by_topic(c).consumers.get(t.name, [])}
    for p in c.platform.tracing.policies.policies:
        if p.mode == "project" and p.project == project:
            return True
        if p.mode in ("route", "queue") and p.topic == t.name:
            return True
        if p.mode == "service" and p.service in names:
            return True
    return False


async def latency_charts(
    c: Console, t: TopicRecord, w: Window, consumer: str | None = None
) -> list[Chart | ChartNote]:
    """Produce→delivered latency, median and 99th percentile per point, from a bounded sample
    of the trace index's delivered hops (tracing/query.py: `delivery_latencies`); where nothing
    traces the deliveries, a note in the charts' place that says so, with the way to turn
    tracing on."""
    whose = f"consumer {consumer}" if consumer is not None else f"topic {t.name}"
    if not delivery_traced(c, t, consumer):
        return [
            ChartNote(
                "latency",
                "Produce → delivered latency",
                f"No trace policy records the deliveries of {whose}, so there is no latency to chart "
                "(it is measured from the traced hops).",
                c.url("/traces/policies"),
                "Turn tracing on with a trace policy",
            )
        ]
    # The median and 99th percentile of points closed long enough ago for the index to hold
    # their hops are kept (a live refresh then reads the newest points only): the series from
    # its first point not kept on. Per series: the topic as made (a topic made again starts
    # afresh), the consumer, the step.
    cache: dict[LatencyKey, dict[int, tuple[float | None, ...]]] = c.cache.setdefault("latency", {})
    if len(cache) > LATENCY_SERIES_KEPT:
        cache.clear()
    kept = cache.setdefault((t.name, t.created_ms, consumer, w.step), {})
    for at in [at for at in kept if at < w.first]:
        del kept[at]
    fresh = list(w.starts)
    while fresh and fresh[0] in kept:
        fresh.pop(0)
    try:
        found = await c.platform.tracing.query.latencies(
            topic=t.name,
            consumer=consumer,
            starts=fresh,
            step_ms=w.step,
            max_bytes=c.settings.max_answer_bytes,
            scan_rows=LATENCY_SCAN_ROWS * len(fresh) // len(w.starts),
        )
    except MqgateError as exc:
        return [
            ChartNote("latency", "Produce → delivered latency",
                      f"The trace index cannot be read just now ({exc.message}).", c.url("/traces"), "Traces")
        ]  # fmt: skip
    settled = now_ms() - LATENCY_SETTLED_MS
    quantiles = dict(kept)
    for at, values in zip(fresh, found.points, strict=True):
        quantiles[at] = tuple(percentile(values, q) for q, _, _ in LATENCY_QUANTILES)
        if at + w.step <= settled and not found.cut:
            kept[at] = quantiles[at]
    charts: list[Chart | ChartNote] = []
    for i, (_, key, label) in enumerate(LATENCY_QUANTILES):
        points = [(at, quantiles[at][i]) for at in w.starts]
        title = f"Produce → delivered latency, {label} (traced, sampled)"
        charts.append(line_chart(key, title, "ms", points, span_label=w.span))
    return charts


async def topic_charts(c: Console, t: TopicRecord, span: str) -> tuple[list[Chart | ChartNote], int]:
    await flushed(c)
    interval = interval_of(c)
    w = window_of(span, now_ms(), interval)
    h = TopicHistory(c, t)
    covered, produced, consumed = await asyncio.gather(
        asyncio.to_thread(h.coverage, w.since, w.until),
        asyncio.to_thread(h.produced, w.since, w.until),
        asyncio.to_thread(h.consumed, w.since, w.until),
    )
    (letters, skipped), latency = await asyncio.gather(dead_letter_points(c, t, w), latency_charts(c, t, w))
    charts: list[Chart | ChartNote] = [
        line_chart("produce", "Messages produced per second", "msg/s",
                   per_point(w, covered, column(produced, 0), interval, rate=True), span_label=span),
        line_chart("consume", "Messages delivered per second", "msg/s",
                   per_point(w, covered, column(consumed, 0), interval, rate=True), span_label=span),
        line_chart("lag", "Consumer lag (average, all consumers)", "messages",
                   per_point(w, covered, column(consumed, 1), interval, rate=False), span_label=span),
        line_chart("deadletters", "Messages dead-lettered", "messages", letters, span_label=span),
        *latency,
    ]  # fmt: skip
    return charts, skipped


async def consumer_charts(
    c: Console, t: TopicRecord, x: ConsumerRecord, span: str
) -> list[Chart | ChartNote]:
    """A consumer's own charts: delivered and acked per second, its backlog on the topic's
    queues, its dead letters, the latency of its deliveries where they are traced."""
    await flushed(c)
    interval = interval_of(c)
    w = window_of(span, now_ms(), interval)
    h = TopicHistory(c, t)
    covered, activity = await asyncio.gather(
        asyncio.to_thread(h.coverage, w.since, w.until),
        asyncio.to_thread(h.consumer_activity, x.name, w.since, w.until),
    )
    (letters, _), latency = await asyncio.gather(
        dead_letter_points(c, t, w, only=x), latency_charts(c, t, w, x.name)
    )
    return [
        line_chart("delivered", "Messages delivered per second", "msg/s",
                   per_point(w, covered, column(activity, 0), interval, rate=True), span_label=span),
        line_chart("acked", "Messages acked per second", "msg/s",
                   per_point(w, covered, column(activity, 1), interval, rate=True), span_label=span),
        line_chart("backlog", "Backlog (average, all queues)", "messages",
                   per_point(w, covered, column(activity, 2), interval, rate=False), span_label=span),
        line_chart("deadletters", "Messages dead-lettered", "messages", letters, span_label=span),
        *latency,
    ]  # fmt: skip


async def queue_charts(c: Console, t: TopicRecord, queue: int, span: str) -> list[Chart]:
    await flushed(c)
    interval = interval_of(c)
    w = window_of(span, now_ms(), interval)
    h = TopicHistory(c, t)
    covered, lengths, top = await asyncio.gather(
        asyncio.to_thread(h.coverage, w.since, w.until, queue),
        asyncio.to_thread(h.lengths, queue, w.since, w.until),
        asyncio.to_thread(h.most_backlog, queue, w.since, w.until, BACKLOG_CHARTS),
    )
    backlog = await asyncio.to_thread(h.backlog_of, top, queue, w.since, w.until) if top else {}
    charts = [
        line_chart("length", f"Queue {queue} length (average)", "messages",
                   per_point(w, covered, column(lengths, 0), interval, rate=False), span_label=span),
    ]  # fmt: skip
    for i, name in enumerate(top):
        points = per_point(w, covered, column(backlog, 0, (name,)), interval, rate=False)
        charts.append(line_chart(f"backlog-{i}", f"Backlog of {name}", "messages", points, span_label=span))
    return charts


async def recent_rates(
    c: Console, t: TopicRecord, bounds: Sequence[QueueBounds], every: Sequence[QueueBounds] | None = None
) -> tuple[dict[int, float], dict[int, float | None], float | None, float | None]:
    """Over the last RATE_WINDOW_MS: each queue's produce rate (from its offsets: exact), each
    queue's delivery rate (from the history), and the topic's produce and delivery rates. The
    topic's produce rate is the sum of the per-queue rates over all its queues (`every`, else
    `bounds`), so the headline agrees with the table of queues."""
    store = c.gateway.ctx.store
    now = now_ms()
    since = now - RATE_WINDOW_MS
    every = bounds if every is None else every
    firsts = await asyncio.gather(*(store.offset_for_time(t.name, b.queue, since) for b in every))
    all_produced = {
        b.queue: (b.max - max(o, b.min)) * 1000 / RATE_WINDOW_MS for b, o in zip(every, firsts, strict=True)
    }
    produced = {b.queue: all_produced[b.queue] for b in bounds}
    await flushed(c)
    h = TopicHistory(c, t)
    covered, by_queue, topic_wide = await asyncio.gather(
        asyncio.to_thread(h.coverage, since, now),
        asyncio.to_thread(h.consumed, since, now, [b.queue for b in bounds]),
        asyncio.to_thread(h.consumed, since, now),
    )
    span = len(covered) * interval_of(c)

    def rate(total: float) -> float | None:
        return total * 1000 / span if span else None

    delivered: dict[int, float] = {}
    for (key, _), values in by_queue.items():
        delivered[key[0]] = delivered.get(key[0], 0.0) + values[0]
    queue_rates = {b.queue: rate(delivered.get(b.queue, 0.0)) for b in bounds}
    return (
        produced,
        queue_rates,
        sum(all_produced.values()),
        rate(sum(v[0] for v in topic_wide.values())),
    )


async def queue_sizes(c: Console, t: TopicRecord) -> dict[int, int] | None:
    """The bytes each of the topic's store queues holds (`MessageStore.queue_bytes`: one look
    for all of them), or None if the store could not say just now (the page says so)."""
    try:
        return dict(enumerate(await c.gateway.ctx.store.queue_bytes(t.name)))
    except MqgateError:
        return None


# --- messages ---------------------------------------------------------------------------------


def short_row(queue: int, offset: int, raw: bytes) -> dict[str, Any]:
    row = message_row(queue, offset, raw)
    body: str = row["body"]
    row["preview"] = body[:BODY_CHARS]
    row["cut"] = len(body.encode()) - len(row["preview"].encode())
    return row


async def newest_messages(c: Console, t: TopicRecord, bounds: Sequence[QueueBounds]) -> list[dict[str, Any]]:
    """The topic's newest LAST_MESSAGES messages, newest first: the last message of every queue
    tells which queues hold the newest, and only those are read further."""
    reading = c.gateway.log_reading
    filled = [b for b in bounds if b.max > b.min]
    lasts = await asyncio.gather(*(reading.read_within(t.name, b.queue, b.max - 1, 1) for b in filled))
    tops = sorted(
        ((short_row(b.queue, got[0][0], got[0][1]), b) for b, got in zip(filled, lasts, strict=True) if got),
        key=lambda rb: (rb[0]["timestamp"], rb[0]["offset"]),
        reverse=True,
    )[:LAST_MESSAGES]
    rows: list[dict[str, Any]] = []
    for _, b in tops:
        start = max(b.min, b.max - LAST_MESSAGES)
        rows += [
            short_row(b.queue, o, raw)
            for o, raw in await reading.read_within(t.name, b.queue, start, b.max - start)
        ]
    rows.sort(key=lambda r: (r["timestamp"], r["offset"], r["queue"]), reverse=True)
    return rows[:LAST_MESSAGES]


# --- the pages --------------------------------------------------------------------------------


class TopicPages:
    def __init__(self, c: Console) -> None:
        self.c = c

    def _topic(self, v: Request) -> TopicRecord:
        """The topic the path names, if the user may see its project; else the page of a
        topic that does not exist. Read from the registry's copy (no look at the registry on a
        miss: a miss must take as long as a refusal)."""
        name = v.params["name"]
        t = self.c.gateway.ctx.registry.snapshot.topics.get(name)
        if t is None or name.startswith(INTERNAL_PREFIXES) or not principal(v).can_view(topic_project(t)):
            raise missing(name)
        return t

    def _queue(self, v: Request, t: TopicRecord) -> int:
        raw = v.params["queue"]
        # ASCII digits only: "²" is a digit to str.isdigit, not to int().
        if not (raw.isascii() and raw.isdigit()) or len(raw) > 9 or int(raw) >= t.store_queues:
            raise NotFound(f"topic {t.name} has no queue {raw} (its queues are 0 to {t.store_queues - 1})",
                           field="queue")  # fmt: skip
        return int(raw)

    def _span(self, v: Request) -> str:
        span = v.arg("range", "hour")
        if span not in SPANS:
            raise BadRequest(f"range must be one of {', '.join(SPANS)}", field="range")
        return span

    def _values(self, v: Request, t: TopicRecord) -> dict[str, Any]:
        readers = by_topic(self.c)
        return {
            "t": t,
            "project": topic_project(t),
            "can_view_project": principal(v).can_view(topic_project(t)),
            "spans": SPANS,
            "producers": readers.producers.get(t.name, []),
            "now": now_ms(),
        }

    async def topic(self, v: Request) -> Response:
        t = self._topic(v)
        span = self._span(v)
        every = await self.c.gateway.log_reading.bounds(t.name)
        queues, queue_pager = paginate(v, every, QUEUES_PER_PAGE, "qpage")
        consumers_all = by_topic(self.c).consumers.get(t.name, [])
        consumers, consumer_pager = paginate(
            v, matching(v, consumers_all, "name"), CONSUMERS_PER_PAGE, "cpage"
        )
        rows = await asyncio.gather(*(holds_of(self.c, x, t, every) for x in consumers))
        rates, messages, (charts, skipped), sizes = await asyncio.gather(
            recent_rates(self.c, t, queues, every),
            newest_messages(self.c, t, every),
            topic_charts(self.c, t, span),
            queue_sizes(self.c, t),
        )
        produced, delivered, produce_rate, deliver_rate = rates
        return self.c.page(
            v,
            "topic.html",
            queues=queues,
            queue_pager=queue_pager,
            total_messages=sum(b.max - b.min for b in every),
            sizes=sizes,
            total_bytes=None if sizes is None else sum(sizes.values()),
            queue_count=len(every),
            produced=produced,
            delivered=delivered,
            produce_rate=produce_rate,
            deliver_rate=deliver_rate,
            consumer_rows=rows,
            consumer_pager=consumer_pager,
            consumer_total=len(consumers_all),
            q=v.arg("q"),
            messages=messages,
            charts=charts,
            skipped_sources=skipped,
            span=span,
            locks_shown=LOCKS_SHOWN,
            behind_shown=BEHIND_SHOWN,
            window_min=RATE_WINDOW_MS // 60_000,
            **self._values(v, t),
        )

    async def queue(self, v: Request) -> Response:
        t = self._topic(v)
        queue = self._queue(v, t)
        span = self._span(v)
        every = await self.c.gateway.log_reading.bounds(t.name)
        b = every[queue]
        consumers_all = by_topic(self.c).consumers.get(t.name, [])
        consumers, consumer_pager = paginate(
            v, matching(v, consumers_all, "name"), QUEUE_CONSUMERS_PER_PAGE, "cpage"
        )
        rows = await asyncio.gather(*(holds_of(self.c, x, t, [b]) for x in consumers))
        before = v.int_arg("before")
        end = b.max if before is None else min(max(before, b.min), b.max)
        start = max(b.min, end - QUEUE_MESSAGES)
        raw = (
            await self.c.gateway.log_reading.read_within(t.name, queue, start, end - start)
            if end > start
            else []
        )
        messages = [short_row(queue, o, r) for o, r in reversed(raw)]
        (produced, delivered, _, _), charts, sizes = await asyncio.gather(
            recent_rates(self.c, t, [b]), queue_charts(self.c, t, queue, span), queue_sizes(self.c, t)
        )
        return self.c.page(
            v,
            "queue.html",
            queue=queue,
            b=b,
            produced=produced[queue],
            delivered=delivered[queue],
            queue_bytes=None if sizes is None else sizes.get(queue),
            consumer_rows=rows,
            consumer_pager=consumer_pager,
            consumer_total=len(consumers_all),
            q=v.arg("q"),
            messages=messages,
            older=start if start > b.min else None,
            newer=min(end + QUEUE_MESSAGES, b.max) if end < b.max else None,
            first_offset=start,
            end_offset=end,
            charts=charts,
            span=span,
            window_min=RATE_WINDOW_MS // 60_000,
            **self._values(v, t),
        )

    async def live_topic_charts(self, v: Request) -> Response:
        t = self._topic(v)
        span = self._span(v)
        charts, _ = await topic_charts(self.c, t, span)
        return fragment(self.c, v, "charts_part.html", charts=charts, span=span, spans=SPANS)

    async def live_queue_charts(self, v: Request) -> Response:
        t = self._topic(v)
        queue = self._queue(v, t)
        span = self._span(v)
        charts = await queue_charts(self.c, t, queue, span)
        return fragment(self.c, v, "charts_part.html", charts=charts, span=span, spans=SPANS)

    async def live_consumer_charts(self, v: Request) -> Response:
        x = await self.c.gateway.topology.consumer(v.params["name"])
        t = self.c.gateway.ctx.registry.snapshot.topics.get(x.topic)
        if t is None or not principal(v).can_view(topic_project(t)):
            raise NotFound(f"consumer {x.name} does not exist", field="name")
        span = self._span(v)
        charts = await consumer_charts(self.c, t, x, span)
        return fragment(self.c, v, "charts_part.html", charts=charts, span=span, spans=SPANS)

    def routes(self) -> list[Route]:
        return [
            route("GET", "/live/consumers/{name}/charts", self.live_consumer_charts, "fragment"),
            route("GET", "/topics/{name}", self.topic),
            route("GET", "/topics/{name}/queues/{queue}", self.queue),
            route("GET", "/live/topics/{name}/charts", self.live_topic_charts, "fragment"),
            route("GET", "/live/topics/{name}/queues/{queue}/charts", self.live_queue_charts, "fragment"),
        ]
