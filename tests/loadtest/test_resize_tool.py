"""loadtest/resize.py, small: the tool resizes a real evq serve under load and reports the
time, the moves and what they cost (the full run is a documented command, RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> tuple[dict[str, Any], str]:
    """loadtest/resize.py with ``args``: its JSON result and its progress (stderr)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "resize.py"), *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_resize_tool_grows_a_served_store_and_reports_the_moves(tmp_path: Path) -> None:
    result, progress = _run(
        *("--queues", "12", "--messages", "3", "--to", "2", "--load", "2"),
        *("--dir", str(tmp_path)),
    )
    assert (result["queues"], result["from"], result["to"], result["count_after"]) == (12, 1, 2, 2)
    assert result["moves"] >= 1
    assert 0 < result["unavailable_p50_ms"] <= result["unavailable_p99_ms"]
    assert result["resize_s"] > 0
    assert result["ops"] > 0
    assert result["failed_ops"] == 0, result["failures"]
    assert "queues moved" in progress  # progress


def test_the_resize_tool_restarts_every_shard_under_load_and_counts_failures(
    tmp_path: Path,
) -> None:
    result, progress = _run(
        *("--queues", "6", "--messages", "2", "--from", "2", "--restart", "--load", "2"),
        *("--dir", str(tmp_path)),
    )
    assert (result["shards"], result["restarted"]) == (2, 2)
    assert result["restart_s"] > 0
    assert result["ops"] > 0
    assert 0 < result["op_p99_ms"] <= result["op_max_ms"]
    assert result["failed_ops"] == 0, result["failures"]
    assert "shards restarted" in progress
