"""The short version of loadtest/bench_s3_puts.py: evq serve on moto's S3 server, through the
tool's counting proxy, with a few and with many busy queues. Each group commit is one object:
the shard log's PUT requests are the shards' commits, whatever the number of queues, and
fewer than one object per queue per commit would have been."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_log_puts_follow_commits_not_queues() -> None:
    tool = [sys.executable, "loadtest/bench_s3_puts.py", "--shards", "2", "--queues", "4", "300"]
    run = subprocess.run(
        [*tool, "--producers", "16", "--duration", "3", "--warmup", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    # The tool's error comes first, its proxy's shutdown after: show both ends.
    assert run.returncode == 0, run.stderr[:3000] + "\n...\n" + run.stderr[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if '"puts_per_s"' in line]
    assert [r["queues"] for r in rows] == [4, 300]
    for row in rows:
        assert row["puts_per_s"] > 0
        assert row["commits_per_s"] > 0
        # The proxy's count and the shards' count are read a moment apart: a few commits.
        slack = 5 / 3
        assert abs(row["wal_puts_per_s"] - row["commits_per_s"]) <= slack, row
    many = rows[1]
    # 300 queues busy at once: a per-queue layout would write an object per queue per commit.
    assert many["per_queue_layout_puts_per_s"] > 2 * many["wal_puts_per_s"], many
