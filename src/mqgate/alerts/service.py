"""Alerts with webhook notifications (SPEC G9, issue 13).

Every `alert_check_interval_s` each gateway evaluates the rules of mqgate.alerts.rules (a
consumer's lag over its threshold; dead letters growing) and applies what changed to the table
`mqgate_alerts` in the registry's database, which every gateway shares.

A check evaluates the consumers whose rules may have changed since the last one (issue 27): those
whose lag may have moved or whose dead-letter topic was written, as the store and the offsets tell
(services/changes.py), those whose registration changed, those whose dead-letter alert is firing
and whose window passes a count sampled by now (a heap of the next such time per consumer: time
only lowers the count within a window), and those the last check could not evaluate. Nothing
moved, nothing due: a check reads no store, evaluates no rule and only reads the active alerts
(every gateway's) again. Every
consumer is evaluated at the first check, after a move of anything (e.g. the projects with
clusters changed), and at every check where moves can go unheard (a Redis store other gateways
write to, a project served by a cluster), as before. `mqgate_alert_checks_total` and
`mqgate_alert_consumers_checked_total` count both. A transition is claimed
there by a conditional UPDATE (or the INSERT of a new key): of several gateways seeing the same
alert fire or resolve, exactly one wins, and only the winner notifies. So an alert that stays
active is never notified twice, across gateways and restarts.

A notification is a JSON POST (mqgate.alerts.rules.notification) to `alert_webhook_url`, sent by
a task of its own from a bounded queue: each attempt within `alert_webhook_timeout_s`, at most
`alert_webhook_attempts` attempts with a doubling pause between them (a 4xx other than 408 and
429 is not tried again). A failed attempt is logged and counted (`mqgate_alert_webhook_errors`),
a notification given up is counted (`mqgate_alert_notifications{outcome="failed"}`); nothing of
it waits in a request's path.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import socket
from typing import Any, Final

import msgspec
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from mqgate.alerts.rules import (
    CONSUMER_GONE,
    DEAD_LETTERS,
    FIRING,
    KINDS,
    LAG,
    RESOLVED,
    UNSURE,
    Clear,
    Condition,
    DeadLetterWatch,
    Decision,
    Verdict,
    alert_key,
    decide,
    lag_verdict,
    notification,
)
from mqgate.alerts.webhook import Webhook
from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import MODE_CLUSTER
from mqgate.names import DLQ_PREFIX, dlq_topic
from mqgate.registry.records import DEFAULT_PROJECT, ConsumerRecord, TopicRecord
from mqgate.services.changes import ChangeReader
from mqgate.services.context import now_ms
from mqgate.services.gateway import Gateway
from mqgate.settings import Settings
from mqgate.sqlschema import create_all_shared

log = logging.getLogger(__name__)

READ_CHUNK: Final = 200  # dead-letter counts read at once

meta: Final = sa.MetaData()
table = sa.Table(
    "mqgate_alerts",
    meta,
    sa.Column("key", sa.String(300), primary_key=True),  # "<kind>:<consumer>"
    sa.Column("kind", sa.String(32), nullable=False),
    sa.Column("consumer", sa.String(200), nullable=False),
    sa.Column("topic", sa.String(200), nullable=False),
    sa.Column("project", sa.String(128), nullable=False),
    sa.Column("state", sa.String(16), nullable=False),  # firing, resolved
    sa.Column("value", sa.BigInteger, nullable=False),
    sa.Column("peak", sa.BigInteger, nullable=False),
    sa.Column("threshold", sa.BigInteger, nullable=False),
    sa.Column("window_s", sa.Float, nullable=False),
    sa.Column("summary", sa.Text, nullable=False),
    sa.Column("since_ms", sa.BigInteger, nullable=False),
    sa.Column("updated_ms", sa.BigInteger, nullable=False),
    sa.Column("resolved_ms", sa.BigInteger, nullable=True),
    sa.Column("reason", sa.String(64), nullable=True),
)


Row = dict[str, Any]  # an alert's row, as a notification is made from it


class ActiveAlert(msgspec.Struct, frozen=True):
    key: str
    kind: str
    consumer: str
    topic: str
    project: str
    value: int
    peak: int
    threshold: int
    window_s: float
    summary: str
    since_ms: int
    updated_ms: int


def _project(t: TopicRecord | None) -> str:
    return (t.project if t is not None else "") or DEFAULT_PROJECT


def check_settings(s: Settings) -> None:
    """The alert settings, refused at start-up naming the one that is wrong."""
    if s.alert_check_interval_s <= 0:
        raise BadRequest("alert_check_interval_s must be more than 0", field="alert_check_interval_s")
    if s.alert_webhook_url and not s.alert_webhook_url.startswith(("http://", "https://")):
        raise BadRequest("alert_webhook_url must be an http:// or https:// URL", field="alert_webhook_url")
    if s.alert_webhook_timeout_s <= 0:
        raise BadRequest("alert_webhook_timeout_s must be more than 0", field="alert_webhook_timeout_s")
    if s.alert_webhook_attempts < 1:
        raise BadRequest("alert_webhook_attempts must be 1 or more", field="alert_webhook_attempts")
    if s.alert_dead_letters < 0:
        raise BadRequest("alert_dead_letters must be 0 (off) or more", field="alert_dead_letters")
    if s.alert_dead_letter_window_s <= 0:
        raise BadRequest("alert_dead_letter_window_s must be more than 0", field="alert_dead_letter_window_s")


class AlertTable:
    """The shared active alerts, in SQL (called off the event loop)."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine

    def create(self) -> None:
        create_all_shared(meta, self.engine)

    def active(self) -> list[ActiveAlert]:
        c = table.c
        cols = [getattr(c, f) for f in ActiveAlert.__struct_fields__]
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(*cols).where(c.state == FIRING).order_by(c.since_ms, c.key)).all()
        return [ActiveAlert(*r) for r in rows]

    def apply(
        self, d: Decision, active: list[ActiveAlert], now: int
    ) -> tuple[list[Row], list[tuple[Row, str]]]:
        """Make the decision's changes; the rows of the transitions this call won: (fired,
        [(row, reason)] resolved)."""
        fired = [row for cond in d.fire if (row := self._fire(cond, now)) is not None]
        resolved = [(row, clear.reason) for key, clear in d.resolve
                    if (row := self._resolve(key, clear, now)) is not None]  # fmt: skip
        known = {a.key: a for a in active}
        changed = [k for k in d.keep if k.key in known and known[k.key].value != k.value]
        if changed:
            c = table.c
            stmt = (
                sa.update(table)
                .where(c.key == sa.bindparam("k"), c.state == FIRING)
                .values(value=sa.bindparam("v"), summary=sa.bindparam("s"), updated_ms=now,
                        peak=sa.case((c.peak < sa.bindparam("v"), sa.bindparam("v")), else_=c.peak))
            )  # fmt: skip
            with self.engine.begin() as conn:
                conn.execute(stmt, [{"k": k.key, "v": k.value, "s": k.summary} for k in changed])
        return fired, resolved

    def _fire(self, cond: Condition, now: int) -> Row | None:
        values = {
            "key": cond.key, "kind": cond.kind, "consumer": cond.consumer, "topic": cond.topic,
            "project": cond.project, "state": FIRING, "value": cond.value, "peak": cond.value,
            "threshold": cond.threshold, "window_s": cond.window_s, "summary": cond.summary,
            "since_ms": now, "updated_ms": now, "resolved_ms": None, "reason": None,
        }  # fmt: skip
        c = table.c
        try:
            with self.engine.begin() as conn:
                won = conn.execute(
                    sa.update(table).where(c.key == cond.key, c.state == RESOLVED).values(**values)
                ).rowcount
                if not won:
                    conn.execute(sa.insert(table).values(**values))  # a new key; fails if another has it
        except IntegrityError:
            return None  # another gateway raised it first (or it is still firing)
        return values

    def _resolve(self, key: str, clear: Clear, now: int) -> Row | None:
        c = table.c
        with self.engine.begin() as conn:
            row = conn.execute(sa.select(table).where(c.key == key, c.state == FIRING)).mappings().first()
            if row is None:
                return None
            mine = c.key == key, c.state == FIRING
            change = {"state": RESOLVED, "resolved_ms": now, "updated_ms": now, "reason": clear.reason}
            if clear.value is not None:
                change["value"] = clear.value
            if clear.reason == CONSUMER_GONE:  # its row goes with it
                won = conn.execute(sa.delete(table).where(*mine)).rowcount
            else:
                won = conn.execute(sa.update(table).where(*mine).values(**change)).rowcount
        return {**row, **change} if won else None


