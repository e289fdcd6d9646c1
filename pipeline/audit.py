"""The audit job: every message the log accepted is accounted for, or listed.

Message by message (a message is ``(queue, arrival number)``, and which life of the queue it
came in when a queue was deleted and created again; client ids may be reused), the history
folded by the engine (:mod:`pipeline.timeline`) must end in one fate:

- ``acked``, ``deleted``, ``purged``, ``expired`` (retention), ``dropped`` (its queue was
  deleted), ``dead_lettered`` — and a dead letter of a queue with a dead-letter queue must
  arrive there (a put in that queue whose idempotency key is ``dlq:<queue>:<arrival>``, as
  the server routes them) or still wait for it;
- or be ``present`` at the end.

Everything else is an exception: a message with no fate (``lost``), a snapshot that lacks
a message the history has (``vanished``) or has one it does not (``appeared``), snapshot
counters that differ, an event naming a message that is not there (``orphan``), a routed
dead letter that never reached its dead-letter queue (``dead_letter_lost``). Also listed:
messages delivered more than ``max_deliveries`` times, and cascades that lost or duplicated
a message. A cascade step is recognised by idempotency keys ``<source queue>:<message id>``
(as ``examples/cascade.py`` moves messages) or ``<source queue>:<message id>:<n>`` (output
``n`` of a handler, ``evq.handlers.plan.cascade_key``): each message acked in a source
queue must have been put into a next queue (``cascade_lost``), each output exactly once
(``cascade_duplicated``), and each moved message must come from a message the source had
(``cascade_unknown_source``).

Records discarded as damage are listed too (``damage``): recovery dropped them as well.
Output: ``audit.json`` in ``--out DIR`` (counts, fates, exceptions, up to ``limit`` each).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from functools import reduce
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline.frames import check_store, load_timeline, progress

__all__ = ["AuditResult", "run_audit"]

log = logging.getLogger(__name__)

_ORIGINS = ("put", "baseline", "joined")
_FATES = [  # in order of precedence: the first that applies is the message's fate
    ("acked", "acked"),
    ("deleted", "deleted"),
    ("purged", "purged"),
    ("retention_expired", "expired"),
    ("dead_lettered", "dead_lettered"),
    ("dropped", "dropped"),  # its queue was deleted
    ("present", "present"),
    ("left", "unverifiable"),  # gone while records were pruned under the reader
]
_SNAPSHOT_KINDS = ("vanished", "appeared", "counters", "orphan", "damage")


@dataclass
class AuditResult:
    """What the audit found."""

    out: str
    messages: int
    fates: dict[str, int]
    exceptions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # exceptions by kind, all of them

    @property
    def clean(self) -> bool:
        """No exception of any kind."""
        return not any(self.counts.values())


def _has(kind: str) -> Column:
    return F.max(F.when(F.col("type") == kind, 1).otherwise(0)) == 1


def _per_message(timeline: DataFrame) -> DataFrame:
    """One row per message: where it came from, its fate, its deliveries, its key."""
    msgs = timeline.where(F.col("arrival").isNotNull() & F.col("message_id").isNotNull())
    msgs = msgs.where(~F.col("type").isin("orphan", "vanished", "appeared"))
    fate: Column = F.lit(None)
    for kind, name in reversed(_FATES):
        fate = F.when(F.col(f"has_{kind}"), F.lit(name)).otherwise(fate)
    grouped = msgs.groupBy("queue", "incarnation", "arrival").agg(
        F.first("message_id").alias("message_id"),
        F.max(F.when(F.col("type").isin(*_ORIGINS), 1).otherwise(0)).alias("known"),
        *[_has(kind).alias(f"has_{kind}") for kind, _ in _FATES],
        _has("dead_letter_routed").alias("routed"),
        F.max("receive_count").alias("deliveries"),
        F.max(F.when(F.col("type") == "put", F.col("idempotency_key"))).alias("key"),
        F.max(F.when(F.col("type") == "put", F.col("seq"))).alias("put_seq"),
    )
    return grouped.withColumn("fate", fate)


_EXCEPTION_COLUMNS = ["kind", "queue", "message_id", "arrival", "seq", "object", "detail"]


def _exceptions(kind: str, df: DataFrame, **cols: Column | str | None) -> DataFrame:
    """``df`` as exception rows of ``kind`` (columns given by name or expression)."""
    picked = []
    for name in _EXCEPTION_COLUMNS[1:]:
        value = cols.get(name, name if name in df.columns else None)
        col = F.lit(None) if value is None else (F.col(value) if isinstance(value, str) else value)
        picked.append(col.cast("long" if name in ("arrival", "seq") else "string").alias(name))
    return df.select(F.lit(kind).alias("kind"), *picked)


def _collect(
    found: DataFrame, limit: int
) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
    """Counts by kind, and the first ``limit`` rows of each kind (two Spark jobs)."""
    counts = {r.kind: r["count"] for r in found.groupBy("kind").count().collect()}
    order = Window.partitionBy("kind").orderBy("queue", "seq", "arrival", "message_id")
    first = found.withColumn("n", F.row_number().over(order)).where(F.col("n") <= limit)
    listed: dict[str, list[dict[str, Any]]] = {}
    for r in first.drop("n").collect():
        row = r.asDict()
        listed.setdefault(row.pop("kind"), []).append(row)
    for rows in listed.values():
        rows.sort(key=lambda x: (x["queue"] or "", x["seq"] or 0, x["arrival"] or 0))
    return counts, listed


def _settings(timeline: DataFrame) -> tuple[list[str], dict[str, str]]:
    """The queues of the history, and queue → its dead-letter queue, from the settings at
    the end of the history."""
    names, dlqs = [], {}
    for r in timeline.where(F.col("type") == "final").select("queue", "detail").collect():
        names.append(r.queue)
        settings = json.loads(r.detail).get("settings") or {}
        if settings.get("dead_letter_queue"):
            dlqs[r.queue] = settings["dead_letter_queue"]
    return sorted(names), dlqs


def _dead_letters_lost(spark: SparkSession, per: DataFrame, dlqs: dict[str, str]) -> DataFrame:
    """Routed dead letters of queues with a dead-letter queue that never arrived there."""
    if not dlqs:
        return per.limit(0).withColumn("dlq", F.lit(None).cast("string"))
    targets = spark.createDataFrame(list(dlqs.items()), "queue string, dlq string")
    routed = per.where(F.col("routed")).join(targets, "queue")
    expected = routed.withColumn(
        "dlq_key", F.concat(F.lit("dlq:"), F.col("queue"), F.lit(":"), F.col("arrival"))
    )
    arrived = per.where(F.col("key").startswith("dlq:")).select(
        F.col("queue").alias("dlq"), F.col("key").alias("dlq_key")
    )
    return expected.join(arrived, ["dlq", "dlq_key"], "left_anti")


def _cascades(per: DataFrame, queues: list[str]) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Lost, duplicated and unknown-source moves of cascades (see the module docstring).

    A key ``<queue>:<rest>`` names source message ``<rest>``; or, when ``rest`` is
    ``<id>:<n>`` and the source has no message ``<rest>``, output ``n`` of message ``<id>``
    (the handler runtime's keys, ``evq.handlers.plan.cascade_key``)."""
    known = F.array(*[F.lit(q) for q in queues]) if queues else F.array().cast("array<string>")
    keyed = (
        per.where(F.col("key").isNotNull() & ~F.col("key").startswith("dlq:"))
        .withColumn("src_queue", F.substring_index(F.col("key"), ":", 1))
        .withColumn("rest", F.expr("substring(key, length(src_queue) + 2)"))
        .where(F.array_contains(known, F.col("src_queue")) & (F.col("src_queue") != F.col("queue")))
        .withColumn("alt_id", F.regexp_extract("rest", r"^(.*):(\d+)$", 1))
        .withColumn("alt_n", F.regexp_extract("rest", r"^(.*):(\d+)$", 2))
    )
    had = per.select(F.col("queue").alias("src_queue"), F.col("message_id").alias("had_id"))
    exact = had.withColumn("exact", F.lit(True))
    moved = (
        keyed.join(
            exact,
            (keyed.src_queue == exact.src_queue) & (keyed.rest == exact.had_id),
            "left",
        )
        .drop(exact.src_queue)
        .drop("had_id")
        .select(
            "src_queue",
            F.when(F.col("exact") | (F.col("alt_id") == ""), F.col("rest"))
            .otherwise(F.col("alt_id"))
            .alias("src_id"),
            F.when(F.col("exact") | (F.col("alt_id") == ""), F.lit(""))
            .otherwise(F.col("alt_n"))
            .alias("output"),
            F.col("queue").alias("to_queue"),
            F.col("message_id").alias("to_id"),
        )
    )
    sources = moved.select("src_queue").distinct()
    stage = per.join(sources, per.queue == sources.src_queue, "left_semi")
    acked = stage.where(F.col("fate") == "acked").select(
        F.col("queue").alias("src_queue"), F.col("message_id").alias("src_id"), "arrival"
    )
    # Several messages of one source id (client ids are reused) count as one source.
    per_output = moved.groupBy("src_queue", "src_id", "output").agg(
        F.count("*").alias("copies"), F.collect_list("to_queue").alias("to_queues")
    )
    lost = acked.join(
        moved.select("src_queue", "src_id").distinct(), ["src_queue", "src_id"], "left_anti"
    )
    duplicated = per_output.where(F.col("copies") > 1)
    unknown = moved.join(
        had.withColumnRenamed("had_id", "src_id"), ["src_queue", "src_id"], "left_anti"
    )
    return lost, duplicated, unknown


