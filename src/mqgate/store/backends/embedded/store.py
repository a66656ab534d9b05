"""The embedded message store: topics as directories of queue logs on local disk.

Layout: `<data_dir>/topics/<topic>/topic.json` and `<data_dir>/topics/<topic>/<queue>/`
holding `<base offset>.log`, `<base offset>.idx` and `checkpoint.json`. One process owns a
data directory at a time (an exclusive lock on `<data_dir>/.lock`). A topic whose topic.json
cannot be read costs that topic only: it is not served (its calls answer `topic_damaged`),
counted and shown degraded until an operator repairs it; the other topics are served.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import msgspec

from mqgate.durable.append_file import fsync_dir
from mqgate.durable.group_commit import GroupCommitter, PendingWriteFailed
from mqgate.durable.handles import FileHandles
from mqgate.durable.space import DiskSpace
from mqgate.errors import TOPIC_DAMAGED, BadRequest, MqgateError, NotFound, StorageError
from mqgate.health import Health
from mqgate.model import QueueBounds, StoredMessage, decode_stored
from mqgate.names import validate_topic_name
from mqgate.store.backends.embedded import journal as round_journal
from mqgate.store.backends.embedded.companions import CompanionWriter
from mqgate.store.backends.embedded.data_format import (
    FORMAT,
    READS_ALSO,
    TOPIC_FILE,
    data_format,
    mark_format,
    read_topic_config,
    write_topic_config,
)
from mqgate.store.backends.embedded.file_span import FileSpan
from mqgate.store.backends.embedded.queue_log import COMPONENT, Mark, QueueLog
from mqgate.store.backends.embedded.records import OVERHEAD
from mqgate.store.interface import Companions, Encoded, TopicConfig, TopicListener
from mqgate.store.waiters import ANY_READER, Reader, TopicWaiters

log = logging.getLogger(__name__)

CHECKPOINT_BYTES: Final = 8 * 1024 * 1024

# The code of the error `open` raises while another process holds the directory's lock.
DATA_DIR_IN_USE: Final = "data_dir_in_use"
_encode = msgspec.json.Encoder().encode


def _timestamp_of(payload: bytes) -> int:
    return decode_stored(payload).timestamp_ms


class _Topic:
    __slots__ = ("config", "moved", "queues", "waiters")

    def __init__(self, config: TopicConfig, moved: Callable[[str], None]) -> None:
        self.config = config
        self.queues: list[QueueLog] = []
        self.waiters = TopicWaiters()
        self.moved = moved  # the store's: tells its watchers

    def notify(self) -> None:
        """One queue's new writes became visible: work for one pull of each reader."""
        self.waiters.wake(1)
        self.moved(self.config.name)


