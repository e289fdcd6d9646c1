"""What the `evq` commands share: argument types, and output for people or as JSON."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import IO, Any

import msgspec

from actors.cliargs import count_arg
from evq.client_wire import ItemResult

__all__ = [
    "BODY_WIDTH",
    "Output",
    "count_arg",
    "item_results",
    "json_arg",
    "parse_time",
    "plain",
    "seconds_arg",
    "show_body",
    "show_num",
    "show_time",
    "table",
]

BODY_WIDTH = 80  # characters of a body shown in human output

# Item statuses of ack / release / touch and the error code each stands for.
_ITEM_CODES = {"stale_lease": "StaleLease", "not_found": "MessageNotFound"}


# ------------------------------------------------------------------ argument types


def seconds_arg(text: str) -> float:
    """A number of seconds, at least 0 (argparse type)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"seconds must be >= 0, not {text!r}")
    return value


def parse_time(text: str) -> float:
    """Unix seconds from Unix seconds or ISO-8601 (local time when no offset is given)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (ISO-8601 or Unix seconds): {text!r}"
        ) from None


def json_arg(text: str) -> Any:
    """A JSON value (argparse type)."""
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not JSON: {text!r} (quote strings: '\"x\"')") from None


# ------------------------------------------------------------------ output


@dataclass
class Output:
    """Where a command writes, and whether as JSON."""

    out: IO[str]
    err: IO[str]
    json: bool

    def doc(self, value: Any) -> None:
        """One JSON document on one line."""
        print(json.dumps(value, ensure_ascii=False), file=self.out)

    def line(self, text: str = "") -> None:
        """One line of human output."""
        print(text, file=self.out)

    def note(self, text: str) -> None:
        """A remark for people on stderr (never in JSON output)."""
        print(text, file=self.err)


def table(rows: Iterable[Sequence[object]], headers: Sequence[str] | None = None) -> list[str]:
    """Rows as aligned lines (the last column is not padded)."""
    cells = [[str(c) for c in row] for row in ([headers] if headers else []) + list(rows)]
    if not cells:
        return []
    widths = [max(len(r[i]) for r in cells if i < len(r)) for i in range(len(cells[0]))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths, strict=False)) + "  " + r[-1]
        if len(r) > 1
        else r[0]
        for r in cells
    ]


def show_body(body: bytes, width: int = BODY_WIDTH) -> str:
    """A body for people: text as is, text with control characters quoted, else its size."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return f"<{len(body)} bytes, binary>"
    if not text.isprintable():
        text = json.dumps(text, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def show_num(value: object) -> str:
    """A number for people (whole floats without ``.0``; None as ``-``)."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return "-" if value is None else str(value)


def show_time(seconds: float | None) -> str:
    """Unix seconds for people: local ISO-8601 to the millisecond (None as ``-``)."""
    if seconds is None:
        return "-"
    return datetime.fromtimestamp(seconds).isoformat(sep=" ", timespec="milliseconds")


def plain(value: Any) -> Any:
    """Structs as JSON-ready builtins."""
    return msgspec.to_builtins(value)


def item_results(results: list[ItemResult], verb: str, out: Output) -> int:
    """Per-item results of ack / release / touch (with the new lease expiry when there is
    one); exit code 1 when an item failed, each failure named on stderr."""
    if out.json:
        out.doc({"results": plain(results)})
    else:
        expiry = any(r.lease_expires_at is not None for r in results)
        rows = [
            (r.id, r.status, *([show_time(r.lease_expires_at)] if expiry else [])) for r in results
        ]
        for line in table(rows):
            out.line(line)
    failed = [r for r in results if not r.ok]
    for r in failed:
        code = _ITEM_CODES.get(r.status, "Conflict")
        out.note(f"evq {verb}: {code}: message {r.id}: {r.status}")
    return 1 if failed else 0
