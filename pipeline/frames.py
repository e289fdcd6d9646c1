"""Loading a log into DataFrames for the jobs, with the checks a person needs first."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, DataFrameReader, SparkSession
from pyspark.sql import functions as F

from actors.errors import QueueError
from actors.status import Discarded
from pipeline.chain import SegmentMeta
from pipeline.logread import SyncStore, queue_objects, shard_logs
from pipeline.rows import SEGMENT, wal_segment_meta
from pipeline.walchain import LogCut, WalMeta, cut_logs, log_of

__all__ = [
    "LoadedEvents",
    "PipelineError",
    "check_store",
    "load_events",
    "load_timeline",
    "progress",
]

log = logging.getLogger(__name__)


class PipelineError(Exception):
    """A job cannot run: a wrong store, an empty log, bad arguments. The message says why."""


def check_store(url: str, opts: dict[str, str] | None = None) -> list[str]:
    """The queues with objects under ``queues/`` in the log at ``url`` (queues that so far
    have records only in a shard log are not among them).

    Raises:
        PipelineError: the store cannot be opened or read, or holds no log.
    """
    if "://" not in url and not os.path.isdir(url):
        raise PipelineError(
            f"no such directory: {url} (give the directory `evq serve --data` wrote)"
        )
    try:
        with SyncStore(url, opts) as store:
            names = list(queue_objects(store))
            shards = shard_logs(store)
    except QueueError as exc:
        raise PipelineError(f"cannot read the store {url}: {exc.message}") from None
    if not names and not shards:
        raise PipelineError(
            f"no event log in {url}: nothing under wal/ or queues/ "
            "(is it the directory or bucket prefix `evq serve` writes to?)"
        )
    return names


def _reader(
    spark: SparkSession, url: str, opts: dict[str, str] | None, queues: list[str] | None
) -> DataFrameReader:
    reader = spark.read.format("evq")
    for key, value in (opts or {}).items():
        reader = reader.option(key, value)
    if queues:
        reader = reader.option("queues", ",".join(queues))
    return reader


def load_timeline(
    spark: SparkSession,
    url: str,
    as_of_ms: int,
    *,
    opts: dict[str, str] | None = None,
    queues: list[str] | None = None,
) -> DataFrame:
    """The timeline view, read once and kept (jobs aggregate it several ways)."""
    df = (
        _reader(spark, url, opts, queues)
        .option("view", "timeline")
        .option("as_of_ms", str(as_of_ms))
        .load(url)
    )
    return df.persist(StorageLevel.MEMORY_AND_DISK)


@dataclass
class LoadedEvents:
    """Event rows that count (recovery's rule applied) and what was left out."""

    events: DataFrame
    raw: DataFrame  # the persisted read behind ``events``: unpersist it when done
    discarded: dict[str, list[Discarded]]  # by queue
    pruned: dict[str, list[str]]  # by queue: its version-1 segments pruned while read
    last_seq: dict[str, int | None]
    logs: dict[str, LogCut]  # by shard log (``wal/<shard>/``): all it discarded or lost


_SEGMENT_COLUMNS = [
    "queue", "object", "seq", "lsn", "epoch", "items", "records", "offset", "detail", "end",
    "queues",
]  # fmt: skip


def _segment_metas(raw: DataFrame) -> tuple[dict[str, list[SegmentMeta]], dict[str, list[WalMeta]]]:
    """What the segment rows say: version-1 segments by queue, shard-log ones by log."""
    v1: dict[str, list[SegmentMeta]] = {}
    wal: dict[str, list[WalMeta]] = {}
    for r in raw.where(F.col("type") == SEGMENT).select(*_SEGMENT_COLUMNS).collect():
        if r.lsn is not None:
            wal.setdefault(log_of(r.object), []).append(wal_segment_meta(r.asDict()))
        else:
            meta = SegmentMeta(r.object, r.seq, r.epoch, r["items"], r.records, r.offset, r.detail)
            v1.setdefault(r.queue, []).append(meta)
    return v1, wal


def load_events(
    spark: SparkSession,
    url: str,
    *,
    opts: dict[str, str] | None = None,
    queues: list[str] | None = None,
    bodies: bool = True,
) -> LoadedEvents:
    """The events view, cut where recovery would stop reading each queue's history."""
    raw = _reader(spark, url, opts, queues).option("bodies", str(bodies).lower()).load(url)
    raw = raw.persist(StorageLevel.MEMORY_AND_DISK)
    cuts, logs = cut_logs(*_segment_metas(raw))
    kept = [(q, obj, lo, hi) for q, c in cuts.items() for obj, lo, hi in c.kept]
    ranges = spark.createDataFrame(
        kept or [("", "", 0, -1)], "k_queue string, k_object string, lo long, hi long"
    )
    events = (
        raw.where(F.col("type") != SEGMENT)
        .join(
            F.broadcast(ranges),
            (F.col("queue") == F.col("k_queue"))
            & (F.col("object") == F.col("k_object"))
            & F.col("seq").between(F.col("lo"), F.col("hi")),
        )
        .drop("k_queue", "k_object", "lo", "hi")
    )
    return LoadedEvents(
        events,
        raw,
        {q: c.discarded for q, c in cuts.items() if c.discarded},
        {q: c.pruned for q, c in cuts.items() if c.pruned},
        {q: c.last_seq for q, c in cuts.items()},
        logs,
    )


_GROUPS = itertools.count(1)


@contextmanager
def progress(spark: SparkSession, job: str, every_s: float = 2.0) -> Iterator[None]:
    """Log how many partitions of each stage of the job are done, as they complete.

    The job's Spark jobs run under their own job group, so the last report also covers stages
    that started and finished between two looks (a small log is done in well under `every_s`).
    """
    sc = spark.sparkContext
    tracker = sc.statusTracker()
    group = f"evq-{job}-{os.getpid()}-{next(_GROUPS)}"
    stop = threading.Event()
    seen: dict[int, tuple[int, int]] = {}

    def watch() -> None:
        while not stop.wait(every_s):
            _report(tracker, job, group, seen)

    sc.setJobGroup(group, f"evq pipeline {job}")
    thread = threading.Thread(target=watch, name=f"evq-{job}-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        # None removes the property (the JVM takes null); the stub allows only a str
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        _report(tracker, job, group, seen)


def _report(tracker: Any, job: str, group: str, seen: dict[int, tuple[int, int]]) -> None:
    """Log stages whose count of finished partitions changed since the last look."""
    active = set(tracker.getActiveStageIds())
    ours: set[int] = set()
    for job_id in tracker.getJobIdsForGroup(group):
        info = tracker.getJobInfo(job_id)
        if info is not None:
            ours.update(info.stageIds)
    for stage_id in sorted(ours | {s for s, (d, n) in seen.items() if d < n}):
        info = tracker.getStageInfo(stage_id)
        if info is None:
            continue
        done = (info.numCompletedTasks, info.numTasks)
        if stage_id not in active and done[0] < done[1]:
            done = (done[1], done[1])  # finished since (skipped tasks count as done)
        if seen.get(stage_id) != done:
            seen[stage_id] = done
            log.info("%s: stage %d: %d/%d partitions done", job, stage_id, *done)
