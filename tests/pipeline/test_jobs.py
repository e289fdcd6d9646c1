"""The jobs on real PySpark (local mode), on logs the real engine wrote (``logs.py``).

Numbers are checked against the engine: its own ``Stats`` replies for the live queues, and
what recovery rebuilds and reports for the damaged ones.
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
from pipeline.archive import run_archive
from pipeline.audit import run_audit
from pipeline.rows import events_from_rows
from pipeline.stats import COLUMNS, run_stats
from tests.pipeline.logs import BusyLog

# ------------------------------------------------------------------ the data source


def test_events_view_has_every_record_and_reports_damage_per_segment(
    spark: SparkSession, busy_log: BusyLog
) -> None:
    df = spark.read.format("evq").option("bodies", "false").load(str(busy_log.root))
    segments = df.where(F.col("type") == "segment").collect()
    on_disk = sorted(p.relative_to(busy_log.root).as_posix() for p in busy_log.root.rglob("*.seg"))
    assert sorted(r.object for r in segments) == on_disk
    damaged = {(r.queue, r.object, r.offset, r.detail) for r in segments if r.detail}
    assert damaged == {
        ("torn", *busy_log.damage["torn"][0][:2], "torn tail: record payload cut short"),
        ("flipped", *busy_log.damage["flipped"][0][:2], "record checksum mismatch"),
    }
    puts = df.where((F.col("queue") == "orders") & (F.col("type") == "put")).count()
    assert puts == busy_log.stats["orders"]["enqueued"]


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
    got = {
        q: [(d["object"], d["offset"], d["records"]) for d in e["damage"]]
        for q, e in on_disk.items()
    }
    assert {q: d for q, d in got.items() if d} == busy_log.damage


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
    assert "torn tail" in page
    assert page.count("data:image/png;base64,") >= 1 + 8  # the overview and one per queue
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
    assert {k: n for k, n in result.counts.items() if n} == {"damage": 11}
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


# ------------------------------------------------------------------ archive


def _log_events(root: Path, before_ms: int, last_seq: dict[str, int]) -> list[tuple[str, int, Any]]:
    """The events of the log below ``before_ms``, decoded directly with the codec."""
    found = []
    for path in sorted(root.rglob("*.seg")):
        key = path.relative_to(root).as_posix()
        queue = keys.queue_of(key)
        read = decode_segment(path.read_bytes())
        for i, event in enumerate(read.events):
            seq = read.header.first_seq + i
            if event.at_ms < before_ms and seq <= last_seq[queue]:
                found.append((queue, seq, event))
    return sorted(found, key=lambda x: (x[0], x[1]))


def test_archive_round_trips_and_runs_again_without_duplicates(
    spark: SparkSession, busy_log: BusyLog, tmp_path: Path
) -> None:
    root = str(busy_log.root)
    middle = busy_log.now_ms - 5 * 60_000
    first = run_archive(spark, root, str(tmp_path), before_ms=middle)
    last_seq = {q: s["log_ends_at"] for q, s in first.queues.items()}
    assert last_seq["flipped"] < max(
        int(p.stem) for p in (busy_log.root / "queues/flipped/log").glob("*.seg")
    )
    archived = spark.read.parquet(first.path)
    assert set(archived.columns) >= {"queue", "date", "seq", "type", "body"}
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
