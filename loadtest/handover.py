"""Per-queue unavailability during a handover (issue 34): how long a queue has no owner
while it moves between two shards, on a local disk.

Two shards in this process (``LocalDirectory`` over a local store under ``--dir``, as
``evq serve --no-ray`` runs them), ``--queues`` queues of ``--messages`` messages each
(100-B bodies, 1000 a put: spilled runs, so a handover reads their bodies back into its
snapshot), a reserved one and a delayed one each; then every queue is moved to the other
shard and back ``--rounds`` times, one at a time. Each move's time without an owner is
from the source's fence to the target serving (``move_queue``'s second result): its
p50/p99/max, and the moves a second. Progress every 50 moves.

    .venv/bin/python loadtest/handover.py [--queues 50] [--messages 10000] [--rounds 4]
        [--dir /work]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from actors.core import commands as cmd
from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings


async def run(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(dir=args.dir) as root:
        directory = LocalDirectory(LocalDirStore(Path(root)), count=2)
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
    ms = sorted(x * 1000 for x in paused)
    return {
        "queues": args.queues,
        "messages_each": args.messages,
        "moves": len(ms),
        "moves_per_s": round(len(ms) / elapsed, 1),
        "unavailable_p50_ms": round(statistics.median(ms), 1),
        "unavailable_p99_ms": round(ms[min(len(ms) - 1, int(0.99 * len(ms)))], 1),
        "unavailable_max_ms": round(ms[-1], 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--queues", type=int, default=50)
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--dir", default="/work")
    result = asyncio.run(run(p.parse_args()))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
