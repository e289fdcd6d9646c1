"""loadtest/index_memory.py, small: each index is built in a process of its own, and the
table ranks them as the full run does (today's state with bodies above the same without
bodies, both far above the columnar sketch; the runs a spilling shard holds below all).
The full run (1M and 2M messages) is a documented command (docs/DESIGN-NOTES.md)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_table_ranks_the_indexes_by_bytes_per_message() -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "loadtest" / "index_memory.py"),
            "--messages",
            "20000",
            "60000",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    rows = dict(re.findall(r"^\| ([a-z-]+) \| (\d+) \|", done.stdout, re.MULTILINE))
    kinds = ("engine", "engine-nobody", "runs", "runs-updated", "columns")
    assert set(rows) == set(kinds), done.stdout
    engine, nobody, runs, updated, columns = (int(rows[k]) for k in kinds)
    assert runs < updated < engine // 4  # a patch: the update record's place, no object
    assert engine - nobody >= 100  # each 100-B body is an object of its own
    assert nobody > 3 * columns > 0
    assert runs < 10  # a placed run: a 4-byte length a message, its bodies in the log
