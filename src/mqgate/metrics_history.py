"""A history of the gateway's throughput and lag for the console's charts (issue 13 §3).

Every `sample_every_s` the gateway reads its own counters (messages produced, messages
delivered) and the sum of its consumers' lag gauges, and adds what changed since the last
sample to two rows: the minute's and the hour's. Rows are kept 7 days (minutes) and 90 days
(hours), so the table stays bounded (about 12,000 rows per gateway). They live in SQL (the
registry's PostgreSQL when there is one, else an SQLite file beside the data, as the queue
state history does), so the history survives restarts; each gateway writes its own rows
(`source`), and a chart adds the gateways' rates and takes the largest lag (every gateway sees
the same consumers' lag).

A row holds sums, not rates: messages produced and consumed, the lag × time area, the largest
lag seen, and the time the samples covered; a rate is messages / covered time, so a minute the
gateway was down for half of is not shown at half the rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Iterable
from typing import Any, Final

import msgspec
import sqlalchemy as sa

from mqgate.services.context import Context
from mqgate.services.gateway import Feature
from mqgate.sqlschema import create_all_shared, upsert_insert

log = logging.getLogger(__name__)

MINUTE_S: Final = 60
HOUR_S: Final = 3600
# (resolution in seconds, how long its rows are kept in seconds)
RESOLUTIONS: Final = ((MINUTE_S, 7 * 86_400), (HOUR_S, 90 * 86_400))
# A chart's range: (span in seconds, rows of this resolution, one point per this many seconds)
RANGES: Final = {
    "hour": (3600, MINUTE_S, 60),
    "day": (86_400, MINUTE_S, 600),
    "week": (7 * 86_400, HOUR_S, 3600),
}
PRUNE_EVERY_S: Final = 3600.0

meta: Final = sa.MetaData()
history = sa.Table(
    "mqgate_metrics_history",
    meta,
    sa.Column("resolution_s", sa.Integer, primary_key=True),
    sa.Column("bucket_ms", sa.BigInteger, primary_key=True),  # start of the minute or hour
    sa.Column("source", sa.String(200), primary_key=True),  # the gateway: host:port
    sa.Column("produced", sa.BigInteger, nullable=False),
    sa.Column("consumed", sa.BigInteger, nullable=False),
    sa.Column("lag_area", sa.Float, nullable=False),  # lag × milliseconds
    sa.Column("lag_max", sa.BigInteger, nullable=False),
    sa.Column("covered_ms", sa.BigInteger, nullable=False),
)


class Point(msgspec.Struct, frozen=True):
    """One point of a chart: None where nothing was recorded."""

    at_ms: int
    produce_rate: float | None  # messages per second
    consume_rate: float | None
    lag: float | None  # time-weighted average
    lag_max: int | None


class Reading(msgspec.Struct, frozen=True):
    produced: float
    consumed: float
    lag: float


def _sum(metric: Any, suffix: str = "") -> float:
    return float(
        sum(s.value for family in metric.collect() for s in family.samples if s.name.endswith(suffix))
    )


def engine_for(url: str) -> sa.Engine:
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite"):
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    return sa.create_engine(url, **kwargs)


class MetricsHistory(Feature):
    def __init__(
        self, ctx: Context, *, url: str | None = None, sample_every_s: float = 10.0, source: str | None = None
    ) -> None:
        self.ctx = ctx
        self.sample_every_s = sample_every_s
        self.source = source or f"{socket.gethostname()}:{ctx.settings.port}"
        self.engine = engine_for(url or ctx.settings.index_url("metrics-history.sqlite"))

        # Both dialects have INSERT ... ON CONFLICT DO UPDATE (an upsert adding to a row).
        self._insert = upsert_insert(self.engine)
        self._last: Reading | None = None
        self._last_ms = 0
        self._pruned_at = 0.0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await asyncio.to_thread(create_all_shared, meta, self.engine)
        self._last, self._last_ms = self.read(), _now_ms()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="metrics-history")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
            with contextlib.suppress(Exception):  # the last few seconds, if the database is there
                await self.sample()
        await asyncio.to_thread(self.engine.dispose)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.sample_every_s)
            try:
                await self.sample()
                if time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                    await asyncio.to_thread(self.prune, _now_ms())
                    self._pruned_at = time.monotonic()
            except Exception as exc:  # the database is away: the next sample carries the counts
                log.warning("metrics history: %s", exc)
                self.ctx.health.fault("background", "metrics_history", repr(exc))

    def read(self) -> Reading:
        m = self.ctx.metrics
        return Reading(_sum(m.produced, "_total"), _sum(m.consumed, "_total"), _sum(m.lag))

    async def sample(self, *, at_least_s: float = 0.0) -> None:
        """Record what changed since the last sample (unless that was under `at_least_s` ago).
        What a failed write did not record stays counted for the next sample."""
        async with self._lock:
            now = _now_ms()
            if self._last is None or not sample_due(now, self._last_ms, at_least_s):
                return
            current = self.read()
            covered = max(now - self._last_ms, 0)
            rows = [
                {
                    "resolution_s": resolution,
                    "bucket_ms": now - now % (resolution * 1000),
                    "source": self.source,
                    # A counter only falls when the process restarted: then all of it is new.
                    "produced": int(_delta(current.produced, self._last.produced)),
                    "consumed": int(_delta(current.consumed, self._last.consumed)),
                    "lag_area": current.lag * covered,
                    "lag_max": int(current.lag),
                    "covered_ms": covered,
                }
                for resolution, _ in RESOLUTIONS
            ]
            await asyncio.to_thread(self._add, rows)
            self._last, self._last_ms = current, now

    def _add(self, rows: list[dict[str, Any]]) -> None:
        stmt = self._insert(history).values(rows)
        new, c = stmt.excluded, history.c
        stmt = stmt.on_conflict_do_update(
            index_elements=[c.resolution_s, c.bucket_ms, c.source],
            set_={
                "produced": c.produced + new.produced,
                "consumed": c.consumed + new.consumed,
                "lag_area": c.lag_area + new.lag_area,
                "lag_max": sa.case((new.lag_max > c.lag_max, new.lag_max), else_=c.lag_max),
                "covered_ms": c.covered_ms + new.covered_ms,
            },
        )
        with self.engine.begin() as conn:
            conn.execute(stmt)

    def prune(self, now_ms: int) -> int:
        removed = 0
        with self.engine.begin() as conn:
            for resolution, keep_s in RESOLUTIONS:
                result = conn.execute(
                    sa.delete(history).where(
                        history.c.resolution_s == resolution, history.c.bucket_ms < now_ms - keep_s * 1000
                    )
                )
                removed += result.rowcount or 0
        return removed

    async def series(self, span: str, now_ms: int | None = None) -> list[Point]:
        """The points of a chart over the last `span` (hour, day or week), oldest first, one
        for every step (None where nothing was recorded)."""
        if span not in RANGES:
            raise ValueError(f"span must be one of {', '.join(RANGES)}")
        return await asyncio.to_thread(self._series, span, _now_ms() if now_ms is None else now_ms)

    def _series(self, span: str, now: int) -> list[Point]:
        span_s, resolution, step_s = RANGES[span]
        step = step_s * 1000
        last = now - now % step
        first = last - (span_s // step_s - 1) * step
        c = history.c
        point = (c.bucket_ms - c.bucket_ms % step).label("bucket_ms")
        q = (  # added up per point and gateway in the database: a day is 1,440 rows a gateway
            sa.select(
                point,
                c.source,
                sa.func.sum(c.produced).label("produced"),
                sa.func.sum(c.consumed).label("consumed"),
                sa.func.sum(c.lag_area).label("lag_area"),
                sa.func.max(c.lag_max).label("lag_max"),
                sa.func.sum(c.covered_ms).label("covered_ms"),
            )
            .where(c.resolution_s == resolution, c.bucket_ms >= first)
            .group_by(point, c.source)
        )
        with self.engine.connect() as conn:
            rows = conn.execute(q).all()
        return points(rows, first, last, step)


def points(rows: Iterable[Any], first: int, last: int, step: int) -> list[Point]:
    """Rows added up per point and gateway; rates added over the gateways, lag the largest."""
    sums: dict[tuple[int, str], list[float]] = {}
    for r in rows:
        at = r.bucket_ms - r.bucket_ms % step
        s = sums.setdefault((at, r.source), [0, 0, 0.0, 0, 0])
        s[0] += r.produced
        s[1] += r.consumed
        s[2] += r.lag_area
        s[3] = max(s[3], r.lag_max)
        s[4] += r.covered_ms
    by_point: dict[int, list[list[float]]] = {}
    for (at, _), s in sums.items():
        if s[4] > 0:
            by_point.setdefault(at, []).append(s)
    out = []
    for at in range(first, last + 1, step):
        mine = by_point.get(at)
        if not mine:
            out.append(Point(at, None, None, None, None))
            continue
        out.append(
            Point(
                at,
                sum(s[0] * 1000 / s[4] for s in mine),
                sum(s[1] * 1000 / s[4] for s in mine),
                max(s[2] / s[4] for s in mine),
                int(max(s[3] for s in mine)),
            )
        )
    return out


def sample_due(now_ms: int, last_ms: int, at_least_s: float) -> bool:
    """Whether a sample is due: `at_least_s` passed since the last one, or a new minute began
    since it (else a chart drawn just after the minute turned would end in a point with no
    data, though the gateway was up all along)."""
    minute_ms = MINUTE_S * 1000
    return now_ms - last_ms >= at_least_s * 1000 or now_ms // minute_ms != last_ms // minute_ms


def _delta(now: float, before: float) -> float:
    return now - before if now >= before else now


def _now_ms() -> int:
    return int(time.time() * 1000)
