"""The ``evq`` PySpark data source: the event log as a DataFrame.

    from pipeline.source import register
    register(spark)
    events = spark.read.format("evq").load("/var/lib/evq")            # or s3://bucket/prefix
    timeline = spark.read.format("evq").option("view", "timeline").load(url)

The log (FORMAT.md): one shard log per shard (``wal/<shard>/``), shared by the shard's
queues, and per queue its snapshots and, from format version 1, possibly segments of its own
(``queues/<queue>/log/``) that come before its records in the shard log.

Views (option ``view``):

- ``events`` (default): one row per message per logged event (:mod:`pipeline.rows`), plus one
  ``segment`` row per segment object. Partitions are runs of consecutive segments of one
  shard log (rows carry each record's queue) and runs of consecutive version-1 segments of
  one queue (``segments_per_partition``, default: enough runs for ~8 partitions), read in
  parallel. Rows are every valid record of every segment; records that recovery would
  discard after a damaged or missing one are cut by :func:`pipeline.frames.load_events`.
- ``timeline``: one partition per shard log, folding every queue of the log in one pass, in
  each queue's order (:mod:`pipeline.shardfold`), through the engine (:mod:`pipeline.timeline`):
  derived transitions (lease expiry, retention, dead letters), per-minute depth samples,
  snapshot checks, damage and final stats. ``as_of_ms`` (default: now on the driver) is the
  time the fold runs to. Queues that no shard log holds are adopted by one partition each;
  without shard logs (a version-1 store), each queue is a partition.

Other options: ``queues`` (comma-separated names: read only these), ``bodies`` (``false``
leaves message bodies out of ``events``), and for S3 ``endpoint``, ``region``,
``access_key_id``, ``secret_access_key`` (otherwise the usual AWS environment variables).
Option names arrive lower-cased.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any, cast

import msgspec
import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from actors.clock import SystemClock
from actors.log.shard_recovery import placement
from pipeline.logread import (
    BATCH_ROWS,
    SyncStore,
    queue_objects,
    read_segment,
    read_wal_segment,
    shard_logs,
    wal_segments,
)
from pipeline.rows import EVENTS_SCHEMA, EventRows, event_rows, segment_row, wal_segment_row
from pipeline.shardfold import fold_log, fold_queue
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


class _Run(InputPartition):
    """Consecutive segments of one log (events view: ``segments`` are ``(key, the next
    listed segment's first LSN)``), or a whole shard log or queue (timeline view)."""

    def __init__(
        self,
        *,
        shard: int | None = None,
        queue: str | None = None,
        segments: list[tuple[str, int | None]] | None = None,
        adopted: list[str] | None = None,
    ) -> None:
        super().__init__((shard, queue, len(segments or [])))
        self.shard = shard
        self.queue = queue
        self.segments = segments or []
        self.adopted = adopted or []


class EvqDataSource(DataSource):
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


class _Reader(DataSourceReader):
    def __init__(self, url: str, opts: dict[str, str], queues: set[str] | None) -> None:
        self.url = url
        self.opts = opts
        self.queues = queues

    def _wanted(self, queue: str) -> bool:
        return self.queues is None or queue in self.queues


def _with_next(listed: list[tuple[int, str]]) -> list[tuple[str, int | None]]:
    """Each segment with the first LSN of the one listed after it (where its blocks end)."""
    nexts = [first for first, _ in listed[1:]] + [None]
    return [(key, following) for (_, key), following in zip(listed, nexts, strict=True)]


def _chunks(segments: list[tuple[str, int | None]], per: int) -> list[list[tuple[str, int | None]]]:
    return [segments[i : i + per] for i in range(0, len(segments), per)]


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
            logs = {shard: wal_segments(store, shard) for shard in shard_logs(store)}
            objects = queue_objects(store)
        wal = {shard: _with_next(listed) for shard, listed in logs.items()}
        v1: dict[str, list[tuple[str, int | None]]] = {
            q: [(key, None) for _, key in o.segments]
            for q, o in objects.items()
            if o.segments and self._wanted(q)
        }
        total = sum(map(len, wal.values())) + sum(map(len, v1.values()))
        per = self.per_partition or max(1, math.ceil(total / TARGET_PARTITIONS))
        runs = [
            _Run(shard=s, segments=run) for s, segs in wal.items() for run in _chunks(segs, per)
        ]
        runs += [
            _Run(queue=q, segments=run) for q, segs in v1.items() for run in _chunks(segs, per)
        ]
        log.info(
            "evq: %d segments of %d logs in %d partitions", total, len(wal) + len(v1), len(runs)
        )
        return runs or [_Run()]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Decode the run's segments with the log's codecs."""
        run = cast("_Run", partition)  # Spark hands back one of partitions()'s
        if not run.segments:
            return
        out = EventRows(bodies=self.bodies)
        with SyncStore(self.url, self.opts) as store:
            if run.shard is not None:
                steps = self._read_wal(store, run.shard, run.segments, out)
            else:
                assert run.queue is not None
                steps = self._read_v1(store, run.queue, run.segments, out)
            for _ in steps:
                if out.rows >= BATCH_ROWS:
                    yield out.batch()
        if out.rows:
            yield out.batch()

    def _read_wal(
        self, store: SyncStore, shard: int, segments: list[tuple[str, int | None]], out: EventRows
    ) -> Iterator[None]:
        for key, following in segments:
            segment = read_wal_segment(store, shard, key, following)
            for block, groups in segment.blocks():
                for queue, first, lsn, events in groups:
                    if self._wanted(queue):
                        event_rows(out, queue, key, block.epoch, first, events, first_lsn=lsn)
                yield
            meta = segment.meta
            if self.queues is not None:
                mine = {q: runs for q, runs in meta.queues.items() if q in self.queues}
                meta = msgspec.structs.replace(meta, queues=mine)
            wal_segment_row(out, meta)

    def _read_v1(
        self, store: SyncStore, queue: str, segments: list[tuple[str, int | None]], out: EventRows
    ) -> Iterator[None]:
        for key, _ in segments:
            meta, read = read_segment(store, key)
            segment_row(
                out,
                queue,
                key,
                meta.first_seq,
                epoch=meta.epoch,
                announced=meta.announced,
                valid=meta.valid,
                offset=meta.offset,
                reason=meta.reason,
            )
            if read is not None:
                header = read.header
                event_rows(out, queue, key, header.epoch, header.first_seq, read.events)
            yield


class _TimelineReader(_Reader):
    def __init__(
        self, url: str, opts: dict[str, str], queues: set[str] | None, as_of_ms: int
    ) -> None:
        super().__init__(url, opts, queues)
        self.as_of_ms = as_of_ms

    def partitions(self) -> Sequence[InputPartition]:
        """One partition per shard log; each queue found under ``queues/`` is adopted by
        one of them (the one the server places it on when every shard has a log; it folds
        the queue from its own objects if its log does not hold it). Without shard logs,
        one partition per queue."""
        with SyncStore(self.url, self.opts) as store:
            shards = shard_logs(store)
            names = [q for q in queue_objects(store) if self._wanted(q)]
        if not shards:
            return [_Run(queue=q) for q in names] or [_Run()]
        adopted: dict[int, list[str]] = {shard: [] for shard in shards}
        for queue in names:
            adopted[shards[placement(queue, len(shards))]].append(queue)
        return [_Run(shard=shard, adopted=adopted[shard]) for shard in shards]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Fold the shard log's queues (or the queue) through the engine."""
        run = cast("_Run", partition)  # Spark hands back one of partitions()'s
        with SyncStore(self.url, self.opts) as store:
            if run.shard is not None:
                yield from fold_log(
                    store,
                    run.shard,
                    self.as_of_ms,
                    adopted=run.adopted,
                    wanted=self.queues,
                )
            elif run.queue is not None:
                yield from fold_queue(store, run.queue, self.as_of_ms)
