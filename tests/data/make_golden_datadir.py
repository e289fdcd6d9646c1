"""Write a data directory in the log layout of format version 1. Run ONCE per layout.

    .venv/bin/python tests/data/make_golden_datadir.py            # writes tests/data/datadir-v1/
    .venv/bin/python tests/data/make_golden_datadir.py --out DIR  # writes elsewhere (to look)

Version 1 kept one log per queue (``queues/<queue>/log/<seq>.seg``, one object per group
commit) with its snapshots beside it. Version 2 keeps one log per shard. A server of any
later version must still open a version-1 directory and serve every queue in it as it was:
``tests/unit/log/test_golden_datadir.py`` opens a copy of this directory and compares each
queue with ``datadir-v1.json``, written here at the same time.

What is in it (ManualClock from T, SequentialIds, one shard):

- ``jobs``: server ids; 12 messages put, 3 taken and 1 of them acked, 1 released with a
  delay, 2 put delayed; a snapshot after the first 8 puts, so the directory holds a snapshot
  and segments after it (and the segments before it that the snapshot does not yet let go);
- ``orders.fifo``: a FIFO queue with two groups, the head of one reserved;
- ``work`` with ``max_receives=1`` and dead-letter queue ``dead``: one message taken and
  released, so it went to ``dead`` (with its id in ``evq.source_id``);
- an application key ``app:price`` at version 2 (in the key partition ``__evq-keys-…``).

Every queue but ``dead`` is left as a crash leaves it once its writes are durable (no
closing snapshot), so opening it replays version-1 segments after a snapshot or from the
first record; ``dead`` was closed gracefully (a snapshot covers all of it).

Like the golden segment files, this directory is never regenerated: it is what a version-1
server wrote. The script refuses to write over an existing directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from actors.clock import ManualClock  # noqa: E402
from actors.core import commands as c  # noqa: E402
from actors.ids import SequentialIds  # noqa: E402
from actors.keyspace import partition_of  # noqa: E402
from actors.log.store import LocalDirStore  # noqa: E402
from actors.settings import LogSettings, QueueSettings  # noqa: E402
from actors.shard import QueueShard  # noqa: E402

T = 1_700_000_000_000
# No automatic snapshots: the script takes the one it wants.
NO_AUTO = LogSettings(snapshot_every_records=10**9, snapshot_every_ms=10**12)


def _msg(body: str, **kw: Any) -> c.NewMessage:
    return c.NewMessage(body=body.encode(), **kw)


async def _one(shard: QueueShard, queue: str, command: object) -> Any:
    [result] = await shard.execute_many(queue, [command])
    if isinstance(result, Exception):
        raise result
    return result


async def _fill(shard: QueueShard, clock: ManualClock) -> None:
    await shard.create("jobs", QueueSettings(), [])
    await shard.create("orders.fifo", QueueSettings(fifo=True), [])
    await shard.create("dead", QueueSettings(), [])
    await shard.create("work", QueueSettings(max_receives=1, dead_letter_queue="dead"), [])
    for i in range(8):
        clock.advance(10)
        await _one(shard, "jobs", c.Put([_msg(f"job {i}", idempotency_key=f"k{i}")]))
    await shard.queues["jobs"].snapshot()
    clock.advance(10)
    await _one(shard, "jobs", c.Put([_msg(f"job {i}") for i in range(8, 10)]))
    await _one(
        shard, "jobs", c.Put([_msg("later 1", delay_ms=600_000), _msg("later 2", delay_ms=900_000)])
    )
    clock.advance(10)
    taken = await _one(shard, "jobs", c.Take(3, visibility_timeout_ms=60_000))
    await _one(shard, "jobs", c.Ack([c.LeaseRef(str(taken[0].id), str(taken[0].lease))]))
    await _one(
        shard,
        "jobs",
        c.Release([c.ReleaseItem(id=str(taken[1].id), lease=str(taken[1].lease), delay_ms=30_000)]),
    )
    clock.advance(10)
    await _one(
        shard,
        "orders.fifo",
        c.Put([_msg("a1", group="a"), _msg("a2", group="a"), _msg("b1", group="b")]),
    )
    await _one(shard, "orders.fifo", c.Take(1, visibility_timeout_ms=60_000))
    await _one(shard, "work", c.Put([_msg("doomed")]))
    [w] = await _one(shard, "work", c.Take(1))
    await _one(shard, "work", c.Release([c.ReleaseItem(id=str(w.id), lease=str(w.lease))]))
    await _one(shard, partition_of("app:price"), c.SetKey("app:price", {"eur": 1}))
    await _one(shard, partition_of("app:price"), c.SetKey("app:price", {"eur": 2}))
    for _ in range(200):  # the dead letter moves on in the background
        if shard.queues["dead"].state.n_ready:
            break
        await asyncio.sleep(0.01)


def _describe(shard: QueueShard) -> dict[str, Any]:
    out: dict[str, Any] = {"queues": {}}
    for name, queue in sorted(shard.queues.items()):
        s = queue.state
        messages = []
        for m in s.messages.values():
            messages.append(
                {
                    "id": str(m.id),
                    "body": m.body.decode(),
                    "state": m.state,
                    "activate_at_ms": m.activate_at_ms,
                    "receive_count": m.receive_count,
                    "lease": m.lease,
                    "group": m.group,
                    "attributes": m.attributes,
                }
            )
        out["queues"][name] = {
            "settings": {"fifo": s.settings.fifo, "max_receives": s.settings.max_receives},
            "counts": [s.n_ready, s.n_delayed, s.n_reserved],
            "messages": messages,
            "keys": {k: list(v) for k, v in s.keys.items()},
            "idempotency_keys": sorted(s.idem),
            "last_seq": queue.writer.durable_seq if queue.writer is not None else 0,
        }
    return out


async def _main(out: Path) -> None:
    clock = ManualClock(T)
    store = LocalDirStore(out)
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=NO_AUTO)
    await shard.start()
    await _fill(shard, clock)
    described = _describe(shard)
    described["clock_ms"] = clock.now_ms()
    # Every queue but ``dead`` stops as a crash would leave it once its writes are durable:
    # no closing snapshot, so opening the directory replays version-1 segments.
    for name, queue in shard.queues.items():
        await queue.close(snapshot=name == "dead")
    shard.keys.close()
    await store.close()
    (out.parent / f"{out.name}.json").write_text(json.dumps(described, indent=1, sort_keys=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=HERE / "datadir-v1")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out} exists: golden data directories are never regenerated")
    asyncio.run(_main(args.out))
    print(f"wrote {args.out} and {args.out.name}.json")


if __name__ == "__main__":
    main()
