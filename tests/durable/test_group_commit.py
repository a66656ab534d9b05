"""The group committer (durable/group_commit.py): rounds one at a time, and a flush whose caller
is cancelled still finishes its round (its writers answered, its items told)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

import mqgate.durable.group_commit as group_commit
from mqgate.durable.group_commit import GroupCommitter
from tests.conftest import run_bounded


class File:
    """A Syncable: one real file; `synced` counts its after_sync calls."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        self.synced = 0

    def sync_fds(self) -> list[int]:
        return [self.fd]

    def after_sync(self) -> None:
        self.synced += 1


def test_a_cancelled_flush_still_answers_the_writers_of_its_round(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entered, release = threading.Event(), threading.Event()
    real = group_commit._fsync_all

    def held(fds: list[int]) -> None:  # the disk is slow: the round waits here
        entered.set()
        release.wait(30)
        real(fds)

    monkeypatch.setattr(group_commit, "_fsync_all", held)

    async def go() -> None:
        committer = GroupCommitter(None)  # no flusher task: only the flush runs rounds
        item = File(tmp_path / "f")
        committer.mark_dirty(item)
        loop = asyncio.get_running_loop()
        writer = loop.create_task(committer.durable())
        flush = loop.create_task(committer.flush())
        await loop.run_in_executor(None, entered.wait, 30)
        flush.cancel()  # e.g. a store's checkpoint task, cancelled by close()
        await asyncio.sleep(0)
        release.set()
        await asyncio.wait_for(writer, 20)  # answered, not left waiting for ever
        assert item.synced == 1
        with pytest.raises(asyncio.CancelledError):
            await flush
        committer.mark_dirty(item)
        await committer.flush()  # the next round runs: nothing was left half done
        assert item.synced == 2
        os.close(item.fd)

    run_bounded(go(), 60)
