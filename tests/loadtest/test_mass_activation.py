"""loadtest/mass_activation.py (issue 33) at a small scale against a real ``evq serve``:
5,000 messages due at one second, all ready within a second of it, then drained whole; on
top of 3,000 deferred for hours (``--depth``), which stay."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.mark.parametrize(("procs", "depth"), [(1, 0), (2, 3000)])
def test_the_messages_due_at_one_time_are_ready_within_a_second_and_drained(
    tmp_path: Path, procs: int, depth: int
) -> None:
    tool = ROOT / "loadtest" / "mass_activation.py"
    args = ["--count", "5000", "--lead", "3", "--consumers", "3", "--dir", str(tmp_path)]
    args += ["--procs", str(procs)]  # 2: the consumers in processes of their own
    args += ["--depth", str(depth), "--depth-spread", "1h..30d"]
    done = subprocess.run(
        [sys.executable, str(tool), *args], capture_output=True, text=True, timeout=220
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    woke = next(x["activation"] for x in lines if "activation" in x)
    assert woke["all_ready_after_s"] is not None
    assert -0.05 <= woke["first_ready_after_s"] <= woke["all_ready_after_s"] < 1.0
    drain = next(x["drain"] for x in lines if "drain" in x)
    assert drain["drained"] == 5000
    assert (drain["consumers"], drain["procs"]) == (3, procs)
    assert drain["takes"] >= 50 + 3  # 100 a take, and one empty take per consumer at the end
    assert 0 < drain["take_p50_ms"] <= drain["take_p99_ms"] <= drain["take_max_ms"]
    if depth:
        filled = next(x["depth_filled"] for x in lines if "depth_filled" in x)
        assert filled["depth"] == depth
    assert f"| {depth:,} | 5,000 |" in done.stdout
    assert list(tmp_path.iterdir()) == []  # its data directory went with it
