"""loadtest/latency_floor.py, short: every figure measured against real processes (a real
``evq serve``, aiohttp apps, an echo process, a file in the test's directory), one JSON line
per figure and a summary of them all; and its arguments checked. What the figures are is for
loadtest/RESULTS.md, not for assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "loadtest" / "latency_floor.py"
FIGURES = {
    "fdatasync",
    "hop_tcp",
    "hop_unix",
    "http",
    "http_fdatasync",
    "evq_healthz",
    "evq_get",
    "evq_put",
}

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_each_figure_is_measured_once_a_round_and_summed_up(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--rounds", "1", "--count", "50", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines()]
    rows = [x for x in lines if "figure" in x]
    assert {r["figure"] for r in rows} == FIGURES
    assert all(0 < r["p50_ms"] <= r["p90_ms"] for r in rows), rows
    summary = lines[-1]["summary"]
    # one round: each figure's median is that round's p50 (no timings compared here: on a
    # busy machine an fdatasync alone took longer than a whole put in another moment)
    assert summary == {r["figure"]: r["p50_ms"] for r in rows}
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # its files are gone


def test_it_refuses_too_few_round_trips() -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--count", "5"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert "--count must be at least 10" in done.stderr