class Alerts:
    """The alert checks of one gateway process, and what it shows of them."""

    def __init__(self, gateway: Gateway, engine: sa.Engine, *, source: str | None = None) -> None:
        settings = gateway.ctx.settings
        check_settings(settings)
        self.gateway = gateway
        self.interval_s = settings.alert_check_interval_s
        self.table = AlertTable(engine)
        window_ms = int(settings.alert_dead_letter_window_s * 1000)
        self.dead_letters = DeadLetterWatch(settings.alert_dead_letters, window_ms)
        self.webhook = Webhook(settings, gateway.ctx.metrics) if settings.alert_webhook_url else None
        self.source = source or f"{socket.gethostname()}:{settings.port}"
        self.active: list[ActiveAlert] = []  # as of the last check
        self.checked_ms = 0
        self._lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        # What moved since the last check (None: not started, every check is full).
        self._moved: ChangeReader | None = None
        self._due: list[tuple[int, str]] = []  # (ms, consumer): its dead-letter window passes a count
        self._due_at: dict[str, int] = {}  # consumer -> its entry in _due (older entries are stale)
        self._unsure: set[str] = set()  # consumers a check could not evaluate: the next one tries
        self._broken = False  # a check failed after taking what moved: the next one is full

    async def start(self) -> None:
        self._moved = self.gateway.changes.reader()
        await asyncio.to_thread(self.table.create)
        self.active = await asyncio.to_thread(self.table.active)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._run(), name="alerts")]
        if self.webhook is not None:
            self._tasks.append(loop.create_task(self.webhook.run(), name="alert-webhook"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._moved is not None:
            self._moved.close()
            self._moved = None
        if self.webhook is not None and self.webhook.queue.qsize():
            log.warning("alert webhook: %d notifications not sent at shutdown", self.webhook.queue.qsize())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.check()
            except Exception as exc:  # the database or the store is away: the next check tries again
                log.warning("alert check failed: %r", exc)
                self.gateway.ctx.health.fault("background", "alerts", repr(exc))

    async def check(self) -> list[ActiveAlert]:
        """Evaluate now every rule that may have changed, record what changed, notify the
        transitions this gateway won; the active alerts after it (every gateway's)."""
        async with self._lock:
            now = now_ms()
            snap = self.gateway.ctx.registry.snapshot
            moved = self._moved.take() if self._moved is not None else None
            full = moved is None or moved.everything or self._broken or not self.gateway.changes.exact
            self._broken = True  # until this check is done
            names: set[str] = set()  # what may have changed (when not full)
            if full:
                consumers = list(snap.consumers.values())
                self.dead_letters.keep_only(snap.consumers)
                self._due, self._due_at = [], {}  # made again as each is evaluated
            else:
                assert moved is not None
                names = moved.consumers | self._unsure | self._came_due(now, self.active)
                names |= {t[len(DLQ_PREFIX) :] for t in moved.topics if t.startswith(DLQ_PREFIX)}
                consumers = [c for name in sorted(names) if (c := snap.consumers.get(name)) is not None]
                for name in names - snap.consumers.keys():  # deleted
                    self.dead_letters.forget(name)
                    self._due_at.pop(name, None)
            self._unsure = set()
            fired: list[Row] = []
            resolved: list[tuple[Row, str]] = []
            if full or names:  # else nothing to change here: only what the other gateways changed
                verdicts = await self._verdicts(consumers, now)
                before = await asyncio.to_thread(self.table.active)
                decision = decide((a.key for a in before), verdicts, None if full else snap.consumers)
                fired, resolved = await asyncio.to_thread(self.table.apply, decision, before, now)
            self.active = await asyncio.to_thread(self.table.active)
            self.checked_ms = now
            for row in fired:
                self._notify(notification(FIRING, row, gateway=self.source, at_ms=now))
            for row, reason in resolved:
                self._notify(notification(RESOLVED, row, gateway=self.source, at_ms=now, reason=reason))
            m = self.gateway.ctx.metrics
            for kind in KINDS:
                m.child(m.alerts_active, kind).set(sum(a.kind == kind for a in self.active))
            m.child(m.alert_checks, "full" if full else "changes").inc()
            m.alert_consumers_checked.inc(len(consumers))
            self._broken = False
            return self.active

    def event(self, kind: str, summary: str, **fields: Any) -> None:
        """A one-off event, not a condition that holds (e.g. a project moved to its backup
        cluster): logged and POSTed to the webhook with status "event"."""
        key = f"{kind}:{fields.get('project', '')}"
        self._notify({"status": "event", "key": key, "kind": kind, "summary": summary, **fields,
                      "gateway": self.source, "at": now_ms()})  # fmt: skip

    def _notify(self, body: dict[str, Any]) -> None:
        log.warning("alert %s: %s", body["status"], body["summary"])
        if self.webhook is not None:
            self.webhook.send(body)

    def _came_due(self, now: int, active: list[ActiveAlert]) -> set[str]:
        """The consumers whose dead-letter window passed a count sampled, by `now`, and whose
        dead-letter alert is active: time only lowers the count within the window (or makes a
        whole window watched), which changes nothing but an active alert. The others wait for
        their next point (no read, no rule)."""
        firing = {a.key for a in active if a.kind == DEAD_LETTERS}
        due: set[str] = set()
        while self._due and self._due[0][0] <= now:
            at, name = heapq.heappop(self._due)
            if self._due_at.get(name) == at:
                del self._due_at[name]
                if alert_key(DEAD_LETTERS, name) in firing:
                    due.add(name)
                else:
                    self._schedule(name, now)
        return due

    def _schedule(self, name: str, now: int) -> None:
        """When `name`'s dead-letter verdict may change next with no new dead letter."""
        at = self.dead_letters.next_change(name, now)
        if at is None:
            self._due_at.pop(name, None)
        elif self._due_at.get(name) != at:
            self._due_at[name] = at
            heapq.heappush(self._due, (at, name))
            if len(self._due) > 2 * len(self._due_at) + 64:  # stale entries: drop them now and then
                self._due = [(t, n) for t, n in self._due if self._due_at.get(n) == t]
                heapq.heapify(self._due)

    async def _verdicts(self, consumers: list[ConsumerRecord], now: int) -> dict[str, Verdict]:
        ctx = self.gateway.ctx
        snap = ctx.registry.snapshot
        verdicts: dict[str, Verdict] = {}
        projects = {c.name: _project(snap.topics.get(c.topic)) for c in consumers}
        for c in consumers:
            verdicts[key := alert_key(LAG, c.name)] = await self._lag(c, projects[c.name])
            if verdicts[key] is UNSURE:
                self._unsure.add(c.name)
        counts: list[Any] = []
        if self.dead_letters.threshold > 0:
            for i in range(0, len(consumers), READ_CHUNK):
                chunk = consumers[i : i + READ_CHUNK]
                reads = (ctx.store.bounds(dlq_topic(c.name)) for c in chunk)
                counts += await asyncio.gather(*reads, return_exceptions=True)
        for i, c in enumerate(consumers):
            key = alert_key(DEAD_LETTERS, c.name)
            if counts and isinstance(counts[i], list) and counts[i]:
                self.dead_letters.observe(c.name, counts[i][0].max, now)
            elif counts:  # its DLQ could not be read (just made or deleted, store away)
                verdicts[key] = UNSURE
                self._unsure.add(c.name)
                continue
            verdicts[key] = self.dead_letters.verdict(c.name, c.topic, projects[c.name], now)
            self._schedule(c.name, now)
        return verdicts

    async def _lag(self, c: ConsumerRecord, project: str) -> Verdict:
        if c.alert_backlog <= 0:
            return lag_verdict(c.name, c.topic, project, 0, c.alert_backlog)
        await asyncio.sleep(0)  # thousands of reads, each maybe without a pause: let requests in
        try:
            lag = await self.lag_of(c)
        except NotFound:
            return UNSURE  # deleted since the snapshot: the next check no longer lists it
        except MqgateError as exc:
            log.warning("alert check: lag of %s: %s", c.name, exc.message)
            return UNSURE
        return lag_verdict(c.name, c.topic, project, lag, c.alert_backlog)

    async def lag_of(self, c: ConsumerRecord) -> int:
        """The consumer's lag as Operations.progress sums it. A cluster consumer has one offset
        table: read it alone, without listing the group's clients (a scan of every table in the
        embedded offset store: 1.5 ms at 5,000 consumers, for each consumer checked)."""
        if c.mode != MODE_CLUSTER:
            return (await self.gateway.operations.progress(c.name)).lag
        topology = self.gateway.topology
        bounds = await topology.bounds(await topology.layout(c))
        table = await self.gateway.ctx.offsets.table(c.name, "")
        if table is None:  # no table yet: progress lists no client, lag 0
            return 0
        committed = [e.committed for e in table] + [b.min for b in bounds[len(table) :]]
        return sum(max(b.max - max(at, b.min), 0) for b, at in zip(bounds, committed, strict=False))
