"""What a Spark task runs: one queue range read page by page into Arrow batches, and the
bounds the driver plans from. Imported only where it runs (pyarrow, HTTP, Redis).

A thread fetches and decodes the next pages while the task turns the current one into an
Arrow batch and Spark ships it, so waiting for the gateway overlaps with that work.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterator
from typing import Final, TypeVar, cast

import pyarrow as pa

from mqgate.client import Client
from mqgate.spark.arrow import Record, decode_read, decode_stored, to_batch
from mqgate.spark.offsets import Bounds, QueueRange
from mqgate.spark.options import ReadOptions

PREFETCH_PAGES: Final = 2
T = TypeVar("T")


def bounds(opts: ReadOptions) -> tuple[str, list[Bounds]]:
    """(broker, each store queue's bounds)."""
    if opts.store is not None:
        from mqgate.spark.store import StoreReader

        with StoreReader(opts.store, opts.redis_prefix, opts.broker) as reader:
            return opts.broker, reader.bounds(opts.topic)
    assert opts.gateway is not None and opts.token is not None
    with Client(opts.gateway, opts.token, consumer=opts.consumer) as gw:
        broker, queues = gw.bounds(opts.topic)
    return broker, [Bounds(b.queue, b.min, b.max) for b in queues]


def read_range(opts: ReadOptions, broker: str, r: QueueRange) -> Iterator[pa.RecordBatch]:
    """Every stored record of offsets [r.start, r.end) of one queue. A range may start below
    the queue's oldest record (retention removed it): reading then starts there."""
    pages = _store_pages(opts, r) if opts.store is not None else _gateway_pages(opts, r)
    for first, msgs in _prefetched(pages):
        yield to_batch(opts.topic, broker, r.queue, first, msgs)


def _gateway_pages(opts: ReadOptions, r: QueueRange) -> Generator[tuple[int, list[Record]], None, None]:
    assert opts.gateway is not None and opts.token is not None
    offset = r.start
    with Client(opts.gateway, opts.token, consumer=opts.consumer) as gw:
        while offset < r.end:
            first, _, msgs = decode_read(
                gw.read(opts.topic, r.queue, offset, min(opts.read_batch, r.end - offset))
            )
            del msgs[max(0, r.end - first) :]
            if not msgs:
                return
            yield first, msgs
            offset = first + len(msgs)


def _store_pages(opts: ReadOptions, r: QueueRange) -> Generator[tuple[int, list[Record]], None, None]:
    from mqgate.spark.store import StoreReader

    assert opts.store is not None
    offset = r.start
    with StoreReader(opts.store, opts.redis_prefix, opts.broker) as store:
        while offset < r.end:
            raw = store.read_raw(opts.topic, r.queue, offset, min(opts.read_batch, r.end - offset))
            first = raw[0][0] if raw else offset
            del raw[max(0, r.end - first) :]
            if not raw:
                return
            yield first, decode_stored([p for _, p in raw])
            offset = first + len(raw)


def _prefetched(pages: Generator[T, None, None]) -> Iterator[T]:
    """`pages`, produced by a thread of its own up to PREFETCH_PAGES ahead. Its errors are
    raised here; stopping early (or failing) stops the thread."""
    box: queue.Queue[tuple[str, object]] = queue.Queue(PREFETCH_PAGES)
    stop = threading.Event()

    def put(item: tuple[str, object]) -> bool:
        while not stop.is_set():
            try:
                box.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run() -> None:
        try:
            for page in pages:
                if not put(("page", page)):
                    return
            put(("end", None))
        except BaseException as exc:  # handed to the reading task, which raises it
            put(("error", exc))
        finally:
            pages.close()

    thread = threading.Thread(target=run, name="mqgate-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = box.get()
            if kind == "end":
                return
            if kind == "error":
                assert isinstance(value, BaseException)
                raise value
            yield cast(T, value)
    finally:
        stop.set()
        thread.join(5)
