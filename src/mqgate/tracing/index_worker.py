"""The trace index writer process (tracing/index_writer.py's worker):

    python -m mqgate.tracing.index_worker <index url> <gateway pid>

reads framed rounds (`Round`, msgpack) on stdin, decodes and writes each in one transaction, and
answers each with a framed `Outcome` on stdout. It exits when stdin closes (the gateway stopped
or went), and at once when the gateway is killed.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import BinaryIO

import msgspec

from mqgate.tracing.index import PositionMove, StalePositions, TraceIndex
from mqgate.tracing.index_writer import FRAME_HEADER_BYTES, Outcome, Round, decode_and_write, frame

log = logging.getLogger("mqgate.tracing.index_worker")


def serve(index: TraceIndex, rounds: BinaryIO, answers: BinaryIO) -> None:
    decode = msgspec.msgpack.Decoder(Round).decode
    encode = msgspec.msgpack.Encoder().encode
    while True:
        head = rounds.read(FRAME_HEADER_BYTES)
        if len(head) < FRAME_HEADER_BYTES:
            return  # the gateway closed the pipe: it stopped or went
        size = int.from_bytes(head, "big")
        payload = rounds.read(size)
        if len(payload) < size:
            return  # the gateway went mid-round: the round is redone from the index's positions
        request = decode(payload)
        moves = {(t, q): PositionMove(old, new) for t, q, old, new in request.moves}
        try:
            written = decode_and_write(index, request.raws, moves)
            outcome = Outcome(written.held, written.rows, written.malformed)
        except StalePositions as exc:
            outcome = Outcome(stale=str(exc))
        except Exception as exc:  # the gateway counts it, logs it and retries the round
            outcome = Outcome(error=repr(exc))
        answers.write(frame(encode(outcome)))
        answers.flush()


def _die_with_parent(parent: int) -> None:
    """A gateway killed -9 takes its worker along (Linux: the parent-death signal; a parent
    that died while this process was starting is seen by its pid no longer being ours)."""
    try:
        import ctypes
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the worker ends when its stdin closes
        pass
    if os.getppid() != parent:
        sys.exit(0)


def main(argv: list[str]) -> None:
    url, parent = argv
    _die_with_parent(int(parent))
    # Answers go on a copy of stdout; fd 1 then points at stderr, so that nothing printed by
    # a library can corrupt the frames.
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    index = TraceIndex(url)
    try:
        serve(index, sys.stdin.buffer, answers)
    finally:
        index.dispose()


if __name__ == "__main__":
    main(sys.argv[1:])
