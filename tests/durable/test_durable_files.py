"""mqgate.durable.append_file: the one writer of framed records.

A failed write is produced for real: a child process lowers its file size limit
(RLIMIT_FSIZE, with SIGXFSZ ignored), so a write crossing it is cut short and the next one
fails with EFBIG, as a full disk cuts a write short and then fails with ENOSPC.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from mqgate.durable.append_file import AppendFile, install, write_new
from mqgate.durable.framing import frame, iter_payloads

LIMITED_CHILD_PRELUDE = r"""
import asyncio, json, resource, signal, sys
from pathlib import Path

signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
SOFT, HARD = resource.getrlimit(resource.RLIMIT_FSIZE)


def limit_file_size(nbytes):
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, HARD))


def unlimit_file_size():
    resource.setrlimit(resource.RLIMIT_FSIZE, (SOFT, HARD))
"""

APPEND_FILE_CHILD = r"""
from mqgate.durable.append_file import AppendFile
from mqgate.durable.framing import frame, iter_payloads

path = Path(sys.argv[1]) / "f.log"
f = AppendFile.create(path)
f.append(frame(b"a" * 100))
limit_file_size(f.size + 50)  # the next record gets 50 of its 108 bytes, then EFBIG
try:
    f.append(frame(b"b" * 100))
    error = None
except OSError as exc:
    error = exc.errno
size_after_failure = (path.stat().st_size, f.size)
unlimit_file_size()
f.append(frame(b"c"))
f.close()
payloads = [p.decode() for _, p in iter_payloads(path.read_bytes())]
print(json.dumps({"error": error, "size_after_failure": size_after_failure, "payloads": payloads}))
"""

MESSAGE_LOG_CHILD = r"""
from mqgate.errors import StorageError
from mqgate.model import StoredMessage
from mqgate.store.backends.embedded import EmbeddedStore
from mqgate.store.interface import TopicConfig


def msg(i, size=10):
    return StoredMessage(f"id{i}", 1000 + i, "p", "x" * size, [], [], {})


async def main():
    root = Path(sys.argv[1])
    store = EmbeddedStore(root)
    await store.open()
    await store.create_topic(TopicConfig("t", 1, 7 * 24 * 3600 * 1000))
    await store.append("t", 0, [msg(0), msg(1)])
    log_file = root / "topics" / "t" / "0" / "00000000000000000000.log"
    limit_file_size(log_file.stat().st_size + 50)
    try:
        await store.append("t", 0, [msg(2, size=500)])
        error = None
    except StorageError as exc:
        error = exc.message
    unlimit_file_size()
    after = await store.append("t", 0, [msg(3)])
    first_run = [m.msg_id for _, m in await store.read("t", 0, 0, 10)]
    await store.close()
    store = EmbeddedStore(root)
    await store.open()
    second_run = [m.msg_id for _, m in await store.read("t", 0, 0, 10)]
    cut = store.recovered_bytes_cut
    await store.close()
    print(json.dumps({"error": error, "after": after, "read": first_run, "reopened": second_run, "cut": cut}))


asyncio.run(main())
"""


def run_limited(child: str, directory: Path) -> Any:
    done = subprocess.run(
        [sys.executable, "-c", LIMITED_CHILD_PRELUDE + child, str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_write_cut_short_is_cut_back_and_the_file_goes_on(tmp_path: Path) -> None:
    got = run_limited(APPEND_FILE_CHILD, tmp_path)
    assert got["error"] == errno.EFBIG
    assert got["size_after_failure"] == [108, 108]  # the 50 bytes that got through are gone
    assert got["payloads"] == ["a" * 100, "c"]


def test_a_failed_message_log_write_leaves_no_offset_behind(tmp_path: Path) -> None:
    got = run_limited(MESSAGE_LOG_CHILD, tmp_path)
    assert got["error"] is not None and got["error"].startswith("write failed")
    assert got["after"] == 2  # the failed record took no offset
    assert got["read"] == got["reopened"] == ["id0", "id1", "id3"]
    assert got["cut"] == 0


def test_reopen_cuts_a_torn_tail_and_appends_after_the_intact_records(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(frame(b"one") + frame(b"two") + frame(b"three")[:9])
    intact_end = sum(len(frame(p)) for p in (b"one", b"two"))
    f = AppendFile.reopen(path, intact_end)
    assert (f.size, path.stat().st_size) == (intact_end, intact_end)
    f.append(frame(b"four"))
    f.close()
    assert [p for _, p in iter_payloads(path.read_bytes())] == [b"one", b"two", b"four"]


def test_write_new_and_install_replace_a_file_whole(tmp_path: Path) -> None:
    path = tmp_path / "f.log"
    path.write_bytes(frame(b"old"))
    tmp = tmp_path / "f.tmp"
    f = write_new(tmp, [frame(b"a"), memoryview(frame(b"b"))])
    install(tmp, path)
    f.append(frame(b"c"))  # the new file, now under the old name, stays open for appending
    f.close()
    assert not tmp.exists()
    assert [p for _, p in iter_payloads(path.read_bytes())] == [b"a", b"b", b"c"]
