"""Writing the trace index in a process of its own (issue 11: tracing's cost on the gateway).

The indexer's round reads raw trace records from the store in the gateway (cheap: stored bytes,
no decoding) and hands them to one worker process, which decodes them and writes the rows and
the new positions in one transaction. The decoding and the SQL driver's work then run beside
the gateway's event loop, not in its process, so they neither take its CPU time nor its GIL.
The worker is started with `spawn` (no copy of the gateway's threads and event loop) and exits
when the gateway goes: its end of the pipe closes.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import msgspec

from mqgate.errors import Unavailable
from mqgate.model import decode_stored
from mqgate.tracing.batch import TraceBatch, TraceRound, decode_record
from mqgate.tracing.index import IndexRow, Position, PositionMove, TraceIndex, batch_row

log = logging.getLogger(__name__)

_index: TraceIndex | None = None  # the worker process's own


@dataclass(slots=True, frozen=True)
class Written:
    held: int  # events the written records hold
    rows: int
    malformed: int


def decode_rows(raws: Sequence[bytes]) -> tuple[list[IndexRow], int, int]:
    """The index rows of raw trace records, the events they hold and how many did not decode."""
    rows: list[IndexRow] = []
    held = malformed = 0
    for raw in raws:
        try:
            body = decode_stored(raw).body
            record = decode_record(body)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeError) as exc:
            log.warning("skipping a malformed trace record: %r", exc)
            malformed += 1
            continue
        if isinstance(record, (TraceBatch, TraceRound)):
            rows.append(batch_row(record, body))
            held += record.event_count
        else:
            rows.append(IndexRow(record.msg_id, record.request_id, record.time_ms, record.keys, body))
            held += 1
    return rows, held, malformed


def decode_and_write(
    index: TraceIndex, raws: Sequence[bytes], moves: Mapping[Position, PositionMove]
) -> Written:
    rows, held, malformed = decode_rows(raws)
    index.write(rows, moves)
    return Written(held, len(rows), malformed)


def _start(url: str, parent: int) -> None:
    global _index
    _die_with_parent(parent)
    _index = TraceIndex(url)


def _die_with_parent(parent: int) -> None:
    """A gateway killed -9 takes its worker along (Linux: the parent-death signal; a parent
    that died while this process was starting is seen by its pid no longer being ours)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker ends at its next write's EOF
        pass
    if os.getppid() != parent:
        os._exit(0)


def _write(raws: Sequence[bytes], moves: Mapping[Position, PositionMove]) -> Written:
    assert _index is not None
    return decode_and_write(_index, raws, moves)


class ProcessWriter:
    """`decode_and_write` in a worker process (one: the index's writes are serial anyway). The
    worker starts at the first write; one that died is replaced at the next (the round that
    failed is retried from the positions the index holds, so nothing is lost or doubled)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.restarts = 0
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(
            max_workers=1, mp_context=context, initializer=_start, initargs=(self.url, os.getpid())
        )

    async def write(self, raws: Sequence[bytes], moves: Mapping[Position, PositionMove]) -> Written:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, _write, list(raws), dict(moves))
        except BrokenProcessPool as exc:
            log.error("the trace index writer process died (%s): starting another", exc)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = self._new_pool()
            self.restarts += 1
            raise Unavailable("the trace index writer process died; the round is retried") from exc

    def worker_pids(self) -> list[int]:
        processes = getattr(self._pool, "_processes", None) or {}
        return [p.pid for p in list(processes.values()) if p.pid is not None]

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
