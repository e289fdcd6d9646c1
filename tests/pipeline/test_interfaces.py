"""The pipeline's ways in: S3 through obstore (a shard log of one object per commit), reading
while a shard writes and prunes, the ``evq pipeline`` command, and spark-submit."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from actors.clock import ManualClock
from actors.core.ids import SequentialIds
from actors.log import keys
from actors.log.store import LocalDirStore, ObjectStore
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from evq.cli.main import main as evq
from pipeline.frames import load_events
from tests.conftest import CREDENTIALS, REGION, S3Server
from tests.pipeline.logs import BusyLog, Driver, new

REPO = Path(__file__).resolve().parents[2]


async def _work(d: Driver, rounds: int) -> None:
    for _ in range(rounds):
        await d.put("jobs", *[new(f"job {i}") for i in range(3)])
        d.tick(1_500)
        taken = await d.take("jobs", 2)
        await d.ack("jobs", *taken[:1])


async def _open(store: ObjectStore, clock: ManualClock, **log: Any) -> tuple[QueueShard, Driver]:
    shard = QueueShard(
        0, 1, store, clock=clock, ids=SequentialIds(), log_settings=LogSettings(**log)
    )
    await shard.start()
    await shard.create("jobs", QueueSettings(visibility_timeout_ms=2_000), [])
    return shard, Driver([shard], clock)


def _final(spark: SparkSession, url: str, as_of_ms: int, **options: str) -> dict[str, Any]:
    reader = spark.read.format("evq").option("view", "timeline").option("as_of_ms", str(as_of_ms))
    for key, value in options.items():
        reader = reader.option(key, value)
    rows = reader.load(url).where(F.col("type").isin("final", "damage", "vanished")).collect()
    others = [r.asDict() for r in rows if r.type != "final"]
    assert [r.type for r in rows] == ["final"], others
    stats = json.loads(rows[0].detail)
    stats.pop("settings")
    return stats  # type: ignore[no-any-return]


@pytest.mark.integration
def test_a_log_on_s3_is_read_through_obstore(spark: SparkSession, s3_server: S3Server) -> None:
    prefix = s3_server.fresh_prefix()

    async def write() -> tuple[int, dict[str, Any]]:
        store = s3_server.store(prefix)
        clock = ManualClock()
        shard, d = await _open(store, clock)
        await _work(d, 5)
        stats = await d.stats("jobs")
        await shard.close()
        await store.close()
        return clock.now_ms(), stats

    now, stats = asyncio.run(write())
    url = f"s3://{s3_server.bucket}/{prefix}"
    options = {"endpoint": s3_server.endpoint, "region": REGION, **CREDENTIALS}
    assert _final(spark, url, now, **options) == stats
    events = spark.read.format("evq").options(**options).load(url)
    assert events.where(F.col("type") == "put").count() == stats["enqueued"]


def test_reading_while_the_queue_writes_and_prunes_is_safe(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A queue keeps writing (snapshotting every few records, its shard log rolling small
    segments and pruning them behind the snapshots) while Spark reads the log: every read
    is a consistent prefix, with no damage and no false exception."""
    root = tmp_path / "live"
    clock = ManualClock()
    stop = threading.Event()
    result: dict[str, Any] = {}

    async def serve() -> None:
        store = LocalDirStore(root)
        shard, d = await _open(
            store, clock, snapshot_every_records=12, snapshot_every_ms=10**12, segment_bytes=400
        )
        result["opened"] = True
        while not stop.is_set():
            await _work(d, 1)
            await asyncio.sleep(0.005)
        result["stats"] = await d.stats("jobs")
        result["now"] = clock.now_ms()
        result["pruned"] = not (root / keys.wal_segment_key(0, 1)).exists()
        await shard.close(snapshot=False)
        await store.close()

    writer = threading.Thread(target=asyncio.run, args=(serve(),))
    writer.start()
    try:
        seen = []
        for _ in range(3):
            while not result.get("opened"):
                stop.wait(0.01)
            stats = _final(spark, str(root), 10**13)  # far future: every lease has expired
            seen.append(stats["enqueued"])
            loaded = load_events(spark, str(root))
            assert not loaded.discarded
            assert not any(cut.discarded for cut in loaded.logs.values())
            loaded.raw.unpersist()
    finally:
        stop.set()
        writer.join(timeout=60)
    assert seen == sorted(seen)
    assert seen[-1] > 0
    assert result["pruned"], "segments were pruned while the log was read"
    assert _final(spark, str(root), result["now"]) == result["stats"]


