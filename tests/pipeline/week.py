"""A week of traffic whose log the shards mostly pruned into the archive.

:func:`write_week_log` drives the queues of two real shards over a ``LocalDirStore`` with a
manual clock, for seven days: every hour producers put, consumers take, ack, release and
let leases expire, a poison message goes to the dead-letter queue now and then, and the
shards snapshot often (every 40 records, and an idle queue when 200 records are kept
behind it), so their logs prune: nearly every segment ends in
the archive (``actors/log/archive.py``). On the way the shards restart once (a graceful
close and open, on the fourth day), and in the last hours a prune is cut between archiving a
segment and deleting it (the deletion fails, as a crash there would leave it), so the
archive and the live log both hold that segment. What the engine says at the end is kept
beside the log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.clock import ManualClock
from actors.core.ids import SequentialIds
from actors.log.device import LogDevice
from actors.log.shard_recovery import placement
from actors.log.store import LocalDirStore, StoreError
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from tests.pipeline.logs import Driver, new

START_MS = 1_800_000_000_000
HOUR = 3_600_000
DAYS = 7
SHARDS = 2
PRUNING = LogSettings(
    snapshot_every_records=40, snapshot_every_ms=10**12, segment_bytes=4096, retain_records=200
)
QUEUES = {
    "jobs": QueueSettings(
        visibility_timeout_ms=60_000, max_receives=2, dead_letter_queue="jobs-dlq"
    ),
    "jobs-dlq": QueueSettings(),
    "events": QueueSettings(visibility_timeout_ms=30_000),
}


@dataclass
class WeekLog:
    """A log on disk and what the engine says about it."""

    root: Path
    now_ms: int
    stats: dict[str, dict[str, Any]]
    notes: dict[str, Any] = field(default_factory=dict)


async def _open(store: LocalDirStore, clock: ManualClock) -> list[QueueShard]:
    shards: list[QueueShard] = []

    async def forward(target: str, commands: list[object]) -> list[Any]:
        return await shards[placement(target, SHARDS)].execute_many(target, commands)

    shards += [
        QueueShard(
            i,
            SHARDS,
            store,
            clock=clock,
            ids=SequentialIds(),
            log_settings=PRUNING,
            forward=forward,
        )
        for i in range(SHARDS)
    ]
    for shard in shards:
        await shard.start()
    return shards


async def _settle(shards: list[QueueShard]) -> None:
    """Until no shard or queue has background work (snapshots, prunes, dead letters)."""
    for _ in range(1000):
        tasks = [t for s in shards for t in (*s._background, *_queue_tasks(s))]
        if not tasks:
            return
        await asyncio.gather(*tasks, return_exceptions=True)
    raise AssertionError("the shards did not settle")


def _queue_tasks(shard: QueueShard) -> list[asyncio.Task[Any]]:
    return [t for q in shard.queues.values() for t in q._background]


async def _hour(d: Driver, hour: int) -> None:
    """One hour of traffic."""
    await d.put("jobs", *[new(f"job {hour}-{i}") for i in range(6)])
    await d.put("events", *[new(f"event {hour}-{i}") for i in range(4)])
    if hour % 9 == 0:
        await d.put("jobs", new(f"poison {hour}"))
    taken = await d.take("jobs", 10)
    fine = [m for m in taken if not m.body.startswith(b"poison")]
    await _ack(d, "jobs", fine[:-1])
    if fine:
        await d.release("jobs", fine[-1], delay_ms=60_000)  # comes back in a minute
    events = await d.take("events", 10)
    await _ack(d, "events", events[:-1])  # one lease a time runs out
    await _ack(d, "jobs-dlq", await d.take("jobs-dlq", 10))
    d.tick(HOUR)


async def _ack(d: Driver, queue: str, deliveries: list[Any]) -> None:
    if deliveries:
        await d.ack(queue, *deliveries)


def _fail_one_delete(device: LogDevice, notes: dict[str, Any]) -> None:
    """The next deletion of a pruned segment (of any device patched so) fails, after its
    archiving, and so does every later try of it: the segment stays where a crash between
    archiving and pruning leaves it, in the archive and in the live log (the prunes that
    follow stop at it, as the whole history must still read once)."""
    real = device.delete

    async def delete(key: str) -> None:
        notes.setdefault("cut", key)
        if key == notes["cut"]:  # the shard "died" here: it never got to delete this one
            raise StoreError("cut between archiving and pruning", ambiguous=False)
        await real(key)

    device.delete = delete  # type: ignore[method-assign]


async def write_week_log(root: Path) -> WeekLog:
    """Write the week under ``root``; see the module docstring."""
    store = LocalDirStore(root)
    clock = ManualClock(START_MS)
    notes: dict[str, Any] = {}
    shards = await _open(store, clock)
    for name, settings in QUEUES.items():
        await Driver(shards, clock).shard(name).create(name, settings, [])
    for hour in range(DAYS * 24):
        if hour == 3 * 24:  # a restart in the middle of the week
            await _settle(shards)
            for shard in shards:
                await shard.close()
            shards = await _open(store, clock)
        if hour == DAYS * 24 - 6:  # near the end, so the live log stays short
            for shard in shards:
                _fail_one_delete(shard.device, notes)
        await _hour(Driver(shards, clock), hour)
        await _settle(shards)
    d = Driver(shards, clock)
    stats = {q: await d.stats(q) for q in QUEUES}
    now = clock.now_ms()
    await _settle(shards)
    for shard in shards:
        await shard.close(snapshot=False)
    await store.close()
    return WeekLog(root, now, stats, notes)
