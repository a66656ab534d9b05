"""The message-store contract, one suite for every backend.

"redis" runs against the machine's Redis on 6379 with a random key prefix per test and
deletes its own keys afterwards (the server is shared: never FLUSHDB). "remote" is the
embedded store served by a store process's server (`serve --workers N`), in the test's loop.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mqgate.errors import BadRequest, MqgateError, NotFound
from mqgate.model import StoredMessage
from mqgate.redisio import connect
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.backends.remote import RemoteStore
from mqgate.store.interface import Companions, MessageStore, TopicConfig
from tests.conftest import require_service
from tests.storeproc.served import Served

WEEK_MS = 7 * 24 * 3600 * 1000
REDIS_URL = "redis://127.0.0.1:6379/0"
SEGMENT_BYTES = 1024  # small embedded segments, so retention has whole segments to drop


def msg(i: int, ts: int = 1_000, size: int = 50) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", ts, "p", f"m{i}-" + "é" * size, [f"k{i}"], ["t"], {"i": str(i)})


class Harness:
    """Opens stores of one backend over the same data, so a test can close and reopen."""

    def __init__(self, kind: str, tmp_path: Path) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.prefix = f"test-{secrets.token_hex(6)}"
        self.client: Any = None
        self.opened: list[MessageStore] = []
        self.served: Served | None = None

    async def open(self) -> MessageStore:
        store: MessageStore
        if self.kind == "embedded":
            store = EmbeddedStore(self.tmp_path, segment_bytes=SEGMENT_BYTES)
        elif self.kind == "remote":
            if self.served is None:
                self.served = await Served(self.tmp_path, segment_bytes=SEGMENT_BYTES).start()
            store = RemoteStore(await self.served.client(), "local")
        else:
            from mqgate.store.backends.redis import RedisStore

            if self.client is None:
                self.client = connect(REDIS_URL)
            store = RedisStore(self.client, broker="b1", prefix=self.prefix)
        await store.open()
        self.opened.append(store)
        return store

    async def reopen(self, store: MessageStore) -> MessageStore:
        await store.close()
        self.opened.remove(store)
        if self.served is not None:  # a restart of the store process
            await self.served.restart()
        return await self.open()

    async def cleanup(self) -> None:
        for store in self.opened:
            await store.close()
        if self.served is not None:
            await self.served.stop()
        if self.client is not None:
            keys = [k async for k in self.client.scan_iter(match=self.prefix + ":*", count=1000)]
            if keys:
                await self.client.delete(*keys)
            await self.client.aclose()


@pytest.fixture(params=["embedded", "redis", "remote"])
def kind(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        require_service("127.0.0.1", 6379, "Redis")
    return str(request.param)


def run(kind: str, tmp_path: Path, body: Callable[[Harness, MessageStore], Awaitable[None]]) -> None:
    async def go() -> None:
        h = Harness(kind, tmp_path)
        try:
            await body(h, await h.open())
        finally:
            await h.cleanup()

    asyncio.run(go())


@asynccontextmanager
async def waiting(store: MessageStore, topic: str, timeout_s: float) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(store.wait_for_data(topic, timeout_s))
    await asyncio.sleep(0)  # let it register its waiter
    try:
        yield task
    finally:
        task.cancel()


# --- writing and reading -------------------------------------------------------------------


def test_append_returns_first_offsets_and_reads_return_exact_records(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 3, WEEK_MS))
        assert s.has_topic("t") and not s.has_topic("other")
        assert await s.append("t", 1, [msg(i) for i in range(10)]) == 0
        assert await s.append("t", 1, [msg(10)]) == 10
        firsts = await s.append_many("t", {0: [msg(100), msg(101)], 1: [msg(11), msg(12)], 2: [msg(200)]})
        assert firsts == {0: 0, 1: 11, 2: 0}
        assert await s.append_many("t", {2: [msg(201)], 0: [msg(102)]}) == {2: 1, 0: 2}

        got = await s.read("t", 1, 3, 4)
        assert got == [(o, msg(o)) for o in range(3, 7)]
        raw = await s.read_raw("t", 1, 3, 4)
        assert [o for o, _ in raw] == [3, 4, 5, 6]
        decode = msgspec.json.Decoder(StoredMessage).decode
        assert [decode(p) for _, p in raw] == [msg(o) for o in range(3, 7)]
        assert msgspec.json.decode(raw[0][1])["messageId"] == "id00000003"  # the wire JSON

        assert [m for _, m in await s.read("t", 0, 0, 100)] == [msg(100), msg(101), msg(102)]
        assert [o for o, _ in await s.read_raw("t", 1, 0, 1000)] == list(range(13))  # up to max only
        assert await s.read("t", 1, 13, 10) == []  # at max
        assert await s.read_raw("t", 1, 500, 10) == []  # beyond max
        assert await s.read_raw("t", 1, 12, 10) == [(12, raw_of(msg(12)))]
        assert await s.read("t", 1, 5, 0) == []

    run(kind, tmp_path, body)


def raw_of(m: StoredMessage) -> bytes:
    return msgspec.json.encode(m)


def test_append_with_companions_writes_both_and_a_failed_companion_fails_nothing(
    kind: str, tmp_path: Path
) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("data", 2, WEEK_MS))
        await s.create_topic(TopicConfig("side", 1, WEEK_MS))
        seen: list[dict[int, int]] = []

        def side_records(firsts: dict[int, int]) -> dict[str, dict[int, list[tuple[int, bytes]]]]:
            seen.append(dict(firsts))
            return {"side": {0: [(5, raw_of(msg(900 + q * 10 + o))) for q, o in sorted(firsts.items())]}}

        await s.append("data", 1, [msg(0)])
        firsts, failed = await s.append_many_with("data", {0: [msg(1)], 1: [msg(2), msg(3)]}, side_records)
        assert firsts == {0: 0, 1: 1} and failed is None and seen == [{0: 0, 1: 1}]
        assert [m for _, m in await s.read("side", 0, 0, 10)] == [msg(900), msg(911)]
        # A companion for a topic that does not exist: the messages are stored all the same.
        firsts, failed = await s.append_many_with(
            "data", {0: [msg(4)]}, lambda f: {"missing": {0: [(1, raw_of(msg(1)))]}}
        )
        assert firsts == {0: 1} and isinstance(failed, NotFound)
        assert [m for _, m in await s.read("data", 0, 0, 10)] == [msg(1), msg(4)]
        # Many at once (the embedded store writes their companions together): none lost.
        results = await asyncio.gather(
            *(
                s.append_many_with(
                    "data", {1: [msg(10 + i)]}, lambda f: {"side": {0: [(7, raw_of(msg(f[1])))]}}
                )
                for i in range(50)
            )
        )
        assert sorted(f[1] for f, err in results) == list(range(3, 53)) and all(e is None for _, e in results)
        side = [m for _, m in await s.read("side", 0, 2, 100)]
        assert sorted(m.msg_id for m in side) == sorted(msg(o).msg_id for o in range(3, 53))
        s = await h.reopen(s)  # durable, both
        assert [m for _, m in await s.read("side", 0, 0, 2)] == [msg(900), msg(911)]
        assert len(await s.read("side", 0, 0, 100)) == 52
        *before, first_of_many = [m for _, m in await s.read("data", 1, 0, 4)]
        # The 50 went at once: on Redis (a pool of connections) in no set order.
        assert before == [msg(0), msg(2), msg(3)] and first_of_many in [msg(10 + i) for i in range(50)]

    run(kind, tmp_path, body)


class Joined:
    """A CompanionGroup: the message ids its calls add, written as one record when sealed."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.seals = 0
        self.outcomes: list[MqgateError | None] = []  # what `written` was told, each time

    def seal(self) -> list[tuple[int, bytes]]:
        self.seals += 1
        if self.seals > 1:
            return []
        joined = StoredMessage(",".join(self.ids), 9, "p", "", [], [], {})
        return [(9, raw_of(joined))]

    def written(self, error: MqgateError | None) -> None:
        self.outcomes.append(error)


