"""Logging for every evq process, as text, key=value or JSON, that never blocks (unless asked to).

The gateway, its worker processes, the shard actors, the handler actors and their workers
all log through :func:`setup_logging`: the caller only puts a record on a bounded in-memory
queue; a thread formats and writes it. When the sink is slow and the queue is full, one of
two policies applies:

- ``drop`` (the default): the record is dropped and counted; the writer reports the count
  ("dropped N log records") as soon as it catches up, and :func:`dropped` gives the total
  (exported as a metric by the gateway).
- ``block``: the caller waits for room — no record is ever lost, at the price of a process
  that slows down with its log sink.

A process that serves one shard or one handler names it in every record (``fields``: e.g.
``{"shard": 1}``); a record whose message starts with ``queue %s`` (the convention of evq's
log lines about one queue) carries that queue as ``queue``. The settings reach the shard and
handler processes as a :class:`LogConfig` in their constructor arguments; a Ray driver (the
gateway, ``evq handle``) prints what its workers write through the same handler
(:func:`forward_ray_output`), so its output is one stream in one format.

Pure of evq's own modules (``msgspec`` apart), so that the gateway and the actors import it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import sys
import threading
from collections.abc import Mapping
from typing import IO, Any

import msgspec

__all__ = [
    "FORMATS",
    "MODES",
    "JsonFormatter",
    "KeyValueFormatter",
    "LogConfig",
    "NonBlockingHandler",
    "TextFormatter",
    "add_log_arguments",
    "config_of",
    "configure",
    "dropped",
    "forward_ray_output",
    "make_handler",
    "setup_logging",
    "worker_records",
]

FORMATS = ("text", "kv", "json")
MODES = ("drop", "block")
TEXT_FORMAT = "%(asctime)s %(levelname)s {prefix}%(name)s: %(message)s"
WORKER_LOGGER = "ray.worker"  # the logger name of lines a Ray driver forwards

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


class LogConfig(msgspec.Struct, frozen=True):
    """How a process logs: ``level``, ``format`` (text, kv, json), ``mode`` (drop, block)."""

    level: str = "INFO"
    format: str = "text"
    mode: str = "drop"

    def check(self) -> LogConfig:
        """This config, checked.

        Raises:
            ValueError: an unknown format or mode.
        """
        if self.format not in FORMATS:
            raise ValueError(f"log format must be text, kv or json, not {self.format!r}")
        if self.mode not in MODES:
            raise ValueError(f"log mode must be drop or block, not {self.mode!r}")
        return self


def add_log_arguments(p: argparse.ArgumentParser) -> None:
    """``--log-level``, ``--log-format`` and ``--log-mode`` (read by :func:`config_of`)."""
    p.add_argument("--log-level", metavar="LEVEL", help="default: $EVQ_LOG_LEVEL or INFO")
    p.add_argument("--log-format", choices=FORMATS, help="default: $EVQ_LOG_FORMAT or text")
    p.add_argument(
        "--log-mode",
        choices=MODES,
        help="a slow log sink: drop records and count them (default), or block; also $EVQ_LOG_MODE",
    )


def config_of(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> LogConfig:
    """How a command logs: its ``--log-*`` options, else ``EVQ_LOG_*``, else INFO, text, drop.

    Raises:
        ValueError: an unknown format or mode in the environment.
    """
    env = os.environ if env is None else env
    return LogConfig(
        level=args.log_level or env.get("EVQ_LOG_LEVEL") or "INFO",
        format=args.log_format or env.get("EVQ_LOG_FORMAT") or "text",
        mode=args.log_mode or env.get("EVQ_LOG_MODE") or "drop",
    ).check()


def _extra(record: logging.LogRecord) -> dict[str, Any]:
    # Private attributes (Ray's record factory adds _ray_timestamp_ns) are not fields.
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and k[:1] != "_"}


def _forwarded(record: logging.LogRecord) -> str | None:
    """The line a worker wrote, when ``record`` carries one (see forward_ray_output)."""
    line = record.__dict__.get("_line")
    return line if isinstance(line, str) else None


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and any ``extra`` fields. A
    worker's line that is already a JSON object is passed on as it is."""

    def format(self, record: logging.LogRecord) -> str:
        line = _forwarded(record)
        if line is not None and line.startswith("{") and line.endswith("}"):
            return line
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
    """``ts=… level=… logger=… msg="…" key=value …`` (logfmt). A worker's line that is
    already logfmt is passed on as it is."""

    def format(self, record: logging.LogRecord) -> str:
        line = _forwarded(record)
        if line is not None and line.startswith("ts="):
            return line
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


