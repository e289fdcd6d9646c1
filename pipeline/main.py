"""Running a pipeline job: ``evq pipeline JOB …``, ``python -m pipeline JOB …``, or
``spark-submit pipeline/__main__.py JOB …`` on a cluster.

Exit codes: 0 done, 1 the job could not run (its reason on stderr), 2 usage error, 3 the
audit found exceptions.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import IO, TYPE_CHECKING

from actors.clock import SystemClock
from actors.logsetup import config_of, make_handler
from pipeline.args import add_arguments

if TYPE_CHECKING:  # pyspark is imported when a job runs
    from pyspark.sql import SparkSession

__all__ = ["build_parser", "main", "run"]

log = logging.getLogger("pipeline")

EXIT_ERROR = 1
EXIT_AUDIT_EXCEPTIONS = 3


def build_parser() -> argparse.ArgumentParser:
    """The standalone parser (the same subcommands as ``evq pipeline``)."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline", description="evq's Spark jobs over the event log"
    )
    add_arguments(parser)
    return parser


def _store_opts(args: argparse.Namespace) -> dict[str, str]:
    return {k: v for k, v in (("endpoint", args.endpoint), ("region", args.region)) if v}


def run(args: argparse.Namespace, err: IO[str] | None = None) -> int:
    """Run the job ``args`` describe (parsed by :func:`pipeline.args.add_arguments`); its
    progress is logged to ``err`` in the ``--log-*`` format and mode, and only for the run."""
    err = err if err is not None else sys.stderr
    try:
        config = config_of(args)
    except ValueError as exc:
        print(f"evq pipeline: {exc}", file=err)
        return 2
    # On the job's own logger, not the root: the job may run inside another program (the
    # `evq` command, a test) whose logging is its own.
    handler = make_handler(config.format, mode=config.mode, stream=err)
    log.addHandler(handler)
    log.setLevel(config.level.upper())
    try:
        return _run(args, err)
    finally:
        log.removeHandler(handler)
        handler.close()  # what the job logged is written before it returns


def _run(args: argparse.Namespace, err: IO[str]) -> int:
    # Imported here: Spark is slow to load and only jobs need it.
    from pipeline.frames import PipelineError
    from pipeline.session import spark_session

    now_ms = SystemClock().now_ms()
    opts = _store_opts(args)
    try:
        from pipeline.frames import check_store

        check_store(args.store, opts)  # before paying for Spark: a wrong store fails fast
        spark = spark_session(args.master)
        return _dispatch(spark, args, opts, now_ms, err)
    except PipelineError as exc:
        print(f"evq pipeline {args.job}: {exc}", file=err)
        return EXIT_ERROR


def _dispatch(
    spark: SparkSession, args: argparse.Namespace, opts: dict[str, str], now_ms: int, err: IO[str]
) -> int:
    if args.job == "stats":
        from pipeline.stats import run_stats

        queues = [q for q in (args.queues or "").split(",") if q] or None
        result = run_stats(
            spark,
            args.store,
            args.out,
            as_of_ms=args.as_of or now_ms,
            opts=opts,
            queues=queues,
            report=not args.no_report,
        )
        print(f"stats: {result.rows} rows for {len(result.queues)} queues in {args.out}", file=err)
        return 0
    if args.job == "audit":
        from pipeline.audit import run_audit

        audit = run_audit(
            spark,
            args.store,
            args.out,
            as_of_ms=args.as_of or now_ms,
            max_deliveries=args.max_deliveries,
            opts=opts,
        )
        found = {k: n for k, n in audit.counts.items() if n}
        print(f"audit: {audit.messages} messages, fates {audit.fates}", file=err)
        if found:
            print(f"audit: EXCEPTIONS {found} (details in {args.out}/audit.json)", file=err)
            return EXIT_AUDIT_EXCEPTIONS
        print("audit: every message is accounted for", file=err)
        return 0
    from pipeline.archive import run_archive

    before = args.before if args.before is not None else now_ms - args.older_than
    archived = run_archive(spark, args.store, args.out, before_ms=before, opts=opts)
    print(f"archive: {archived.rows} event rows added to {archived.path}", file=err)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pipeline`` and spark-submit."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 2
    return run(args)
