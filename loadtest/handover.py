"""Per-queue unavailability during a handover (issue 34): how long a queue has no owner
while it moves between two shards, on a local disk or (``--s3``) on moto's S3 server on
loopback (the shards' logs and snapshots in its bucket, a local segment copy as
``evq serve --store s3://…`` keeps one).

Two shards in this process (``LocalDirectory`` over a local store under ``--dir``, as
``evq serve --no-ray`` runs them), ``--queues`` queues of ``--messages`` messages each
(100-B bodies, 1000 a put: spilled runs, so a handover reads their bodies back into its
snapshot), a reserved one and a delayed one each; then every queue is moved to the other
shard and back ``--rounds`` times, one at a time. Each move's time without an owner is
from the source's fence to the target serving (``move_queue``'s second result): its
p50/p99/max, and the moves a second. Progress every 50 moves.

With ``--s3``, the floor is measured after the moves on the same server with the same
client: ``--floor`` chains of the round trips a handover waits for, made bare (no shard:
a small create-only put, a put of a snapshot's size, a small create-only put and a get
of that snapshot at once, a small put), and single small puts; their p50/p99 (``floor_*``). A move
cannot be quicker than its chain.

    .venv/bin/python loadtest/handover.py [--queues 50] [--messages 10000] [--rounds 4]
        [--dir /work] [--s3 [--floor 200]]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.core import commands as cmd
from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore, ObjectStore
from actors.log.stores import open_store
from actors.settings import LogSettings, QueueSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import free_port

BUCKET = "evq-handover"
REGION = "us-east-1"


async def run(args: argparse.Namespace, s3: str | None = None) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        if s3 is None:
            directory = LocalDirectory(LocalDirStore(Path(root)), count=2)
        else:
            target = f"s3://{BUCKET}/handover-{time.monotonic_ns()}"
            store = open_store(target, endpoint=s3, region=REGION)
            cache = LogSettings(segment_cache=str(Path(root) / "segments"))
            directory = LocalDirectory(store, count=2, log_settings=cache)
        await asyncio.gather(*(shard.start() for shard in directory.shards))
        names = [f"h{i:04d}" for i in range(args.queues)]
        for name in names:
            await directory.create(name, QueueSettings(), [])
            for first in range(0, args.messages, 1000):
                put = cmd.Put(
                    [
                        cmd.NewMessage(body=b"x" * 100)
                        for _ in range(first, min(first + 1000, args.messages))
                    ]
                )
                [result] = await directory.execute_many(name, [put])
                assert isinstance(result, list), result
            await directory.execute_many(
                name,
                [
                    cmd.Take(1, visibility_timeout_ms=600_000),
                    cmd.Put([cmd.NewMessage(body=b"d", delay_ms=3_600_000)]),
                ],
            )
        paused: list[float] = []
        started = time.perf_counter()
        for _ in range(args.rounds):
            for name in names:
                target = 1 - directory.shard_of(name)
                _, seconds = await directory.move(name, target)
                paused.append(seconds)
                if len(paused) % 50 == 0:
                    print(
                        json.dumps(
                            {
                                "moves": len(paused),
                                "p50_ms": round(statistics.median(paused) * 1000, 1),
                            }
                        ),
                        file=sys.stderr,
                    )
        elapsed = time.perf_counter() - started
        for name in names:  # everything is still there
            [stats] = await directory.execute_many(name, [cmd.Stats()])
            assert (stats.ready, stats.reserved, stats.delayed) == (args.messages - 1, 1, 1), stats
        await directory.close()
        floor = await _floor(store, args.floor, 100 * args.messages) if s3 is not None else {}
    ms = sorted(x * 1000 for x in paused)
    return floor | {
        "store": "moto S3" if s3 is not None else "local disk",
        "queues": args.queues,
        "messages_each": args.messages,
        "moves": len(ms),
        "moves_per_s": round(len(ms) / elapsed, 1),
        "unavailable_p50_ms": round(statistics.median(ms), 1),
        "unavailable_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
        "unavailable_max_ms": round(ms[-1], 1),
    }


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 1)


async def _floor(store: ObjectStore, chains: int, snapshot_bytes: int) -> dict[str, object]:
    """The store's own round trips in the handover's order, with nothing else (see the
    module's docstring): p50/p99 of a chain and of one small put."""
    small, snapshot = b"r" * 200, b"s" * snapshot_bytes
    chain: list[float] = []
    single: list[float] = []
    for i in range(chains):
        began = time.perf_counter()
        await store.put_if_absent(f"floor/{i}/fence", small)
        await store.put_if_absent(f"floor/{i}/snapshot", snapshot)
        await asyncio.gather(
            store.put_if_absent(f"floor/{i}/map", small), store.get(f"floor/{i}/snapshot")
        )
        await store.put_if_absent(f"floor/{i}/taken", small)
        chain.append(time.perf_counter() - began)
        began = time.perf_counter()
        await store.put_if_absent(f"floor/{i}/one", small)
        single.append(time.perf_counter() - began)
    return {
        "floor_chains": chains,
        "floor_chain_p50_ms": _p(chain, 0.5),
        "floor_chain_p99_ms": _p(chain, 0.99),
        "floor_put_p50_ms": _p(single, 0.5),
        "floor_put_p99_ms": _p(single, 0.99),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--queues", type=int, default=50)
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default="/work")
    p.add_argument("--s3", action="store_true", help="on moto's S3 server (started here)")
    p.add_argument("--floor", type=int, default=200, help="with --s3: bare chains measured")
    args = p.parse_args()
    if not args.s3:
        print(json.dumps(asyncio.run(run(args))))
        return
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    port = free_port()
    moto_s3 = [sys.executable, str(Path(__file__).with_name("moto_s3.py"))]  # S3's atomicity
    moto = subprocess.Popen(
        [*moto_s3, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        import boto3

        for _ in range(300):
            try:
                boto3.client("s3", endpoint_url=endpoint, region_name=REGION).create_bucket(
                    Bucket=BUCKET
                )
                break
            except Exception:  # not listening yet
                time.sleep(0.1)
        print(json.dumps(asyncio.run(run(args, endpoint))))
    finally:
        moto.terminate()
        moto.wait(10)


if __name__ == "__main__":
    main()