class TextFormatter(logging.Formatter):
    """``time LEVEL prefix logger: message``; a worker's line as Ray prints it,
    ``(Actor pid=N) line``."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__(TEXT_FORMAT.format(prefix=prefix))

    def format(self, record: logging.LogRecord) -> str:
        line = _forwarded(record)
        if line is None:
            return super().format(record)
        actor = record.__dict__.get("actor")
        return f"({actor + ' ' if actor else ''}pid={record.__dict__.get('pid')}) {line}"


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
    """Log records dropped so far in this process because the sink was slow (``drop``)."""
    return _stats.dropped


class _Context(logging.Filter):
    """Adds the process's fields (its shard, its handler) and the queue a record is about."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        super().__init__()
        self.fields = dict(fields)

    def filter(self, record: logging.LogRecord) -> bool:
        if _forwarded(record) is not None:
            return True  # another process's line: its fields are its own
        for key, value in self.fields.items():
            record.__dict__.setdefault(key, value)
        args = record.args
        if (
            "queue" not in record.__dict__
            and isinstance(record.msg, str)
            and record.msg.startswith("queue %s")
            and isinstance(args, tuple)
            and args
            and isinstance(args[0], str)
        ):
            record.queue = args[0]
        return True


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
            note.dropped = n
            self.filter(note)
            self.stream.write(self.format(note) + "\n")

    def close(self) -> None:
        """Write what is queued, then stop the writer."""
        try:
            self.queue.put(None, timeout=5)
            self._thread.join(timeout=5)
        except queue.Full:
            pass
        super().close()


def make_handler(
    fmt: str = "text",
    *,
    mode: str = "drop",
    capacity: int = 10_000,
    stream: IO[str] | None = None,
    prefix: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> NonBlockingHandler:
    """A non-blocking handler writing ``fmt`` to ``stream`` (stderr by default), installed
    nowhere: :func:`setup_logging` puts one on the root logger; a job that runs inside
    another program (``evq pipeline``) puts one on its own logger."""
    fields = dict(fields or {})
    handler = NonBlockingHandler(stream or sys.stderr, capacity=capacity, block=mode == "block")
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    elif fmt == "kv":
        handler.setFormatter(KeyValueFormatter())
    else:
        if prefix is None:
            prefix = "".join(f"{k}={v} " for k, v in fields.items())
        handler.setFormatter(TextFormatter(prefix))
    handler.addFilter(_Context(fields))
    return handler


def setup_logging(
    level: str = "INFO",
    fmt: str = "text",
    *,
    mode: str = "drop",
    capacity: int = 10_000,
    stream: IO[str] | None = None,
    prefix: str | None = None,
    fields: Mapping[str, Any] | None = None,
) -> NonBlockingHandler:
    """Route every log record of this process through a non-blocking handler on stderr (or
    ``stream``), instead of the handlers the root logger had.

    ``fmt``: ``text``, ``kv`` (key=value) or ``json``; ``mode``: ``drop`` or ``block``;
    ``fields`` go into every record (as ``key=value`` before the logger's name in text,
    unless ``prefix`` says otherwise).

    Raises:
        ValueError: an unknown format or mode.
    """
    LogConfig(level, fmt, mode).check()
    handler = make_handler(
        fmt, mode=mode, capacity=capacity, stream=stream, prefix=prefix, fields=fields
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    return handler


def configure(config: LogConfig, **fields: Any) -> NonBlockingHandler:
    """:func:`setup_logging` with ``config`` and ``fields``: the set-up of a shard or handler
    process (Ray keeps its workers' stderr in its session's log files and sends it on to the
    driver).

    Raises:
        ValueError: an unknown format or mode.
    """
    return setup_logging(config.level, config.format, mode=config.mode, fields=fields)


def forward_ray_output(handler: logging.Handler | None = None) -> bool:
    """In a Ray driver, after ``ray.init``: print what the workers write (the lines Ray
    sends to the driver) through ``handler`` (default: the one :func:`setup_logging`
    installed) — in its format, never blocking in ``drop`` mode — instead of Ray's printer,
    and let the ``ray`` logger's records reach it too. False when there is no such handler
    or this Ray has no such hook (then Ray prints as it does by default)."""
    found = [h for h in logging.getLogger().handlers if isinstance(h, NonBlockingHandler)]
    sink = handler or (found[0] if found else None)
    if sink is None:
        return False
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    if not hasattr(dispatcher, "remove_handler"):
        return False

    def forward(batch: dict[str, Any]) -> None:
        for record in worker_records(batch):
            sink.handle(record)

    dispatcher.remove_handler("ray_print_logs")  # the name ray.shutdown() removes again
    dispatcher.add_handler("ray_print_logs", forward)
    ray_logger = logging.getLogger("ray")
    for old in list(ray_logger.handlers):
        ray_logger.removeHandler(old)
    ray_logger.propagate = True
    return True


def worker_records(batch: Mapping[str, Any]) -> list[logging.LogRecord]:
    """The lines of one batch Ray sends a driver (``pid``, ``actor_name``, ``lines``) as
    records the formatters print as they are, or wrap (see :func:`forward_ray_output`)."""
    actor = batch.get("actor_name") or batch.get("task_name") or ""
    lines = batch.get("lines", ())
    if batch.get("pid") == "autoscaler":  # only its events, as Ray prints them
        from ray._private.worker import filter_autoscaler_events

        lines = filter_autoscaler_events(list(lines))
    records = []
    for line in lines:
        record = logging.LogRecord(WORKER_LOGGER, logging.INFO, "", 0, line, None, None)
        record.__dict__.update(_line=line, pid=batch.get("pid"), actor=actor)
        records.append(record)
    return records