def test_appends_passing_one_companions_object_share_its_write_and_its_failure(
    kind: str, tmp_path: Path
) -> None:
    """Produces that join one open group pass the same companions object, a new one once the
    group is sealed (tracing.recorder.TraceRecorder.join): each call hears its group's fate."""

    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("data", 1, WEEK_MS))
        await s.create_topic(TopicConfig("side", 1, WEEK_MS))
        for where, expected in (("missing", NotFound), ("side", None)):
            opened: list[tuple[Joined, Companions]] = []

            def joining(
                i: int, where: str = where, opened: list[tuple[Joined, Companions]] = opened
            ) -> Callable[[dict[int, int]], Companions]:
                def companions(firsts: dict[int, int]) -> Companions:
                    if not opened or opened[-1][0].seals:
                        group = Joined()
                        opened.append((group, {where: {0: [group]}}))
                    opened[-1][0].ids.append(f"c{i}")
                    return opened[-1][1]

                return companions

            results = await asyncio.gather(
                *(s.append_many_with("data", {0: [msg(i)]}, joining(i)) for i in range(20))
            )
            assert [type(err) for _, err in results] == [expected or type(None)] * 20
            # Each group hears its fate once, whatever the number of calls that joined it.
            assert [[type(e) for e in g.outcomes] for g, _ in opened] == [[expected or type(None)]] * len(
                opened
            )
            if kind == "embedded":  # one write for the calls of a round
                assert len(opened) < 20
        written = [i for _, m in await s.read("side", 0, 0, 100) for i in m.msg_id.split(",")]
        assert sorted(written) == sorted(f"c{i}" for i in range(20))
        assert len(await s.read("data", 0, 0, 100)) == 40

    run(kind, tmp_path, body)


