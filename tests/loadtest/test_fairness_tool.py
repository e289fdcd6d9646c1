"""loadtest/fairness.py, small: the tool runs ``evq serve`` and measures quiet tenants' time in
queue beside a noisy tenant's backlog, on a fair queue and on one that is not (the full run
is a documented command, loadtest/RESULTS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_fairness_tool_shows_quiet_tenants_served_past_a_noisy_backlog() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "fairness.py"),
            *("--rounds", "1", "--seconds", "4", "--noisy", "4000", "--tenants", "10"),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=240,
    )
    doc = json.loads(done.stdout.strip().splitlines()[-1])
    [run] = doc["rounds"]
    quiet, fair, unfair = run["quiet"], run["fair"], run["unfair"]
    assert quiet["quiet_messages"] > 20
    assert quiet["noisy_taken"] == 0
    # the noisy tenant held (nearly) all that waited, and was served meanwhile
    assert fair["noisy_share_min"] >= 0.99
    assert fair["noisy_taken"] > 0
    # a fair queue served every quiet message in time; one that is not served none of them,
    # the noisy backlog (thousands, at a few hundred a second) ahead of them all
    assert fair["unserved"] == 0, fair
    assert unfair["unserved"] == unfair["quiet_messages"], unfair
    assert unfair["median_ms"] > 10 * fair["median_ms"], run
    assert doc["summary"]["fair_over_quiet_median"] == round(
        fair["median_ms"] / quiet["median_ms"], 2
    )
