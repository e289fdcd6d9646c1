"""The jobs on real PySpark (local mode), on logs the real engine wrote (``logs.py``,
``layouts.py``).

Numbers are checked against the engine: its own ``Stats`` replies for the live queues, and
what recovery rebuilds and reports for damaged logs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from actors.log import keys
from actors.log.codec import decode_segment
from actors.log.wal import decode_groups, decode_record, scan_segment
from pipeline.archive import run_archive
from pipeline.audit import run_audit
from pipeline.frames import load_events
from pipeline.rows import events_from_rows
from pipeline.stats import COLUMNS, run_stats
from tests.pipeline import layouts
from tests.pipeline.layouts import run
from tests.pipeline.logs import BusyLog

# ------------------------------------------------------------------ the data source


def test_events_view_has_every_record_and_a_row_per_segment(
    spark: SparkSession, busy_log: BusyLog
) -> None:
    df = spark.read.format("evq").option("bodies", "false").load(str(busy_log.root))
    segments = df.where(F.col("type") == "segment").collect()
    on_disk = sorted(p.relative_to(busy_log.root).as_posix() for p in busy_log.root.rglob("*.seg"))
    assert sorted(r.object for r in segments) == on_disk
    assert {r.object.split("/")[1] for r in segments} == {"0000", "0001"}, "two shard logs"
    assert all(r.queue is None and r.detail is None for r in segments)
    assert {r.end for r in segments} <= {"clean", "zeros"}
    for r in segments:  # LSN ranges: each segment's records follow the one before it
        later = [s for s in segments if s.object[:9] == r.object[:9] and s.lsn > r.lsn]
        if later:
            assert min(s.lsn for s in later) == r.lsn + r.records
    puts = df.where((F.col("queue") == "orders") & (F.col("type") == "put"))
    assert puts.count() == busy_log.stats["orders"]["enqueued"]
    assert puts.where(F.col("lsn").isNull()).count() == 0


def _kept(loaded: Any) -> dict[str, list[int]]:
    seqs: dict[str, set[int]] = {}
    for r in loaded.events.select("queue", "seq").distinct().collect():
        seqs.setdefault(r.queue, set()).add(r.seq)
    return {q: sorted(s) for q, s in seqs.items()}


def test_events_view_reads_each_queue_across_both_layouts(
    spark: SparkSession, tmp_path: Path
) -> None:
    run(layouts.write_mixed(tmp_path))
    ends = run(layouts.recovered_ends(tmp_path))
    loaded = load_events(spark, str(tmp_path))
    try:
        assert not loaded.discarded
        assert not any(cut.discarded for cut in loaded.logs.values())
        kept = _kept(loaded)
        for queue, last in ends.items():
            assert kept[queue] == list(range(1, last + 1)), queue  # no gap, no overlap
        objects = {
            r.object.split("/")[0]
            for r in loaded.events.where(F.col("queue") == "jobs").select("object").collect()
        }
        assert objects == {"queues", "wal"}
        assert loaded.events.groupBy("queue", "seq", "item").count().where("count > 1").count() == 0
    finally:
        loaded.raw.unpersist()


def test_a_version_1_store_is_still_read_whole(spark: SparkSession, tmp_path: Path) -> None:
    shutil.copytree(layouts.DATADIR_V1, tmp_path / "v1")
    golden = json.loads((layouts.DATADIR_V1.parent / "datadir-v1.json").read_text())
    loaded = load_events(spark, str(tmp_path / "v1"))
    try:
        assert not loaded.discarded
        last = {q: seqs[-1] for q, seqs in _kept(loaded).items()}
        assert last == {q: v["last_seq"] for q, v in golden["queues"].items()}
    finally:
        loaded.raw.unpersist()
    timeline = (
        spark.read.format("evq")
        .option("view", "timeline")
        .option("as_of_ms", str(golden["clock_ms"]))
        .load(str(tmp_path / "v1"))
    )
    kinds = {
        r.queue: r.type for r in timeline.where(F.col("type").isin("final", "damage")).collect()
    }
    assert kinds == dict.fromkeys(golden["queues"], "final")


@pytest.mark.parametrize("damage", ["torn", "flipped"])
def test_events_view_ends_a_damaged_shard_log_where_recovery_does(
    spark: SparkSession, tmp_path: Path, damage: str
) -> None:
    run(layouts.write_interleaved(tmp_path))
    if damage == "torn":
        key, offset = layouts.tear_last_block(tmp_path)
    else:
        key, offset = layouts.flip_middle_block(tmp_path)
    ends = run(layouts.recovered_ends(tmp_path))
    loaded = load_events(spark, str(tmp_path))
    try:
        [row] = loaded.raw.where(F.col("object") == key).where(F.col("type") == "segment").collect()
        assert (row.end, row.offset) == ("torn" if damage == "torn" else "damaged", offset)
        assert {q: seqs[-1] for q, seqs in _kept(loaded).items()} == ends
        discarded = [(d.object, d.offset, d.reason) for d in loaded.logs["wal/0000/"].discarded]
        if damage == "torn":  # a write that never finished: just the end, no damage
            assert row.detail  # why the bytes there are no block (its CRC, as zeros follow)
            assert discarded == []
            assert not loaded.discarded
        else:
            assert discarded == [(key, offset, "block checksum mismatch")]
    finally:
        loaded.raw.unpersist()


# ------------------------------------------------------------------ stats


@pytest.fixture(scope="module")
def stats_run(
    spark: SparkSession, busy_log: BusyLog, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Any]:
    out = tmp_path_factory.mktemp("stats")
    return out, run_stats(spark, str(busy_log.root), str(out), as_of_ms=busy_log.now_ms)


def test_stats_end_where_the_engine_is_for_every_queue(
    stats_run: tuple[Path, Any], busy_log: BusyLog
) -> None:
    out, result = stats_run
    final = {q: entry["stats"] for q, entry in result.queues.items()}
    assert final == busy_log.stats
    on_disk = json.loads((out / "queues.json").read_text())
    assert {q: e["stats"] for q, e in on_disk.items()} == busy_log.stats
    assert not result.damaged
    assert all(e["damage"] == [] and e["exceptions"] == 0 for e in on_disk.values())


def test_stats_of_a_damaged_shard_log_are_what_recovery_rebuilds(
    spark: SparkSession, tmp_path: Path
) -> None:
    now, _ = run(layouts.write_interleaved(tmp_path / "log"))
    key, offset = layouts.flip_middle_block(tmp_path / "log")
    recovered = run(layouts.recovered_stats(tmp_path / "log", now))
    result = run_stats(
        spark, str(tmp_path / "log"), str(tmp_path / "out"), as_of_ms=now, report=False
    )
    assert result.damaged
    assert {q: e["stats"] for q, e in result.queues.items() if e["stats"]} == recovered
    damage = result.queues["wal/0000/"]["damage"]  # in the middle of a segment: no queue named
    assert damage == [
        {"object": key, "offset": offset, "records": None, "reason": "block checksum mismatch"}
    ]


def test_stats_parquet_sums_match_the_engines_counters(
    stats_run: tuple[Path, Any], busy_log: BusyLog
) -> None:
    out, _ = stats_run
    table = pd.read_parquet(out / "stats.parquet")
    assert list(table.columns) == COLUMNS
    assert not table.duplicated(["queue", "minute"]).any(), "one row per queue and minute"
    sums = table.groupby("queue")[["enqueued", "acked", "dead_lettered", "expired", "purged"]].sum()
    for queue, stats in busy_log.stats.items():
        row = sums.loc[queue]
        assert row["enqueued"] == stats["enqueued"], queue
        assert row["acked"] == stats["acked"], queue
        assert row["dead_lettered"] == stats["dead_lettered"], queue
        assert row["expired"] == stats["expired"], queue
        assert row["purged"] == stats["purged"], queue
    orders = table[table["queue"] == "orders"]
    assert orders["released"].sum() == 1
    assert orders["lease_expired"].sum() > 0
    assert orders["received_2"].sum() > 0, "the poison message was delivered again"
    assert orders["wait_p50_ms"].notna().any()
    assert (orders["ack_p99_ms"].dropna() >= orders["ack_p50_ms"].dropna()).all()


def test_the_report_renders_in_headless_chromium(
    stats_run: tuple[Path, Any], tmp_path: Path
) -> None:
    from PIL import Image

    out, _ = stats_run
    report = out / "report.html"
    page = report.read_text()
    assert "No damaged records" in page
    assert page.count("data:image/png;base64,") >= 1 + 7  # the overview and one per queue
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed: apt-get install -y chromium"
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={shot}",
            "--window-size=1200,1800",
            report.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # The plots' blue (enqueued, depth by state "delayed") is nowhere in the page's own
    # styles: it shows only if the embedded PNGs were decoded and drawn.
    blue = int((np.abs(pixels - [31, 119, 180]).max(axis=2) < 12).sum())
    assert blue > 300, f"no plot drawn ({blue} plot-blue pixels)"


# ------------------------------------------------------------------ audit


def test_audit_accounts_for_every_message_of_the_busy_log(
    spark: SparkSession, busy_log: BusyLog, tmp_path: Path
) -> None:
    result = run_audit(
        spark, str(busy_log.root), str(tmp_path), as_of_ms=busy_log.now_ms, max_deliveries=3
    )
    assert result.clean, result.exceptions
    fates = result.fates
    assert fates["dead_lettered"] == busy_log.stats["orders"]["dead_lettered"]
    assert fates["purged"] == busy_log.stats["scratch"]["purged"]
    assert fates["expired"] == busy_log.stats["shortlived"]["expired"]
    present = sum(s["total"] + s["dead_letter_pending"] for s in busy_log.stats.values())
    assert fates["present"] == present
    assert "lost" not in fates


def test_audit_reports_each_way_a_log_can_lose_a_message(
    spark: SparkSession, bad_log: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    root, expect = bad_log
    result = run_audit(spark, str(root), str(tmp_path), as_of_ms=expect["now_ms"], max_deliveries=3)
    assert not result.clean
    found = result.exceptions

    def ids(kind: str) -> set[tuple[str, str]]:
        return {(r["queue"], r["message_id"]) for r in found[kind]}

    assert ids("vanished") == {expect["vanished"]}
    assert ids("lost") == {expect["vanished"]}, "acknowledged, then gone without an event"
    assert {r["queue"] for r in found["over_delivered"]} == {expect["redelivered"]}
    assert ids("cascade_lost") == {expect["cascade_lost"]}
    assert ids("cascade_duplicated") == {expect["cascade_duplicated"]}
    assert found["cascade_unknown_source"] == [], "fan-out keys <queue>:<id>:<n> are understood"
    assert ids("orphan") == {expect["removed"]}, "the message cut out of a copy of the log"
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert doc["clean"] is False
    assert doc["exception_counts"]["cascade_lost"] == 1


def test_audit_accounts_for_the_messages_of_a_deleted_queue(
    spark: SparkSession, tmp_path: Path
) -> None:
    now, stats, _ = run(layouts.write_recreated(tmp_path / "log"))
    result = run_audit(spark, str(tmp_path / "log"), str(tmp_path / "out"), as_of_ms=now)
    assert result.clean, result.exceptions
    assert result.fates["dropped"] == 2, "the messages the deletion took"
    present = sum(s["total"] for s in stats.values())
    assert result.fates["present"] == present


# ------------------------------------------------------------------ archive


def _log_events(root: Path, before_ms: int, last_seq: dict[str, int]) -> list[tuple[str, int, Any]]:
    """The events of the log below ``before_ms``, decoded directly with the codecs."""
    found = []
    for path in sorted(root.rglob("*.seg")):
        key = path.relative_to(root).as_posix()
        if key.startswith(keys.WAL_ROOT):
            records = [
                (queue, first + i, decode_record(raw))
                for block in scan_segment(path.read_bytes()).blocks
                for queue, first, group in decode_groups(block)
                for i, raw in enumerate(group)
                if queue
            ]
        else:
            read = decode_segment(path.read_bytes())
            records = [
                (keys.queue_of(key), read.header.first_seq + i, e)
                for i, e in enumerate(read.events)
            ]
        found += [r for r in records if r[2].at_ms < before_ms and r[1] <= last_seq[r[0]]]
    return sorted(found, key=lambda x: (x[0], x[1]))


def test_archive_round_trips_and_runs_again_without_duplicates(
    spark: SparkSession, busy_log: BusyLog, tmp_path: Path
) -> None:
    root = str(busy_log.root)
    middle = busy_log.now_ms - 5 * 60_000
    first = run_archive(spark, root, str(tmp_path), before_ms=middle)
    last_seq = {q: s["log_ends_at"] for q, s in first.queues.items()}
    assert all(s["damage"] == [] for s in first.queues.values())
    assert first.logs == {
        log: {"damage": [], "pruned_while_reading": []} for log in ("wal/0000/", "wal/0001/")
    }
    archived = spark.read.parquet(first.path)
    assert set(archived.columns) >= {"queue", "date", "seq", "type", "body"}
    assert not set(archived.columns) & {"object", "lsn", "end", "queues"}
    partitions = {p.relative_to(first.path).parts[:2] for p in Path(first.path).rglob("*.parquet")}
    assert ("queue=orders", "date=2023-11-14") in partitions
    rebuilt = list(events_from_rows(r.asDict() for r in archived.collect()))
    assert rebuilt == _log_events(busy_log.root, middle, last_seq)
    assert first.rows > 0

    second = run_archive(spark, root, str(tmp_path), before_ms=busy_log.now_ms + 1)
    assert second.rows > 0
    everything = spark.read.parquet(first.path)
    assert everything.count() == everything.select("queue", "seq", "item").distinct().count()
    rebuilt = list(events_from_rows(r.asDict() for r in everything.collect()))
    assert rebuilt == _log_events(busy_log.root, busy_log.now_ms + 1, last_seq)
    third = run_archive(spark, root, str(tmp_path), before_ms=busy_log.now_ms + 1)
    assert third.rows == 0


def test_archive_holds_each_queue_across_both_layouts_and_stops_at_damage(
    spark: SparkSession, tmp_path: Path
) -> None:
    run(layouts.write_mixed(tmp_path / "mixed"))
    ends = run(layouts.recovered_ends(tmp_path / "mixed"))
    done = run_archive(spark, str(tmp_path / "mixed"), str(tmp_path / "a1"), before_ms=2**62)
    rebuilt = list(events_from_rows(r.asDict() for r in spark.read.parquet(done.path).collect()))
    assert rebuilt == _log_events(tmp_path / "mixed", 2**62, ends)
    assert {q: s["log_ends_at"] for q, s in done.queues.items()} == ends

    run(layouts.write_interleaved(tmp_path / "damaged", objects=True))
    key, _ = layouts.flip_middle_block(tmp_path / "damaged")
    ends = run(layouts.recovered_ends(tmp_path / "damaged"))
    done = run_archive(spark, str(tmp_path / "damaged"), str(tmp_path / "a2"), before_ms=2**62)
    assert {q: s["log_ends_at"] for q, s in done.queues.items()} == ends
    [first, *after] = done.logs["wal/0000/"]["damage"]
    assert (first["object"], first["reason"]) == (key, "block checksum mismatch")
    assert after
    assert all(d["reason"] == f"after damage in {key}" for d in after)
    assert all(done.queues[q]["damage"] for q in layouts.QUEUES), "records of each follow it"