def test_a_companion_group_shared_by_many_appends_is_written_once_with_all_of_them(
    kind: str, tmp_path: Path
) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("data", 1, WEEK_MS))
        await s.create_topic(TopicConfig("side", 1, WEEK_MS))
        groups: list[Joined] = []

        def joining(i: int) -> Callable[[dict[int, int]], Companions]:
            def companions(firsts: dict[int, int]) -> Companions:
                if not groups or groups[-1].seals:
                    groups.append(Joined())
                groups[-1].ids.append(f"c{i}")
                return {"side": {0: [groups[-1], groups[-1]]}}  # listed twice: written once

            return companions

        results = await asyncio.gather(
            *(s.append_many_with("data", {0: [msg(i)]}, joining(i)) for i in range(40))
        )
        assert all(err is None for _, err in results)
        records = [m.msg_id for _, m in await s.read("side", 0, 0, 100)]
        written = [i for r in records for i in r.split(",")]
        assert sorted(written) == sorted(f"c{i}" for i in range(40))  # each once
        assert all(g.seals >= 1 for g in groups) and len(records) == len(groups)
        assert all(g.outcomes == [None] for g in groups)  # listed twice: told once
        if kind == "embedded":  # fsync=always: the calls of one group-commit round share a record
            assert len(records) < 40

    run(kind, tmp_path, body)


class Refusing(Joined):
    """A group that fails when told its outcome."""

    def written(self, error: MqgateError | None) -> None:
        super().written(error)
        raise RuntimeError("this group cannot take its outcome")


def test_a_group_that_fails_to_take_its_outcome_fails_no_write(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("data", 1, WEEK_MS))
        await s.create_topic(TopicConfig("side", 1, WEEK_MS))
        refusing, fine = Refusing(), Joined()
        refusing.ids.append("r")
        fine.ids.append("f")
        firsts, failed = await s.append_many_with(
            "data", {0: [msg(1)]}, lambda f: {"side": {0: [refusing, fine]}}
        )
        assert firsts == {0: 0} and failed is None
        assert refusing.outcomes == [None] and fine.outcomes == [None]  # both told
        assert await s.append("data", 0, [msg(2)]) == 1  # the store goes on
        assert sorted(m.msg_id for _, m in await s.read("side", 0, 0, 10)) == ["f", "r"]

    run(kind, tmp_path, body)


def test_bounds_per_queue(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 3, WEEK_MS))
        assert [(b.queue, b.min, b.max) for b in await s.bounds("t")] == [(0, 0, 0), (1, 0, 0), (2, 0, 0)]
        await s.append("t", 2, [msg(i) for i in range(7)])
        await s.append("t", 0, [msg(1)])
        assert [(b.queue, b.min, b.max) for b in await s.bounds("t")] == [(0, 0, 1), (1, 0, 0), (2, 0, 7)]

    run(kind, tmp_path, body)


def test_bounds_of_many_topics_in_one_call_are_each_topics_and_an_unknown_one_is_refused(
    kind: str, tmp_path: Path
) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("a", 2, WEEK_MS))
        await s.create_topic(TopicConfig("b", 1, WEEK_MS))
        await s.append("a", 1, [msg(i) for i in range(3)])
        await s.append("b", 0, [msg(9)])
        many = await s.bounds_many(["b", "a", "b"])
        assert many == [await s.bounds("b"), await s.bounds("a"), await s.bounds("b")]
        assert [[(x.queue, x.max) for x in one] for one in many] == [[(0, 1)], [(0, 0), (1, 3)], [(0, 1)]]
        with pytest.raises(NotFound):
            await s.bounds_many(["a", "nope", "b"])
        assert await s.bounds_many([]) == []

    run(kind, tmp_path, body)


