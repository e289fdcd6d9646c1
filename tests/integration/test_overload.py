"""Overload and soak, short (loadtest/overload.py): a real ``evq serve`` (two shards, two
gateway processes) with a small shard memory budget is offered 10x its sustainable put load
open-loop for 12 s, then half the sustainable rate with consumers draining until puts are
answered 2xx again, then a 10-s mixed soak on the same server (one server start for both:
the suite's budget, ~60 s in all). The long runs are the same command with ``--minutes``
(loadtest/overload.py's docstring)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(480)]

ROOT = Path(__file__).resolve().parents[2]
# Idle shards are ~130 MiB, and a shard keeps ~50 MiB of its budget as room for the puts its
# gateways can have on their way in and for its next snapshots. Queued bodies stay in the log
# (a message costs a shard ~150 B of memory): the 12-s overload grows a shard by ~50 MiB.
BUDGET_MB = 208


Run = tuple[subprocess.CompletedProcess[str], list[dict[str, Any]]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """One run of the tool for the module's tests (a second would cost the suite ~60 s)."""
    tmp_path = tmp_path_factory.mktemp("overload")
    command = [
        sys.executable, str(ROOT / "loadtest" / "overload.py"), "overload",
        "--minutes", "0.2", "--shard-memory-mb", str(BUDGET_MB), "--shards", "2",
        "--workers", "2", "--calibrate", "4", "--recovery-limit", "60", "--progress", "4",
        "--then-soak", "10", "--warmup", "2", "--dir", str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=400)  # 41 s alone; minutes beside the campaigns
    except subprocess.TimeoutExpired:
        proc.terminate()  # the tool stops its server on SIGTERM (a kill would leave it)
        out, err = proc.communicate(timeout=60)
    done = subprocess.CompletedProcess(command, proc.returncode, out, err)
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    return done, lines


def test_ten_times_the_sustainable_load_gets_429s_within_the_budget_and_recovers(
    run: Run,
) -> None:
    done, lines = run
    summaries = [x["summary"] for x in lines if "summary" in x]
    assert summaries, done.stdout[-3000:] + done.stderr[-3000:]
    summary = summaries[0]
    recovering = [x for x in lines if x.get("progress") == "recovery"]
    drained = {
        op: {k: summary["recovery"].get(op, {}).get(k) for k in ("ok", "messages", "other")}
        for op in ("take", "ack")
    }
    assert summary["failures"] == [], json.dumps([summary["failures"], recovering, drained])[-4000:]

    # overloaded: 10x the messages were offered, the excess got 429 with Retry-After
    assert summary["offered"]["factor"] == 10
    over = summary["overload"]["put"]
    assert over["r429"] > 100, over
    assert over["r429_no_retry_after"] == 0
    for phase in ("overload", "recovery"):
        for op in ("put", "take", "ack"):
            counts = summary[phase].get(op, {})
            assert counts.get("timeout", 0) == 0, (phase, op, counts)
            assert counts.get("conn_error", 0) == 0, (phase, op, counts)

    # memory: the shards' budget was reached, and every process was sampled
    assert over["r429_over_budget"] > 100, over  # the shards refused, not only the gateways
    memory = summary["memory"]
    shards = {k: v for k, v in memory.items() if k.startswith("shard:")}
    assert len(shards) == 2, memory
    for doc in shards.values():
        assert doc["limit_mib"] == BUDGET_MB + summary["allowances"]["shard_mib"]
        assert doc["peak_mib"] > doc["base_mib"], doc  # it held the backlog until it refused
    assert {k.split(":")[0] for k in memory} == {"gateway", "worker", "shard"}
    assert summary["recovery"]["take"]["messages"] > 0  # the consumers drained

    # progress lines came out while it ran
    assert {x["progress"] for x in lines if "progress" in x} >= {"overload", "recovery", "soak"}


def test_after_the_overload_puts_are_answered_again_and_memory_stayed_in_bounds(run: Run) -> None:
    done, lines = run
    summary = next(x["summary"] for x in lines if "summary" in x)
    for name, doc in summary["memory"].items():
        assert doc["peak_mib"] <= doc["limit_mib"], (name, doc)
    recovery = summary["recovery"]
    assert recovery["recovered"], recovery
    assert recovery["seconds_to_recover"] <= 60
    assert recovery["ack"]["messages"] > 0
    assert done.returncode == 0, summary["failures"]


def test_the_soak_samples_every_process_of_the_server(run: Run) -> None:
    done, lines = run
    summaries = [x["summary"] for x in lines if "summary" in x]
    assert summaries, done.stdout[-3000:] + done.stderr[-3000:]
    summary = summaries[0]
    soak = summary["soak"]
    baseline = next(x["baseline"] for x in lines if "baseline" in x)
    assert set(baseline) <= set(soak["processes"]), (baseline, soak["processes"])
    assert soak["roles"]["shard"] == 2
    assert soak["roles"]["gateway"] == 1
    assert soak["roles"]["worker"] == 1
    for name, proc in soak["processes"].items():
        assert proc["samples"] >= 7, (name, proc)
        assert proc["fds_start"] is not None, name
        assert proc["fds_end"] is not None, name
        assert proc["rss_slope_mib_per_hour"] is not None, name
        assert proc["rss_end_mib"] > 0
    for op in ("put", "take", "ack"):
        assert soak["p99_ms_per_minute"][op], op
        assert soak["p99_ms_per_minute"][op][0] is not None
        assert set(soak["p99_ms_first_vs_last_10_min"][op]) == {"first", "last"}
        assert soak["totals"][op]["ok"] > 0
        assert soak["totals"][op]["timeout"] == 0
    assert soak["thresholds"]["judged"] == ["gateway", "worker", "shard"]
    assert soak["thresholds"]["rss_slope_judged"] is False  # 10 s: the warm-up's slope
    assert soak["ok"], soak["failures"]
