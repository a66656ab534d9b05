"""What moved since a reader last looked: the consumers whose lag may have changed and the store
topics that moved (issue 27: idle work proportional to what changed, not to what exists).

The store and the offset tables tell every move as it is made (`MessageStore.watch`,
`OffsetStore.watch`: a write became visible, retention dropped messages, a topic was made or
grown, a commit, a reset, a table made, grown or dropped), whatever made it: the data path, a
redrive, QoS messages coming due, the failover's replay or drain, an admin reset. The registry
tells its changes through the gateway (`registry_changed`). Each reader (the lag gauges, the
alert checks) keeps its own record, which `ChangeReader.take` hands over and clears: the
consumers whose lag reads what moved (a store topic is read by the consumers of that topic, a
retry queue or inbox by its consumer, an offsets group is its consumer) and the store topics
themselves (the alert checks look for dead-letter topics among them).

Where a move can go unheard (`exact` False: a Redis store other gateways write to, or a project
served by a cluster), a reader must look at everything on its own schedule. A move of anything
(None from a backend, e.g. when the projects with clusters change) marks every reader
`everything`, and a new reader starts with `everything`: it knows nothing yet.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from mqgate.core.layout import INBOX_PREFIX, RETRY_PREFIX
from mqgate.offsets.interface import OffsetStore
from mqgate.registry.cache import Removed
from mqgate.registry.records import Snapshot
from mqgate.store.interface import MessageStore


class Moved(msgspec.Struct):
    """What a reader is handed: everything, or the consumers and store topics that moved."""

    everything: bool
    consumers: set[str] = msgspec.field(default_factory=set)  # whose lag may have moved
    topics: set[str] = msgspec.field(default_factory=set)  # store topics whose bounds may have moved


class ChangeReader:
    """One reader's record of what moved since its last `take`."""

    def __init__(self, changes: Changes, on_mark: Callable[[], None] | None) -> None:
        self._changes = changes
        self._on_mark = on_mark
        self._everything = True
        self._topics: set[str] = set()
        self._groups: set[str] = set()
        self._consumers: set[str] = set()

    def take(self) -> Moved:
        """What moved since the last take (the first: everything), and forget it."""
        changes = self._changes
        moved = Moved(self._everything, self._consumers, self._topics)
        for topic in self._topics:
            moved.consumers |= changes.readers_of(topic)
        moved.consumers |= {g for g in self._groups if g in changes.topic_of}
        self._everything = False
        self._topics, self._groups, self._consumers = set(), set(), set()
        return moved

    def close(self) -> None:
        self._changes.readers.remove(self)

    def _mark(self) -> None:
        if self._on_mark is not None:
            self._on_mark()


class Changes:
    """The store's and the offsets' moves, and the registry's changes, for every reader."""

    def __init__(self, store: MessageStore, offsets: OffsetStore) -> None:
        self.store = store
        self.offsets = offsets
        self.readers: list[ChangeReader] = []
        self.topic_of: dict[str, str] = {}  # consumer -> its topic
        self._consumers_of: dict[str, set[str]] = {}  # topic -> its consumers
        store.watch(self._topic_moved)
        offsets.watch(self._group_moved)

    @property
    def exact(self) -> bool:
        """Whether every move is heard now: readers may look only at what moved."""
        return self.store.hears_every_change and self.offsets.hears_every_change

    def reader(self, on_mark: Callable[[], None] | None = None) -> ChangeReader:
        """A new reader (its first take: everything); `on_mark` is called at each move."""
        reader = ChangeReader(self, on_mark)
        self.readers.append(reader)
        return reader

    def readers_of(self, topic: str) -> set[str]:
        """The consumers whose lag reads store topic `topic`."""
        for prefix in (RETRY_PREFIX, INBOX_PREFIX):
            if topic.startswith(prefix):
                name = topic[len(prefix) :]
                return {name} if name in self.topic_of else set()
        return self._consumers_of.get(topic, set())

    # --- what moved -------------------------------------------------------------------------

    def consumer_moved(self, name: str) -> None:
        """`name`'s lag may have moved (e.g. it was registered, changed or deleted)."""
        for reader in self.readers:
            reader._consumers.add(name)
            reader._mark()

    def registry_changed(self, changed: Snapshot, removed: Removed) -> None:
        """Registrations changed (`changed`: the changed records and the topics of changed
        consumers; after a full reload, every record): keep the map of who reads what, and
        mark the consumers whose lag may read differently now."""
        for name in removed.consumers:
            self._forget(name)
            self.consumer_moved(name)
        for c in changed.consumers.values():
            if self.topic_of.get(c.name) != c.topic:
                self._forget(c.name)
                self.topic_of[c.name] = c.topic
                self._consumers_of.setdefault(c.topic, set()).add(c.name)
            self.consumer_moved(c.name)
        for topic in changed.topics:  # grown: its consumers read more queues
            for name in self._consumers_of.get(topic, ()):
                self.consumer_moved(name)

    def _forget(self, name: str) -> None:
        topic = self.topic_of.pop(name, None)
        if topic is not None:
            readers = self._consumers_of.get(topic)
            if readers is not None:
                readers.discard(name)
                if not readers:
                    del self._consumers_of[topic]

    def _topic_moved(self, topic: str | None) -> None:
        for reader in self.readers:
            if topic is None:
                reader._everything = True
            else:
                reader._topics.add(topic)
            reader._mark()

    def _group_moved(self, group: str | None) -> None:
        for reader in self.readers:
            if group is None:
                reader._everything = True
            else:
                reader._groups.add(group)
            reader._mark()
