"""loadtest/sitting.py's table: the harness's records of the five targets become one row per
load shape, medians with the runs' range, evq over the best peer of the row, and records of
other shapes stay out.

The sitting itself needs the shared harness's servers (beanstalkd, RabbitMQ, PostgreSQL,
Redis) and takes about 25 minutes: it is a documented command (loadtest/RESULTS.md), not part
of the suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.loadtest.tables import markdown_rows, run_tool


def _record(group: str, name: str, runs: list[dict[str, float]], **settings: Any) -> str:
    settings = {"size": 100, "procs": 1, **settings}
    rec = {"group": group, "name": name, "settings": settings, "runs": runs, "ts": "T"}
    return json.dumps(rec)


def _puts(*rates: float, p50: float = 1.0) -> list[dict[str, float]]:
    return [{"put_s": r, "put_p50_ms": p50 + i} for i, r in enumerate(rates)]


def test_the_table_shows_medians_per_target_and_shape(tmp_path: Path) -> None:
    beanstalkd = [
        _record(
            "beanstalkd",
            "fsync-always (-f 0) put, 1 producers, 100 B",
            _puts(10, 30, 20),
            producers=1,
        ),
        _record(
            "beanstalkd",
            "fsync-always (-f 0) put, 64 producers, 100 B",
            _puts(7, 8, 9),
            producers=64,
            procs=8,
        ),
        _record("beanstalkd", "default (-f 50) put, 1 producers, 100 B", _puts(999), producers=1),
        _record(
            "beanstalkd",
            "fsync-always (-f 0) put, 1 producers, 4096 B",
            _puts(998),
            producers=1,
            size=4096,
        ),
        _record(
            "beanstalkd",
            "fsync-always (-f 0) mixed 16 prod + 16 cons (reserve+delete), 100 B",
            [{"put_s": 50, "acked_s": a} for a in (4, 6, 5)],
            producers=16,
            consumers=16,
        ),
    ]
    evq = [
        _record("evq", "put, 1 producers, 100 B", _puts(100, 300, 200), producers=1),
        _record("evq", "put x100 per request, 16 producers, 100 B", _puts(1, 2, 3), producers=16),
        _record("evq", "put, 64 producers, 100 B, 8 procs", _puts(5), producers=64, procs=8),
        # a newer record of the same shape replaces the older one
        _record("evq", "put, 64 producers, 100 B, 8 procs", _puts(6), producers=64, procs=8),
    ]
    postgres = [
        _record("postgres", "pgmq-style put, 1 producers, 100 B", _puts(40, 50, 60), producers=1),
        _record(
            "postgres",
            "pgmq-style mixed 16 prod + 16 cons (take 1 + ack), 100 B",
            [{"put_s": 9, "acked_s": a} for a in (2, 3, 4)],
            producers=16,
            consumers=16,
        ),
    ]
    redis = [
        _record(
            "redis",
            "appendfsync always put, 64 producers, 100 B",
            _puts(3, 4, 5),
            producers=64,
            procs=8,
        ),
    ]
    floor = [
        # the floor is shown, never the best "peer" (it would be, by far)
        _record("floor", "put, 1 producers, 100 B", _puts(900, 1000, 1100), producers=1),
    ]
    (tmp_path / "floor.jsonl").write_text("\n".join(floor) + "\n")
    (tmp_path / "postgres.jsonl").write_text("\n".join(postgres) + "\n")
    (tmp_path / "redis.jsonl").write_text("\n".join(redis) + "\n")
    (tmp_path / "beanstalkd.jsonl").write_text("\n".join(beanstalkd) + "\n")
    (tmp_path / "evq.jsonl").write_text("\n".join(evq) + "\n")
    run = run_tool("sitting.py", "--table-only", "--out", str(tmp_path))
    assert run.returncode == 0, run.stderr
    rows = markdown_rows(run.stdout)
    # columns: beanstalkd, RabbitMQ, PostgreSQL, Redis, evq, the floor, evq over the best peer
    assert rows["1 producer, single puts"] == [
        "20/s (10-30), p50 2.000 ms",  # the median of the runs' p50s (1, 2, 3)
        "—",
        "50/s (40-60), p50 2.000 ms",
        "—",
        "200/s (100-300), p50 2.000 ms",
        "1,000/s (900-1,100), p50 2.000 ms",
        "4.00x",  # 200 over PostgreSQL's 50, not over the floor's 1,000
    ]
    assert rows["64 producers, single puts, 8 load-generator processes"] == [
        "8/s (7-9)",
        "—",
        "—",
        "4/s (3-5)",
        "6/s (6-6)",
        "—",
        "0.75x",  # 6 over beanstalkd's 8
    ]
    mixed = rows["16 producers + 16 consumers (take 1, ack)"]
    assert mixed[0] == "50 put/s, **5 acked/s** (4-6)"
    assert mixed[2] == "9 put/s, **3 acked/s** (2-4)"
    assert mixed[4:] == ["—", "—", "—"]  # no evq record: no ratio
    assert rows["16 producers, 100 messages per put"] == ["—"] * 4 + [
        "200 msg/s (100-300)",
        "—",
        "—",
    ]
    assert rows["16 producers, single puts"] == ["—"] * 7
    assert (tmp_path / "table.md").read_text().strip() == run.stdout.strip()
