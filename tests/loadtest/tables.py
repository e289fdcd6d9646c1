"""The Markdown tables the load tools print, read back for the tests."""

from __future__ import annotations


def markdown_rows(text: str) -> dict[str, list[str]]:
    """Each row of the tables in ``text`` by its first cell: the other cells, in order (the
    header row too, by its first cell; separator rows left out)."""
    return {
        line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:]
        for line in text.splitlines()
        if line.startswith("| ") and "---" not in line
    }
