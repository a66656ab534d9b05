"""The Redis message store: one Redis Stream per queue, shared by every gateway.

Key layout, the offset ↔ stream-ID mapping and each script's contract: README.md beside
this file. Every write is one Lua script call, so offsets stay gap-free with any number of
gateways appending at once. Long polls wake across gateways through pub/sub.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis import exceptions as rexc

from mqgate.errors import BadRequest, MqgateError, NotFound, Unavailable
from mqgate.model import QueueBounds, StoredMessage, decode_stored
from mqgate.names import validate_topic_name
from mqgate.redisio import RedisClient, ReplicaWait, lane_of, listen_forever, register, run_script, translated
from mqgate.store.backends.redis.topic import StoreTopic, glob_escape, text, unparsed
from mqgate.store.interface import Companions, Encoded, TopicConfig, TopicListener, write_companions
from mqgate.store.waiters import ANY_READER, Reader

log = logging.getLogger(__name__)

SCRIPTS: Final = "mqgate.store.backends.redis"
# Appends of one topic publish a wake at most once per this interval (any gateway); a writer
# whose publish was skipped publishes once more this long after, so no append goes unheard.
WAKE_COALESCE_S: Final = 0.002
# Bounded work per retention script call, so Redis never stalls on a large backlog.
RETENTION_CHUNK: Final = 10_000
SCRIPT_ERROR: Final = "MQGATE "

# One script call's share of a group of appends (`RedisStore.append_encoded`): bounded so a
# call stays short for Redis, which runs nothing else meanwhile.
GROUP_MAX_APPENDS: Final = 64
GROUP_MAX_BYTES: Final = 1 << 20

_encode = msgspec.json.Encoder().encode


class _Group:
    """Appends of one topic waiting for the same script call."""

    __slots__ = ("answers", "size")

    def __init__(self) -> None:
        # Each append's answer and its (queue, messages) batches, in the order they joined.
        self.answers: list[tuple[asyncio.Future[dict[int, int]], list[tuple[int, list[Encoded]]]]] = []
        self.size = 0

    def takes(self, size: int) -> bool:
        """Whether an append of `size` payload bytes may join (the first always may)."""
        return not self.answers or (
            len(self.answers) < GROUP_MAX_APPENDS and self.size + size <= GROUP_MAX_BYTES
        )

    def add(
        self, batches: dict[int, list[Encoded]], size: int, answer: asyncio.Future[dict[int, int]]
    ) -> None:
        self.answers.append((answer, list(batches.items())))
        self.size += size


# What the current task last looked at (topic, wake epoch), taken before each bounds/read
# round trip: a wake that lands while the answer is on its way must not be lost.
_looked: ContextVar[tuple[StoreTopic, int] | None] = ContextVar("mqgate_redis_store_looked", default=None)


def _own_copy(exc: BaseException) -> BaseException:
    """An error for one of a group's appends: a copy of the call's (each caller raises its own:
    a raise rewrites the exception's traceback and context), the call's as its cause. Not an
    Exception (the store's task cancelled): the store is closing."""
    if not isinstance(exc, Exception):
        return Unavailable("the Redis store is closing")
    try:
        own = copy.copy(exc)
    except Exception:
        return exc
    own.__cause__ = exc
    return own


async def _stop(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end. Python 3.11's `asyncio.wait_for`, which redis-py
    uses to send commands, swallows a cancel that lands as the send completes: cancel again
    until the task is done."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=0.05)
    if not task.cancelled() and task.exception() is not None:
        log.warning("redis store task %s failed: %s", task.get_name(), task.exception())


class RedisStore:
    def __init__(
        self, client: RedisClient, *, broker: str, prefix: str = "mq", wait: ReplicaWait | None = None
    ) -> None:
        self.broker = broker
        self._wait = wait  # None: an append is answered once its primary applied it
        self.prefix = prefix
        self._client = client
        self._topics_key = f"{prefix}:topics"
        self._wake_pattern = glob_escape(f"{prefix}:wake:") + "*"
        self._channel_prefix = len(f"{prefix}:wake:".encode())
        self._origin = os.urandom(8).hex().encode()  # tells this store's wakes from others'
        self._topics: dict[str, StoreTopic] = {}
        self._create = register(client, SCRIPTS, "create_topic.lua")
        self._append_script = register(client, SCRIPTS, "append.lua")
        # Reads skip redis-py's XRANGE reply parsing (a dict per entry): a client of its own
        # over the same connection pool, so the app's client keeps its callbacks. A cluster
        # client has a pool per node: it reads parsed replies.
        self._reader: aioredis.Redis | None = None
        if isinstance(client, aioredis.Redis):
            self._reader = aioredis.Redis(connection_pool=client.connection_pool)
            self._reader.set_response_callback("XRANGE", unparsed)
        self._lane = lane_of(client)  # the data path's reads on one pipelined connection
        self._offset_for_time = register(client, SCRIPTS, "offset_for_time.lua")
        self._retention = register(client, SCRIPTS, "retention.lua")
        self._listener: asyncio.Task[None] | None = None
        self._wake_pending: set[str] = set()
        self._trailing: set[str] = set()
        self._wake_task: asyncio.Task[None] | None = None
        self._groups: dict[str, _Group] = {}  # per topic: the group appends of this turn join
        self._group_tasks: set[asyncio.Task[None]] = set()
        self.listening = asyncio.Event()  # set while the pub/sub connection is subscribed
        self._closed = True
        self._watchers: list[TopicListener] = []

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        self._closed = False
        await self._load_all()
        self._listener = asyncio.get_running_loop().create_task(self._listen())

    async def close(self) -> None:
        self._closed = True  # no append starts from here on
        while self._group_tasks:  # appends on their way: answered before the client goes
            await asyncio.gather(*self._group_tasks, return_exceptions=True)
        for task in (self._listener, self._wake_task):
            if task is not None:
                await _stop(task)
        self._listener = self._wake_task = None
        self._topics.clear()

    async def _load_all(self) -> None:
        with translated("loading topics"):
            names = sorted(text(n) for n in await self._client.smembers(self._topics_key))
            async with self._client.pipeline(transaction=False) as pipe:
                for name in names:
                    pipe.hmget(self._meta_key(name), "queues", "retention_ms", "retention_bytes")
                rows = await pipe.execute()
        for name, row in zip(names, rows, strict=True):
            self._remember(name, row)

    async def _load(self, name: str) -> StoreTopic | None:
        with translated("loading a topic"):
            row = await self._client.hmget(self._meta_key(name), "queues", "retention_ms", "retention_bytes")
        return self._remember(name, row)

    def _remember(self, name: str, row: list[Any]) -> StoreTopic | None:
        queues, retention_ms, retention_bytes = row
        if queues is None:
            return None
        return self._cache(
            TopicConfig(
                name,
                int(queues),
                int(retention_ms or 0),
                None if retention_bytes is None else int(retention_bytes),
            )
        )

    def _cache(self, config: TopicConfig) -> StoreTopic:
        t = self._topics.get(config.name)
        if t is None:
            t = self._topics[config.name] = StoreTopic(self.prefix, config)
        elif config.queues >= len(t.streams):  # topics only grow: an older answer is ignored
            t.resize(config)
        return t

    def _meta_key(self, name: str) -> str:
        return f"{self.prefix}:{{t:{name}}}:meta"

    # --- topics -------------------------------------------------------------------------

    async def create_topic(self, config: TopicConfig) -> None:
        validate_topic_name(config.name)
        if config.queues < 1:
            raise BadRequest("a topic needs at least one queue", field="queues")
        retention_bytes = "" if config.retention_bytes is None else config.retention_bytes
        with translated("creating a topic"):
            _, now = await self._create(
                keys=[self._meta_key(config.name)],
                args=[config.queues, config.retention_ms, retention_bytes],
            )
            # After the meta: a topic listed here always exists; a crash in between is healed
            # by the next create_topic, which every gateway calls for a topic it has not seen.
            await self._client.sadd(self._topics_key, config.name)
        if now > config.queues:
            raise BadRequest(f"topic {config.name} exists with {now} queues", field="queues")
        self._cache(config)
        self._moved(config.name)

    async def delete_topic(self, topic: str) -> None:
        with translated("deleting a topic"):
            # Unlisted first, so no gateway loads it again; then the meta hash and every
            # stream in one DEL (one hash slot), so an append sees the whole topic or none.
            await self._client.srem(self._topics_key, topic)
            queues = await self._client.hget(self._meta_key(topic), "queues")
            tag = f"{self.prefix}:{{t:{topic}}}"
            await self._client.delete(f"{tag}:meta", *(f"{tag}:q:{q}" for q in range(int(queues or 0))))
        self.forget_topic(topic)

    def forget_topic(self, topic: str) -> None:
        t = self._topics.pop(topic, None)
        if t is not None:
            t.notify()
            self._moved(topic)

    def has_topic(self, topic: str) -> bool:
        return topic in self._topics

    def watch(self, listener: TopicListener) -> None:
        """Listeners hear this gateway's moves only: other gateways write to the same keys
        (`hears_every_change` is False), so a reader of the bounds also looks for itself."""
        self._watchers.append(listener)

    @property
    def hears_every_change(self) -> bool:
        return False

    def _moved(self, topic: str) -> None:
        for listener in self._watchers:
            listener(topic)

    async def _topic(self, topic: str) -> StoreTopic:
        t = self._topics.get(topic) or await self._load(topic)
        if t is None:
            raise NotFound(f"topic {topic} does not exist", field="topic")
        return t

    async def _queue(self, topic: str, queue: int) -> tuple[StoreTopic, bytes]:
        t = await self._topic(topic)
        if not 0 <= queue < len(t.streams):
            await self._load(topic)  # another gateway may have grown it
            if not 0 <= queue < len(t.streams):
                raise BadRequest(f"queue {queue} does not exist in topic {topic}", field="queue")
        return t, t.streams[queue]

    def _script_error(self, exc: rexc.ResponseError, topic: str) -> Exception:
        text = str(exc)
        if text.startswith(SCRIPT_ERROR + "no_topic"):
            self._topics.pop(topic, None)
            return NotFound(f"topic {topic} does not exist", field="topic")
        if text.startswith(SCRIPT_ERROR + "no_queue"):
            queue = text.rsplit(" ", 1)[-1]
            return BadRequest(f"queue {queue} does not exist in topic {topic}", field="queue")
        return exc

    # --- data ---------------------------------------------------------------------------

    async def append(self, topic: str, queue: int, messages: list[StoredMessage]) -> int:
        return (await self.append_many(topic, {queue: messages}))[queue]

    async def append_many(self, topic: str, batches: dict[int, list[StoredMessage]]) -> dict[int, int]:
        return await self.append_encoded(
            topic, {q: [(m.timestamp_ms, _encode(m)) for m in messages] for q, messages in batches.items()}
        )

    async def append_many_with(
        self,
        topic: str,
        batches: dict[int, list[StoredMessage]],
        companions: Callable[[dict[int, int]], Companions],
    ) -> tuple[dict[int, int], MqgateError | None]:
        firsts = await self.append_many(topic, batches)
        return firsts, await write_companions(companions(firsts), self.append_encoded)

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        """Appends of one topic made in the same turn of the event loop go to Redis together,
        in one script call (a group commit, as the embedded store's round): most of a single
        produce's cost on Redis is the client's per call, not Redis's per message. Each append's
        queues are checked first, so one bad queue fails its own append only."""
        t = await self._topic(topic)
        for q in batches:
            if not 0 <= q < len(t.streams):
                t, _ = await self._queue(topic, q)  # grown by another gateway, or BadRequest
        if self._closed:
            raise Unavailable("the Redis store is closing")
        size = sum(len(payload) for messages in batches.values() for _, payload in messages)
        group = self._groups.get(topic)
        if group is None or not group.takes(size):
            group = _Group()
            self._groups[topic] = group
            task = asyncio.get_running_loop().create_task(self._append_group(topic, group))
            self._group_tasks.add(task)
            task.add_done_callback(self._group_tasks.discard)
        answer: asyncio.Future[dict[int, int]] = asyncio.get_running_loop().create_future()
        group.add(batches, size, answer)
        return await answer

    async def _append_group(self, topic: str, group: _Group) -> None:
        """Runs once the appends of this turn have joined `group`: its one script call, each
        append answered its own queues' first offsets (or the call's error, each its own copy).
        An append whose caller went away before the call (cancelled: a time limit, a closed
        request) is left out of it, as it would not have been sent on its own."""
        if self._groups.get(topic) is group:
            del self._groups[topic]  # later appends start a group of their own
        answers = [(answer, batches) for answer, batches in group.answers if not answer.done()]
        if not answers:
            return
        try:
            firsts = await self._append_now(topic, [b for _, batches in answers for b in batches])
        except BaseException as exc:
            for answer, _ in answers:
                if not answer.done():
                    answer.set_exception(_own_copy(exc))
            if not isinstance(exc, Exception):
                raise
            return
        i = 0
        for answer, batches in answers:
            if not answer.done():  # not cancelled meanwhile (its request went away)
                queues = [q for q, _ in batches]
                answer.set_result(dict(zip(queues, firsts[i : i + len(batches)], strict=True)))
            i += len(batches)

    async def _append_now(self, topic: str, batches: list[tuple[int, list[Encoded]]]) -> list[int]:
        """One script call appending `batches` (a queue may come more than once: its batches
        follow each other): the first offset of each, in order."""
        t = await self._topic(topic)
        streams = t.streams
        keys: list[bytes] = [t.meta]
        args: list[Any] = [t.channel, self._origin, int(WAKE_COALESCE_S * 1_000_000)]
        for q, messages in batches:
            if not 0 <= q < len(streams):
                t, _ = await self._queue(topic, q)
                streams = t.streams
            keys.append(streams[q])
            args += (q, len(messages))
            for timestamp_ms, payload in messages:
                args += (timestamp_ms, payload)
        with translated("appending"):
            try:
                published, *firsts = await run_script(
                    self._client, self._append_script, keys, args, self._wait
                )
            except rexc.ResponseError as exc:
                raise self._script_error(exc, topic) from exc
        t.notify(len({q for q, _ in batches}))  # one pull of each reader per queue written
        self._moved(topic)
        if not published and topic not in self._trailing:
            self._trailing.add(topic)
            asyncio.get_running_loop().call_later(WAKE_COALESCE_S, self._trailing_wake, topic)
        return [int(f) for f in firsts]

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        t, stream = await self._queue(topic, queue)
        _looked.set((t, t.epoch))
        if max_count <= 0:
            return []
        start = b"%d-1" % max(offset, 0)
        with translated("reading"):
            if self._lane is not None:  # raw: [[id, [t, ts, d, json]], ...]
                entries: Any = await self._lane.execute(
                    b"XRANGE", stream, start, b"+", b"COUNT", max_count, reads=True
                )
            elif self._reader is None:  # a cluster: parsed, [(id, {t: ts, d: json}), ...]
                parsed: Any = await self._client.xrange(stream, start, b"+", count=max_count)
                entries = [(i, [None, None, None, fields[b"d"]]) for i, fields in parsed]
            else:  # raw, as the lane's
                entries = await self._reader.xrange(stream, start, b"+", count=max_count)
        if not entries:
            return []
        # Offsets are contiguous, so only the first ID is parsed; fields are [t, ts, d, json].
        first = int(entries[0][0][:-2])
        return [(first + i, fields[3]) for i, (_, fields) in enumerate(entries)]

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]:
        return [(o, decode_stored(p)) for o, p in await self.read_raw(topic, queue, offset, max_count)]

    async def bounds_many(self, topics: list[str]) -> list[list[QueueBounds]]:
        """The topics' bounds in one round trip (a pull's three topics: one pipeline, not three
        tasks on three connections). The wake epoch looked at is the first topic's, the one a
        pull then waits on."""
        ts = [await self._topic(topic) for topic in topics]
        if ts:
            _looked.set((ts[0], ts[0].epoch))
        with translated("reading bounds"):
            if self._reader is None:
                # A cluster client: a pipeline that meets a connection error closes every node's
                # connections (redis-py), under the other calls in flight; one call a topic.
                metas = await asyncio.gather(*(self._client.hgetall(t.meta) for t in ts))
            else:
                metas = await self._metas(ts)
        return [self._bounds_of(topic, t, meta) for topic, t, meta in zip(topics, ts, metas, strict=True)]

    async def _metas(self, ts: list[StoreTopic]) -> list[Any]:
        """The topics' meta hashes in one pipeline (on the lane, the commands one after another
        on its connection). A pipeline, unlike a single command, is not tried again on a pooled
        connection the server closed (Redis restarted): these reads are, once."""
        lane = self._lane
        if lane is not None:
            flat = await lane.execute_many(*((b"HGETALL", t.meta) for t in ts), reads=True)
            return [dict(zip(f[::2], f[1::2], strict=True)) for f in flat]
        try:
            return await self._pipelined_metas(ts)
        except rexc.ConnectionError:
            return await self._pipelined_metas(ts)

    async def _pipelined_metas(self, ts: list[StoreTopic]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for t in ts:
                pipe.hgetall(t.meta)
            return list(await pipe.execute())

    async def bounds(self, topic: str) -> list[QueueBounds]:
        t = await self._topic(topic)
        _looked.set((t, t.epoch))
        with translated("reading bounds"):
            meta = await self._client.hgetall(t.meta)
        return self._bounds_of(topic, t, meta)

    def _bounds_of(self, topic: str, t: StoreTopic, meta: dict[Any, Any]) -> list[QueueBounds]:
        if not meta:
            self._topics.pop(topic, None)
            raise NotFound(f"topic {topic} does not exist", field="topic")
        queues = int(meta[b"queues"])
        if queues > len(t.streams):
            self._remember(topic, [meta[b"queues"], meta.get(b"retention_ms"), meta.get(b"retention_bytes")])
        return [
            QueueBounds(queue=q, min=int(meta[b"min:%d" % q]), max=int(meta[b"max:%d" % q]))
            for q in range(queues)
        ]

    async def queue_bytes(self, topic: str) -> list[int]:
        # The counters append.lua and retention.lua keep (README.md): one HMGET for every queue
        # this gateway knows of, and one more if another gateway grew the topic since.
        t = await self._topic(topic)
        known = len(t.streams)
        while True:
            with translated("reading queue sizes"):
                row = await self._client.hmget(t.meta, [b"queues", *(b"bytes:%d" % q for q in range(known))])
            if row[0] is None:
                self._topics.pop(topic, None)
                raise NotFound(f"topic {topic} does not exist", field="topic")
            queues = int(row[0])
            if queues <= known:
                return [int(n or 0) for n in row[1 : queues + 1]]
            known = queues

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        t, stream = await self._queue(topic, queue)
        with translated("finding an offset by time"):
            try:
                found = await self._offset_for_time(keys=[t.meta, stream], args=[queue, timestamp_ms])
            except rexc.ResponseError as exc:
                raise self._script_error(exc, topic) from exc
        return int(found)

    # --- long polling -------------------------------------------------------------------

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        t = await self._topic(topic)
        looked = _looked.get()
        if looked is not None and looked[0] is t and looked[1] != t.epoch:
            _looked.set(None)
            return  # woken since the caller last looked: look again first
        await t.waiters.wait(timeout_s, reader, recheck_s)

    def wake(self, topic: str, *, consumer: str | None = None, count: int | None = None) -> None:
        t = self._topics.get(topic)
        if t is not None:
            t.notify(count, consumer)
        # Other gateways wake a few of each reader (see _listen): a freed lock or a reset
        # has work for that many at most.
        self._publish_wake(topic)

    def wake_all(self) -> None:
        for t in list(self._topics.values()):
            t.notify()

    def _trailing_wake(self, topic: str) -> None:
        self._trailing.discard(topic)
        self._publish_wake(topic)

    def _publish_wake(self, topic: str) -> None:
        if self._closed:
            return
        self._wake_pending.add(topic)
        if self._wake_task is None or self._wake_task.done():
            self._wake_task = asyncio.get_running_loop().create_task(self._publish_wakes())

    async def _publish_wakes(self) -> None:
        """Publish pending wakes, one per topic however many were asked while one was on
        its way; a wake asked after a publish was sent gets a publish of its own."""
        while self._wake_pending:
            topics = sorted(self._wake_pending)
            self._wake_pending.clear()
            try:
                async with self._client.pipeline(transaction=False) as pipe:
                    for name in topics:
                        # Not pipe.publish: a cluster pipeline refuses it by name (PUBLISH
                        # reaches every node of a cluster from any node).
                        pipe.execute_command("PUBLISH", f"{self.prefix}:wake:{name}", self._origin)
                    await pipe.execute()
            except (rexc.RedisError, rexc.RedisClusterException) as exc:
                log.warning("could not publish a wake for %s: %s", ", ".join(topics), exc)

    async def _listen(self) -> None:
        """Wake local readers on other stores' wakes; reconnect for ever, never raise."""

        def heard(channel: bytes, origin: bytes) -> None:
            if origin != self._origin:  # our own writes woke our readers already
                t = self._topics.get(channel[self._channel_prefix :].decode())
                if t is not None:
                    # A wake says "something changed", not how much (it may stand for many
                    # coalesced appends): a reader has work for at most one pull per queue.
                    t.notify(len(t.streams))

        def reconnected() -> None:
            self.wake_all()  # wakes sent while we were away are lost: every reader looks again

        await listen_forever(
            self._client,
            self._wake_pattern,
            heard,
            reconnected,
            self.listening,
            "redis wake listener",
            pattern=True,
        )

    # --- retention ----------------------------------------------------------------------

    async def enforce_retention(self, now_ms: int) -> int:
        """Drop messages past their topic's age or size limit; return how many went."""
        await self._load_all()
        dropped = 0
        for t in list(self._topics.values()):
            more = True
            while more:
                with translated("enforcing retention"):
                    n, more_flag = await self._retention(
                        keys=[t.meta, *t.streams], args=[now_ms, RETENTION_CHUNK]
                    )
                dropped += n
                more = bool(more_flag) and n > 0
                if n > 0:
                    self._moved(t.name)
        return dropped
