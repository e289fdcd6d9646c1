"""The stats job: per queue and minute, what happened and how deep the queue was.

Output in ``--out DIR``:

- ``stats.parquet/``: one row per queue and minute with activity (:data:`COLUMNS`);
- ``queues.json``: per queue, the engine's own stats at the end (what ``evq stats`` would
  have said at that time), its settings, and what the reader discarded (damage to a shard
  log that names no queue: under the log's name, ``wal/<shard>/``);
- ``report.html``: plots of the above in one file (:mod:`pipeline.report`).

Minutes without any activity have no row: nothing changed in them, except that the oldest
ready message got older.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from pipeline.frames import check_store, load_timeline, progress
from pipeline.timeline import MINUTE_MS
from pipeline.walchain import log_of

__all__ = ["COLUMNS", "StatsResult", "run_stats", "stats_frame"]

log = logging.getLogger(__name__)

COLUMNS = [
    "queue",
    "minute",  # start of the minute (UTC timestamp)
    "enqueued",
    "taken",
    "acked",
    "released",
    "dead_lettered",
    "lease_expired",
    "expired",  # removed by retention
    "purged",
    "deleted",
    "ready",  # depth by state at the end of the minute
    "delayed",
    "reserved",
    "dead_pending",  # dead letters not yet handed to the dead-letter queue
    "oldest_ready_age_ms",
    "received_1",  # takes by receive count: first delivery, second, 3-5, 6 and more
    "received_2",
    "received_3_5",
    "received_6_plus",
    "max_receive_count",
    "wait_p50_ms",  # put → first take, for messages first taken in this minute
    "wait_p95_ms",
    "wait_p99_ms",
    "ack_p50_ms",  # put → ack, for messages acked in this minute
    "ack_p95_ms",
    "ack_p99_ms",
]

_COUNTED = {
    "enqueued": "put",
    "taken": "taken",
    "acked": "acked",
    "released": "released",
    "dead_lettered": "dead_lettered",
    "lease_expired": "lease_expired",
    "expired": "retention_expired",
    "purged": "purged",
    "deleted": "deleted",
}
_PERCENTILES = [0.5, 0.95, 0.99]


@dataclass
class StatsResult:
    """What the stats job wrote and found."""

    out: str
    rows: int
    queues: dict[str, Any]  # per queue: final stats, settings, damage

    @property
    def damaged(self) -> bool:
        """Whether any queue's log had damage."""
        return any(q["damage"] for q in self.queues.values())


def _count(kind: str, extra: Column | None = None) -> Column:
    cond = F.col("type") == kind
    if extra is not None:
        cond = cond & extra
    return F.sum(F.when(cond, 1).otherwise(0))


def _taken_with(lo: int, hi: int | None = None) -> Column:
    rc = F.col("receive_count")
    return _count("taken", (rc >= lo) if hi is None else rc.between(lo, hi))


