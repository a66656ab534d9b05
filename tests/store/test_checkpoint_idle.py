"""The embedded store's checkpoint round visits only the queues synced past their checkpoint
(issue 27, "idle work proportional to what changed": every second it visited every queue of
every topic, so an idle gateway with many queues spent its time looking at them). A queue
written to is due once its write is synced, checkpointed by the next round, then forgotten; one
whose checkpoint fails stays due; a deleted topic's queues are forgotten with it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig
from tests.conftest import run_bounded

WEEK_MS = 7 * 24 * 3600 * 1000


def msg(i: int) -> StoredMessage:
    return StoredMessage(f"id{i:08d}", 1_000, "p", f"m{i}", [], [], {})


async def until(what: str, check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `check` until it is true; `what` names it if it never is."""
    try:
        async with asyncio.timeout(timeout_s):
            while not check():
                await asyncio.sleep(0.05)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


DUE = (("many", "7"), ("other", "2"))


def checkpointed_end(root: Path, topic: str, queue: int) -> int:
    return int(json.loads((root / "topics" / topic / str(queue) / "checkpoint.json").read_text())["end"])


def test_only_written_queues_are_due_and_each_is_checkpointed_then_forgotten(tmp_path: Path) -> None:
    async def go() -> None:
        store = EmbeddedStore(tmp_path, checkpoint_interval_s=0.0)
        await store.open()
        try:
            await store.create_topic(TopicConfig("many", 64, WEEK_MS))
            await store.create_topic(TopicConfig("other", 4, WEEK_MS))
            assert store.checkpoints_due == set()  # nothing written: nothing to visit
            await store.append("many", 7, [msg(i) for i in range(3)])
            await store.append("other", 2, [msg(9)])
            due = {(q.directory.parent.name, int(q.directory.name)) for q in store.checkpoints_due}
            assert due <= {("many", 7), ("other", 2)}  # a round may have taken some already
            # Due once their files are fsynced (the round journal's settle), then checkpointed.
            await until(
                "the rounds checkpoint them",
                lambda: (
                    not store.checkpoints_due
                    and all((tmp_path / "topics" / t / q / "checkpoint.json").exists() for t, q in DUE)
                ),
            )
            assert checkpointed_end(tmp_path, "many", 7) == 3 and checkpointed_end(tmp_path, "other", 2) == 1
            # A deleted topic's queues are not visited any more.
            await store.append("other", 1, [msg(10)])
            await store.delete_topic("other")
            assert all(q.directory.parent.name != "other" for q in store.checkpoints_due)
        finally:
            await store.close()

    run_bounded(go(), 120)


def test_a_queue_whose_checkpoint_fails_stays_due_until_it_succeeds(tmp_path: Path) -> None:
    async def go() -> None:
        store = EmbeddedStore(tmp_path, checkpoint_interval_s=0.0)
        await store.open()
        try:
            await store.create_topic(TopicConfig("t", 2, WEEK_MS))
            qdir = tmp_path / "topics" / "t" / "1"
            blocker = qdir / "checkpoint.tmp"
            blocker.mkdir()  # the checkpoint's temporary file cannot be written
            await store.append("t", 1, [msg(0)])
            await until(
                "its file is fsynced (the round journal's settle)", lambda: bool(store.checkpoints_due)
            )
            [due] = store.checkpoints_due
            failed = store.health.count("message_log", "checkpoint_failed")
            await until(
                "a round tried it", lambda: store.health.count("message_log", "checkpoint_failed") > failed
            )
            assert store.checkpoints_due == {due}
            blocker.rmdir()
            await until("the checkpoint is written", lambda: not store.checkpoints_due)
            assert checkpointed_end(tmp_path, "t", 1) == 1
        finally:
            await store.close()

    run_bounded(go(), 120)
