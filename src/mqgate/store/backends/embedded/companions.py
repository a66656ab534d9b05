"""Companion records (an append's trace records) written together at the start of the next
group-commit round.

A traced single-message produce would otherwise append its one trace record on its own: a
second framed write per request, as costly as the message's. Held here until the round that
makes the message durable begins, the records of every append in that round go out in one
write per topic and queue, and the round's fsync covers them with the messages.
"""

from __future__ import annotations

from collections.abc import Callable

from mqgate.errors import MqgateError, StorageError
from mqgate.store.interface import CompanionGroup, Companions, Encoded, sealed, tell

# (topic, {queue: (payloads, last timestamp)}) -> first offsets: the store's all-or-nothing write
WriteAll = Callable[[str, dict[int, tuple[list[bytes], int]]], dict[int, int]]


class Ticket:
    """One call's companions; `error` is set when the store refused them."""

    __slots__ = ("error", "topics")

    def __init__(self, topics: frozenset[str]) -> None:
        self.topics = topics
        self.error: MqgateError | None = None


class CompanionWriter:
    def __init__(self, write_all: WriteAll) -> None:
        self._write_all = write_all
        self._records: dict[str, dict[int, list[Encoded | CompanionGroup]]] = {}
        self._tickets: list[Ticket] = []
        # Calls that join one open group pass the same companions (tracing.rounds.RoundGroup):
        # the group is held once, and they share its ticket.
        self._last: tuple[Companions, Ticket] | None = None

    def add(self, records: Companions) -> Ticket:
        last = self._last
        if last is not None and last[0] is records:
            return last[1]
        topics: list[str] = []  # those this call holds records of
        for topic, queues in records.items():
            held = None
            for queue, encoded in queues.items():
                if encoded:
                    if held is None:
                        held = self._records.setdefault(topic, {})
                        topics.append(topic)
                    held.setdefault(queue, []).extend(encoded)
        ticket = Ticket(frozenset(topics))
        self._tickets.append(ticket)
        self._last = (records, ticket)
        return ticket

    def write_pending(self) -> None:
        """The group committer's before-round hook: write what is held, one write per topic;
        each call and group hears how its topic's write went."""
        records, self._records = self._records, {}
        tickets, self._tickets = self._tickets, []
        self._last = None
        for topic, queues in records.items():
            ready, groups = sealed(queues)
            error: MqgateError | None = None
            if ready:
                try:
                    self._write_all(
                        topic, {q: ([p for _, p in msgs], msgs[-1][0]) for q, msgs in ready.items()}
                    )
                except Exception as exc:  # never into the committer: the callers hear of it
                    error = exc if isinstance(exc, MqgateError) else StorageError(f"companion write: {exc!r}")
                    for ticket in tickets:
                        if topic in ticket.topics:
                            ticket.error = error
            tell(groups, error)  # never into the committer
