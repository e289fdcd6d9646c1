"""loadtest/handover.py and loadtest/restore_fifo.py, small: the tools run end to end and
report what they measure (the full runs are documented commands, loadtest/RESULTS.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_handover_tool_moves_every_queue_and_reports_its_unavailability(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "handover.py"),
            "--queues",
            "3",
            "--messages",
            "1500",
            "--rounds",
            "2",
            "--dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["queues"], result["messages_each"], result["moves"]) == (3, 1500, 6)
    p50, p99, top = (result[f"unavailable_{k}_ms"] for k in ("p50", "p99", "max"))
    assert 0 < p50 <= p99 <= top
    assert result["moves_per_s"] > 0


def test_the_fifo_restore_tool_restores_every_message() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "restore_fifo.py"), "--messages", "20000"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = re.search(r"restore ([\d.]+) s \(([\d,]+) delayed\)", done.stdout)
    assert found is not None, done.stdout
    assert float(found.group(1)) > 0
    assert found.group(2) == "20,000"


def test_the_handover_tool_runs_on_moto_s3(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, str(ROOT / "loadtest" / "handover.py"), "--s3"),
            *("--queues", "2", "--messages", "300", "--rounds", "1", "--dir", str(tmp_path)),
            *("--floor", "5"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["store"], result["queues"], result["moves"]) == ("moto S3", 2, 2)
    assert 0 < result["unavailable_p50_ms"] <= result["unavailable_max_ms"]
    assert result["floor_chains"] == 5
    assert 0 < result["floor_put_p50_ms"] < result["floor_chain_p50_ms"]  # four round trips
    assert result["floor_chain_p50_ms"] <= result["floor_chain_p99_ms"]