def stats_frame(timeline: DataFrame) -> DataFrame:
    """The per-queue, per-minute stats of a timeline DataFrame (one row per active minute)."""
    minute_ms = F.floor(F.col("at_ms") / MINUTE_MS) * MINUTE_MS
    tl = timeline.withColumn("minute_ms", minute_ms)
    first_take = (F.col("type") == "taken") & (F.col("at_ms") == F.col("first_taken_ms"))
    in_queue = F.col("at_ms") - F.col("enqueued_at_ms")
    wait = F.percentile(F.when(first_take, in_queue), _PERCENTILES)
    ack = F.percentile(F.when(F.col("type") == "acked", in_queue), _PERCENTILES)
    counts = (
        tl.where(F.col("type").isin(*_COUNTED.values()))
        .groupBy("queue", "minute_ms")
        .agg(
            *[_count(kind).alias(name) for name, kind in _COUNTED.items()],
            _taken_with(1, 1).alias("received_1"),
            _taken_with(2, 2).alias("received_2"),
            _taken_with(3, 5).alias("received_3_5"),
            _taken_with(6).alias("received_6_plus"),
            F.max(F.when(F.col("type") == "taken", F.col("receive_count"))).alias(
                "max_receive_count"
            ),
            wait.alias("wait"),
            ack.alias("ack"),
        )
    )
    depth = ["ready", "delayed", "reserved", "dead_pending", "oldest_ready_age_ms"]
    samples = tl.where(F.col("type") == "sample").select("queue", "minute_ms", *depth)
    joined = counts.join(samples, ["queue", "minute_ms"], "full_outer")
    cols: list[Column] = [
        F.col("queue"),
        F.timestamp_millis(F.col("minute_ms")).alias("minute"),
    ]
    for name in _COUNTED:
        cols.append(F.coalesce(F.col(name), F.lit(0)).cast("long").alias(name))
    cols += [F.col(name).cast("long").alias(name) for name in depth]
    for name in ("received_1", "received_2", "received_3_5", "received_6_plus"):
        cols.append(F.coalesce(F.col(name), F.lit(0)).cast("long").alias(name))
    cols.append(F.col("max_receive_count").cast("int").alias("max_receive_count"))
    for array, prefix in (("wait", "wait"), ("ack", "ack")):
        for i, p in enumerate(("p50", "p95", "p99")):
            cols.append(F.col(array)[i].cast("double").alias(f"{prefix}_{p}_ms"))
    return joined.select(*cols).orderBy("queue", "minute")


def _queue_summaries(timeline: DataFrame) -> dict[str, Any]:
    """Per queue: the final stats and settings, and the damage the reader reported."""
    queues: dict[str, Any] = {}
    kinds = ("final", "damage", "orphan", "vanished", "appeared", "counters", "pruned")
    rows = timeline.where(F.col("type").isin(*kinds)).select(
        "queue", "type", "detail", "object", "offset", "records", "at_ms"
    )
    for r in rows.collect():
        # A shard log's damage that names no queue is listed under the log's name.
        name = r.queue if r.queue is not None else log_of(r.object)
        entry = queues.setdefault(
            name, {"stats": None, "settings": None, "damage": [], "exceptions": 0}
        )
        if r.type == "final":
            final = json.loads(r.detail)
            entry["settings"] = final.pop("settings", None)
            entry["stats"] = final
        elif r.type == "damage":
            entry["damage"].append(
                {"object": r.object, "offset": r.offset, "records": r.records, "reason": r.detail}
            )
        elif r.type != "pruned":
            entry["exceptions"] += 1
    return queues


def run_stats(
    spark: SparkSession,
    url: str,
    out: str,
    *,
    as_of_ms: int,
    opts: dict[str, str] | None = None,
    queues: list[str] | None = None,
    report: bool = True,
) -> StatsResult:
    """Compute the stats of the log at ``url`` into ``out``.

    Raises:
        PipelineError: a wrong store or an empty log.
    """
    check_store(url, opts)
    os.makedirs(out, exist_ok=True)
    with progress(spark, "stats"):
        timeline = load_timeline(spark, url, as_of_ms, opts=opts, queues=queues)
        try:
            frame = stats_frame(timeline)
            path = os.path.join(out, "stats.parquet")
            frame.write.mode("overwrite").parquet(path)
            summaries = _queue_summaries(timeline)
        finally:
            timeline.unpersist()
        table = spark.read.parquet(path).orderBy("queue", "minute").toPandas()
    with open(os.path.join(out, "queues.json"), "w") as f:
        json.dump(summaries, f, indent=2, sort_keys=True)
    if report:
        from pipeline.report import write_report

        write_report(os.path.join(out, "report.html"), table, summaries, url=url, as_of_ms=as_of_ms)
    log.info("stats: %d rows for %d queues in %s", len(table), len(summaries), out)
    return StatsResult(out, len(table), summaries)
