"""Benchmark of the stats job: Spark (local mode) against the same work in plain Python.

    python -m pipeline.bench --events 10000000 --queues 4 --dir /tmp/evq-bench

Writes a synthetic log first (the pure engine decides puts, takes, acks and releases; the
log's codec encodes them into segments of ``--records`` records, laid out as ``evq serve
--data`` does), unless ``--dir`` already holds one. Then times:

- ``spark``: :func:`pipeline.stats.run_stats` without the HTML report, in ``--master``
  (default ``local[2]``), after the session has started (its start is printed apart);
- ``python``: the same fold (:func:`pipeline.logread.fold_queue`, one queue after another)
  and the same per-minute counts and percentiles with pandas, in this one process.

Events are message events: a put of 100 messages counts 100 (the rows the jobs process).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa

from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.ids import SequentialIds
from actors.core.state import QueueState
from actors.log import keys
from actors.log.codec import encode_payloads, encode_segment
from actors.settings import QueueSettings
from pipeline.logread import SyncStore, fold_queue
from pipeline.timeline import MINUTE_MS, TIMELINE_SCHEMA

__all__ = ["main", "python_stats", "write_log"]

START_MS = 1_700_000_000_000
_COUNTED = ["put", "taken", "acked", "released", "dead_lettered", "retention_expired"]


def _events_of(command: object, state: QueueState, now: int, ids: SequentialIds) -> list[ev.Event]:
    events, _ = execute(state, command, now, ids)
    return events


def write_log(root: Path, events: int, queues: int, records: int, batch: int = 100) -> int:
    """A synthetic log of about ``events`` message events over ``queues`` queues; returns
    the time at its end."""
    now = START_MS
    per_queue = events // queues
    for q in range(queues):
        name = f"bench{q}"
        state, ids, now = QueueState(), SequentialIds(), START_MS
        log = [ev.WriterStarted(now, 1, 1)]
        log += _events_of(
            cmd.Create(name, QueueSettings(visibility_timeout_ms=5_000)), state, now, ids
        )
        done = 0
        while done < per_queue:
            log += _events_of(cmd.Put([cmd.NewMessage(body=b"x" * 100)] * batch), state, now, ids)
            now += 50
            taken = execute(state, cmd.Take(max=batch), now, ids)
            log += taken[0]
            refs = [cmd.LeaseRef(d.id, d.lease) for d in taken[1]]
            log += _events_of(cmd.Ack(refs[: batch * 9 // 10]), state, now, ids)
            items = [cmd.ReleaseItem(id=r.id, lease=r.lease) for r in refs[batch * 9 // 10 :]]
            if items:
                log += _events_of(cmd.Release(items), state, now, ids)
            now += 50
            done += 2 * batch + len(refs)
        folder = root / keys.log_prefix(name)
        folder.mkdir(parents=True, exist_ok=True)
        for first in range(0, len(log), records):
            chunk = log[first : first + records]
            data = encode_segment(1, first + 1, encode_payloads(chunk))
            (root / keys.segment_key(name, first + 1)).write_bytes(data)
    return now


def python_stats(root: str, as_of_ms: int) -> tuple[int, pd.DataFrame]:
    """The stats job's fold and per-minute aggregates in one process; returns the rows
    processed and the per-minute table."""
    rows = 0
    tables = []
    with SyncStore(root) as store:
        for queue in sorted(os.listdir(os.path.join(root, "queues"))):
            batches = list(fold_queue(store, queue, as_of_ms))
            table = pa.Table.from_batches(batches, schema=TIMELINE_SCHEMA)
            rows += table.num_rows
            frame = table.select(["queue", "type", "at_ms", "enqueued_at_ms"]).to_pandas()
            frame["minute"] = frame["at_ms"] // MINUTE_MS * MINUTE_MS
            frame["in_queue"] = frame["at_ms"] - frame["enqueued_at_ms"]
            counts = frame[frame["type"].isin(_COUNTED)].pivot_table(
                index=["queue", "minute"], columns="type", values="at_ms", aggfunc="count"
            )
            acked = frame[frame["type"] == "acked"].groupby(["queue", "minute"])["in_queue"]
            quantiles = acked.quantile([0.5, 0.95, 0.99]).unstack()
            tables.append(counts.join(quantiles))
    return rows, pd.concat(tables)


def main() -> None:
    """Write (if needed) and time; print one line per measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--records", type=int, default=2_000, help="records per segment")
    p.add_argument("--dir", default="/tmp/evq-bench")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--skip", choices=["spark", "python"], action="append", default=[])
    args = p.parse_args()
    root = Path(args.dir)
    marker = root / "END_MS"
    if not marker.exists():
        started = time.perf_counter()
        end = write_log(root, args.events, args.queues, args.records)
        marker.write_text(str(end))
        print(f"wrote the log in {time.perf_counter() - started:.1f} s")
    as_of = int(marker.read_text()) + 1
    if "python" not in args.skip:
        started = time.perf_counter()
        rows, _ = python_stats(str(root), as_of)
        took = time.perf_counter() - started
        print(f"python: {rows} rows in {took:.1f} s = {rows / took:,.0f} rows/s")
    if "spark" not in args.skip:
        from pipeline.session import spark_session
        from pipeline.stats import run_stats

        started = time.perf_counter()
        spark = spark_session(args.master, app="evq-bench")
        print(f"spark: session started in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        result = run_stats(spark, str(root), str(root / "out"), as_of_ms=as_of, report=False)
        took = time.perf_counter() - started
        rows = (
            spark.read.format("evq")
            .option("view", "timeline")
            .option("as_of_ms", str(as_of))
            .load(str(root))
            .count()
        )
        print(f"spark {args.master}: {rows} rows in {took:.1f} s = {rows / took:,.0f} rows/s")
        print(f"spark: {result.rows} stats rows")
        spark.stop()


if __name__ == "__main__":
    main()
