"""The Markdown tables the load tools print, read back for the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_tool(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``loadtest/<tool>`` run with ``args`` from the repository's root (60 s at most)."""
    return subprocess.run(
        [sys.executable, f"loadtest/{tool}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def markdown_rows(text: str) -> dict[str, list[str]]:
    """Each row of the tables in ``text`` by its first cell: the other cells, in order (the
    header row too, by its first cell; separator rows left out)."""
    return {
        line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:]
        for line in text.splitlines()
        if line.startswith("| ") and "---" not in line
    }
