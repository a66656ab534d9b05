"""The `mqgate` data source: batch and streaming reads of a topic by exact per-queue offsets.

The driver plans one input partition per store queue range; each Spark task reads its range
directly (gateway /mq/read pages, or the Redis store's streams) and yields Arrow batches
(mqgate.spark.reading, imported only there: Spark starts fresh Python processes to plan
each query, so this module stays light).
Offsets are the source's own (Spark checkpoints them); reading takes no lock and commits
nothing. Progress for a consumer group is committed by the sink (mqgate.spark.sink), since
a stream reader's commit() runs one batch late and its stop() may never run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from mqgate.spark import offsets as off
from mqgate.spark.options import ReadOptions, read_options
from mqgate.spark.schema import SCHEMA


@dataclass
class QueuePartition(InputPartition):
    """Offsets [start, end) of one store queue; `broker` fills the broker column."""

    queue: int
    start: int
    end: int
    broker: str


def _bounds(opts: ReadOptions) -> tuple[str, list[off.Bounds]]:
    from mqgate.spark.reading import bounds

    return bounds(opts)


def _plan(opts: ReadOptions, broker: str, start: off.Offsets, end: off.Offsets) -> list[InputPartition]:
    return [QueuePartition(r.queue, r.start, r.end, broker) for r in off.ranges(start, end)]


def _read(opts: ReadOptions, partition: InputPartition) -> Iterator[Any]:
    if not isinstance(partition, QueuePartition):
        return iter(())  # Spark's stand-in partition when there is nothing to read
    from mqgate.spark.reading import read_range

    p = partition
    return read_range(opts, p.broker, off.QueueRange(p.queue, p.start, p.end))


class MqgateBatchReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        broker, bounds = _bounds(opts)
        start = off.resolve(opts.starting, bounds, "startingOffsets", missing=off.EARLIEST)
        assert opts.ending is not None
        end = off.resolve(opts.ending, bounds, "endingOffsets", missing=off.LATEST)
        off.check_ordered(start, end, "endingOffsets")
        return _plan(opts, broker, start, end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)


class MqgateStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of at most `maxMessagesPerTrigger` messages (shared among the queues
    in proportion to their backlog); with Trigger.AvailableNow, everything stored when the
    query started, in as many such batches as that takes."""

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self._broker: str | None = None
        self._target: off.Offsets | None = None  # Trigger.AvailableNow: stop here
        self._latest: off.Offsets | None = None

    def _look(self) -> list[off.Bounds]:
        self._broker, bounds = _bounds(self.opts)
        self._latest = {b.queue: b.max for b in bounds}
        return bounds

    def initialOffset(self) -> dict[str, int]:
        bounds = self._look()
        return off.to_json(off.resolve(self.opts.starting, bounds, "startingOffsets", missing=off.EARLIEST))

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {b.queue: b.max for b in self._look()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        bounds = self._look()
        n = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return off.to_json(off.advance(off.from_json(start), bounds, n, self._target))

    def reportLatestOffset(self) -> dict[str, int] | None:
        return None if self._latest is None else off.to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if self._broker is None:  # a restarted query replays a batch before looking
            self._look()
        assert self._broker is not None
        return _plan(self.opts, self._broker, off.from_json(start), off.from_json(end))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: progress is committed by the sink, once per batch."""


class MqgateDataSource(DataSource):
    """Format "mqgate". Options: see mqgate.spark.options."""

    @classmethod
    def name(cls) -> str:
        return "mqgate"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return MqgateBatchReader(read_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return MqgateStreamReader(read_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from mqgate.spark.sink import MqgateBatchWriter

        return MqgateBatchWriter(self.options, schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from mqgate.spark.sink import MqgateStreamWriter

        return MqgateStreamWriter(self.options, schema)
