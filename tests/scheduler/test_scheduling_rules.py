"""The scheduling rules (SPEC S2, S3, S5) as properties, and the embedded scheduler against a
model: a plain dict of held messages, filtered and sorted for every question asked."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mqgate.core.scheduling import (
    BACKOFF_CAP_MS,
    DUE,
    EXPIRED,
    MAX_TIME_MS,
    WAITING,
    deadline_for,
    delivery_order,
    delivery_rank,
    redelivery_backoff_ms,
    redelivery_due,
    validate_priority,
    validate_window,
    window_state,
)
from mqgate.durable.group_commit import GroupCommitter
from mqgate.errors import BadRequest
from mqgate.scheduler.backends.embedded import EmbeddedScheduler
from mqgate.scheduler.interface import Destination, Due

NOW = 1_763_000_000_000
T = TypeVar("T")
times = st.integers(0, MAX_TIME_MS)


class TestWindows:
    def test_deadline_is_start_plus_ttl(self) -> None:
        assert deadline_for(NOW, 5000) == NOW + 5000

    @pytest.mark.parametrize("ttl", [None, 0])
    def test_no_ttl_means_no_deadline(self, ttl: int | None) -> None:
        assert deadline_for(NOW, ttl) == 0

    def test_negative_ttl_is_refused_naming_ttl(self) -> None:
        with pytest.raises(BadRequest) as err:
            deadline_for(NOW, -1)
        assert err.value.field == "ttlMs"

    def test_deadline_before_start_is_refused_naming_the_field(self) -> None:
        with pytest.raises(BadRequest) as err:
            validate_window(NOW, NOW - 1, NOW)
        assert err.value.field == "deadline"
        with pytest.raises(BadRequest) as err:
            validate_window(NOW, NOW - 1, NOW, deadline_field="ttlMs")
        assert err.value.field == "ttlMs"

    def test_start_in_the_past_is_due_now(self) -> None:
        assert validate_window(NOW - 60_000, 0, NOW) == DUE

    def test_deadline_already_past_is_reported_expired(self) -> None:
        assert validate_window(NOW - 60_000, NOW - 1, NOW) == EXPIRED

    def test_out_of_range_times_and_priorities_are_refused(self) -> None:
        with pytest.raises(BadRequest):
            validate_window(-1, 0, NOW)
        with pytest.raises(BadRequest):
            validate_window(0, MAX_TIME_MS + 1, NOW)
        with pytest.raises(BadRequest) as err:
            validate_priority(10)
        assert err.value.field == "priority"
        validate_priority(0)
        validate_priority(9)

    @given(times, st.integers(1, 10**9), st.booleans(), times)
    def test_window_state_follows_the_closed_window(
        self, start: int, ttl: int, has_deadline: bool, now: int
    ) -> None:
        deadline = min(start + ttl, MAX_TIME_MS) if has_deadline else 0
        dest = Destination("t", start, deadline, 0)
        state = window_state(dest, now)
        assert validate_window(start, deadline, now) == state
        if has_deadline and now > deadline:
            assert state == EXPIRED
        elif now >= start:
            assert state == DUE
        else:
            assert state == WAITING


class TestRedelivery:
    def test_backoff_doubles_from_one_second_up_to_five_minutes(self) -> None:
        assert [redelivery_backoff_ms(a) for a in range(1, 11)] == [
            1000,
            2000,
            4000,
            8000,
            16000,
            32000,
            64000,
            128000,
            256000,
            300000,
        ]
        assert redelivery_backoff_ms(10**6) == BACKOFF_CAP_MS
        assert redelivery_backoff_ms(0) == 1000

    @given(st.integers(1, 10**6))
    def test_backoff_never_shrinks(self, attempt: int) -> None:
        assert redelivery_backoff_ms(attempt) <= redelivery_backoff_ms(attempt + 1) <= BACKOFF_CAP_MS

    @given(st.integers(1, 50), st.integers(0, 10**7), st.booleans(), st.integers(0, 20))
    def test_redelivery_until_deadline_or_attempts(
        self, attempts: int, ttl: int, has_deadline: bool, max_attempts: int
    ) -> None:
        deadline = NOW + ttl if has_deadline else 0
        due = redelivery_due(NOW, attempts, deadline, max_attempts)
        expected = NOW + redelivery_backoff_ms(attempts)
        given_up = (max_attempts > 0 and attempts >= max_attempts) or (has_deadline and expected > deadline)
        assert due == (None if given_up else expected)


class TestDeliveryOrder:
    keys = st.tuples(st.integers(0, 9), times, st.integers(0, 2**63 - 1), st.integers(0, 2**16 - 1))

    @given(keys, keys)
    def test_packed_rank_sorts_like_the_order_key(
        self, a: tuple[int, int, int, int], b: tuple[int, int, int, int]
    ) -> None:
        assert (delivery_rank(*a) < delivery_rank(*b)) == (delivery_order(*a) < delivery_order(*b))
        assert (delivery_rank(*a) == delivery_rank(*b)) == (a == b)

    def test_higher_priority_then_earlier_start_then_lower_seq(self) -> None:
        ranked = sorted(
            [(1, 10, 1, 0), (5, 99, 9, 0), (5, 20, 7, 1), (5, 20, 7, 0), (5, 20, 3, 0)],
            key=lambda k: delivery_order(*k),
        )
        assert ranked == [(5, 20, 3, 0), (5, 20, 7, 0), (5, 20, 7, 1), (5, 99, 9, 0), (1, 10, 1, 0)]


# --- the embedded scheduler against a model ------------------------------------------------

Member = tuple[int, int]


@dataclass
class Model:
    held: dict[int, tuple[bytes, list[Destination | None]]] = field(default_factory=dict)
    claims: dict[Member, int] = field(default_factory=dict)  # member -> claim deadline
    attempts: dict[Member, int] = field(default_factory=dict)

    def live(self) -> list[tuple[int, int, Destination]]:
        return [(s, i, d) for s, (_, ds) in self.held.items() for i, d in enumerate(ds) if d is not None]

    def claimable(self, now: int) -> list[tuple[int, int, Destination]]:
        free = [(s, i, d) for s, i, d in self.live() if self.claims.get((s, i), now) <= now]
        due = [(s, i, d) for s, i, d in free if d.deliver_at_ms <= now]
        return sorted(due, key=lambda x: delivery_order(x[2].priority, x[2].deliver_at_ms, x[0], x[1]))

    def remove(self, seq: int, index: int) -> None:
        entry = self.held.get(seq)
        if entry is None or not 0 <= index < len(entry[1]) or entry[1][index] is None:
            return
        entry[1][index] = None
        self.claims.pop((seq, index), None)
        self.attempts.pop((seq, index), None)
        if all(d is None for d in entry[1]):
            del self.held[seq]


destinations = st.lists(
    st.builds(
        lambda target, start, ttl, prio: Destination(
            target, NOW + start, NOW + start + ttl if ttl else 0, prio
        ),
        st.sampled_from(["topic:a", "inbox:b", "t"]),
        st.integers(-50, 200),
        st.one_of(st.just(0), st.integers(0, 100)),
        st.integers(0, 9),
    ),
    min_size=1,
    max_size=4,
)


class EmbeddedAgainstModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.dir = Path(tempfile.mkdtemp(prefix="sched-model-"))
        self.model = Model()
        self.now = NOW
        self.last_seq = 0
        self.committer = GroupCommitter(None)
        self.scheduler = self._open()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def _open(self) -> EmbeddedScheduler:
        async def go() -> EmbeddedScheduler:
            if self.committer._task is None:
                self.committer.start()
            s = EmbeddedScheduler(self.dir, self.committer)
            await s.open()
            return s

        return self._run(go())

    def teardown(self) -> None:
        try:
            self._run(self.scheduler.close())
            self._run(self.committer.stop())
            self._run(self.loop.shutdown_default_executor())
        finally:
            self.loop.close()
            shutil.rmtree(self.dir, ignore_errors=True)

    @rule(
        items=st.lists(st.tuples(st.binary(max_size=8), destinations), min_size=1, max_size=5),
    )
    def hold(self, items: list[tuple[bytes, list[Destination]]]) -> None:
        seqs = self._run(self.scheduler.hold(items))
        assert len(seqs) == len(items) and seqs == sorted(set(seqs)) and seqs[0] > self.last_seq
        self.last_seq = seqs[-1]
        for seq, (payload, dests) in zip(seqs, items, strict=True):
            self.model.held[seq] = (payload, list(dests))

    @rule(advance=st.integers(0, 120), limit=st.integers(0, 6), claim_ms=st.integers(1, 80))
    def claim(self, advance: int, limit: int, claim_ms: int) -> None:
        self.now += advance
        got: list[Due] = self._run(self.scheduler.claim_due(self.now, limit, claim_ms))
        expected = self.model.claimable(self.now)[:limit]
        assert [(d.seq, d.index, d.destination) for d in got] == expected
        self.model.claims = {m: t for m, t in self.model.claims.items() if t > self.now}
        for d in got:
            member = (d.seq, d.index)
            self.model.claims[member] = self.now + claim_ms
            self.model.attempts[member] = self.model.attempts.get(member, 0) + 1
            assert d.attempt == self.model.attempts[member]
            assert d.payload == self.model.held[d.seq][0]
            assert d.expired == (d.destination.deadline_ms != 0 and self.now > d.destination.deadline_ms)

    @precondition(lambda self: self.model.held)
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        live = [(s, i) for s, i, _ in self.model.live()]
        pairs = data.draw(st.lists(st.sampled_from([*live, (10**9, 0), (live[0][0], 99)]), max_size=6))
        self._run(self.scheduler.settle(pairs))
        for seq, index in pairs:
            self.model.remove(seq, index)

    @rule()
    def restart(self) -> None:
        """Claims and attempt counts are memory only: after a restart all is claimable again."""
        self._run(self.scheduler.close())
        self.scheduler = self._open()
        self.model.claims.clear()
        self.model.attempts.clear()
        recovered = {seq: (rec.payload, list(rec.dests)) for seq, rec in self.scheduler._held.items()}
        assert recovered == self.model.held
        stats = self._run(self.scheduler.stats())
        assert stats.log_records == len(self.model.held) + 1  # compacted: one mark + one add each

    @invariant()
    def counts_and_next_due_match(self) -> None:
        stats = self._run(self.scheduler.stats())
        live = self.model.live()
        assert (stats.held_messages, stats.held_destinations) == (len(self.model.held), len(live))
        nxt = self._run(self.scheduler.next_due_ms())
        if not live:
            assert nxt is None
            return
        free = [d for s, i, d in live if self.model.claims.get((s, i), self.now) <= self.now]
        if any(d.deliver_at_ms <= self.now for d in free):
            assert nxt is not None and nxt <= self.now
        else:
            active = [t for t in self.model.claims.values() if t > self.now]
            assert nxt == min([d.deliver_at_ms for d in free] + active)


EmbeddedAgainstModel.TestCase.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
TestEmbeddedAgainstModel = EmbeddedAgainstModel.TestCase


def test_online_compaction_keeps_the_live_set_while_intake_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mqgate.scheduler.backends.embedded import scheduler as embedded

    monkeypatch.setattr(embedded, "COMPACT_MIN_RECORDS", 100)

    async def go() -> None:
        committer = GroupCommitter(None)
        committer.start()
        s = EmbeddedScheduler(tmp_path, committer)
        await s.open()
        model: dict[int, tuple[bytes, list[Destination | None]]] = {}
        compactions = 0

        async def worker(w: int) -> None:
            nonlocal compactions
            for i in range(150):
                dests = [Destination(f"t{w}", NOW + i, 0, i % 10), Destination("x", NOW, 0, 0)]
                [seq] = await s.hold([(f"{w}-{i}".encode(), dests)])
                model[seq] = (f"{w}-{i}".encode(), list(dests))
                compactions += s._compaction is not None
                settle = [(seq, 1)] if i % 3 else [(seq, 0), (seq, 1)]
                await s.settle(settle)
                for _, index in settle:
                    model[seq][1][index] = None
                if all(d is None for d in model[seq][1]):
                    del model[seq]

        await asyncio.gather(*(worker(w) for w in range(4)))
        if s._compaction is not None:
            await s._compaction
        stats = await s.stats()
        assert compactions > 0
        assert stats.log_records < 2 * (len(model) + 1) + 100  # compacted while running
        live = {seq: (rec.payload, list(rec.dests)) for seq, rec in s._held.items()}
        assert live == model
        await s.close()
        s = EmbeddedScheduler(tmp_path, committer)
        await s.open()
        assert {seq: (rec.payload, list(rec.dests)) for seq, rec in s._held.items()} == model
        await s.close()
        await committer.stop()

    asyncio.run(go())
