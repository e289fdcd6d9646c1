"""loadtest/snapshot_stall.py, small: one ``evq serve`` whose every snapshot is encoded in a
forked child (``--fork-above 0``) while a deep queue fills and a probe times single puts
beside it; the tool reports the probe's answers and how many snapshots children encoded (the
full run, at 10M, is a documented command in loadtest/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_the_stall_tool_probes_a_shard_while_children_encode_its_snapshots(
    tmp_path: Path,
) -> None:
    command = [sys.executable, str(ROOT / "loadtest" / "snapshot_stall.py")]
    command += ["--messages", "30k", "--kind", "client-ids", "--fork-above", "0"]
    command += ["--snapshot-every-s", "0.5", "--after", "3", "--dir", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=200, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    docs = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    assert "snapshot_stall.py --messages 30k" in docs[0]["run"]["command"]
    [row] = [d["row"] for d in docs if "row" in d]
    assert (row["fork_above"], row["kind"], row["messages"]) == ("0", "client-ids", 30_000)
    assert row["snapshots_in_a_child"] >= 1, row  # the server's log says so, once or more
    assert row["probes"] >= 20, row  # a put every 50 ms for 3 s at least
    assert 0 < row["probe_p50_ms"] <= row["probe_p99_ms"] <= row["probe_max_ms"], row
    assert "| 0 | client-ids | 30,000 |" in done.stdout
