"""Bodies in the log (actors/core/runs.py, actors/log/bodies.py) on real shards.

A local log's shard holds a ready put as a run and reads its bodies back from the block
that holds it; a snapshot holds where they are. Checked here through real shards over a
local directory (small segments) and obstore's in-memory store, a ManualClock and
SequentialIds:

- bodies read back right after a graceful restart, after one with no snapshot (replay
  places the runs itself), and after snapshots;
- an update of a spilled body, a reschedule, a delete, take order across runs;
- a segment whose bodies a queue may still read stays until they are gone, then goes;
- a damaged block read back is an error of that command, not a wrong body;
- the body cache stays within its bound, and a shard over its memory budget drops it;
- an object store's shard keeps bodies in memory (no place), and recovers them;
- a reshard leaves snapshots that hold every body, so the old logs can go.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core.ids import SequentialIds
from actors.errors import DataError, QueueError
from actors.log import keys
from actors.log.store import LocalDirStore, ObjectStore
from actors.reshard import reshard
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from tests.fault.actor_support import empty_store
from tests.fault.actor_support import settle_shard as settle

pytestmark = pytest.mark.fault

SERVER_IDS = QueueSettings(id_mode="server")
SETTINGS = LogSettings(
    segment_bytes=64 * 1024,
    snapshot_every_records=10**9,
    snapshot_every_ms=10**12,
    body_cache_bytes=32 * 1024,  # three puts' bodies
)
Q = "jobs"


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    st = empty_store("local", tmp_path)
    yield st
    await st.close()


async def open_shard(
    store: ObjectStore, clock: ManualClock, settings: LogSettings = SETTINGS
) -> QueueShard:
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=settings)
    await shard.start()
    return shard


async def run(shard: QueueShard, *commands: object) -> list[Any]:
    results = await shard.execute_many(Q, list(commands))
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


def body(i: int) -> bytes:
    """~100 bytes that do not compress (the log compresses records)."""
    return b"body %05d " % i + hashlib.sha256(b"%d" % i).digest() * 3


async def fill(shard: QueueShard, puts: int, per_put: int = 100) -> list[str]:
    await shard.create(Q, SERVER_IDS, [])
    ids: list[str] = []
    for p in range(puts):
        batch = [cmd.NewMessage(body=body(p * per_put + i)) for i in range(per_put)]
        [results] = await run(shard, cmd.Put(batch))
        ids += [r.id for r in results]
    return ids


async def take_all(shard: QueueShard) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    while True:
        [taken] = await run(shard, cmd.Take(max=37))
        if not taken:
            return got
        got += [(d.id, d.body) for d in taken]


def spilled(shard: QueueShard) -> int:
    return shard.queues[Q].state.spilled


@pytest.mark.parametrize("snapshot", [True, False], ids=["graceful", "no-snapshot"])
async def test_spilled_bodies_read_back_after_a_restart(local: ObjectStore, snapshot: bool) -> None:
    clock = ManualClock()
    shard = await open_shard(local, clock)
    ids = await fill(shard, 20)
    state = shard.queues[Q].state
    assert (state.spilled, len(state.messages)) == (2000, 0)
    assert all(run.place is not None and run.bodies is None for run in state.runs)
    [first] = await run(shard, cmd.Take(max=10))
    assert [d.body for d in first] == [body(i) for i in range(10)]
    await shard.close(snapshot=snapshot)

    shard = await open_shard(local, clock)
    try:
        assert spilled(shard) == 1990
        if snapshot:
            [snap_key] = [k for k in await local.list(keys.queue_prefix(Q)) if k.endswith(".snap")]
            assert len(await local.get(snap_key)) < 20_000  # places, not 200 kB of bodies
        rest = await take_all(shard)
        assert rest == [(ids[i], body(i)) for i in range(10, 2000)]
    finally:
        await shard.close()


async def test_update_reschedule_and_delete_of_spilled_messages_survive_a_restart(
    local: ObjectStore,
) -> None:
    clock = ManualClock()
    shard = await open_shard(local, clock)
    ids = await fill(shard, 3)
    await run(
        shard,
        cmd.Update(id=ids[150], body=b"patched"),
        cmd.Reschedule(id=ids[10], delay_ms=60_000),
        cmd.Delete(ids[20], None),
    )
    [view] = await run(shard, cmd.Peek(ids[151]))
    assert view.body == body(151)  # a neighbour, still spilled, reads right
    await shard.close(snapshot=False)

    shard = await open_shard(local, clock)
    try:
        got = dict(await take_all(shard))
        assert got[ids[150]] == b"patched"
        assert ids[10] not in got  # delayed
        assert ids[20] not in got  # deleted
        assert len(got) == 298
        assert all(got[ids[i]] == body(i) for i in range(300) if i not in (10, 20, 150))
        clock.advance(60_000)
        [late] = await run(shard, cmd.Peek(ids[10]))
        assert (late.state, late.body) == ("ready", body(10))
    finally:
        await shard.close()


async def test_a_segment_stays_while_a_queue_may_read_bodies_from_it(local: ObjectStore) -> None:
    clock = ManualClock()
    shard = await open_shard(local, clock)
    try:
        await fill(shard, 40)  # ~440 kB of puts: several 64 kB segments
        queue = shard.queues[Q]
        oldest = shard._segments[0].key
        for _ in range(2):  # two snapshots cover every record
            await run(shard, cmd.Checkpoint())
            await queue.snapshot()
        await settle(shard)
        assert shard._segments[0].key == oldest  # its bodies are still wanted
        got = await take_all(shard)
        assert len(got) == 4000
        await run(shard, cmd.Ack([cmd.LeaseRef(i, "x") for i, _ in got[:1]], lenient=True))
        for _ in range(2):
            await run(shard, cmd.Checkpoint())
            await queue.snapshot()
        await settle(shard)
        assert queue.body_floor is None
        assert shard._segments[0].key != oldest  # nothing spilled: the old segments went
        assert oldest not in [k for _, k in await shard.device.segments()]
    finally:
        await shard.close()


async def test_a_damaged_block_is_an_error_of_the_take_not_a_wrong_body(
    local: ObjectStore,
) -> None:
    assert isinstance(local, LocalDirStore)
    clock = ManualClock()
    shard = await open_shard(local, clock, LogSettings(body_cache_bytes=0))
    try:
        await fill(shard, 1)
        run_ = shard.queues[Q].state.runs[0]
        segment, offset = run_.place[0], run_.place[1]
        path = Path(local.root) / segment
        data = bytearray(path.read_bytes())
        data[offset + 100] ^= 0xFF  # a flipped bit inside the put's block
        path.write_bytes(bytes(data))
        shard.device._readers.clear()  # type: ignore[attr-defined]
        [result] = await shard.execute_many(Q, [cmd.Take(max=5)])
        assert isinstance(result, DataError)
        assert spilled(shard) == 100  # nothing was taken
    finally:
        await shard.close(snapshot=False)


async def test_the_body_cache_stays_within_its_bound(local: ObjectStore) -> None:
    shard = await open_shard(local, ManualClock())
    try:
        await fill(shard, 10)
        await take_all(shard)
        bodies = shard.bodies
        assert bodies is not None
        assert 0 < bodies.cached <= SETTINGS.body_cache_bytes
        assert bodies.blocks_read >= 10
        assert bodies.hits > 0
    finally:
        await shard.close()


async def test_a_shard_over_its_memory_budget_drops_the_body_cache(local: ObjectStore) -> None:
    shard = await open_shard(local, ManualClock())
    try:
        await fill(shard, 2)
        [taken] = await run(shard, cmd.Take(max=150))
        assert len(taken) == 150
        assert shard.bodies is not None
        assert shard.bodies.cached > 0
        shard.memory.budget = 1  # over it from now on; the reading is due now
        shard.memory._checked = 0.0
        assert shard.memory.over()
        assert shard.bodies.cached == 0
    finally:
        await shard.close(snapshot=False)


async def test_an_object_store_shard_keeps_run_bodies_in_memory(tmp_path: Path) -> None:
    store = empty_store("memory", tmp_path)
    clock = ManualClock()
    shard = await open_shard(store, clock)
    ids = await fill(shard, 3)
    state = shard.queues[Q].state
    assert shard.bodies is None
    assert state.spilled == 300  # runs all the same: the index stays small
    assert all(run.place is None and run.bodies is not None for run in state.runs)
    await shard.close()
    shard = await open_shard(store, clock)
    try:
        assert await take_all(shard) == [(ids[i], body(i)) for i in range(300)]
    finally:
        await shard.close()
        await store.close()


async def test_a_reshard_writes_snapshots_that_hold_every_body(local: ObjectStore) -> None:
    clock = ManualClock()
    shard = await open_shard(local, clock)
    ids = await fill(shard, 5)
    await shard.close()
    await reshard(local, 2, clock=clock, log_settings=SETTINGS)
    shards = [
        QueueShard(i, 2, local, clock=clock, ids=SequentialIds(), log_settings=SETTINGS)
        for i in range(2)
    ]
    for s in shards:
        await s.start()
    try:
        [owner] = [s for s in shards if Q in s.queues]
        assert await take_all(owner) == [(ids[i], body(i)) for i in range(500)]
    finally:
        for s in shards:
            await s.close()


async def test_the_servers_own_ids_spill_too(local: ObjectStore) -> None:
    """Ids from the clock with a random part (RandomIds, what ``evq serve`` draws) are not
    consecutive: a run keeps them."""
    shard = QueueShard(0, 1, local, clock=ManualClock(), log_settings=SETTINGS)
    await shard.start()
    try:
        ids = await fill(shard, 2)
        state = shard.queues[Q].state
        assert (state.spilled, len(state.messages)) == (200, 0)
        [view] = await run(shard, cmd.Peek(ids[150]))
        assert view.body == body(150)
        assert [d.id for d in (await run(shard, cmd.Take(max=200)))[0]] == ids
    finally:
        await shard.close()
