"""loadtest/console_paint.py, small: the tool opens the console of a served evq in headless
Chromium and times its first paint, its rows and their counts (the 1,000-queue run is a
documented command, loadtest/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_paint_tool_times_the_console_with_its_queues() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "console_paint.py"),
            "--queues",
            "30",
            "--runs",
            "1",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["queues"] == 30
    [run] = result["runs"]
    assert 0 < run["first_paint_ms"] <= run["all_counts_ms"], run
    assert 0 < run["all_rows_ms"] <= run["all_counts_ms"], run
    assert result["median"] == run