def test_queue_bytes_count_what_each_queue_holds(kind: str, tmp_path: Path) -> None:
    """The bytes each queue holds, the measure retention_bytes limits: each message's stored
    JSON, plus (embedded) its record's framing; they fall with retention, survive a reopen and
    follow a topic that grows."""

    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 3, 60_000))
        assert await s.queue_bytes("t") == [0, 0, 0]
        size = len(raw_of(msg(0)))
        for i in range(40):  # one append each: the embedded store rolls segments between them
            await s.append("t", 2, [msg(i, ts=1_000)])
        await s.append("t", 0, [msg(1, ts=100_000)])
        q0, q1, q2 = await s.queue_bytes("t")
        assert q1 == 0
        # Equal-sized messages (msg pads every body alike): the framing is at most 64 bytes each.
        assert size <= q0 <= size + 64
        assert 40 * size <= q2 <= 40 * (size + 64)
        s = await h.reopen(s)
        assert await s.queue_bytes("t") == [q0, 0, q2]
        assert await s.enforce_retention(now_ms=100_000) > 0
        (b2,) = [b for b in await s.bounds("t") if b.queue == 2]
        after = await s.queue_bytes("t")
        assert after[0] == q0 and after[2] < q2
        assert (b2.max - b2.min) * size <= after[2] <= (b2.max - b2.min) * (size + 64) + SEGMENT_BYTES
        await s.create_topic(TopicConfig("t", 5, 60_000))
        assert (await s.queue_bytes("t"))[3:] == [0, 0]
        with pytest.raises(NotFound):
            await s.queue_bytes("nope")

    run(kind, tmp_path, body)


