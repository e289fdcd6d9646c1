"""Command-line arguments of the pipeline jobs. Imports nothing heavy, so ``evq --help``
stays fast: Spark is loaded only when a job runs (:mod:`pipeline.main`)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime

from actors.cliargs import count_arg
from actors.logsetup import add_log_arguments

__all__ = ["add_arguments", "duration_ms", "time_ms"]

_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_ms(text: str) -> int:
    """Unix ms from ISO-8601 (UTC when no offset is given) or Unix seconds."""
    try:
        return int(float(text) * 1000)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a time (ISO-8601 or Unix seconds): {text!r}"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return int(parsed.timestamp() * 1000)


def duration_ms(text: str) -> int:
    """Milliseconds from ``90s``, ``15m``, ``12h``, ``7d`` (or plain seconds)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration (e.g. 90s, 15m, 12h, 7d): {text!r}")
    return int(float(match[1]) * _UNITS_MS[match[2] or "s"])


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        required=True,
        metavar="URL",
        help="the log: a directory `evq serve --data` wrote, file://, or s3://bucket/prefix",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where the job writes its results")
    p.add_argument(
        "--master",
        default=None,
        help="Spark master (default: local[2]; under spark-submit, the one it was given)",
    )
    p.add_argument("--endpoint", help="S3 endpoint URL (e.g. a local S3-compatible server)")
    p.add_argument("--region", help="S3 region")
    add_log_arguments(p)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``stats``, ``audit`` and ``archive`` subcommands to ``parser``."""
    jobs = parser.add_subparsers(dest="job", required=True, metavar="JOB")
    s = jobs.add_parser("stats", help="per queue and minute: Parquet and an HTML report")
    _common(s)
    s.add_argument("--as-of", type=time_ms, metavar="TIME", help="end of the history (default now)")
    s.add_argument("--queues", help="comma-separated queues (default: all)")
    s.add_argument("--no-report", action="store_true", help="Parquet and JSON only")

    s = jobs.add_parser("audit", help="account for every message; list exceptions (exit 3)")
    _common(s)
    s.add_argument("--as-of", type=time_ms, metavar="TIME", help="end of the history (default now)")
    s.add_argument(
        "--max-deliveries",
        type=count_arg,
        default=5,
        metavar="N",
        help="list messages delivered more than N times (default 5)",
    )

    s = jobs.add_parser("archive", help="events older than a cut-off to Parquet by queue and date")
    _common(s)
    cut = s.add_mutually_exclusive_group()
    cut.add_argument("--before", type=time_ms, metavar="TIME", help="archive events before TIME")
    cut.add_argument(
        "--older-than",
        type=duration_ms,
        default=duration_ms("1d"),
        metavar="AGE",
        help="archive events older than AGE, e.g. 7d (default 1d)",
    )
