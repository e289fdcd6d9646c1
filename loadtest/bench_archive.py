"""The archive's cost and what it buys (issue 20): its throughput, the hot path with it on
and off, and an audit of a long history that the live log mostly pruned.

``copy``: how fast a shard archives: ``--segments`` files of ``--segment-mb`` MiB (random
bytes, as incompressible as a log of random bodies) copied with the shard's own
:class:`actors.log.archive.Archive` into a local store (read, create-only put, fsync of the
file and its directory), one after another as a prune does. Prints MB/s and ms per segment.

``hotpath``: ``evq serve`` with snapshots every 5 s (so the logs prune, and archive, all the
time), 64 single-put producers from 8 processes of the shared load generator
(``../shared/bench/loadgen.py``, in the shared harness's virtualenv, ``/tmp/venv-anchors``
by default) for ``--duration`` s; the archive on (the default) and off
(``--archive-retention-days 0``), alternating within a round and reversed every other round.
Prints puts/s, p50 and p99 per run, how much the archive took in during the run, and the
medians.

``history``: ``--messages`` messages of 100 random bytes through two in-process shards over a
local store (in batches of ``--batch``: put, take, ack; 4 MiB segments), snapshotting every
5,000 records, so the logs prune into the archive; then ``evq pipeline audit`` over the
store. Prints the records and the per-message events written, how many segments the archive
and the live log hold, the audit's fates and time. 3.5M messages make 10.5M per-message events.

    .venv/bin/python loadtest/bench_archive.py copy [--segments 32] [--segment-mb 16]
    .venv/bin/python loadtest/bench_archive.py hotpath [--runs 3] [--duration 20]
    .venv/bin/python loadtest/bench_archive.py history [--messages 3500000] [--batch 100]

Every mode works in a fresh directory under ``--dir`` (default: the system's temp dir) and
prints one JSON line per step, then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from served import ROOT, EvqServe, put_load

sys.path.insert(0, str(ROOT))

from actors.clock import SystemClock
from actors.core import commands as cmd
from actors.directory import LocalDirectory
from actors.log import keys
from actors.log.archive import Archive
from actors.log.store import LocalDirStore
from actors.settings import LogSettings, QueueSettings

MIB = 1024 * 1024


def say(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------- copy


async def _copy(root: Path, segments: int, segment_mb: int) -> dict[str, Any]:
    store = LocalDirStore(root)
    names = [keys.wal_segment_key(0, 1 + i * 1000) for i in range(segments)]
    for name in names:
        await store.put(name, os.urandom(segment_mb * MIB))
    archive = Archive(store, 0, SystemClock(), retention_days=None)
    started = time.perf_counter()
    for name in names:
        await archive.keep(name, await store.get(name))
    seconds = time.perf_counter() - started
    await store.close()
    return {
        "segments": segments,
        "segment_mb": segment_mb,
        "seconds": round(seconds, 2),
        "mb_per_s": round(segments * segment_mb / seconds, 1),
        "ms_per_segment": round(seconds * 1000 / segments, 1),
    }


def copy(args: argparse.Namespace) -> None:
    runs = []
    for r in range(args.runs):
        with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
            run = asyncio.run(_copy(Path(tmp), args.segments, args.segment_mb))
        say({"round": r, **run})
        runs.append(run)
    say({"summary": {"median_mb_per_s": statistics.median(x["mb_per_s"] for x in runs)}})


# ---------------------------------------------------------------- hot path


def _hot_run(args: argparse.Namespace, archive: bool, r: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        data = Path(tmp) / "data"
        extra = ["--snapshot-every-s", "5", "--shards", "1", "--auto-create"]
        if not archive:
            extra += ["--archive-retention-days", "0"]
        server = EvqServe(data, Path(tmp) / "serve.log", extra)
        try:
            server.wait_ready(120)
            load = ["--producers", "64", "--procs", "8", "--duration", str(args.duration)]
            queue = f"hot{r}{'a' if archive else 'n'}"
            run = put_load(args.loadgen_python, "http_json", server.url, queue, load)
            archived = du(data / "archive") if (data / "archive").exists() else 0
        finally:
            server.stop()
    return {"archive": archive, **run, "archived_mb": round(archived / MIB, 1)}


def hotpath(args: argparse.Namespace) -> None:
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for r in range(args.runs):
        for archive in (True, False) if r % 2 == 0 else (False, True):
            run = _hot_run(args, archive, r)
            runs[archive].append(run)
            say({"round": r, **run})
    summary = {
        ("on" if on else "off"): {
            "median_puts_per_s": statistics.median(x["puts_per_s"] for x in got),
            "median_p50_ms": statistics.median(x["p50_ms"] for x in got),
            "median_p99_ms": statistics.median(x["p99_ms"] for x in got),
        }
        for on, got in runs.items()
    }
    say({"summary": summary})


# ---------------------------------------------------------------- history


async def _write_history(root: Path, messages: int, batch: int) -> dict[str, Any]:
    settings = LogSettings(
        snapshot_every_records=5_000, snapshot_every_ms=60_000, segment_bytes=4 * MIB
    )
    directory = LocalDirectory(LocalDirStore(root), count=2, log_settings=settings)
    await directory.start()
    assert directory._started is not None
    await directory._started
    queues = ["orders", "events"]
    for name in queues:
        await directory.create(name, QueueSettings(), [])
    started, last = time.perf_counter(), time.perf_counter()
    done = 0
    while done < messages:
        n = min(batch, messages - done)
        queue = queues[(done // batch) % len(queues)]
        body = [cmd.NewMessage(body=os.urandom(100)) for _ in range(n)]
        [put] = await directory.execute_many(queue, [cmd.Put(body)])
        [taken] = await directory.execute_many(queue, [cmd.Take(n)])
        refs = [cmd.LeaseRef(d.id, d.lease) for d in taken]
        await directory.execute_many(queue, [cmd.Ack(refs)])
        assert len(put) == len(taken) == n, (len(put), len(taken))
        done += n
        if time.perf_counter() - last > 10:
            last = time.perf_counter()
            say({"written": done, "of": messages, "seconds": round(last - started)})
    await directory.close()
    return {"messages": done, "write_seconds": round(time.perf_counter() - started, 1)}


def history(args: argparse.Namespace) -> None:
    root = Path(tempfile.mkdtemp(dir=args.dir)) / "data"
    try:
        written = asyncio.run(_write_history(root, args.messages, args.batch))
        live = len(list((root / "wal").rglob("*.seg")))
        archived = len(list((root / "archive").rglob("*.seg")))
        say({**written, "live_segments": live, "archived_segments": archived})
        out = root.parent / "audit"
        started = time.perf_counter()
        command = [sys.executable, "-m", "evq", "pipeline", "audit"]
        audit = subprocess.run(
            [*command, "--store", str(root), "--out", str(out)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        seconds = time.perf_counter() - started
        report = (
            json.loads((out / "audit.json").read_text()) if (out / "audit.json").exists() else {}
        )
        say(
            {
                "summary": {
                    **written,
                    "events": 3 * written["messages"],
                    "live_segments": live,
                    "archived_segments": archived,
                    "audit_exit": audit.returncode,
                    "audit_seconds": round(seconds, 1),
                    "fates": report.get("fates"),
                }
            }
        )
        if audit.returncode != 0:
            print(audit.stdout[-3000:], audit.stderr[-3000:], file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(root.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=None, help="where the temporary stores go")
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("copy")
    p.add_argument("--segments", type=int, default=32)
    p.add_argument("--segment-mb", type=int, default=16)
    p.add_argument("--runs", type=int, default=3)
    p = sub.add_parser("hotpath")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--duration", type=int, default=20)
    p.add_argument("--loadgen-python", default="/tmp/venv-anchors/bin/python")
    p = sub.add_parser("history")
    p.add_argument("--messages", type=int, default=3_500_000)
    p.add_argument("--batch", type=int, default=100)
    p.add_argument("--keep", action="store_true", help="keep the store afterwards")
    args = parser.parse_args()
    {"copy": copy, "hotpath": hotpath, "history": history}[args.mode](args)


if __name__ == "__main__":
    main()
