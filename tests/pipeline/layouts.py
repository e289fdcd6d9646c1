"""Small logs of format 2 for the pipeline tests, written by a real shard: queues interleaved
in one shard log (as preallocated local segments or one object per commit), a queue deleted
and created again, version-1 queues that go on in a shard log, and the damage a shard log can
take (a torn last block, a damaged block in the middle). What each queue should read as comes
from the engine: its live ``Stats``, or what recovery rebuilds (``read_shard``) once damaged.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import msgspec

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core.decide import decide
from actors.core.ids import SequentialIds
from actors.log import keys
from actors.log.device import ObjectLogDevice, open_device
from actors.log.shard_recovery import read_shard
from actors.log.store import LocalDirStore
from actors.log.wal import scan_segment
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from tests.pipeline.logs import START_MS, Driver, new

DATADIR_V1 = Path(__file__).resolve().parents[1] / "data" / "datadir-v1"
NO_SNAPSHOTS = LogSettings(snapshot_every_records=10**9, snapshot_every_ms=10**12)
QUEUES = ["alpha", "beta", "gamma"]


async def open_shard(root: Path, clock: ManualClock, *, objects: bool = False) -> QueueShard:
    """Shard 0 of 1 over ``root``: its log as local segments, or one object per commit."""
    store = LocalDirStore(root)
    device = ObjectLogDevice(store, 0) if objects else None
    shard = QueueShard(
        0,
        1,
        store,
        clock=clock,
        ids=SequentialIds(),
        log_settings=NO_SNAPSHOTS,
        device=device,
    )
    await shard.start()
    return shard


async def stop(shard: QueueShard, *, snapshot: bool = False) -> None:
    """Close the shard (without snapshots: recovery reads the whole log) and its store."""
    await shard.close(snapshot=snapshot)
    await shard.store.close()


async def live_stats(d: Driver, names: list[str]) -> dict[str, dict[str, Any]]:
    """The engine's own ``Stats`` of each queue."""
    return {name: await d.stats(name) for name in names}


async def write_interleaved(root: Path, *, objects: bool = False) -> tuple[int, dict[str, Any]]:
    """Three queues taking turns in one shard log, commit after commit; returns the time at
    the end and each queue's stats then."""
    clock = ManualClock(START_MS)
    shard = await open_shard(root, clock, objects=objects)
    d = Driver([shard], clock)
    for name in QUEUES:
        await shard.create(name, QueueSettings(visibility_timeout_ms=20_000), [])
    for round_ in range(6):
        for name in QUEUES:
            await d.put(name, new(f"{name} {round_}"), new(f"{name} {round_}b"))
            d.tick(1_000)
            await d.ack(name, *(await d.take(name, 1)))
    stats = await live_stats(d, QUEUES)
    now = clock.now_ms()
    await stop(shard)
    return now, stats


async def write_recreated(root: Path) -> tuple[int, dict[str, Any], int]:
    """Queue ``gone`` is deleted with messages in it and created again, one commit per
    object; returns the time at the end, the stats of the queues, and the sequence number
    of the second ``QueueCreated``."""
    clock = ManualClock(START_MS)
    shard = await open_shard(root, clock, objects=True)
    d = Driver([shard], clock)
    await shard.create("gone", QueueSettings(), [])
    await shard.create("stays", QueueSettings(), [])
    await d.put("gone", new("acked"), new("left behind"), new("taken"))
    await d.put("stays", new("kept"))
    await d.ack("gone", *(await d.take("gone", 1)))
    await d.take("gone", 1)
    d.tick(1_000)
    await shard.delete("gone")
    d.tick(1_000)
    await shard.create("gone", QueueSettings(visibility_timeout_ms=5_000), [])
    created = shard.queues["gone"].next_seq - 1
    await d.put("gone", new("second life"), new("again"))
    await d.ack("gone", *(await d.take("gone", 1)))
    stats = await live_stats(d, ["gone", "stays"])
    now = clock.now_ms()
    await stop(shard, snapshot=True)
    return now, stats, created


async def write_mixed(root: Path) -> tuple[int, dict[str, Any]]:
    """The committed version-1 data directory, opened by a shard of format 2 and written
    further: its queues go on in the shard log. The shard prunes a version-1 log once two
    snapshots cover it; its segments are put back afterwards, as a reader finds them when it
    lists before that (or after a crash in between). Returns the time at the end and every
    queue's stats then."""
    shutil.copytree(DATADIR_V1, root, dirs_exist_ok=True)
    clock = ManualClock(START_MS + 60_000)
    shard = await open_shard(root, clock)
    d = Driver([shard], clock)
    await d.put("jobs", new("after the upgrade"))
    await d.ack("jobs", *(await d.take("jobs", 2)))
    await d.put("work", new("more work"))
    d.tick(1_000)
    await d.take("work", 1)
    names = await shard.names()
    stats = await live_stats(d, names)
    now = clock.now_ms()
    await stop(shard)
    for path in DATADIR_V1.rglob("*.seg"):
        target = root / path.relative_to(DATADIR_V1)
        if not target.exists():
            shutil.copy2(path, target)
    return now, stats


async def recovered_stats(root: Path, now_ms: int, *, shards: int = 1) -> dict[str, Any]:
    """What recovery would rebuild of every queue (read-only), as its ``Stats`` at ``now_ms``."""
    store = LocalDirStore(root)
    found = {}
    try:
        for index in range(shards):
            queues, _ = await read_shard(store, open_device(store, index), index, shards)
            for name, queue in queues.items():
                queue.state.advance(now_ms)  # as the server does before answering
                _, view = decide(queue.state, cmd.Stats(), now_ms, SequentialIds())
                found[name] = msgspec.structs.asdict(view)
    finally:
        await store.close()
    return found


def wal_files(root: Path, shard: int = 0) -> list[Path]:
    """The segments of a shard log, in order."""
    return sorted((root / keys.wal_prefix(shard)).glob("*.seg"))


def tear_last_block(root: Path, zeros: int = 4096) -> tuple[str, int]:
    """Cut the last block of the last local segment in the middle, as a write that never
    finished leaves it, with the preallocated zeros after it; returns the segment's key and
    where its valid blocks end."""
    path = wal_files(root)[-1]
    data = path.read_bytes()
    last = scan_segment(data).blocks[-1]
    cut = (last.offset + last.end) // 2
    path.write_bytes(data[:cut] + bytes(zeros))
    return path.relative_to(root).as_posix(), last.offset


def flip_middle_block(root: Path) -> tuple[str, int]:
    """Flip a byte in the body of a block in the middle of the log (a bad checksum); returns
    the key of its segment and the block's offset there."""
    found = [
        (path, block)
        for path in wal_files(root)
        for block in scan_segment(path.read_bytes()).blocks
    ]
    path, block = found[len(found) // 2]
    data = bytearray(path.read_bytes())
    data[block.end - 1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path.relative_to(root).as_posix(), block.offset


def run(coro: Any) -> Any:
    """Run a writer (tests are synchronous: Spark)."""
    return asyncio.run(coro)


async def recovered_ends(root: Path, *, shards: int = 1) -> dict[str, int]:
    """The last record of each queue that recovery would keep (read-only)."""
    store = LocalDirStore(root)
    try:
        found = {}
        for index in range(shards):
            queues, _ = await read_shard(store, open_device(store, index), index, shards)
            found.update({name: queue.next_seq - 1 for name, queue in queues.items()})
        return found
    finally:
        await store.close()
