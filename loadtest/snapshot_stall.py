"""How long a snapshot at depth stops a shard: with it encoded on the shard's loop (``-1``)
and in a forked child (the default threshold, actors/log/forked.py).

For each ``--fork-above`` value: ``evq serve --shards 1`` (both queues on one shard) with
snapshots every ``--snapshot-every-s``; a probe puts one message into a small queue every
``--probe-ms`` and times each answer, while batched puts fill a deep queue with
``--messages`` messages (each due at its own time over 1 h..30 d, as deferred work waits),
and for ``--after`` seconds more, so that snapshots happen at full depth. The probe's
worst answers are the shard's stalls: every queue of a shard waits while it encodes.

    .venv/bin/python loadtest/snapshot_stall.py --messages 10M --kind client-ids --dir /work
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_depth import count  # the tools' directory is on the path
from served import ROOT, EvqServe

from actors.errors import QueueError
from evq.client import AsyncClient, NewMessage

BATCH = 1000
FILLERS = 4
SPREAD_S = (3600, 30 * 86_400)


async def probe(
    url: str,
    stop: asyncio.Event,
    every: float,
    out: list[tuple[float, float]],
    failed: list[tuple[float, str]],
) -> None:
    """A put every ``every`` s: (time, seconds to answer) of each, and (time, error code)
    of each that failed (not resent: a 503 is what a stall past the channel's limit gives)."""
    async with AsyncClient(url, retries=0, timeout=120) as c:
        await c.create_queue("probe")
        started = time.monotonic()
        while not stop.is_set():
            sent = time.monotonic()
            try:
                await c.put("probe", b"p", auto_key=False)
            except QueueError as exc:
                failed.append((sent - started, exc.code))
            done = time.monotonic()
            out.append((sent - started, done - sent))
            await asyncio.sleep(max(0.0, every - (done - sent)))


async def fill(url: str, kind: str, total: int, progress: list[int]) -> None:
    async with AsyncClient(url, retries=5, timeout=120) as c:
        name = "deep.fifo" if kind == "fifo" else "deep"
        await c.create_queue(
            name,
            id_mode="client" if kind == "client-ids" else None,
            fifo=True if kind == "fifo" else None,
            retention=40 * 86_400,  # past the last message's time
        )
        batches = iter(range(0, total, BATCH))
        low, span = SPREAD_S[0], SPREAD_S[1] - SPREAD_S[0]

        async def filler() -> None:
            for first in batches:
                messages = [
                    NewMessage(
                        body=b"%099d" % i,
                        delay=low + (i * 7919) % span,
                        id=f"id-{i}" if kind == "client-ids" else None,
                        group=f"g{i % 1000}" if kind == "fifo" else None,
                    )
                    for i in range(first, min(first + BATCH, total))
                ]
                await c.put(name, messages)  # keys made once: a retried put never doubles
                progress[0] += len(messages)

        await asyncio.gather(*(filler() for _ in range(FILLERS)))


async def one(args: argparse.Namespace, above: str, work: Path) -> dict[str, Any]:
    data = work / f"data-{above}"
    extra = ["--shards", "1", "--snapshot-every-s", str(args.snapshot_every_s)]
    if above != "default":
        extra += ["--snapshot-fork-above", above]
    server = EvqServe(data, work / f"serve-{above}.log", extra)
    try:
        server.wait_ready(120)
        stop, answers, failed, progress = asyncio.Event(), [], [], [0]
        every = args.probe_ms / 1000
        prober = asyncio.create_task(probe(server.url, stop, every, answers, failed))
        started = time.monotonic()
        filling = asyncio.create_task(fill(server.url, args.kind, args.messages, progress))
        while not filling.done():
            await asyncio.wait({filling}, timeout=10)
            print(f"  {above}: {progress[0]:,} put", file=sys.stderr, flush=True)
        await filling
        fill_s = time.monotonic() - started
        await asyncio.sleep(args.after)
        stop.set()
        await prober
    finally:
        server.stop()
    log = (work / f"serve-{above}.log").read_text(errors="replace")
    lat = sorted(a for _, a in answers)
    worst = max(answers, key=lambda x: x[1])
    return {
        "fork_above": above,
        "kind": args.kind,
        "messages": args.messages,
        "fill_s": round(fill_s, 1),
        "fill_msgs_per_s": round(args.messages / fill_s),
        "probes": len(lat),
        "probe_p50_ms": round(statistics.median(lat) * 1000, 2),
        "probe_p99_ms": round(lat[int(0.99 * (len(lat) - 1))] * 1000, 1),
        "probe_max_ms": round(worst[1] * 1000, 1),
        "probe_max_at_s": round(worst[0], 1),
        "probes_over_1s": sum(a > 1 for a in lat),
        "probes_failed": [{"at_s": round(t, 1), "code": code} for t, code in failed],
        "snapshots_in_a_child": log.count("encoded in a child"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--messages", type=count, default=10**7)
    p.add_argument("--kind", choices=["plain", "client-ids", "fifo"], default="client-ids")
    p.add_argument("--fork-above", default="-1,default", help="values, comma-separated")
    p.add_argument("--snapshot-every-s", type=float, default=20.0)
    p.add_argument("--probe-ms", type=float, default=50.0)
    p.add_argument("--after", type=float, default=45.0, help="seconds of probing after the fill")
    p.add_argument("--dir", type=Path, default=None)
    args = p.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    print(json.dumps({"run": {"command": " ".join(sys.argv), "commit": commit,
                              "machine": platform.node()}}))  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="evq-stall-") as tmp:
        for above in args.fork_above.split(","):
            row = asyncio.run(one(args, above, Path(tmp)))
            rows.append(row)
            print(json.dumps({"row": row}), flush=True)
    print("\n| fork above | kind | messages | fill msg/s | probe p50 ms | p99 ms | max ms "
          "| probes > 1 s | probes failed | snapshots in a child |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['fork_above']} | {r['kind']} | {r['messages']:,} | {r['fill_msgs_per_s']:,} "
            f"| {r['probe_p50_ms']} | {r['probe_p99_ms']} | {r['probe_max_ms']:,} "
            f"| {r['probes_over_1s']} | {len(r['probes_failed'])} | {r['snapshots_in_a_child']} |"
        )


if __name__ == "__main__":
    main()