def test_unknown_topic_and_queue_are_refused(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        with pytest.raises(NotFound):
            await s.append("nope", 0, [msg(1)])
        with pytest.raises(NotFound):
            await s.bounds("nope")
        with pytest.raises(BadRequest) as exc:
            await s.append("t", 2, [msg(1)])
        assert exc.value.field == "queue"
        with pytest.raises(BadRequest):
            await s.read_raw("t", -1, 0, 10)
        with pytest.raises(BadRequest):
            await s.append_many("t", {0: [msg(1)], 5: [msg(2)]})
        # A refused batch wrote nothing, not even its valid part.
        assert [b.max for b in await s.bounds("t")] == [0, 0]

    run(kind, tmp_path, body)


def test_offset_for_time(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        for i in range(100):
            await s.append("t", 0, [msg(i, ts=1000 + 10 * i)])
        assert await s.offset_for_time("t", 0, 0) == 0
        assert await s.offset_for_time("t", 0, 1500) == 50
        assert await s.offset_for_time("t", 0, 1501) == 51
        assert await s.offset_for_time("t", 0, 1990) == 99
        assert await s.offset_for_time("t", 0, 10**12) == 100
        assert await s.offset_for_time("t", 1, 1500) == 0  # empty queue: its max

    run(kind, tmp_path, body)


# --- retention -----------------------------------------------------------------------------


def test_retention_by_age_moves_min_and_reads_start_there(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("aged", 1, 60_000))
        await s.create_topic(TopicConfig("kept", 1, WEEK_MS))
        for i in range(60):
            await s.append("aged", 0, [msg(i, ts=1_000 if i < 50 else 100_000)])
            await s.append("kept", 0, [msg(i, ts=1_000)])
        assert await s.enforce_retention(now_ms=100_000) > 0
        (aged,) = await s.bounds("aged")
        assert 0 < aged.min <= 50 and aged.max == 60
        got = await s.read("aged", 0, 0, 100)
        assert got[0][0] == aged.min  # reading below min starts at min
        assert got == [(o, msg(o, ts=1_000 if o < 50 else 100_000)) for o in range(aged.min, 60)]
        assert await s.offset_for_time("aged", 0, 0) == aged.min
        assert [(b.min, b.max) for b in await s.bounds("kept")] == [(0, 60)]
        # Everything expired: the queue empties but keeps counting.
        await s.enforce_retention(now_ms=10**9)
        await s.append("aged", 0, [msg(60, ts=10**9)])
        (aged,) = await s.bounds("aged")
        assert aged.max == 61 and aged.min >= 50
        assert (await s.read("aged", 0, 0, 10))[-1] == (60, msg(60, ts=10**9))

    run(kind, tmp_path, body)


def test_retention_by_bytes_keeps_the_newest(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("sized", 2, WEEK_MS, retention_bytes=3000))
        size = len(raw_of(msg(0)))
        for i in range(60):
            await s.append("sized", 0, [msg(i)])
        await s.append("sized", 1, [msg(0)])
        assert await s.enforce_retention(now_ms=2_000) > 0
        q0, q1 = await s.bounds("sized")
        assert q0.max == 60 and q0.min > 0
        # What is left fits the limit (plus one segment for a store that drops whole ones),
        # and nothing that fits was dropped beyond that slack.
        assert (q0.max - q0.min) * size <= 3000 + SEGMENT_BYTES
        assert (q0.max - q0.min + 1) * size > 3000 - SEGMENT_BYTES
        assert [o for o, _ in await s.read_raw("sized", 0, 0, 100)] == list(range(q0.min, 60))
        assert (q1.min, q1.max) == (0, 1)
        assert await s.enforce_retention(now_ms=2_000) == 0  # already within the limit

    run(kind, tmp_path, body)


# --- lifecycle -----------------------------------------------------------------------------


def test_reopen_keeps_topics_messages_and_offsets(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, 60_000, retention_bytes=10**9))
        await s.create_topic(TopicConfig("%DLQ%c", 1, WEEK_MS))
        await s.append("t", 1, [msg(i, ts=1000 + i) for i in range(30)])
        await s.append("%DLQ%c", 0, [msg(7)])
        s = await h.reopen(s)
        assert s.has_topic("t") and s.has_topic("%DLQ%c")
        assert [(b.min, b.max) for b in await s.bounds("t")] == [(0, 0), (0, 30)]
        assert await s.read("t", 1, 0, 100) == [(i, msg(i, ts=1000 + i)) for i in range(30)]
        assert await s.read("%DLQ%c", 0, 0, 10) == [(0, msg(7))]
        assert await s.offset_for_time("t", 1, 1010) == 10
        assert await s.append("t", 1, [msg(30)]) == 30
        await s.create_topic(TopicConfig("t", 2, 60_000, retention_bytes=10**9))  # a no-op
        assert [b.max for b in await s.bounds("t")] == [0, 31]

    run(kind, tmp_path, body)


def test_topics_grow_but_never_shrink(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        await s.append_many("t", {0: [msg(0)], 1: [msg(1), msg(2)]})
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))  # same count: nothing changes
        assert [b.max for b in await s.bounds("t")] == [1, 2]
        await s.create_topic(TopicConfig("t", 4, WEEK_MS))
        assert [(b.queue, b.min, b.max) for b in await s.bounds("t")] == [
            (0, 0, 1),
            (1, 0, 2),
            (2, 0, 0),
            (3, 0, 0),
        ]
        assert await s.append_many("t", {3: [msg(3)], 1: [msg(4)]}) == {3: 0, 1: 2}
        assert await s.read("t", 3, 0, 10) == [(0, msg(3))]
        with pytest.raises(BadRequest, match="4 queues") as exc:
            await s.create_topic(TopicConfig("t", 3, WEEK_MS))
        assert exc.value.field == "queues"
        s = await h.reopen(s)
        assert [b.max for b in await s.bounds("t")] == [1, 3, 0, 1]
        assert await s.read("t", 1, 0, 10) == [(0, msg(1)), (1, msg(2)), (2, msg(4))]

    run(kind, tmp_path, body)


# --- long polling --------------------------------------------------------------------------


def test_wait_for_data_wakes_on_append(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 2, WEEK_MS))
        await s.create_topic(TopicConfig("other", 1, WEEK_MS))
        async with waiting(s, "t", 10) as waiter:
            await s.append("other", 0, [msg(0)])  # another topic's write does not wake it
            await asyncio.sleep(0.05)
            assert not waiter.done()
            started = time.monotonic()
            await s.append("t", 1, [msg(1)])
            await asyncio.wait_for(waiter, 5)
            assert time.monotonic() - started < 5  # woken: its own wait is 10 s

    run(kind, tmp_path, body)


def test_wait_for_data_wakes_on_wake(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        async with waiting(s, "t", 10) as waiter:
            started = time.monotonic()
            s.wake("t")
            await asyncio.wait_for(waiter, 5)
            assert time.monotonic() - started < 5  # woken: its own wait is 10 s

    run(kind, tmp_path, body)


def test_wait_for_data_returns_after_its_timeout(kind: str, tmp_path: Path) -> None:
    async def body(h: Harness, s: MessageStore) -> None:
        await s.create_topic(TopicConfig("t", 1, WEEK_MS))
        await s.bounds("t")
        started = time.monotonic()
        await s.wait_for_data("t", 0.3)
        elapsed = time.monotonic() - started
        assert 0.28 <= elapsed < 1.5

    run(kind, tmp_path, body)
