"""Benchmark of the stats job: Spark (local mode) against the same work in plain Python.

    python -m pipeline.bench --events 10000000 --queues 4 --dir /tmp/evq-bench

Writes a synthetic log first (the pure engine decides puts, takes, acks and releases; the
shard log's codec encodes them, one block per round of every queue's commands, into segments
of about ``--records`` records of one shard log, laid out as ``evq serve --data`` does),
unless ``--dir`` already holds one. Then times:

- ``spark``: :func:`pipeline.stats.run_stats` without the HTML report, in ``--master``
  (default ``local[2]``), after the session has started (its start is printed apart);
- ``python``: the same fold (:func:`pipeline.shardfold.fold_log`, the shard log's queues in
  one pass) and the same per-minute counts and percentiles with pandas, in this one process.

Events are message events: a put of 100 messages counts 100 (the rows the jobs process).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.ids import SequentialIds
from actors.core.state import QueueState
from actors.log import keys
from actors.log.wal import encode_block, encode_record, encode_wal_header
from actors.settings import QueueSettings
from pipeline.logread import SyncStore
from pipeline.shardfold import fold_log
from pipeline.timeline import MINUTE_MS, TIMELINE_SCHEMA

__all__ = ["main", "python_stats", "write_log"]

START_MS = 1_700_000_000_000
_COUNTED = ["put", "taken", "acked", "released", "dead_lettered", "retention_expired"]


def _events_of(command: object, state: QueueState, now: int, ids: SequentialIds) -> list[ev.Event]:
    events, _ = execute(state, command, now, ids)
    return events


def _round(
    state: QueueState, now: int, ids: SequentialIds, batch: int
) -> tuple[list[ev.Event], int]:
    """One queue's commands of a round (a put of ``batch``, a take, acks and releases): its
    events and the message events among them."""
    log = _events_of(cmd.Put([cmd.NewMessage(body=b"x" * 100)] * batch), state, now, ids)
    taken = execute(state, cmd.Take(max=batch), now + 50, ids)
    log += taken[0]
    refs = [cmd.LeaseRef(d.id, d.lease) for d in taken[1]]
    log += _events_of(cmd.Ack(refs[: batch * 9 // 10]), state, now + 50, ids)
    items = [cmd.ReleaseItem(id=r.id, lease=r.lease) for r in refs[batch * 9 // 10 :]]
    if items:
        log += _events_of(cmd.Release(items), state, now + 50, ids)
    return log, batch + 2 * len(refs)


class _Segments:
    """Blocks appended to segment files of shard 0's log, a new one past ``records``."""

    def __init__(self, root: Path, records: int) -> None:
        self.root = root
        self.records = records
        self.lsn = 1
        self.file: Any = None
        self.in_file = 0

    def append(self, groups: list[tuple[str, int, list[ev.Event]]]) -> None:
        if self.file is None or self.in_file >= self.records:
            self.close()
            path = self.root / keys.wal_segment_key(0, self.lsn)
            path.parent.mkdir(parents=True, exist_ok=True)
            self.file = path.open("wb")
            self.file.write(encode_wal_header(1, self.lsn, 0))
            self.in_file = 0
        encoded = [(q, seq, [encode_record(e) for e in events]) for q, seq, events in groups]
        self.file.write(encode_block(1, self.lsn, encoded))
        count = sum(len(events) for _, _, events in groups)
        self.lsn += count
        self.in_file += count

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def write_log(root: Path, events: int, queues: int, records: int, batch: int = 100) -> int:
    """A synthetic shard log of about ``events`` message events over ``queues`` queues;
    returns the time at its end."""
    names = [f"bench{q}" for q in range(queues)]
    states = {name: QueueState() for name in names}
    seqs = dict.fromkeys(names, 1)  # each queue's next record
    ids = SequentialIds()
    now = START_MS
    out = _Segments(root, records)
    out.append([("", 1, [ev.WriterStarted(now, 1, 1)])])  # the shard's claim
    settings = QueueSettings(visibility_timeout_ms=5_000)
    done = -1
    while done < events:
        groups = []
        for name in names:
            if done < 0:
                log, count = _events_of(cmd.Create(name, settings), states[name], now, ids), 0
            else:
                log, count = _round(states[name], now, ids, batch)
            groups.append((name, seqs[name], log))
            seqs[name] += len(log)
            done += count
        out.append(groups)
        done = max(done, 0)
        now += 100
    out.close()
    return now


def python_stats(root: str, as_of_ms: int) -> tuple[int, pd.DataFrame]:
    """The stats job's fold and per-minute aggregates in one process; returns the rows
    processed and the per-minute table."""
    with SyncStore(root) as store:
        batches = list(fold_log(store, 0, as_of_ms))
    table = pa.Table.from_batches(batches, schema=TIMELINE_SCHEMA)
    frame = table.select(["queue", "type", "at_ms", "enqueued_at_ms"]).to_pandas()
    frame["minute"] = frame["at_ms"] // MINUTE_MS * MINUTE_MS
    frame["in_queue"] = frame["at_ms"] - frame["enqueued_at_ms"]
    counts = frame[frame["type"].isin(_COUNTED)].pivot_table(
        index=["queue", "minute"], columns="type", values="at_ms", aggfunc="count"
    )
    acked = frame[frame["type"] == "acked"].groupby(["queue", "minute"])["in_queue"]
    quantiles = acked.quantile([0.5, 0.95, 0.99]).unstack()
    return table.num_rows, counts.join(quantiles)


def main() -> None:
    """Write (if needed) and time; print one line per measurement."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--queues", type=int, default=4)
    p.add_argument("--records", type=int, default=200_000, help="records per segment (about)")
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