# ------------------------------------------------------------------ the command line


def _evq(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    code = evq(list(argv), stdout=io.StringIO(), stderr=err)
    return code, err.getvalue()


def test_evq_pipeline_says_what_is_wrong_with_the_store(tmp_path: Path) -> None:
    code, err = _evq("pipeline", "stats", "--store", str(tmp_path / "nope"), "--out", str(tmp_path))
    assert code == 1
    assert "no such directory" in err
    code, err = _evq("pipeline", "audit", "--store", str(tmp_path), "--out", str(tmp_path))
    assert code == 1
    assert "no event log" in err
    code, err = _evq("pipeline", "archive", "--store", "ftp://x/y", "--out", str(tmp_path))
    assert code == 1
    assert "unsupported store scheme" in err


def test_evq_pipeline_runs_the_jobs(
    spark: SparkSession, busy_log: BusyLog, bad_log: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    as_of = str(busy_log.now_ms / 1000)
    code, err = _evq(
        "pipeline", "stats", "--store", str(busy_log.root), "--out", str(tmp_path / "s"),
        "--as-of", as_of, "--queues", "orders,stage1", "--no-report",
    )  # fmt: skip
    assert code == 0, err
    assert "partitions done" in err, "progress is logged"
    queues = json.loads((tmp_path / "s" / "queues.json").read_text())
    assert set(queues) == {"orders", "stage1"}
    assert queues["orders"]["stats"] == busy_log.stats["orders"]
    root, expect = bad_log
    code, err = _evq(
        "pipeline", "audit", "--store", str(root), "--out", str(tmp_path / "a"),
        "--as-of", str(expect["now_ms"] / 1000), "--max-deliveries", "3",
        "--log-format", "json",
    )  # fmt: skip
    assert code == 3, err
    assert "EXCEPTIONS" in err
    records = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    assert any("partitions done" in r["msg"] for r in records), err
    assert {r["logger"].split(".")[0] for r in records} == {"pipeline"}
    assert all(r["level"] in ("info", "warning") for r in records)
    assert "partitions done" not in "".join(
        line for line in err.splitlines() if not line.startswith("{")
    ), "every log record of the run is JSON"
    assert not logging.getLogger("pipeline").handlers, "a run takes its log handler away"


def test_the_jobs_run_under_spark_submit(
    bad_log: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    """A job as a Spark application (the cheapest one: a new JVM is slow enough)."""
    root, expect = bad_log
    submit = Path(sys.executable).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [
            str(submit),
            "--master",
            "local[2]",
            "--conf",
            "spark.ui.enabled=false",
            str(REPO / "pipeline" / "__main__.py"),
            "archive",
            "--store",
            str(root),
            "--out",
            str(tmp_path),
            "--before",
            str(expect["now_ms"] / 1000 + 1),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "event rows added" in done.stdout + done.stderr
    doc = json.loads((tmp_path / "archive.json").read_text())
    assert set(doc["queues"]) == {
        "vanish",
        "redeliver",
        "src",
        "dst",
        "removed",
        "fanout",
        "outputs",
    }
    assert all(q["rows"] > 0 for q in doc["queues"].values())
    assert list((tmp_path / "events").glob("queue=src/date=*/*.parquet"))