def run_audit(
    spark: SparkSession,
    url: str,
    out: str,
    *,
    as_of_ms: int,
    max_deliveries: int = 5,
    opts: dict[str, str] | None = None,
    limit: int = 1000,
) -> AuditResult:
    """Audit the log at ``url``; write ``audit.json`` into ``out``.

    Raises:
        PipelineError: a wrong store or an empty log.
    """
    check_store(url, opts)
    os.makedirs(out, exist_ok=True)
    with progress(spark, "audit"):
        timeline = load_timeline(spark, url, as_of_ms, opts=opts)
        try:
            per = _per_message(timeline).persist()
            fates = {r.fate or "lost": r["count"] for r in per.groupBy("fate").count().collect()}
            names, dlqs = _settings(timeline)
            lost, duplicated, unknown = _cascades(per, names)
            put_seq = {"seq": "put_seq"}
            parts = [
                _exceptions("lost", per.where(F.col("fate").isNull()), **put_seq),
                _exceptions("no_origin", per.where(F.col("known") == 0), **put_seq),
                _exceptions(
                    "over_delivered",
                    per.where(F.col("deliveries") > max_deliveries),
                    detail=F.concat(F.lit("delivered "), F.col("deliveries"), F.lit(" times")),
                    **put_seq,
                ),
                *[
                    _exceptions(kind, timeline.where(F.col("type") == kind))
                    for kind in _SNAPSHOT_KINDS
                ],
                _exceptions(
                    "dead_letter_lost",
                    _dead_letters_lost(spark, per, dlqs),
                    detail=F.concat(F.lit("never arrived in "), F.col("dlq")),
                ),
                _exceptions(
                    "cascade_lost",
                    lost,
                    queue="src_queue",
                    message_id="src_id",
                    detail=F.lit("acked, but never put into the next stage"),
                ),
                _exceptions(
                    "cascade_duplicated",
                    duplicated,
                    queue="src_queue",
                    message_id="src_id",
                    detail=F.concat(
                        F.lit("put "),
                        F.col("copies"),
                        F.lit(" times into "),
                        F.array_join(F.array_distinct("to_queues"), ", "),
                    ),
                ),
                _exceptions(
                    "cascade_unknown_source",
                    unknown,
                    queue="to_queue",
                    message_id="to_id",
                    detail=F.concat(
                        F.lit("its key names "), F.col("src_queue"), F.lit(":"), F.col("src_id")
                    ),
                ),
            ]
            # Exceptions are few: one task per core instead of one per part and partition.
            cores = spark.sparkContext.defaultParallelism
            found = reduce(DataFrame.unionByName, parts).coalesce(cores).persist()
            counts, listed = _collect(found, limit)
            found.unpersist()
            per.unpersist()
        finally:
            timeline.unpersist()
    total = sum(fates.values())
    kinds = ["lost", "no_origin", "over_delivered", *_SNAPSHOT_KINDS, "dead_letter_lost"]
    kinds += ["cascade_lost", "cascade_duplicated", "cascade_unknown_source"]
    result = AuditResult(
        out,
        total,
        fates,
        {kind: listed.get(kind, []) for kind in kinds},
        {kind: counts.get(kind, 0) for kind in kinds},
    )
    doc = {
        "store": url,
        "as_of_ms": as_of_ms,
        "max_deliveries": max_deliveries,
        "messages": total,
        "fates": fates,
        "clean": result.clean,
        "exception_counts": result.counts,
        "exceptions": result.exceptions,
    }
    with open(os.path.join(out, "audit.json"), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, default=str)
    log.info("audit: %d messages, fates %s, exceptions %s", total, fates, result.counts)
    return result
