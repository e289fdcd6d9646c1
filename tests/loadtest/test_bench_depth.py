"""loadtest/bench_depth.py (issue 22): how the puts are spread over the queues, the memory
guard's arithmetic, and the tool end to end at a small scale against a real ``evq serve``
(20k and 50k messages on 10 queues, restarting at each depth, then the churn acking half):
every depth reached exactly, the churn's acks and what is left exact, and the numbers sane.
One queue is the same code with one share (``share`` and ``churn_acks`` are tested for it
below; the suite's time is dear). The real runs (1M to 100M messages, 100 queues) are the
commands of the tool's docstring, not part of the suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "loadtest"))

import argparse

from bench_depth import GIB, count, duration, over_memory, parse, spread
from bench_depth_load import batches, churn_acks, plan, put_body, share

ROOT = Path(__file__).resolve().parents[2]
DEPTHS = (20_000, 50_000)  # below ~10k messages the RSS they add is lost in Ray's noise


def test_the_puts_fill_each_queue_to_its_share_round_robin() -> None:
    assert [share(10, 3, i) for i in range(3)] == [4, 3, 3]
    puts = plan(10, 2510, 3, 500)  # from 4, 3, 3 to 837, 837, 836
    assert puts[:3] == [(0, 500), (1, 500), (2, 500)]
    for index in range(3):
        put = sum(n for i, n in puts if i == index)
        assert put == share(2510, 3, index) - share(10, 3, index)
    assert max(n for _, n in puts) == 500
    assert plan(7, 7, 5, 1000) == []


def test_the_churn_acks_half_of_each_queue_s_share_rounded_down() -> None:
    assert churn_acks(50_000, 1) == [25_000]
    assert churn_acks(10, 3) == [2, 1, 1]  # shares 4, 3, 3
    assert churn_acks(1, 2) == [0, 0]


def test_the_churn_that_keeps_the_first_queue_acks_every_other_queue_whole() -> None:
    assert churn_acks(10, 3, keep_first=True) == [0, 3, 3]
    assert churn_acks(1_000_000, 2, keep_first=True) == [0, 500_000]
    assert batches([2500, 0, 1000], 1000) == [(0, 1000), (2, 1000), (0, 1000), (0, 500)]


def test_a_put_body_holds_distinct_bodies_of_the_size_asked() -> None:
    bodies = [m["body"] for m in json.loads(put_body(1000, 100))["messages"]]
    assert len(bodies) == 1000
    assert {len(b) for b in bodies} == {100}
    assert len(set(bodies)) == 1000


def test_a_put_body_delays_its_messages_by_one_time_or_each_by_its_own() -> None:
    one = json.loads(put_body(50, 10, (3600.0, 3600.0)))["messages"]
    assert {m["delay"] for m in one} == {3600.0}
    own = [m["delay"] for m in json.loads(put_body(500, 10, (3600.0, 30 * 86_400.0)))["messages"]]
    assert all(3600.0 <= d <= 30 * 86_400.0 for d in own)
    assert len(set(own)) > 450  # each its own time
    assert "delay" not in json.loads(put_body(5, 10))["messages"][0]


def test_a_put_body_gives_each_message_two_attributes_with_any_timing() -> None:
    for timing in (None, (60.0, 60.0), (60.0, 3600.0)):
        messages = json.loads(put_body(200, 10, timing, attrs=True))["messages"]
        assert all(sorted(m["attributes"]) == ["tenant", "trace"] for m in messages)
        assert len({m["attributes"]["trace"] for m in messages}) == 200  # random, not one
        assert all(("delay" in m) == (timing is not None) for m in messages)
    assert "attributes" not in json.loads(put_body(5, 10))["messages"][0]


def test_a_put_body_gives_groups_or_client_ids_as_the_kinds_ask() -> None:
    fifo = json.loads(put_body(2000, 10, kinds=frozenset({"fifo"})))["messages"]
    groups = {m["group"] for m in fifo}
    assert len(groups) > 800
    assert groups <= {f"g{g:03d}" for g in range(1000)}
    assert all("id" not in m for m in fifo)
    own = json.loads(put_body(1000, 10, (60.0, 60.0), kinds=frozenset({"client_ids"})))["messages"]
    assert len({m["id"] for m in own}) == 1000  # 64 random bits each
    assert all(len(m["id"]) == 16 and m["delay"] == 60.0 for m in own)
    both = json.loads(put_body(3, 10, attrs=True, kinds=frozenset({"fifo", "client_ids"})))
    assert all({"group", "id", "attributes"} <= set(m) for m in both["messages"])


def test_delays_take_units_and_a_spread_must_grow() -> None:
    assert [duration(x) for x in ("90s", "30m", "1h", "2d", "45")] == [90, 1800, 3600, 172_800, 45]
    assert spread("1h..30d") == (3600, 30 * 86_400)
    for bad in ("1x", "0s", "-1h"):
        with pytest.raises(argparse.ArgumentTypeError):
            duration(bad)
    for bad in ("30d..1h", "1h", "1h..1h"):
        with pytest.raises(argparse.ArgumentTypeError):
            spread(bad)
    with pytest.raises(SystemExit):
        parse(["--delay", "1h", "--delay-spread", "1h..2h"])
    assert parse(["--delay-spread", "1h..30d"]).delay_spread == (3600, 30 * 86_400)


def test_depths_take_suffixes() -> None:
    assert [count(x) for x in ("2000", "50k", "1M", "10M", "100M", "1.5M")] == [
        2000,
        50_000,
        10**6,
        10**7,
        10**8,
        1_500_000,
    ]


def test_the_guard_projects_the_cost_per_message_to_the_next_depth() -> None:
    base, limit, plenty = GIB, 18 * GIB, 20 * GIB
    at_1m = base + 500 * 10**6  # 500 B per message
    assert over_memory(at_1m, base, 10**6, 10**7, limit, plenty) is None  # 5.9 GiB at 10M
    why = over_memory(at_1m, base, 10**6, 10**8, limit, plenty)  # 47.5 GiB at 100M
    assert why is not None
    assert "500 B" in why
    assert "--max-rss-gib 18.0" in why
    assert "available" in str(over_memory(at_1m, base, 10**6, 10**7, limit, 4 * GIB))
    assert over_memory(at_1m, base, 50_000, 10**8, limit, plenty) is None  # too few to project
    # a hundredth of the target at least: the first 157k of a 100M FIFO fill cost 350 B
    # each (the server's fixed costs), the 100M 30
    early = base + 350 * 157_000
    assert over_memory(early, base, 157_000, 10**8, limit, plenty) is None
    assert over_memory(early, base, 157_000, 10**7, limit, plenty) is None
    assert "past" in str(over_memory(limit + 1, base, 0, 1, limit, plenty))


def _run(tmp_path: Path, queues: int) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    command = [
        sys.executable, str(ROOT / "loadtest" / "bench_depth.py"),
        "--depths", *map(str, DEPTHS), "--queues", str(queues), "--takes", "30",
        "--settle", "0.5", "--dir", str(tmp_path),
        "--churn", "--churn-quiet", "2", "--churn-wait", "30", "--backoff-churn", "1s",
        "--backoff-jitter", "1s",
    ]  # fmt: skip
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.terminate()  # the tool stops its server on SIGTERM (a kill would leave it)
        out, err = proc.communicate(timeout=60)
    lines = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    return subprocess.CompletedProcess(command, proc.returncode, out, err), lines


@pytest.mark.integration  # starts evq serve three times: ~20 s each; the churn ~5 s
@pytest.mark.timeout(240)
@pytest.mark.parametrize("queues", [10])
def test_the_tool_fills_measures_and_restarts_at_each_depth(tmp_path: Path, queues: int) -> None:
    done, lines = _run(tmp_path, queues)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = next(x["run"] for x in lines if "run" in x)
    assert run["machine"]["cpus"] >= 1
    assert len(run["commit"]) == 40
    assert "bench_depth.py --depths" in run["command"]
    base = next(x["base"] for x in lines if "base" in x)
    assert base["rss_bytes"] > 100 * 2**20  # the gateway, Ray and a shard at least

    rows = [x["depth"] for x in lines if "depth" in x]
    assert [r["depth"] for r in rows] == list(DEPTHS)
    for row in rows:
        assert row["queues"] == queues
        assert row["fill_msgs_per_s"] > 0
        assert 0 < row["rss_per_msg"] < 20_000, row
        assert row["disk_per_msg"] > 50  # 100 random base64 characters a message, compressed
        take = row["take"]
        assert take["takes"] == 30
        assert take["messages_per_take"] == 100
        assert 0 < take["p50_ms"] <= take["p99_ms"] <= take["max_ms"]
        restart = row["restart"]
        assert restart["seconds"] > 0
        assert restart["stop"]["exit_code"] == 0
        stats = restart["stats"]
        assert stats["total"] == stats["ready"] == row["depth"]  # the whole depth back
    assert "| depth | fill msg/s |" in done.stdout
    assert f"| {DEPTHS[-1]:,} |" in done.stdout
    _check_backoff(lines, done.stdout)
    _check_churn(lines, queues, done.stdout)


def _check_backoff(lines: list[Any], stdout: str) -> None:
    """Every message taken once and released 1-2 s later, the RSS weighed before and after."""
    backoff = next(x["backoff_churn"] for x in lines if "backoff_churn" in x)
    assert (backoff["depth"], backoff["released"], backoff["backoff_s"]) == (DEPTHS[-1],) * 2 + (
        1.0,
    )
    assert backoff["jitter_s"] == 1.0  # each message its own time: given back one at a time
    assert backoff["releases_per_s"] > 0
    assert backoff["rss_per_msg"] > 0
    assert backoff["restart_s"] > 0  # restarted on the churned queue, weighed again
    assert backoff["rss_per_msg_after_restart"] is not None
    # at 50k messages the untouched figure may be lost in Ray's noise, so only its sign
    # says whether there is a ratio
    over = backoff["over_untouched"]
    assert over is None or over > 0
    assert "| depth | backoff s | released msg/s |" in stdout
    assert f"| {DEPTHS[-1]:,} | 1..2 |" in stdout
    assert "| restart s | RSS B/msg after restart |" in stdout


def _check_churn(lines: list[Any], queues: int, stdout: str) -> None:
    """Half of each queue's share acked, the rest live, the disk weighed against it."""
    churn = next(x["churn"] for x in lines if "churn" in x)
    depth = DEPTHS[-1]
    assert churn["acked"] == sum(share(depth, queues, i) // 2 for i in range(queues))
    assert churn["acked"] == depth // 2  # 50k over 1 or 10 queues: no rounding
    assert churn["live_messages"] == depth - churn["acked"]
    assert churn["live_body_bytes"] == churn["live_messages"] * 100
    assert churn["acks_per_s"] > 0
    assert isinstance(churn["disk_over_live"], float)
    assert churn["disk_over_live"] > 0
    assert churn["disk_live_bytes"] > 0
    assert churn["disk_archive_bytes"] >= 0
    assert churn["settle_s"] >= 2
    assert "| churn: acked |" in stdout
    assert f"| {churn['acked']:,} |" in stdout
