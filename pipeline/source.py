"""The ``evq`` PySpark data source: a queue log as a DataFrame.

    from pipeline.source import register
    register(spark)
    events = spark.read.format("evq").load("/var/lib/evq")            # or s3://bucket/prefix
    timeline = spark.read.format("evq").option("view", "timeline").load(url)

Views (option ``view``):

- ``events`` (default): one row per message per logged event (:mod:`pipeline.rows`), plus one
  ``segment`` row per segment object. Partitions are runs of consecutive segments of one
  queue (``segments_per_partition``, default: enough runs for ~4 per core), read in
  parallel. Rows are every valid record of every segment; records that recovery would
  discard after a damaged or missing one are cut by :func:`pipeline.frames.load_events`.
- ``timeline``: one partition per queue, folded in order by the engine
  (:mod:`pipeline.timeline`): derived transitions (lease expiry, retention, dead letters),
  per-minute depth samples, snapshot checks, damage and final stats. ``as_of_ms`` (default:
  now on the driver) is the time the fold runs to.

Other options: ``queues`` (comma-separated names: read only these), ``bodies`` (``false``
leaves message bodies out of ``events``), and for S3 ``endpoint``, ``region``,
``access_key_id``, ``secret_access_key`` (otherwise the usual AWS environment variables).
Option names arrive lower-cased.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from actors.clock import SystemClock
from pipeline.logread import (
    BATCH_ROWS,
    SyncStore,
    fold_queue,
    queue_names,
    read_segment,
    segment_keys,
)
from pipeline.rows import EVENTS_SCHEMA, EventRows, event_rows, segment_row
from pipeline.timeline import TIMELINE_SCHEMA

__all__ = ["STORE_OPTIONS", "EvqDataSource", "register", "store_options"]

log = logging.getLogger(__name__)

STORE_OPTIONS = ("endpoint", "region", "access_key_id", "secret_access_key")
VIEWS = {"events": EVENTS_SCHEMA, "timeline": TIMELINE_SCHEMA}
TARGET_PARTITIONS = 8  # runs of segments per read when not told otherwise


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("evq")`` available in this session."""
    spark.dataSource.register(EvqDataSource)


def store_options(options: Any) -> dict[str, str]:
    """The options meant for the object store (S3 endpoint and credentials)."""
    return {k: options[k] for k in STORE_OPTIONS if options.get(k)}


class _Run(InputPartition):  # type: ignore[misc]
    """Consecutive segments of one queue (events view) or a whole queue (timeline)."""

    def __init__(self, queue: str, segments: list[str]) -> None:
        super().__init__((queue, len(segments)))
        self.queue = queue
        self.segments = segments


class EvqDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("evq")``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return "evq"

    def _view(self) -> str:
        view = self.options.get("view", "events")
        if view not in VIEWS:
            raise ValueError(f"evq: unknown view {view!r}: use one of {', '.join(VIEWS)}")
        return str(view)

    def schema(self) -> StructType:
        """The view's row type."""
        return from_arrow_schema(VIEWS[self._view()])

    def reader(self, schema: StructType) -> DataSourceReader:
        """A reader for the view (planned on the driver)."""
        url = self.options.get("path")
        if not url:
            raise ValueError("evq: give the store: spark.read.format('evq').load(URL or DIR)")
        view = self._view()
        wanted = self.options.get("queues")
        queues = {q.strip() for q in wanted.split(",") if q.strip()} if wanted else None
        opts = store_options(self.options)
        if view == "timeline":
            as_of = self.options.get("as_of_ms")
            as_of_ms = int(as_of) if as_of else SystemClock().now_ms()
            return _TimelineReader(url, opts, queues, as_of_ms)
        per = self.options.get("segments_per_partition")
        bodies = str(self.options.get("bodies", "true")).lower() != "false"
        return _EventsReader(url, opts, queues, int(per) if per else None, bodies)


class _Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, url: str, opts: dict[str, str], queues: set[str] | None) -> None:
        self.url = url
        self.opts = opts
        self.queues = queues

    def _queues(self, store: SyncStore) -> list[str]:
        names = queue_names(store)
        return [q for q in names if self.queues is None or q in self.queues]


class _EventsReader(_Reader):
    def __init__(
        self,
        url: str,
        opts: dict[str, str],
        queues: set[str] | None,
        per_partition: int | None,
        bodies: bool,
    ) -> None:
        super().__init__(url, opts, queues)
        self.per_partition = per_partition
        self.bodies = bodies

    def partitions(self) -> Sequence[InputPartition]:
        """Runs of consecutive segments, listed now: later segments are not part of it."""
        with SyncStore(self.url, self.opts) as store:
            listed = [(q, [k for _, k in segment_keys(store, q)]) for q in self._queues(store)]
        total = sum(len(segs) for _, segs in listed)
        per = self.per_partition or max(1, math.ceil(total / TARGET_PARTITIONS))
        runs = [
            _Run(queue, segs[i : i + per])
            for queue, segs in listed
            for i in range(0, len(segs), per)
        ]
        log.info("evq: %d segments of %d queues in %d partitions", total, len(listed), len(runs))
        return runs or [_Run("", [])]

    def read(self, partition: _Run) -> Iterator[pa.RecordBatch]:
        """Decode the run's segments with the log's codec."""
        if not partition.segments:
            return
        out = EventRows(bodies=self.bodies)
        with SyncStore(self.url, self.opts) as store:
            for key in partition.segments:
                meta, read = read_segment(store, key)
                segment_row(
                    out,
                    partition.queue,
                    key,
                    meta.first_seq,
                    epoch=meta.epoch,
                    announced=meta.announced,
                    valid=meta.valid,
                    offset=meta.offset,
                    reason=meta.reason,
                )
                if read is not None:
                    event_rows(out, partition.queue, key, read)
                if out.rows >= BATCH_ROWS:
                    yield out.batch()
        if out.rows:
            yield out.batch()


class _TimelineReader(_Reader):
    def __init__(
        self, url: str, opts: dict[str, str], queues: set[str] | None, as_of_ms: int
    ) -> None:
        super().__init__(url, opts, queues)
        self.as_of_ms = as_of_ms

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per queue."""
        with SyncStore(self.url, self.opts) as store:
            names = self._queues(store)
        return [_Run(q, []) for q in names] or [_Run("", [])]

    def read(self, partition: _Run) -> Iterator[pa.RecordBatch]:
        """Fold the queue through the engine."""
        if not partition.queue:
            return
        with SyncStore(self.url, self.opts) as store:
            yield from fold_queue(store, partition.queue, self.as_of_ms)
