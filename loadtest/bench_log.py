"""Benchmarks of the durable log on the local store (fsync'd).

  writer    durable records/s through the group-commit writer with N concurrent submitters,
            each appending one event and waiting until it is durable, then the next; and
            the time from append to durable (p50/p99).
  recovery  time to recover a queue from a log of N events, with and without a snapshot.
  floor     what bounds the writer on this disk: the local store's write path as raw
            syscalls (create a temp file, write, fdatasync, link, directory fsync, unlink),
            one segment at a time, timed step by step; the writer and its submitters with a
            store that accepts every segment at once (their CPU alone); and the rate a closed
            loop of N submitters could reach if the two only added up.

    .venv/bin/python loadtest/bench_log.py writer --submitters 1 16 64 256 --sizes 100 4096
    .venv/bin/python loadtest/bench_log.py recovery --events 1000000 10000000
    .venv/bin/python loadtest/bench_log.py floor --submitters 64 --dir /work/bench-tmp

Results are printed as JSON lines; loadtest/RESULTS.md quotes them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from actors.clock import SystemClock
from actors.core import events as ev
from actors.core.snapshot import encode_snapshot, snapshot
from actors.core.state import QueueState
from actors.log import keys
from actors.log.codec import encode_payloads, encode_segment, encode_snapshot_object
from actors.log.recovery import open_log
from actors.log.store import LocalDirStore, ObjectStore, _fsync_dir
from actors.log.writer import GroupCommitWriter
from actors.settings import QueueSettings

# Recent timestamps: recovery advances the clock to now, and old messages would expire.
T0 = int(time.time() * 1000) - 3_600_000


def _put_event(i: int, body: bytes) -> ev.MessagesPut:
    return ev.MessagesPut(T0 + i // 1000, [ev.PutItem(i + 1, body, T0)])


async def _writer_run(
    store: ObjectStore, submitters: int, size: int, seconds: float, window: int = 1
) -> dict:
    """``submitters`` producers, each keeping ``window`` appends waiting for durability
    (1: append, wait, append — a closed loop)."""
    writer = GroupCommitWriter(store, "bench", 1, 1)
    body = b"x" * size
    latencies: list[float] = []
    done = 0
    stop = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def submitter() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            t = time.perf_counter()
            await writer.append_and_wait([_put_event(next(counter), body)])
            latencies.append(time.perf_counter() - t)
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(submitter() for _ in range(submitters * window)))
    elapsed = time.perf_counter() - started
    await store.close()
    latencies.sort()
    return {
        "records_per_s": done / elapsed,
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "segments": writer.segments_written,
        "records_per_segment": done / max(1, writer.segments_written),
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
                    asyncio.run(_writer_run(LocalDirStore(r), n, size, args.seconds, args.window))
                    for r in roots
                ]
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(
                json.dumps(
                    {
                        "bench": "writer",
                        "submitters": n,
                        "size": size,
                        "seconds": args.seconds,
                        "median": {k: round(v, 3) for k, v in med.items()},
                        "runs_records_per_s": [round(r["records_per_s"]) for r in runs],
                    }
                ),
                flush=True,
            )


class _AcceptingStore:
    """Takes every segment at once and keeps nothing: with it, the writer's rate is what the
    writer and its submitters cost in CPU alone. For the floor measurement only."""

    url = "accept://"
    write_slots = 1

    async def put_if_absent(self, key: str, data: bytes) -> bool:
        return True

    async def close(self) -> None:
        pass


_STEPS = ("create", "write+fdatasync", "link", "fsync dir", "unlink")


def _syscall_floor(root: Path, data: bytes, segments: int, in_flight: int) -> dict[str, float]:
    """Median milliseconds of each step of ``LocalDirStore.put_if_absent`` (same calls, same
    order, no Python writer) over ``segments`` fresh objects of ``data`` per thread, with
    ``in_flight`` threads writing at once into the same directory."""
    tmp_dir, log_dir = root / ".tmp", root / "log"
    tmp_dir.mkdir()
    log_dir.mkdir()
    log_dir_path = str(log_dir)
    times: dict[str, list[float]] = {step: [] for step in _STEPS}
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC

    def write_segments(thread: int) -> None:
        for i in range(segments):
            tmp, final = tmp_dir / f"t{thread}-{i}", log_dir / f"{thread}-{i:020d}.seg"
            t0 = time.perf_counter()
            fd = os.open(tmp, flags, 0o644)
            t1 = time.perf_counter()
            os.write(fd, data)
            os.fdatasync(fd)
            os.close(fd)
            t2 = time.perf_counter()
            os.link(tmp, final)
            t3 = time.perf_counter()
            _fsync_dir(log_dir_path)
            t4 = time.perf_counter()
            os.unlink(tmp)
            t5 = time.perf_counter()
            took = (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)
            for step, ms in zip(_STEPS, took, strict=True):
                times[step].append(ms * 1000)  # list.append is atomic under the GIL

    threads = [threading.Thread(target=write_segments, args=(t,)) for t in range(in_flight)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {step: statistics.median(v) for step, v in times.items()}


def bench_floor(args: argparse.Namespace) -> None:
    for size in args.sizes:
        for n in args.submitters:
            # A closed loop of n submitters puts at most n events in one segment.
            payloads = encode_payloads([_put_event(i, b"x" * size) for i in range(n)])
            data = encode_segment(1, 1, payloads)
            cpu_runs = [
                asyncio.run(_writer_run(_AcceptingStore(), n, size, args.seconds))
                for _ in range(args.runs)
            ]
            # CPU per segment when every segment holds n events, from the rate without I/O.
            cpu_ms = statistics.median(1000 * n / r["records_per_s"] for r in cpu_runs)
            for k in args.in_flight:
                with _scratch_dirs(args.runs, args.dir) as roots:
                    io_runs = [_syscall_floor(r, data, args.segments, k) for r in roots]
                totals = [sum(r.values()) for r in io_runs]
                io_ms = statistics.median(totals)
                # k segments in flight share the n events, and each event waits at least
                # for the write of its segment: n events per io_ms at most. With one
                # segment in flight the submitters' CPU comes on top (they wait for the
                # write, then run); with more, it may overlap another segment's write.
                bound = n / (io_ms + cpu_ms) if k == 1 else n / io_ms
                print(
                    json.dumps(
                        {
                            "bench": "floor",
                            "submitters": n,
                            "size": size,
                            "in_flight": k,
                            "segment_bytes": len(data),
                            "syscalls_ms": {
                                s: round(statistics.median(r[s] for r in io_runs), 3)
                                for s in _STEPS
                            },
                            "syscalls_ms_per_segment": round(io_ms, 3),
                            "runs_syscalls_ms_per_segment": [round(t, 3) for t in totals],
                            "no_io_records_per_s": round(
                                statistics.median(r["records_per_s"] for r in cpu_runs)
                            ),
                            "cpu_ms_per_segment_of_n": round(cpu_ms, 3),
                            "bound_records_per_s": round(bound * 1000),
                        }
                    ),
                    flush=True,
                )


def _make_log(root: Path, n_events: int, with_snapshot: bool) -> None:
    """A log of ``n_events`` single-message events: puts, then takes and acks of half of
    them, in segments of 10,000 records. With a snapshot covering all but the last 1 %."""
    store_root = root
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
    per = 10_000
    (store_root / "queues" / queue / "log").mkdir(parents=True)
    (store_root / "queues" / queue / "snap").mkdir(parents=True)
    state = QueueState() if with_snapshot else None
    for start in range(0, len(events), per):
        chunk = events[start : start + per]
        seq = start + 1
        data = encode_segment(1, seq, encode_payloads(chunk))
        (store_root / keys.segment_key(queue, seq)).write_bytes(data)
        if state is not None:
            for e in chunk:
                state.apply(e)
                if cut is not None and seq == cut:
                    body_bytes = encode_snapshot(snapshot(state))
                    obj = encode_snapshot_object(1, cut, body_bytes)
                    (store_root / keys.snapshot_key(queue, cut)).write_bytes(obj)
                seq += 1
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

    t = time.perf_counter()
    opened = await open_log(store, "bench", SystemClock(), progress=progress)
    seconds = time.perf_counter() - t
    await store.close()
    shutil.rmtree(copy, ignore_errors=True)
    return {
        "seconds": seconds,
        "records": opened.report.records_replayed,
        "messages": len(opened.state.messages),
    }


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
    f = sub.add_parser("floor")
    f.add_argument("--submitters", type=int, nargs="+", default=[64])
    f.add_argument("--sizes", type=int, nargs="+", default=[100])
    f.add_argument("--in-flight", type=int, nargs="+", default=[1, 2, 4], help="threads at once")
    f.add_argument("--segments", type=int, default=1000, help="objects per thread and run")
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
