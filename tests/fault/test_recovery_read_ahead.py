"""Recovery reads a shard log on an object store ahead, many segments at once.

Found by the chaos campaign (``loadtest/chaos.py --s3``, kind ``s3_500``): on S3 each block
of the shard log is an object of its own, and a write that fails past the retry budget makes
the shard read its whole log again. Read one object at a time, a log of 1,696 objects (25 s
of the campaign's load) took 22 s to read again through moto, so a 2-s outage of the store
kept the shard from answering for 23 s. The segments are now read up to 32 at a time (4 per
write slot of the store), still applied in order; a local log (one write slot, 16 MiB
segments) is read one segment at a time as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from obstore.store import MemoryStore

from actors.clock import ManualClock
from actors.core.ids import SequentialIds
from actors.errors import QueueError
from actors.log.device import LogDevice
from actors.log.obstore_store import ObstoreStore
from actors.log.shard_recovery import read_shard
from actors.log.store import ObjectStore, StoreError
from actors.settings import LogSettings
from actors.shard import QueueShard
from tests.fault.actor_support import CLIENT_IDS, device_of, put, state_view
from tests.fault.actor_support import settle_shard as settle

pytestmark = pytest.mark.fault

BLOCKS = 60
SETTINGS = LogSettings(snapshot_every_records=10**9, snapshot_every_ms=10**12)


class SlowReads:
    """A log device whose reads take 5 ms each and are counted: how many at most at once."""

    def __init__(self, inner: LogDevice, fail: str | None = None) -> None:
        self.inner = inner
        self.fail = fail  # reading this segment fails (the store is down)
        self.reading = 0
        self.most = 0
        self.read_keys: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def read(self, key: str) -> bytes:
        self.reading += 1
        self.most = max(self.most, self.reading)
        self.read_keys.append(key)
        try:
            await asyncio.sleep(0.005)
            if key == self.fail:
                raise StoreError(f"GET {key}: 503 SlowDown", op="get", ambiguous=False)
            return await self.inner.read(key)
        finally:
            self.reading -= 1


async def _a_log_of_many_objects(store: ObjectStore, clock: ManualClock) -> Any:
    """A shard that wrote ``BLOCKS`` blocks (one object each) to ``store``; the queue's state."""
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=SETTINGS)
    await shard.start()
    try:
        await shard.create("q", CLIENT_IDS, [])
        for n in range(BLOCKS):
            results = await shard.execute_many("q", [put(f"m{n}")])
            assert not [r for r in results if isinstance(r, QueueError)], results
        await settle(shard)
        return state_view(shard.queues["q"].state, clock.now_ms())
    finally:
        await shard.close(snapshot=False)


async def test_a_log_of_many_objects_is_read_many_at_a_time_into_the_same_state() -> None:
    store = ObstoreStore(MemoryStore(), "memory://")
    clock = ManualClock()
    live = await _a_log_of_many_objects(store, clock)
    device = SlowReads(device_of(store))
    segments = await device.segments()
    assert len(segments) > BLOCKS

    queues, report = await read_shard(store, device, 0, 1)  # type: ignore[arg-type]

    assert report.clean
    assert state_view(queues["q"].state, clock.now_ms()) == live
    assert device.most > 8, f"at most {device.most} segment read(s) at once"
    assert device.most <= 4 * device.write_slots
    assert sorted(device.read_keys) == sorted(k for _, k in segments)  # each once
    await store.close()


async def test_a_read_ahead_that_fails_fails_the_replay_and_leaves_no_read_behind() -> None:
    store = ObstoreStore(MemoryStore(), "memory://")
    clock = ManualClock()
    await _a_log_of_many_objects(store, clock)
    keys = [k for _, k in await device_of(store).segments()]
    device = SlowReads(device_of(store), fail=keys[len(keys) // 2])
    before = asyncio.all_tasks()

    with pytest.raises(StoreError, match="503 SlowDown"):
        await read_shard(store, device, 0, 1)  # type: ignore[arg-type]

    await asyncio.sleep(0.05)  # cancelled reads finish
    assert asyncio.all_tasks() == before, "a read ahead was left running"
    assert device.reading == 0
    await store.close()
