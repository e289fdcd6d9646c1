"""Logging that never blocks the server (unless asked to), as text, key=value or JSON.

The event loop only puts a record on a bounded in-memory queue; a thread formats and writes
it. When the sink is slow and the queue is full, one of two policies applies:

- ``drop`` (the default): the record is dropped and counted; the writer reports the count
  ("dropped N log records") as soon as it catches up, and :func:`dropped` gives the total
  (exported as a metric).
- ``block``: the caller waits for room — no record is ever lost, at the price of a server
  that slows down with its log sink.
"""

from __future__ import annotations

import json
import logging
import queue
import sys
import threading
from typing import IO, Any

__all__ = ["JsonFormatter", "KeyValueFormatter", "dropped", "setup_logging"]

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra(record),
        }
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, default=str)


class KeyValueFormatter(logging.Formatter):
    """``ts=… level=… logger=… msg="…" key=value …`` (logfmt)."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": f"{record.created:.3f}",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_extra(record),
        }
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{k}={_logfmt(v)}" for k, v in fields.items())


def _logfmt(value: Any) -> str:
    text = str(value)
    if text and not any(c in text for c in ' "=\n\t'):
        return text
    return json.dumps(text)


class _Stats:
    dropped = 0
    reported = 0


_stats = _Stats()


def dropped() -> int:
    """Log records dropped so far because the sink was slow (``drop`` mode)."""
    return _stats.dropped


class NonBlockingHandler(logging.Handler):
    """Puts records on a bounded queue; a daemon thread writes them to ``stream``."""

    def __init__(self, stream: IO[str], *, capacity: int = 10_000, block: bool = False) -> None:
        super().__init__()
        self.stream = stream
        self.block = block
        self.queue: queue.Queue[logging.LogRecord | None] = queue.Queue(capacity)
        self._thread = threading.Thread(target=self._run, name="evq-log-writer", daemon=True)
        self._thread.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg = record.getMessage()  # freeze the arguments now, format later
            record.args = None
            if self.block:
                self.queue.put(record)
            else:
                self.queue.put_nowait(record)
        except queue.Full:
            _stats.dropped += 1

    def _run(self) -> None:
        while True:
            record = self.queue.get()
            if record is None:
                return
            try:
                self._report_drops()
                self.stream.write(self.format(record) + "\n")
                if self.queue.empty():
                    self.stream.flush()
            except Exception:  # a broken sink must not kill the writer
                self.handleError(record)

    def _report_drops(self) -> None:
        n = _stats.dropped - _stats.reported
        if n > 0:
            _stats.reported += n
            note = logging.LogRecord(
                "evq.logs", logging.WARNING, __file__, 0, "dropped %d log records", (n,), None
            )
            note.dropped = n  # type: ignore[attr-defined]
            self.stream.write(self.format(note) + "\n")

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        try:
            self.queue.put(None, timeout=5)
            self._thread.join(timeout=5)
        except queue.Full:
            pass
        super().close()


def setup_logging(
    level: str = "INFO",
    fmt: str = "text",
    *,
    mode: str = "drop",
    capacity: int = 10_000,
    stream: IO[str] | None = None,
    prefix: str = "",
) -> NonBlockingHandler:
    """Route every log record through a non-blocking handler on stderr (or ``stream``).

    ``fmt``: ``text``, ``kv`` (key=value) or ``json``; ``mode``: ``drop`` or ``block``.
    """
    if fmt not in ("text", "kv", "json"):
        raise ValueError(f"log format must be text, kv or json, not {fmt!r}")
    if mode not in ("drop", "block"):
        raise ValueError(f"log mode must be drop or block, not {mode!r}")
    handler = NonBlockingHandler(stream or sys.stderr, capacity=capacity, block=mode == "block")
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif fmt == "kv":
        handler.setFormatter(KeyValueFormatter())
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s")
        )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler
