"""The trace index written by a process of its own (tracing/index_writer.py): the same rows as
in the gateway's thread, malformed records counted, and a writer process that dies (kill -9)
replaced with nothing lost or written twice; the worker goes when its gateway is killed or
stops, and an index that fails in it fails the round."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from mqgate.errors import Unavailable
from mqgate.model import StoredMessage
from mqgate.store.interface import MessageStore
from mqgate.tracing.events import trace_topic
from mqgate.tracing.index import PositionMove, TraceIndex
from mqgate.tracing.index_writer import ProcessWriter
from mqgate.tracing.indexer import TraceIndexer
from mqgate.tracing.query import TraceQuery
from mqgate.tracing.recorder import TraceRecorder
from tests.conftest import wait_until
from tests.tracing.conftest import Stores, event, run_with_stores


def test_a_writer_process_indexes_what_the_thread_would_and_survives_its_own_death(
    tmp_path: Path, index: TraceIndex
) -> None:
    async def body(stores: Stores, store: MessageStore) -> None:
        indexer = TraceIndexer(store, index, batch_events=50)
        indexer.writer = ProcessWriter(index.url)
        recorder = TraceRecorder(store, on_new_topic=indexer.on_new_topic)
        query = TraceQuery(index, indexer)
        try:
            await recorder.record([event(f"m{i}", "accepted", i, keys=[f"k{i % 7}"]) for i in range(120)])
            await store.append(trace_topic("shop"), 0, [StoredMessage("x", 1, "p", "not json", [], [], {})])
            await indexer.step()
            [pid] = indexer.writer.worker_pids()
            assert pid != os.getpid()
            os.kill(pid, signal.SIGKILL)
            await recorder.record([event(f"n{i}", "accepted", 200 + i) for i in range(30)])
            failed_rounds = 0
            while not indexer.lag().caught_up or indexer.counters.indexed < 150:
                try:
                    await indexer.step()
                except Exception:  # the round that met the dead worker; the next one retries it
                    failed_rounds += 1
                assert failed_rounds <= 1
            assert indexer.writer.restarts == 1 and indexer.writer.worker_pids() != [pid]
            assert indexer.counters.indexed == 150 and indexer.counters.malformed == 1
            with index.engine.connect() as conn:
                rows = conn.execute(
                    sa.text("SELECT count(*), count(DISTINCT msg_id) FROM mqgate_trace_events")
                ).one()
            assert tuple(rows) == (150, 150)  # each once, none twice
            assert [p.msg_id for p in (await query.find(msg_id="n29")).paths] == ["n29"]
            assert len((await query.find(key="k3")).paths) == 17
        finally:
            await recorder.close()
            await indexer.writer.close()

    run_with_stores("embedded", tmp_path / "data", body)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


_HOLDER = """
import asyncio, sys
from mqgate.tracing.index import PositionMove, TraceIndex
from mqgate.tracing.index_writer import ProcessWriter

async def main() -> None:
    TraceIndex(sys.argv[1]).create_schema()
    writer = ProcessWriter(sys.argv[1])
    await writer.write([], {})
    print(writer.worker_pids()[0], flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_the_writer_process_goes_with_its_gateway_killed_or_stopped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/trace-index.sqlite"
    with subprocess.Popen([sys.executable, "-c", _HOLDER, url], stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None
        worker = int(holder.stdout.readline())
        assert _alive(worker)
        os.kill(holder.pid, signal.SIGKILL)
        wait_until(lambda: not _alive(worker), 20, "the index writer process to go with its gateway", 0.05)

    async def stopped() -> int:
        writer = ProcessWriter(url)
        written = await writer.write([], {("__trace.shop", 0): PositionMove(None, 0)})
        assert written.rows == 0
        [pid] = writer.worker_pids()
        await writer.close()
        assert writer.worker_pids() == []
        return pid

    assert not _alive(asyncio.run(stopped()))


def test_an_index_that_fails_in_the_writer_process_fails_the_round_as_unavailable(tmp_path: Path) -> None:
    async def body() -> None:
        writer = ProcessWriter(f"sqlite:///{tmp_path}/missing-dir/trace-index.sqlite")
        try:
            with pytest.raises(Unavailable, match="trace index"):
                await writer.write([], {("__trace.shop", 0): PositionMove(None, 1)})
            assert writer.restarts == 0 and len(writer.worker_pids()) == 1  # the worker stays
        finally:
            await writer.close()

    asyncio.run(body())
