"""Writing the trace index in a process of its own (issue 11: tracing's cost on the gateway).

The indexer's round reads raw trace records from the store in the gateway (cheap: stored bytes,
no decoding) and hands them to one worker process (tracing/index_worker.py), which decodes them
and writes the rows and the new positions in one transaction. The decoding and the SQL driver's
work then run beside the gateway's event loop, not in its process, so they neither take its CPU
time nor its GIL.

The worker is fed through its stdin and answers on its stdout, both driven by the gateway's
event loop: a round is one framed write and one framed read, and the gateway runs no thread
for it. (A `ProcessPoolExecutor` did the same with a manager and a feeder thread in the
gateway, which took the GIL from the event loop at every round: py-spy, a traced produce load.)
The worker exits when the gateway goes: its stdin closes, and a gateway killed -9 takes it
along (index_worker.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

import msgspec

import mqgate
from mqgate.errors import Unavailable
from mqgate.model import decode_stored
from mqgate.tracing.batch import TraceBatch, TraceRound, decode_record
from mqgate.tracing.index import IndexRow, Position, PositionMove, StalePositions, TraceIndex, batch_row

log = logging.getLogger(__name__)

FRAME_HEADER_BYTES: Final = 4  # a frame: its length (big-endian) and its msgpack
STOP_WAIT_S: Final = 10.0  # for the worker to end its round and exit before it is killed


class Written(msgspec.Struct, frozen=True):
    held: int  # events the written records hold
    rows: int
    malformed: int


class Round(msgspec.Struct, array_like=True):
    """What the gateway sends: the raw records and the moves of the positions."""

    raws: list[bytes]
    moves: list[tuple[str, int, int | None, int]]  # topic, queue, old, new


class Outcome(msgspec.Struct, array_like=True):
    """What the worker answers: the counts, or why the round wrote nothing."""

    held: int = 0
    rows: int = 0
    malformed: int = 0
    stale: str | None = None  # another indexer moved a position first (StalePositions)
    error: str | None = None  # the index failed (the round is retried)


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


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(FRAME_HEADER_BYTES, "big") + payload


class ProcessWriter:
    """`decode_and_write` in a worker process (one: the index's writes are serial anyway). The
    worker starts at the first write; one that died is replaced at the next (the round that
    failed is retried from the positions the index holds, so nothing is lost or doubled)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.restarts = 0
        self._worker: asyncio.subprocess.Process | None = None
        self._lock = asyncio.Lock()  # one round in the pipe at a time
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(Outcome).decode

    async def write(self, raws: Sequence[bytes], moves: Mapping[Position, PositionMove]) -> Written:
        """Raises StalePositions as `TraceIndex.write` does, Unavailable when the index failed
        or the worker died (then the next write starts another)."""
        request = Round(list(raws), [(t, q, m.old, m.new) for (t, q), m in moves.items()])
        async with self._lock:
            worker = self._worker or await self._start()
            assert worker.stdin is not None and worker.stdout is not None
            try:
                worker.stdin.write(frame(self._encode(request)))
                await worker.stdin.drain()
                size = int.from_bytes(await worker.stdout.readexactly(FRAME_HEADER_BYTES), "big")
                outcome = self._decode(await worker.stdout.readexactly(size))
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                log.error("the trace index writer process died (%r): another starts next round", exc)
                await self._discard(worker)
                self.restarts += 1
                raise Unavailable("the trace index writer process died; the round is retried") from exc
            except BaseException:  # cancelled mid-round: the pipe holds half a frame
                await self._discard(worker)
                raise
        if outcome.stale is not None:
            raise StalePositions(outcome.stale)
        if outcome.error is not None:
            raise Unavailable(f"trace index writer: {outcome.error}")
        return Written(outcome.held, outcome.rows, outcome.malformed)

    async def _start(self) -> asyncio.subprocess.Process:
        self._worker = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "mqgate.tracing.index_worker",
            self.url,
            str(os.getpid()),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=_worker_env(),
        )
        return self._worker

    async def _discard(self, worker: asyncio.subprocess.Process) -> None:
        self._worker = None
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        await _reap(worker)

    def worker_pids(self) -> list[int]:
        worker = self._worker
        return [] if worker is None or worker.returncode is not None else [worker.pid]

    async def close(self) -> None:
        """Let the worker end the round it is in and exit (its stdin closes), then reap it."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        if worker.stdin is not None:
            worker.stdin.close()
        try:
            await asyncio.wait_for(_reap(worker), STOP_WAIT_S)
        except TimeoutError:
            log.error("the trace index writer process did not stop in %.0f s: killed", STOP_WAIT_S)
            await self._discard(worker)


async def _reap(worker: asyncio.subprocess.Process) -> None:
    """Wait for the worker's exit and for its stdout's end (so the pipe is closed)."""
    if worker.stdout is not None:
        with contextlib.suppress(ConnectionError):
            while await worker.stdout.read(1 << 16):
                pass
    await worker.wait()


def _worker_env() -> dict[str, str]:
    """The worker imports mqgate from where this gateway did: an installed package is found as
    it is; a source checkout (tests, benchmarks, `PYTHONPATH=src`) goes first on its path."""
    source = Path(mqgate.__file__).resolve().parent.parent
    if source.name in ("site-packages", "dist-packages"):
        return dict(os.environ)
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": str(source) if not path else f"{source}{os.pathsep}{path}"}
