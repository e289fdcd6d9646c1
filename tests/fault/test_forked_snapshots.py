"""Snapshots encoded in a forked child on real shards (LogSettings.snapshot_fork_above): the
shard goes on deciding commands while the child encodes, and the snapshot is the state as of
its record, not as of when the child finished: a restart from it (no final snapshot, as
after a crash) rebuilds exactly what the shard held, for spilled, FIFO and client-id queues,
with messages taken, acked and put while the snapshot was being made. A queue below the
threshold is encoded in the shard, as before."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors import queue_actor
from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core.ids import SequentialIds
from actors.errors import QueueError
from actors.log import keys
from actors.log.forked import can_fork, encode_forked
from actors.log.store import ObjectStore
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from tests.fault.actor_support import empty_store, state_view
from tests.fault.actor_support import settle_shard as settle

pytestmark = [
    pytest.mark.fault,
    pytest.mark.skipif(not can_fork(), reason="a platform without fork"),
]

FORKED = LogSettings(
    segment_bytes=256 * 1024,
    snapshot_every_records=10**9,
    snapshot_every_ms=10**12,
    snapshot_fork_above=0,  # every queue's snapshots in a child
)
KINDS = {
    "plain": ("jobs", QueueSettings(id_mode="server")),
    "fifo": ("jobs.fifo", QueueSettings(id_mode="server", fifo=True)),
    "client-ids": ("jobs", QueueSettings(id_mode="client")),
}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    st = empty_store("local", tmp_path)
    yield st
    await st.close()


async def open_shard(store: ObjectStore, clock: ManualClock, settings: LogSettings) -> QueueShard:
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=settings)
    await shard.start()
    return shard


def put(kind: str, first: int, n: int = 100) -> cmd.Put:
    return cmd.Put(
        [
            cmd.NewMessage(
                body=b"body %06d" % i,
                id=f"c-{i}" if kind == "client-ids" else None,
                delay_ms=(i * 7919) % 50_000,  # each its own time: spread runs
                group=f"g{i % 7}" if kind == "fifo" else None,
                attributes={"n": str(i)} if i % 3 == 0 else None,
            )
            for i in range(first, first + n)
        ]
    )


async def run(shard: QueueShard, queue: str, *commands: object) -> list[Any]:
    results = await shard.execute_many(queue, list(commands))
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_forked_snapshot_is_the_state_at_its_record_while_commands_go_on(
    store: ObjectStore, kind: str
) -> None:
    name, settings = KINDS[kind]
    clock = ManualClock()
    shard = await open_shard(store, clock, FORKED)
    try:
        await shard.create(name, settings, [])
        for p in range(30):
            await run(shard, name, put(kind, p * 100))
        clock.advance(20_000)  # some are due
        [taken] = await run(shard, name, cmd.Take(max=40))
        assert taken
        queue = shard.queues[name]
        snapshot = asyncio.create_task(queue.snapshot())
        await asyncio.sleep(0)  # it forked: the child has the state as of now
        seq = queue.next_seq - 1
        # meanwhile the shard decides: acks, puts, takes, time passing
        await run(shard, name, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken[:10]]))
        await run(shard, name, put(kind, 10_000))
        clock.advance(10_000)
        await run(shard, name, cmd.Take(max=5))
        key = await snapshot
        assert key == keys.snapshot_key(name, seq)  # of the record when it was taken
        await settle(shard)
        now = clock.now_ms()
        held = state_view(queue.state, now)
    finally:
        await shard.close(snapshot=False)  # as after a crash: the forked snapshot and replay
    shard = await open_shard(store, clock, FORKED)
    try:
        assert state_view(shard.queues[name].state, now) == held
        assert shard.queues[name].snapshots == [seq]
    finally:
        await shard.close(snapshot=False)


async def test_the_threshold_decides_who_encodes(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    forked: list[int] = []  # the size of each queue whose snapshot a child encoded

    def counted(encode: Callable[[], bytes]) -> Awaitable[bytes]:
        forked.append(len(encode()))  # (encoded here too, to see the same bytes come back)
        return encode_forked(encode)

    monkeypatch.setattr(queue_actor, "encode_forked", counted)
    clock = ManualClock()
    above = msgspec.structs.replace(FORKED, snapshot_fork_above=1_000)
    shard = await open_shard(store, clock, above)
    try:
        await shard.create("small", QueueSettings(), [])
        await shard.create("big", QueueSettings(), [])
        await run(shard, "small", put("plain", 0, 999))
        await run(shard, "big", put("plain", 0, 1000))
        small, big = shard.queues["small"], shard.queues["big"]
        assert (small._forks(), big._forks()) == (False, True)
        assert await small.snapshot() is not None  # encoded here: no child
        assert forked == []
        assert await big.snapshot() is not None
        assert len(forked) == 1
    finally:
        await shard.close()
