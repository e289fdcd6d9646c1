"""The archive job: events older than a cut-off, as Parquet partitioned by queue and date.

The log cleans itself up: segments covered by snapshots are deleted (of the shard logs and
of the version-1 logs queues may still have). The archive keeps every queue's history anyway,
in ``--out DIR/events/queue=<queue>/date=<YYYY-MM-DD>/`` (UTC dates), with every field of
every event (:mod:`pipeline.rows`; :func:`pipeline.rows.events_from_rows` rebuilds the exact
events from it). The archive never changes the log.

Runs are incremental and idempotent: each run appends only records past the highest
sequence number the archive already holds for each queue (a failed run commits nothing, so
re-running is safe). Run it more often than the log prunes, or the pruned part is gone
before it is archived; ``archive.json`` says per queue which records each run added and
what was missing or damaged, and per shard log what it discarded or lost while read.
"""

from __future__ import annotations

import glob
import json
import logging
import os
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from actors.status import Discarded
from pipeline.frames import LoadedEvents, check_store, load_events, progress

__all__ = ["ArchiveResult", "run_archive"]

log = logging.getLogger(__name__)


# Where a record was read from, not what it says: not archived.
_LOG_COLUMNS = ("object", "epoch", "offset", "records", "lsn", "end", "queues")


@dataclass
class ArchiveResult:
    """What the archive run added."""

    path: str
    rows: int
    queues: dict[str, Any]
    logs: dict[str, Any]  # by shard log: damage and segments pruned while read


def _archived_up_to(spark: SparkSession, path: str) -> dict[str, int]:
    """The highest record of each queue already in the archive."""
    if not glob.glob(os.path.join(path, "queue=*", "date=*", "*.parquet")):
        return {}
    rows = spark.read.parquet(path).groupBy("queue").agg(F.max("seq").alias("seq")).collect()
    return {r.queue: r.seq for r in rows}


def run_archive(
    spark: SparkSession,
    url: str,
    out: str,
    *,
    before_ms: int,
    opts: dict[str, str] | None = None,
) -> ArchiveResult:
    """Archive the events of the log at ``url`` older than ``before_ms`` into ``out``.

    Raises:
        PipelineError: a wrong store or an empty log.
    """
    check_store(url, opts)
    path = os.path.join(out, "events")
    os.makedirs(out, exist_ok=True)
    with progress(spark, "archive"):
        done = _archived_up_to(spark, path)
        loaded = load_events(spark, url, opts=opts)
        try:
            marks = spark.createDataFrame(
                list(done.items()) or [("", 0)], "m_queue string, m_seq long"
            )
            new = (
                loaded.events.where(F.col("at_ms") < before_ms)
                .join(F.broadcast(marks), F.col("queue") == F.col("m_queue"), "left")
                .where(F.col("m_seq").isNull() | (F.col("seq") > F.col("m_seq")))
                .drop("m_queue", "m_seq", *_LOG_COLUMNS)
                .withColumn("date", F.date_format(F.timestamp_millis("at_ms"), "yyyy-MM-dd"))
                .persist()
            )
            added = {
                r.queue: {"rows": r["rows"], "first_seq": r.lo, "last_seq": r.hi}
                for r in new.groupBy("queue")
                .agg(F.count("*").alias("rows"), F.min("seq").alias("lo"), F.max("seq").alias("hi"))
                .collect()
            }
            rows = sum(a["rows"] for a in added.values())
            if rows:
                new.repartition("queue", "date").sortWithinPartitions("seq", "item").write.mode(
                    "append"
                ).partitionBy("queue", "date").parquet(path)
            new.unpersist()
        finally:
            loaded.raw.unpersist()
    summary = _summary(loaded, added, done)
    logs = {
        name: {"damage": _damage(cut.discarded), "pruned_while_reading": cut.pruned}
        for name, cut in loaded.logs.items()
    }
    with open(os.path.join(out, "archive.json"), "w") as f:
        doc = {"store": url, "before_ms": before_ms, "queues": summary, "logs": logs}
        json.dump(doc, f, indent=2)
    log.info("archive: %d event rows added to %s", rows, path)
    return ArchiveResult(path, rows, summary, logs)


def _damage(discarded: list[Discarded]) -> list[dict[str, Any]]:
    return [
        {"object": d.object, "offset": d.offset, "records": d.records, "reason": d.reason}
        for d in discarded
    ]


def _summary(loaded: LoadedEvents, added: dict[str, Any], done: dict[str, int]) -> dict[str, Any]:
    """Per queue: what this run added, and what reading the log found."""
    return {
        q: {
            **added.get(q, {"rows": 0}),
            "already_archived_to": done.get(q),
            "log_ends_at": loaded.last_seq.get(q),
            "damage": _damage(loaded.discarded.get(q, [])),
            "pruned_while_reading": loaded.pruned.get(q, []),
        }
        for q in sorted(set(added) | set(loaded.last_seq))
    }
