"""The jobs read the archive and the live log as one history (issue 20), on a week of
traffic that the shards mostly pruned into the archive (``week.py``): no gap and no overlap
across prunes, a restart, and a prune cut between archiving and deleting a segment; the
stats end where the engine is, and the audit accounts for every message of the week."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from actors.log import keys
from pipeline.archive import run_archive
from pipeline.audit import run_audit
from pipeline.stats import run_stats
from tests.pipeline.week import WeekLog, write_week_log


@pytest.fixture(scope="module")
def week(tmp_path_factory: pytest.TempPathFactory) -> WeekLog:
    return asyncio.run(write_week_log(tmp_path_factory.mktemp("week") / "data"))


def _segments(root: Path) -> tuple[set[str], set[str]]:
    """Shard-log segments in the live log and in the archive, by their live names."""
    live = {p.relative_to(root).as_posix() for p in (root / "wal").rglob("*.seg")}
    archived = {
        keys.unarchived(p.relative_to(root).as_posix()) for p in (root / "archive").rglob("*.seg")
    }
    return live, archived


def test_most_of_the_week_was_pruned_into_the_archive(week: WeekLog) -> None:
    live, archived = _segments(week.root)
    assert len(archived) > 3 * len(live)
    assert live & archived == {week.notes["cut"]}  # the one a cut prune left in both


def _records(spark: SparkSession, root: Path) -> Any:
    events = spark.read.format("evq").load(str(root))
    return events.where(F.col("type") != "segment").select("queue", "seq", "lsn", "object")


def test_the_events_view_reads_every_record_once_in_order(
    spark: SparkSession, week: WeekLog
) -> None:
    records = _records(spark, week.root).distinct()
    per_record = records.groupBy("queue", "seq").agg(F.countDistinct("lsn").alias("lsns"))
    assert per_record.where(F.col("lsns") != 1).count() == 0  # no record read twice
    for row in (
        records.groupBy("queue")
        .agg(F.min("seq").alias("first"), F.max("seq").alias("last"), F.count("seq").alias("n"))
        .collect()
    ):
        assert (row["first"], row["n"]) == (1, row["last"]), row  # from its creation, no gap
    segments = spark.read.format("evq").load(str(week.root)).where(F.col("type") == "segment")
    logs: dict[str, list[tuple[int, int]]] = {}
    for row in segments.select("object", "lsn", "records").collect():
        log = keys.unarchived(row["object"]).rpartition("/")[0]
        logs.setdefault(log, []).append((row["lsn"], row["records"]))
    assert sorted(logs) == ["wal/0000", "wal/0001"]
    for runs in logs.values():  # each segment once, archive and live log, LSN 1 on: no gap
        runs.sort()
        assert runs[0][0] == 1
        for (first, count), (following, _) in itertools.pairwise(runs):
            assert first + count == following
    assert records.where(F.col("object").startswith("archive/")).count() > 0


def test_without_the_archive_the_history_would_start_late(
    spark: SparkSession, week: WeekLog, tmp_path: Path
) -> None:
    live_only = tmp_path / "live-only"
    shutil.copytree(week.root, live_only, ignore=shutil.ignore_patterns("archive"))
    first = _records(spark, live_only).agg(F.min("lsn")).collect()[0][0]
    assert first > 1  # what the archive adds is real


def test_stats_of_the_whole_week_end_where_the_engine_is(
    spark: SparkSession, week: WeekLog, tmp_path: Path
) -> None:
    result = run_stats(spark, str(week.root), str(tmp_path), as_of_ms=week.now_ms)
    assert {q: e["stats"] for q, e in result.queues.items()} == week.stats
    assert not result.damaged


def test_the_audit_accounts_for_every_message_of_the_week(
    spark: SparkSession, week: WeekLog, tmp_path: Path
) -> None:
    result = run_audit(spark, str(week.root), str(tmp_path), as_of_ms=week.now_ms, max_deliveries=2)
    assert result.clean, result.exceptions
    fates = result.fates
    assert "lost" not in fates
    enqueued = sum(s["enqueued"] for s in week.stats.values())
    assert sum(fates.values()) == enqueued  # each put message has exactly one fate
    assert fates["dead_lettered"] == week.stats["jobs"]["dead_lettered"] > 0
    assert fates["present"] == sum(
        s["total"] + s["dead_letter_pending"] for s in week.stats.values()
    )


def test_the_archive_job_writes_the_whole_week(
    spark: SparkSession, week: WeekLog, tmp_path: Path
) -> None:
    result = run_archive(spark, str(week.root), str(tmp_path), before_ms=week.now_ms + 1)
    written = spark.read.parquet(result.path)
    queues = written.groupBy("queue").agg(F.min("seq").alias("first")).collect()
    assert {r["queue"]: r["first"] for r in queues} == dict.fromkeys(week.stats, 1)
    assert written.count() == _records(spark, week.root).count()
