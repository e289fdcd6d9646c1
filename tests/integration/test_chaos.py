"""The short reliability campaign (loadtest/chaos.py): 20 faults of every kind at random
against a real ``evq serve`` (two shards, two gateway processes) under the mixed workload,
then the whole history checked. The long campaign is the same command with more faults
(loadtest/RESULTS.md, "Reliability campaign")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

ROOT = Path(__file__).resolve().parents[2]
KINDS = {"shard_kill", "worker_kill", "server_kill", "pause", "conn_drop"}


def test_twenty_faults_of_every_kind_break_no_guarantee(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "loadtest" / "chaos.py"), "--faults", "20", "--seed", "11",
         "--gap", "1", "--out", str(out), "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )  # fmt: skip
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    summaries = [x["summary"] for x in lines if "summary" in x]
    assert summaries, done.stdout[-3000:] + done.stderr[-3000:]
    summary = summaries[0]
    assert done.returncode == 0, json.dumps(summary, indent=1) + done.stdout[-3000:]
    assert summary["faults_total"] == 20
    assert set(summary["faults"]) == KINDS, summary["faults"]
    assert set(summary["violations"].values()) == {0}
    assert summary["acknowledged_puts"] > 500
    assert summary["watchers_caught_up"]
    assert set(summary["unavailability"]) == KINDS
    # the report on disk says the same, and keeps the whole history
    report = json.loads((out / "report.json").read_text())
    assert report["found"] == []
    assert (out / "history.jsonl").read_bytes().count(b"\n") >= summary["operations"]
