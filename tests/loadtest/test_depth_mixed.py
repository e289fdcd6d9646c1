"""loadtest/depth_mixed.py's table: the harness's records of the take-and-ack row at depth
become one row per depth, medians with the runs' range, each depth's rate over the same
target's empty queue; records of other shapes stay out.

The measurement itself needs the shared harness's servers and virtualenv (PostgreSQL, Redis,
asyncpg, redis-py) and fills a million messages per run: a documented command
(loadtest/RESULTS.md), not part of the suite."""

from __future__ import annotations

import json
from pathlib import Path

from tests.loadtest.tables import markdown_rows, run_tool


def _record(group: str, mode: str | None, acked: list[float]) -> str:
    settings = {"producers": 16, "consumers": 16, "depth": 1000}
    if mode is not None:
        settings["mode"] = mode  # type: ignore[assignment]
    runs = [{"acked_s": a, "put_s": 2 * a} for a in acked]
    return json.dumps({"group": group, "name": f"mixed {mode}", "settings": settings, "runs": runs})


def test_the_table_gives_each_depth_and_its_share_of_the_empty_rate(tmp_path: Path) -> None:
    (tmp_path / "evq.jsonl").write_text(
        "\n".join(
            [
                _record("evq", "empty", [90, 100, 110]),
                _record("evq", "queued", [95, 99, 200]),
                _record("evq", "churned", [50, 40, 60]),
                _record("evq", None, [1, 1, 1]),  # the sitting's row: not this table's
            ]
        )
        + "\n"
    )
    (tmp_path / "postgres.jsonl").write_text(
        "\n".join([_record("postgres", "empty", [10]), _record("postgres", "churned", [3])]) + "\n"
    )
    run = run_tool("depth_mixed.py", "--table-only", "--depth", "1000", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    rows = markdown_rows(run.stdout)
    # columns: PostgreSQL, Redis, evq
    assert rows["queue empty"] == ["**10 acked/s** (10-10)", "—", "**100 acked/s** (90-110)"]
    assert rows["1,000 messages queued"] == ["—", "—", "**99 acked/s** (95-200), 99 % of empty"]
    assert rows["1,000 just taken and acked"] == [
        "**3 acked/s** (3-3), 30 % of empty",
        "—",
        "**50 acked/s** (40-60), 50 % of empty",
    ]
    assert (tmp_path / "depth.md").read_text().strip() == run.stdout.strip()


def test_it_refuses_a_depth_below_one() -> None:
    run = run_tool("depth_mixed.py", "--table-only", "--depth", "0")
    assert run.returncode == 2
    assert "--depth must be at least 1" in run.stderr
