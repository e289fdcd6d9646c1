"""Benchmarks of the durable log: a shard's log on the local disk (fsync'd).

  writer    durable records/s through the shard log's group commit with N concurrent
            submitters, each appending one event and waiting until it is durable, then the
            next; and the time from append to durable (p50/p99). ``--queues`` spreads the
            submitters over that many queues of the one shard log; ``--layout objects``
            writes one object per commit through the local object store instead (the
            object-store layout, version 1's write path).
  recovery  time to recover a shard of one queue from a log of N events, with and without
            a snapshot.
  floor     what bounds the writer on this disk: the local log's write path as raw
            syscalls (pwrite of one block into a zero-filled segment, fdatasync), timed; the
            writer and its submitters with a device that accepts every block at once (their
            CPU alone); and the rate a closed loop of N submitters could reach if the two
            only added up. ``--files K`` splits each commit over K files (a log per queue
            with one commit for all: the fallback layout for many queues), each synced.

    .venv/bin/python loadtest/bench_log.py writer --submitters 1 16 64 256 --sizes 100 4096
    .venv/bin/python loadtest/bench_log.py recovery --events 1000000 10000000
    .venv/bin/python loadtest/bench_log.py floor --submitters 64 --dir /work/bench-tmp
    .venv/bin/python loadtest/bench_log.py floor --submitters 64 --files 32 --dir /work/bench-tmp

Results are printed as JSON lines; loadtest/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from actors.clock import SystemClock
from actors.core import events as ev
from actors.core.snapshot import encode_snapshot, snapshot
from actors.core.state import QueueState
from actors.ids import SequentialIds
from actors.log import keys
from actors.log.codec import encode_snapshot_object
from actors.log.device import LocalLogDevice, LogDevice, ObjectLogDevice
from actors.log.shardlog import ShardLog
from actors.log.store import LocalDirStore
from actors.log.wal import encode_block, encode_record, encode_wal_header
from actors.settings import QueueSettings
from actors.shard import QueueShard

# Recent timestamps: recovery advances the clock to now, and old messages would expire.
T0 = int(time.time() * 1000) - 3_600_000


def _put_event(i: int, body: bytes) -> ev.MessagesPut:
    return ev.MessagesPut(T0 + i // 1000, [ev.PutItem(i + 1, body, T0)])


def _device(root: Path, layout: str) -> LogDevice:
    store = LocalDirStore(root)
    return LocalLogDevice(store, 0) if layout == "local" else ObjectLogDevice(store, 0)


async def _writer_run(
    device: LogDevice, submitters: int, size: int, seconds: float, window: int = 1, queues: int = 1
) -> dict:
    """``submitters`` producers over ``queues`` queues, each keeping ``window`` appends
    waiting for durability (1: append, wait, append — a closed loop)."""
    await device.open()
    await device.begin(1, 1)
    wal = ShardLog(device, 1, 1)
    body = b"x" * size
    latencies: list[float] = []
    done = 0
    stop = time.perf_counter() + seconds
    counter = itertools.count()
    seqs = [itertools.count(1) for _ in range(queues)]

    async def submitter(queue: int) -> None:
        nonlocal done
        name = f"q{queue}"
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await wal.append(name, next(seqs[queue]), [_put_event(next(counter), body)]).wait()
            latencies.append(time.perf_counter() - t)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(submitter(i % queues) for i in range(submitters * window)))
    elapsed = time.perf_counter() - started
    await device.close()
    latencies.sort()
    return {
        "records_per_s": done / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "blocks": wal.blocks_written,
        "records_per_block": done / max(1, wal.blocks_written),
    }


@contextlib.contextmanager
def _scratch_dirs(count: int, parent: str | None) -> Iterator[list[Path]]:
    """``count`` fresh directories under ``parent``, deleted together at the end. Deleting
    only after all runs matters: on ext4 without a journal, creating files right after many
    were deleted nearby is slower (RESULTS.md, "Where the writer's time goes"), and one
    run's clean-up would slow the next run's writes."""
    roots = [Path(tempfile.mkdtemp(dir=parent)) for _ in range(count)]
    try:
        yield roots
    finally:
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)


def bench_writer(args: argparse.Namespace) -> None:
    for size in args.sizes:
        for n in args.submitters:
            with _scratch_dirs(args.runs, args.dir) as roots:
                runs = [
                    asyncio.run(
                        _writer_run(
                            _device(r, args.layout),
                            n,
                            size,
                            args.seconds,
                            args.window,
                            args.queues,
                        )
                    )
                    for r in roots
                ]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(
                json.dumps(
                    {
                        "bench": "writer",
                        "layout": args.layout,
                        "queues": args.queues,
                        "submitters": n,
                        "size": size,
                        "seconds": args.seconds,
                        "median": {k: round(v, 3) for k, v in med.items()},
                        "runs_records_per_s": [round(r["records_per_s"]) for r in runs],
                    }
                ),
                flush=True,
            )


class _AcceptingDevice:
    """Takes every block at once and keeps nothing: with it, the writer's rate is what the
    writer and its submitters cost in CPU alone. For the floor measurement only."""

    url = "accept://"
    write_slots = 1

    async def open(self) -> None:
        pass

    async def begin(self, epoch: int, next_lsn: int) -> None:
        pass

    async def write(self, epoch: int, first_lsn: int, block: bytes) -> tuple[str, int]:
        return "accepted", 0

    async def close(self) -> None:
        pass


def _syscall_floor(root: Path, block: bytes, blocks: int, files: int = 1) -> dict[str, float]:
    """Median milliseconds of the local log's write path (same calls, no Python writer):
    ``pwrite`` of ``block`` after the previous one into a zero-filled segment, then
    ``fdatasync``; ``blocks`` times. With ``files`` > 1, the fallback layout the issue names
    for many queues (a log per queue, one commit for all): each commit splits ``block`` over
    that many zero-filled segments, one per queue, and syncs each of them."""
    part = -(-len(block) // files)
    size = part * blocks + 4096
    fds = [
        os.open(root / f"segment-{i}", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for i in range(files)
    ]
    try:
        zero = bytes(1 << 20)
        for fd in fds:
            for off in range(0, size, len(zero)):
                os.pwrite(fd, zero[: size - off], off)
            os.fdatasync(fd)
        writes, syncs = [], []
        pos = 32
        for _ in range(blocks):
            t0 = time.perf_counter()
            for i, fd in enumerate(fds):
                os.pwrite(fd, block[i * part : (i + 1) * part], pos)
            t1 = time.perf_counter()
            for fd in fds:
                os.fdatasync(fd)
            t2 = time.perf_counter()
            pos += part
            writes.append((t1 - t0) * 1000)
            syncs.append((t2 - t1) * 1000)
    finally:
        for fd in fds:
            os.close(fd)
    return {"pwrite": statistics.median(writes), "fdatasync": statistics.median(syncs)}


def bench_floor(args: argparse.Namespace) -> None:
    for size in args.sizes:
        for n in args.submitters:
            # A closed loop of n submitters puts at most n events in one block.
            records = [encode_record(_put_event(i, b"x" * size)) for i in range(n)]
            block = encode_block(1, 1, [("q0", 1, records)])
            cpu_runs = [
                asyncio.run(_writer_run(_AcceptingDevice(), n, size, args.seconds))  # type: ignore[arg-type]
                for _ in range(args.runs)
            ]
            # CPU per block when every block holds n events, from the rate without I/O.
            cpu_ms = statistics.median(1000 * n / r["records_per_s"] for r in cpu_runs)
            with _scratch_dirs(args.runs, args.dir) as roots:
                io_runs = [_syscall_floor(r, block, args.segments, args.files) for r in roots]
            totals = [sum(r.values()) for r in io_runs]
            io_ms = statistics.median(totals)
            # Each event waits at least for the write of its block, and the submitters run
            # between writes (the write is made on their event loop): n events per
            # io_ms + cpu_ms at most.
            bound = n / (io_ms + cpu_ms)
            print(
                json.dumps(
                    {
                        "bench": "floor",
                        "submitters": n,
                        "size": size,
                        "files": args.files,
                        "block_bytes": len(block),
                        "syscalls_ms": {
                            s: round(statistics.median(r[s] for r in io_runs), 3)
                            for s in io_runs[0]
                        },
                        "syscalls_ms_per_block": round(io_ms, 3),
                        "runs_syscalls_ms_per_block": [round(t, 3) for t in totals],
                        "no_io_records_per_s": round(
                            statistics.median(r["records_per_s"] for r in cpu_runs)
                        ),
                        "cpu_ms_per_block_of_n": round(cpu_ms, 3),
                        "bound_records_per_s": round(bound * 1000),
                    }
                ),
                flush=True,
            )


def _make_log(root: Path, n_events: int, with_snapshot: bool) -> None:
    """Shard 0's log holding one queue's ``n_events`` single-message events: puts, then
    takes and acks of half of them, in blocks of 100 records and segments of 10,000. With a
    snapshot covering all but the last 1 %."""
    queue = "bench"
    settings = QueueSettings(retention_ms=30 * 24 * 3600 * 1000)
    body = b"y" * 100
    n_put = n_events // 2
    n_take = (n_events - n_put) // 2
    events: list[ev.Event] = [ev.QueueCreated(T0, queue, settings)]
    events += [_put_event(i, body) for i in range(n_put - 1)]
    events += [ev.MessagesTaken(T0 + 10_000, [i + 1], [7], T0 + 10_000_000) for i in range(n_take)]
    events += [ev.MessagesAcked(T0 + 10_001, [i + 1]) for i in range(n_events - len(events))]
    cut = len(events) - len(events) // 100 if with_snapshot else None
    per, per_block = 10_000, 100
    (root / keys.wal_prefix(0)).mkdir(parents=True)
    (root / keys.snapshot_prefix(queue)).mkdir(parents=True)
    state = QueueState() if with_snapshot else None
    for start in range(0, len(events), per):
        chunk = events[start : start + per]
        parts = [encode_wal_header(1, start + 1, 0)]
        for b in range(0, len(chunk), per_block):
            records = [encode_record(e) for e in chunk[b : b + per_block]]
            parts.append(encode_block(1, start + b + 1, [(queue, start + b + 1, records)]))
        (root / keys.wal_segment_key(0, start + 1)).write_bytes(b"".join(parts))
        if state is not None:
            for seq, e in enumerate(chunk, start + 1):
                state.apply(e)
                if seq == cut:
                    body_bytes = encode_snapshot(snapshot(state))
                    obj = encode_snapshot_object(1, cut, body_bytes)
                    (root / keys.snapshot_key(queue, cut)).write_bytes(obj)
        print(
            f"  wrote {min(start + per, len(events)):,}/{len(events):,} events",
            file=sys.stderr,
            end="\r",
        )
    print(file=sys.stderr)


def bench_recovery(args: argparse.Namespace) -> None:
    for n in args.events:
        for with_snapshot in (False, True):
            root = Path(tempfile.mkdtemp(dir=args.dir))
            try:
                t = time.perf_counter()
                _make_log(root, n, with_snapshot)
                build = time.perf_counter() - t
                runs = []
                for _ in range(args.runs):
                    runs.append(asyncio.run(_recover(root)))
                print(
                    json.dumps(
                        {
                            "bench": "recovery",
                            "events": n,
                            "snapshot": with_snapshot,
                            "median_s": round(statistics.median(r["seconds"] for r in runs), 2),
                            "runs_s": [round(r["seconds"], 2) for r in runs],
                            "records_replayed": runs[0]["records"],
                            "messages": runs[0]["messages"],
                            "log_bytes": sum(
                                p.stat().st_size for p in root.rglob("*") if p.is_file()
                            ),
                            "build_s": round(build, 1),
                        }
                    ),
                    flush=True,
                )
            finally:
                shutil.rmtree(root, ignore_errors=True)


async def _recover(root: Path) -> dict:
    # Each run recovers a copy: recovery claims an epoch, which adds a segment.
    copy = Path(tempfile.mkdtemp(dir=root.parent))
    shutil.rmtree(copy)
    shutil.copytree(root, copy)
    store = LocalDirStore(copy)
    last = [0.0]

    def progress(done: int, total: int, records: int) -> None:
        now = time.perf_counter()
        if now - last[0] > 2:
            last[0] = now
            print(f"  replaying: {done}/{total} segments, {records:,} records", file=sys.stderr)

    shard = QueueShard(0, 1, store, clock=SystemClock(), ids=SequentialIds(), progress=progress)
    t = time.perf_counter()
    await shard.start()
    seconds = time.perf_counter() - t
    queue = shard.queues["bench"]
    report = next(r for r in shard.reports if r.queue == "bench")
    result = {
        "seconds": seconds,
        "records": report.records_replayed,
        "messages": len(queue.state.messages),
    }
    await shard.close(snapshot=False)
    await store.close()
    shutil.rmtree(copy, ignore_errors=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("writer")
    w.add_argument("--submitters", type=int, nargs="+", default=[1, 16, 64, 256])
    w.add_argument("--sizes", type=int, nargs="+", default=[100, 4096])
    w.add_argument("--seconds", type=float, default=5.0)
    w.add_argument("--runs", type=int, default=3)
    w.add_argument("--window", type=int, default=1, help="appends each submitter keeps waiting")
    w.add_argument("--dir", default=None, help="where the temporary stores go (default: /tmp)")
    w.add_argument("--queues", type=int, default=1, help="queues the submitters spread over")
    w.add_argument("--layout", choices=["local", "objects"], default="local")
    f = sub.add_parser("floor")
    f.add_argument("--submitters", type=int, nargs="+", default=[64])
    f.add_argument("--sizes", type=int, nargs="+", default=[100])
    f.add_argument("--segments", type=int, default=1000, help="blocks written per run")
    f.add_argument(
        "--files",
        type=int,
        default=1,
        help="split each commit over this many files, one per queue, each synced (the "
        "per-queue log with a shared commit)",
    )
    f.add_argument("--seconds", type=float, default=3.0, help="length of each no-I/O run")
    f.add_argument("--runs", type=int, default=3)
    f.add_argument("--dir", default=None, help="where the temporary directories go")
    r = sub.add_parser("recovery")
    r.add_argument("--events", type=int, nargs="+", default=[1_000_000, 10_000_000])
    r.add_argument("--runs", type=int, default=3)
    r.add_argument("--dir", default=None)
    args = ap.parse_args()
    {"writer": bench_writer, "recovery": bench_recovery, "floor": bench_floor}[args.cmd](args)


if __name__ == "__main__":
    main()
