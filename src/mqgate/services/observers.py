"""The seam between the data path and the features (dramatiq's middleware is the model).

The data path (produce, pull, ack, redelivery, dead letters, QoS hand-off, log reads) tells
what happened to messages through the hooks of `Observer`; a feature (tracing, queue state,
...) subclasses it and overrides the hooks it needs. The data path imports no feature: it holds
one `Observers`, which keeps per hook a tuple of the attached observers that override it, so a
hook that no attached feature listens to costs one empty-tuple check. A feature attaches while
it has work (tracing: while a trace policy exists) and detaches when it has none.

The hooks, in a message's order:
- produce: `records_with` (records a feature writes in the messages' own group commit),
  `stored` (after messages were appended without such records), `produce_failed`,
  `produced`, `spooled` (kept for a cluster, SPEC P8), `held` (QoS: kept by the scheduler),
  `came_due` (held messages stored when due);
- consume: `pulled` (every pull, found or not), `delivered` (may give the messages as the
  consumer gets them), `acked`, `settled` (an ack or release, its outcome), `batch_hop` (what
  the gateway did with a batch on its own: redelivered, expired, dead-lettered), `redriven`
  (dead letters copied back), `read` (read by offset, without a lock).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

from mqgate.core.layout import Slot
from mqgate.core.tokens import AckToken
from mqgate.errors import MqgateError
from mqgate.model import MessageInput, StoredMessage
from mqgate.registry.records import ConsumerRecord, ProducerRecord, TopicRecord
from mqgate.store.interface import Companions, Encoded

# What the gateway did with a batch on its own (`batch_hop`), or how it was settled.
BatchHop = Literal["redelivered", "lock_expired", "released", "expired", "dead_lettered"]
Settlement = Literal["acked", "released"]
Placed = list[tuple[int, StoredMessage]]  # (offset, message)
RecordsMaker = Callable[[dict[int, int]], Companions]  # the queues' first offsets -> records


class Observer:
    """Every hook a no-op: a feature overrides those it needs (see the module's docstring)."""

    # --- produce ------------------------------------------------------------------------

    async def records_with(
        self,
        producer: ProducerRecord,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        accepted_ms: int,
        context: str | None,
        own_context: set[int],
    ) -> RecordsMaker | None:
        """Records to write in the group commit of a plain produce's messages, made once their
        offsets are known (None: none; then `stored` is told after the append).
        `context`: the request's trace context, kept with its messages (None: each message its
        own or none); `own_context`: queues where a message carries a context of its own."""
        return None

    async def stored(
        self,
        producer: ProducerRecord,
        topic: TopicRecord,
        by_queue: dict[int, list[StoredMessage]],
        firsts: dict[int, int],
        accepted_ms: int,
        context: str | None,
        own_context: set[int],
    ) -> None:
        """A plain produce's messages were appended without records of a feature."""

    def produced(self, topic: TopicRecord, count: int) -> None:
        """A produce of `count` messages was accepted (stored, held or spooled)."""

    def produce_failed(
        self, producer: ProducerRecord, topic: TopicRecord, messages: list[MessageInput], exc: MqgateError
    ) -> None:
        """A produce was refused: the caller got `exc`, no receipt."""

    def spooled(
        self, topic: TopicRecord, by_queue: dict[int, list[StoredMessage]], ts: int, why: str
    ) -> None:
        """Messages kept in the gateway's spool until their project's cluster takes them."""

    async def held(
        self, producer: ProducerRecord, held: list[tuple[StoredMessage, list[str]]], accepted_ms: int
    ) -> None:
        """QoS produce: messages held by the scheduler, each with where and when it is due."""

    async def stored_qos(
        self,
        by_topic: Mapping[str, dict[int, list[StoredMessage]]],
        firsts: Mapping[str, dict[int, int]],
        ts: int,
    ) -> None:
        """QoS produce: the destinations due at once were appended (per store topic)."""

    def came_due(
        self,
        target: str,
        topic: str,
        by_queue: dict[int, list[Encoded]],
        firsts: dict[int, int],
        appended_ms: int,
    ) -> None:
        """Held messages came due and were appended to `topic` for `target` (the append began
        at `appended_ms`)."""

    # --- consume ------------------------------------------------------------------------

    def pulled(self, c: ConsumerRecord, queue: int | None, count: int) -> None:
        """A pull delivered `count` messages of the consumer's topic queue `queue` (None: of
        its retry or inbox queue, or nothing found)."""

    def delivered(
        self,
        c: ConsumerRecord,
        slot: Slot,
        raw: list[tuple[int, bytes]],
        request_id: str,
        client: str,
        owner: str,
        attempt: int,
    ) -> list[tuple[int, bytes]]:
        """A batch is handed to a consumer: the messages as it gets them (`raw` unchanged, or
        copies with what the feature adds)."""
        return raw

    def acked(self, c: ConsumerRecord, queue: int, count: int) -> None:
        """A batch of `count` messages of store queue `queue` was acked."""

    async def settled(
        self, c: ConsumerRecord, token: AckToken, how: Settlement, durable: bool, refusal: str | None
    ) -> None:
        """An ack or release of a batch, valid (refusal None) or refused. `durable`: what the
        feature records must be durable before the caller is answered."""

    def batch_hop(
        self, c: ConsumerRecord, slot: Slot, msgs: Placed, hop: BatchHop, attempt: int, **fields: Any
    ) -> None:
        """The gateway did `hop` with a consumer's batch on its own (no caller waits)."""

    async def redriven(self, c: ConsumerRecord, copies: Placed) -> None:
        """Dead letters of `c` were copied back to its inbox (offset there, copy)."""

    def read(self, topic: str, queue: int, raw: list[tuple[int, bytes]], reader: str | None) -> None:
        """Records were read by offset, without a lock (a Spark job, a browse)."""


HOOKS = tuple(name for name, value in vars(Observer).items() if callable(value) and not name.startswith("_"))


class Observers:
    """The attached observers, per hook: a tuple of the bound hooks that do something."""

    def __init__(self, *observers: Observer) -> None:
        self._attached: list[Observer] = []
        self.records_with: tuple[Callable[..., Any], ...] = ()
        self.stored: tuple[Callable[..., Any], ...] = ()
        self.produced: tuple[Callable[..., Any], ...] = ()
        self.produce_failed: tuple[Callable[..., Any], ...] = ()
        self.spooled: tuple[Callable[..., Any], ...] = ()
        self.held: tuple[Callable[..., Any], ...] = ()
        self.stored_qos: tuple[Callable[..., Any], ...] = ()
        self.came_due: tuple[Callable[..., Any], ...] = ()
        self.pulled: tuple[Callable[..., Any], ...] = ()
        self.delivered: tuple[Callable[..., Any], ...] = ()
        self.acked: tuple[Callable[..., Any], ...] = ()
        self.settled: tuple[Callable[..., Any], ...] = ()
        self.batch_hop: tuple[Callable[..., Any], ...] = ()
        self.redriven: tuple[Callable[..., Any], ...] = ()
        self.read: tuple[Callable[..., Any], ...] = ()
        for o in observers:
            self.attach(o)

    def attach(self, observer: Observer) -> None:
        if observer not in self._attached:
            self._attached.append(observer)
            self._index()

    def detach(self, observer: Observer) -> None:
        if observer in self._attached:
            self._attached.remove(observer)
            self._index()

    def is_attached(self, observer: Observer) -> bool:
        return observer in self._attached

    def _index(self) -> None:
        for name in HOOKS:
            base = getattr(Observer, name)
            hooks = tuple(getattr(o, name) for o in self._attached if getattr(type(o), name) is not base)
            setattr(self, name, hooks)