class EmbeddedStore:
    def __init__(
        self,
        data_dir: Path,
        *,
        broker: str = "local",
        segment_bytes: int = 64 * 1024 * 1024,
        fsync_interval_ms: int | None = None,
        committer: GroupCommitter | None = None,
        checkpoint_interval_s: float = 5.0,
        health: Health | None = None,
        disk_free_floor_bytes: int = 0,
        max_open_files: int | None = None,
        journal_settle_interval_s: float = 1.0,
    ) -> None:
        """`journal_settle_interval_s`: how long the queue files may go without an fsync while
        the round journal holds their records (fsync=always; journal.py)."""
        self.health = health or Health()
        self.journal_settle_interval_s = journal_settle_interval_s
        self.space = DiskSpace(Path(data_dir), disk_free_floor_bytes, self.health)
        self._max_open_files = max_open_files
        self.handles = FileHandles(max_open_files)
        self.broker = broker
        self.root = Path(data_dir)
        self.topics_dir = self.root / "topics"
        # Deleted topics on their way out (a rename into here is atomic, the removal is not).
        self.trash_dir = self.root / "trash"
        self.segment_bytes = segment_bytes
        self._own_committer = committer is None
        self._fsync_interval_ms = fsync_interval_ms
        self.committer: GroupCommitter | None = committer
        self.checkpoint_interval_s = checkpoint_interval_s
        self.checkpoints_due: set[QueueLog] = set()  # synced past their checkpoint
        self._topics: dict[str, _Topic] = {}
        self._damaged: dict[str, str] = {}  # topic -> why it is not served
        self._lock_fd = -1
        self._checkpointer: asyncio.Task[None] | None = None
        self.recovered_bytes_cut = 0
        self._companions = CompanionWriter(self._write_all)
        self._unhook: Callable[[], None] = lambda: None
        self._watchers: list[TopicListener] = []
        self.journal: round_journal.RoundJournal | None = None
        self._closed = False
        self._deleting: set[str] = set()  # topics whose delete awaits its settle

    # --- lifecycle ----------------------------------------------------------------------

    async def open(self) -> None:
        self._closed = False
        self.topics_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._lock_fd)
            raise StorageError(
                f"data directory {self.root} is in use by another process", code=DATA_DIR_IN_USE
            ) from exc
        self._check_format()
        if self.trash_dir.exists():
            shutil.rmtree(self.trash_dir, ignore_errors=True)
        if self.committer is None:
            self.committer = GroupCommitter(self._fsync_interval_ms, self.health)
            self.committer.start()
        self.handles = FileHandles(self._max_open_files, self.committer)
        self._unhook = self.committer.before_round(self._companions.write_pending)
        for topic_dir in sorted(p for p in self.topics_dir.iterdir() if p.is_dir()):
            try:
                config = read_topic_config(topic_dir)
            except FileNotFoundError:
                continue
            except (OSError, ValueError) as exc:
                self._damaged_topic(topic_dir.name, exc)
                continue
            self._load_topic(config)
        self._open_journal()
        self._checkpointer = asyncio.get_running_loop().create_task(self._checkpoint_loop())

    def _open_journal(self) -> None:
        """Replay what a crash left in the round journal (whatever the mode: it may have run
        with fsync=always before), then journal every queue's rounds if writers wait for them."""
        assert self.committer is not None
        directory = self.root / round_journal.JOURNAL_DIR
        last = round_journal.replay(directory, self._queue_log_of, self.health)
        if not self.committer.waits_for_fsync:
            return
        self.journal = round_journal.RoundJournal(
            directory,
            health=self.health,
            mark_dirty=self.committer.mark_dirty,
            settle_interval_s=self.journal_settle_interval_s,
        )
        self.journal.start(last)
        for topic in self._topics.values():
            for queue, queue_log in enumerate(topic.queues):
                self._journal(queue_log, topic.config.name, queue)

    def _queue_log_of(self, topic: str, queue: int) -> QueueLog | None:
        t = self._topics.get(topic)
        return t.queues[queue] if t is not None and 0 <= queue < len(t.queues) else None

    def _journal(self, queue_log: QueueLog, topic: str, queue: int) -> None:
        if self.journal is not None:
            queue_log.journal = self.journal
            self.journal.register(queue_log, topic, queue)

    def _damaged_topic(self, name: str, exc: Exception) -> None:
        self._damaged[name] = f"its {TOPIC_FILE} cannot be read ({exc}); see mqgate check"
        detail = f"{self.topics_dir / name / TOPIC_FILE} cannot be read ({exc}): topic {name} is not served"
        self.health.fault(COMPONENT, "topic_unreadable", detail)
        self.health.degrade(f"topic {name}", detail)

    def _check_format(self) -> None:
        found = data_format(self.root, self.topics_dir)
        if found in READS_ALSO:
            log.warning("data directory %s: format %r marked %r", self.root, found, FORMAT)
            mark_format(self.root)
        elif found != FORMAT:
            os.close(self._lock_fd)
            self._lock_fd = -1
            raise StorageError(
                f"data directory {self.root} holds format {found!r}, this build reads {FORMAT!r}"
            )

    async def close(self) -> None:
        self._closed = True  # writes from now on are refused
        if self._checkpointer is not None:
            self._checkpointer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checkpointer
        if self.committer is not None:
            for _ in range(64):  # a clean stop leaves no journal to replay (64 files a round)
                if self.journal is None or not self.journal.pending:
                    break
                self.journal.want_settle()
                await self.committer.flush()
            if self._own_committer:
                await self.committer.stop()
                self._close_files()
            else:
                # Shared: no round of the committer may begin between the last one that makes
                # this store's writes durable and the closing of its files.
                await self.committer.last_round(self._close_files)
            self._unhook()
            self._unhook = lambda: None
        else:
            self._close_files()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    def _close_files(self) -> None:
        # Each queue's last checkpoint may fail (a full disk): reported, and the next start
        # verifies a little more; closing goes on.
        for topic in self._topics.values():
            for q in topic.queues:
                q.close()
        self._topics.clear()
        self.checkpoints_due.clear()
        if self.journal is not None:
            self.journal.close()
            if self.committer is not None:
                self.committer.forget(self.journal)
            self.journal = None

    def _load_topic(self, config: TopicConfig) -> _Topic:
        topic = _Topic(config, self._moved)
        try:
            for q in range(config.queues):
                self._add_queue(topic, q)
        except BaseException:
            for log_ in topic.queues:
                log_.close()
            raise
        self._topics[config.name] = topic
        return topic

    def _add_queue(self, topic: _Topic, queue: int) -> None:
        assert self.committer is not None
        queue_log = QueueLog(
            self.topics_dir / topic.config.name / str(queue),
            segment_bytes=self.segment_bytes,
            committer=self.committer,
            on_visible=topic.notify,
            timestamp_of=_timestamp_of,
            health=self.health,
            handles=self.handles,
            on_synced=self.checkpoints_due.add,
        )
        self.recovered_bytes_cut += queue_log.recover()
        if queue_log.checkpoint_due:  # what start-up verified past its checkpoint
            self.checkpoints_due.add(queue_log)
        self._journal(queue_log, topic.config.name, queue)
        topic.queues.append(queue_log)

    async def _checkpoint_loop(self) -> None:
        """Checkpoint the queues synced past their checkpoint (`checkpoints_due`: only those, so
        an idle store with many queues does nothing): each that wrote CHECKPOINT_BYTES at
        once, every one each `checkpoint_interval_s`. One whose checkpoint fails stays due."""
        last_full = time.monotonic()
        while True:
            await asyncio.sleep(1.0)
            try:
                full = time.monotonic() - last_full >= self.checkpoint_interval_s
                for q in list(self.checkpoints_due):
                    if full or q.bytes_since_checkpoint >= CHECKPOINT_BYTES:
                        q.try_checkpoint()
                        if not q.checkpoint_due:
                            self.checkpoints_due.discard(q)
                if full:
                    last_full = time.monotonic()
                if self.journal is not None and self.committer is not None and self.journal.settle_due:
                    self.journal.want_settle()  # an idle store's journal settles too
                    await self.committer.flush()
            except Exception as exc:
                # This task must not die silently: the next round tries again.
                log.exception("message store checkpoint round failed")
                self.health.fault(COMPONENT, "checkpoint_task_failed", repr(exc))

    # --- topics -------------------------------------------------------------------------

    async def create_topic(self, config: TopicConfig) -> None:
        validate_topic_name(config.name)
        try:
            moved = self._create_topic(config)
        except OSError as exc:  # taken back: nothing moved
            raise self.space.write_error(exc, COMPONENT, "topic creation", config.name) from exc
        if moved:  # made or grown (a start-up's sync finds most as they are)
            self._moved(config.name)

    def _create_topic(self, config: TopicConfig) -> bool:
        """Whether anything changed."""
        if config.name in self._deleting:
            raise StorageError(f"topic {config.name} is being deleted: try again", field="topic")
        why = self._damaged.get(config.name)
        if why is not None:
            # Left as it is (a topic.json written from the registration would hide the damage
            # from the operator), and said: growing it must not answer 200 with nothing grown.
            raise StorageError(f"topic {config.name} is not served: {why}", field="topic", code=TOPIC_DAMAGED)
        existing = self._topics.get(config.name)
        if existing is not None:
            if existing.config.queues > config.queues:
                raise BadRequest(
                    f"topic {config.name} exists with {existing.config.queues} queues",
                    field="queues",
                )
            if existing.config != config:
                # Queues before the meta: a crash in between leaves empty queue directories
                # that the next start ignores and the next growth reuses.
                try:
                    for q in range(existing.config.queues, config.queues):
                        self._add_queue(existing, q)
                    self._write_meta(config)
                except BaseException:
                    for added in existing.queues[existing.config.queues :]:
                        added.close()
                    del existing.queues[existing.config.queues :]
                    raise
                existing.config = config
                return True
            return False
        # Queues first, the meta last: a failure in between leaves queue directories without a
        # topic.json, which start-up ignores and a new attempt reuses; never half a topic.
        topic = self._load_topic(config)
        try:
            self._write_meta(config)
        except BaseException:
            del self._topics[config.name]
            for queue_log in topic.queues:
                queue_log.close()
            raise
        return True

    def _write_meta(self, config: TopicConfig) -> None:
        write_topic_config(self.topics_dir / config.name, config)

    async def delete_topic(self, topic: str) -> None:
        """The topic's directory is renamed into the trash (atomic: a crash leaves the topic
        whole or gone), then removed; whatever a crash leaves in the trash goes at the next
        start."""
        journal = self.journal
        if journal is not None and journal.keep_all:  # before anything changes
            raise StorageError(
                f"topic {topic} was not deleted: the round journal is kept after a failed fsync "
                "until the gateway restarts"
            )
        if topic in self._deleting:
            raise StorageError(f"topic {topic} is being deleted", field="topic")
        t = self._topics.pop(topic, None)
        if t is not None:
            self._deleting.add(topic)
            try:
                await self._settle_topic(topic, t)
            except BaseException:
                # Kept (a cancelled or failed delete): unless made again meanwhile, which the
                # deletion refuses.
                self._topics.setdefault(topic, t)
                raise
            finally:
                self._deleting.discard(topic)
            for q in t.queues:
                q.close()
                if journal is not None:
                    journal.forget(q)
            self.checkpoints_due.difference_update(t.queues)
        elif self._damaged.pop(topic, None) is not None:
            self.health.restore(f"topic {topic}")  # deleting is one way to be rid of it
        else:
            return
        self.trash_dir.mkdir(exist_ok=True)
        trash = self.trash_dir / f"{time.time_ns()}-{topic}"
        try:
            os.rename(self.topics_dir / topic, trash)
        except FileNotFoundError:
            return
        await asyncio.to_thread(shutil.rmtree, trash, True)

    async def _settle_topic(self, topic: str, t: _Topic) -> None:
        """Before a topic's files go: its writes durable, and no journal entry of it left."""
        journal = self.journal
        t.waiters.wake()
        self._moved(topic)
        if self.committer is not None:
            await self.committer.flush()
        # No entry of the topic may outlive it: one of a topic made again under its name would be
        # replayed into the new one's files. A settle fsyncs 64 files a round.
        for _ in range(64):
            if journal is None or self.committer is None or not journal.holds(t.queues):
                break
            journal.want_settle()
            await self.committer.flush()
        if journal is None:
            return
        if journal.holds(t.queues):
            raise StorageError(f"topic {topic} was not deleted: the round journal may still hold its records")
        try:
            fsync_dir(journal.directory)  # the settle's deletions, before the topic goes
        except OSError as exc:
            raise StorageError(f"topic {topic} was not deleted: {exc.strerror}") from exc

    def forget_topic(self, topic: str) -> None:
        """One process owns an embedded store: no other gateway can have deleted a topic."""

    def topic_names(self) -> list[str]:
        """The topics this store serves (its store process tells a worker that opens)."""
        return list(self._topics)

    def has_topic(self, topic: str) -> bool:
        return topic in self._topics

    def watch(self, listener: TopicListener) -> None:
        self._watchers.append(listener)

    @property
    def hears_every_change(self) -> bool:
        """One process owns the data directory: every move goes through this object."""
        return True

    def _moved(self, topic: str) -> None:
        for listener in self._watchers:
            listener(topic)

    def _topic(self, topic: str) -> _Topic:
        t = self._topics.get(topic)
        if t is None:
            why = self._damaged.get(topic)
            if why is not None:
                raise StorageError(f"topic {topic} is not served: {why}", field="topic", code=TOPIC_DAMAGED)
            raise NotFound(f"topic {topic} does not exist", field="topic")
        return t

    def _queue(self, topic: str, queue: int) -> QueueLog:
        queues = self._topic(topic).queues
        if not 0 <= queue < len(queues):
            raise BadRequest(f"queue {queue} does not exist in topic {topic}", field="queue")
        return queues[queue]

    # --- data ---------------------------------------------------------------------------

    def _write_all(self, topic: str, batches: dict[int, tuple[list[bytes], int]]) -> dict[int, int]:
        """Write each queue's records (payloads, last timestamp): all of them or none. Nothing
        awaits in here, so the queues written before a failure are taken back before anyone
        could read them; the failed one cut itself back."""
        if self._closed:
            raise StorageError("the message store is closing: nothing was stored")
        logs = {q: self._queue(topic, q) for q in batches}
        size = sum(len(p) + OVERHEAD for payloads, _ in batches.values() for p in payloads)
        # The round journal holds a copy of them until its next settle.
        self.space.check(size if self.journal is None else 2 * size)
        firsts: dict[int, int] = {}
        marks: list[tuple[QueueLog, Mark]] = []
        for q, (payloads, timestamp_ms) in batches.items():
            queue_log = logs[q]
            mark = queue_log.mark()
            try:
                firsts[q] = queue_log.append(payloads, timestamp_ms)
            except OSError as exc:
                for done, done_mark in reversed(marks):
                    try:
                        done.take_back(done_mark)
                    except OSError as undo_exc:  # they stay: delivered, though not acknowledged
                        self.health.fault(COMPONENT, "take_back_failed", f"{done.directory}: {undo_exc}")
                if marks:
                    self._moved(topic)  # a visible end may have gone back
                raise self.space.write_error(exc, COMPONENT, "write", f"to {topic} queue {q}") from exc
            marks.append((queue_log, mark))
        return firsts

    async def _durable(self) -> None:
        assert self.committer is not None
        try:
            await self.committer.durable()
        except PendingWriteFailed as exc:  # the round took these records back: nothing stored
            raise self.space.write_error(exc.os_error, COMPONENT, "write") from exc

    async def append_encoded(self, topic: str, batches: dict[int, list[Encoded]]) -> dict[int, int]:
        firsts = self._write_all(
            topic, {q: ([payload for _, payload in msgs], msgs[-1][0]) for q, msgs in batches.items()}
        )
        await self._durable()
        return firsts

    async def append(self, topic: str, queue: int, messages: list[StoredMessage]) -> int:
        return (await self.append_many(topic, {queue: messages}))[queue]

    async def append_many(self, topic: str, batches: dict[int, list[StoredMessage]]) -> dict[int, int]:
        firsts = self._write_all(
            topic, {q: ([_encode(m) for m in msgs], msgs[-1].timestamp_ms) for q, msgs in batches.items()}
        )
        await self._durable()
        return firsts

    async def append_many_with(
        self,
        topic: str,
        batches: dict[int, list[StoredMessage]],
        companions: Callable[[dict[int, int]], Companions],
    ) -> tuple[dict[int, int], MqgateError | None]:
        firsts = self._write_all(
            topic, {q: ([_encode(m) for m in msgs], msgs[-1].timestamp_ms) for q, msgs in batches.items()}
        )
        assert self.committer is not None
        ticket = self._companions.add(companions(firsts))
        if self.committer.waits_for_fsync:
            # Written with every other append's companions when the round begins that makes
            # these messages durable: one write for many calls, the same fsync.
            await self._durable()
        else:
            self._companions.write_pending()
        return firsts, ticket.error

    async def read_raw(self, topic: str, queue: int, offset: int, max_count: int) -> list[tuple[int, bytes]]:
        return self._queue(topic, queue).read(offset, max_count)

    def span(self, topic: str, queue: int, offset: int, max_count: int) -> FileSpan | None:
        """Where `read_raw`'s records are, for a worker to read them itself (`FileSpan`)."""
        return self._queue(topic, queue).span(offset, max_count)

    async def read(
        self, topic: str, queue: int, offset: int, max_count: int
    ) -> list[tuple[int, StoredMessage]]:
        return [(o, decode_stored(p)) for o, p in self._queue(topic, queue).read(offset, max_count)]

    async def bounds(self, topic: str) -> list[QueueBounds]:
        return self._bounds(topic)

    async def bounds_many(self, topics: list[str]) -> list[list[QueueBounds]]:
        return [self._bounds(topic) for topic in topics]  # from memory: no task, no turn of the loop

    def _bounds(self, topic: str) -> list[QueueBounds]:
        return [
            QueueBounds(queue=i, min=q.min_offset, max=q.visible_end)
            for i, q in enumerate(self._topic(topic).queues)
        ]

    async def queue_bytes(self, topic: str) -> list[int]:
        # Each segment's size is kept as it is written (and read from a stat at start-up).
        return [q.size_bytes for q in self._topic(topic).queues]

    async def offset_for_time(self, topic: str, queue: int, timestamp_ms: int) -> int:
        log = self._queue(topic, queue)
        lo, hi = log.min_offset, log.visible_end
        while lo < hi:
            mid = (lo + hi) // 2
            # The first readable record from mid on (a damaged one is skipped).
            found = log.read(mid, 16)
            if not found:
                hi = mid
            elif _timestamp_of(found[0][1]) < timestamp_ms:
                lo = found[0][0] + 1
            else:
                hi = mid
        return lo

    async def wait_for_data(
        self, topic: str, timeout_s: float, reader: Reader = ANY_READER, recheck_s: float | None = None
    ) -> None:
        await self._topic(topic).waiters.wait(timeout_s, reader, recheck_s)

    def wake(self, topic: str, *, consumer: str | None = None, count: int | None = None) -> None:
        t = self._topics.get(topic)
        if t is not None:
            t.waiters.wake(count, consumer)

    def wake_all(self) -> None:
        for t in self._topics.values():
            t.waiters.wake()

    async def enforce_retention(self, now_ms: int) -> int:
        dropped = 0
        for topic in list(self._topics.values()):
            cfg = topic.config
            before = dropped
            for q in topic.queues:
                dropped += q.drop_old_segments(now_ms, cfg.retention_ms, cfg.retention_bytes)
            if dropped > before:
                self._moved(cfg.name)  # its min offsets moved
        return dropped
