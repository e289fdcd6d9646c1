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
- an object store's shard keeps bodies in memory (no place), and recovers them; with a
  segment cache, it reads them from its local copy of the log (no GET), fills the copy
  again after a restart on an empty one, and drops what the log prunes;
- a reshard leaves snapshots that hold every body, so the old logs can go;
- compaction: a segment kept only by a few live bodies has them written again further on
  (BodiesMoved) and goes; they read right after a restart, after a move replayed without
  its snapshots, and after a crash that tore the move's block; a segment with many live
  bodies stays as it is.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core.ids import SequentialIds
from actors.core.snapshot import decode_snapshot
from actors.errors import DataError, QueueError
from actors.log import keys
from actors.log.codec import decode_snapshot_object
from actors.log.faults import FaultyStore
from actors.log.store import LocalDirStore, ObjectStore
from actors.reshard import reshard
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from pipeline.logread import SyncStore, read_snapshot
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


async def fill(shard: QueueShard, puts: int, per_put: int = 100, queue: str = Q) -> list[str]:
    if queue not in shard.queues:
        await shard.create(queue, SERVER_IDS, [])
    ids: list[str] = []
    for p in range(puts):
        batch = [cmd.NewMessage(body=body(p * per_put + i)) for i in range(per_put)]
        [results] = await shard.execute_many(queue, [cmd.Put(batch)])
        ids += [r.id for r in results]
    return ids


async def take_all(shard: QueueShard) -> list[tuple[str, bytes]]:
    got: list[tuple[str, bytes]] = []
    while True:
        [taken] = await run(shard, cmd.Take(max=37))
        if not taken:
            return got
        got += [(d.id, d.body) for d in taken]


async def segments_of(shard: QueueShard) -> set[str]:
    """The keys of the log segments on disk (or in the store)."""
    return {k for _, k in await shard.device.segments()}


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
        # taken, not acked: they may be given back into their runs (return runs), which
        # read the puts' records again, so the segments stay while they are in flight
        assert queue.body_floor is not None
        for k in range(0, len(got), 1000):
            acks = [cmd.LeaseRef(i, "x") for i, _ in got[k : k + 1000]]
            await run(shard, cmd.Ack(acks, lenient=True))
        for _ in range(2):
            await run(shard, cmd.Checkpoint())
            await queue.snapshot()
        await settle(shard)
        assert queue.body_floor is None
        assert shard._segments[0].key != oldest  # nothing spilled: the old segments went
        assert oldest not in await segments_of(shard)
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
        shard.device.files.close()  # type: ignore[attr-defined]
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
    await run(shard, cmd.Update(id=ids[7], body=b"seven"))  # held in memory: no place
    assert state.runs[0].patches is not None
    assert state.runs[0].patches.held == {7: b"seven"}
    await shard.close()
    shard = await open_shard(store, clock)
    try:
        want = [(ids[i], b"seven" if i == 7 else body(i)) for i in range(300)]
        assert await take_all(shard) == want
    finally:
        await shard.close()
        await store.close()


@pytest.mark.parametrize("snapshot", [True, False], ids=["graceful", "no-snapshot"])
async def test_an_object_store_shard_with_a_segment_cache_reads_bodies_locally(
    tmp_path: Path, snapshot: bool
) -> None:
    """With ``segment_cache``, an object store's runs spill too: their bodies are read
    back from the local copy of the log, never with a GET; a restart on an empty copy (a
    new machine) fills it again from the segments recovery reads anyway."""
    store = FaultyStore(empty_store("memory", tmp_path))
    cache = tmp_path / "cache"
    settings = msgspec.structs.replace(SETTINGS, segment_cache=str(cache))
    clock = ManualClock()
    shard = await open_shard(store, clock, settings)
    try:
        ids = await fill(shard, 5)
        state = shard.queues[Q].state
        assert shard.bodies is not None
        assert all(run.place is not None and run.bodies is None for run in state.runs)
        copies = [p for p in cache.rglob("*") if p.is_file()]
        assert copies  # the log's objects, copied
        gets = store.calls["get"]
        [taken] = await run(shard, cmd.Take(max=150))
        assert [d.body for d in taken] == [body(i) for i in range(150)]
        assert store.calls["get"] == gets  # read from the copy
        await run(shard, cmd.Update(id=ids[444], body=b"changed"))  # read from the copy too
        [view] = await run(shard, cmd.Peek(ids[444]))
        assert view.body == b"changed"
    finally:
        await shard.close(snapshot=snapshot)
    shutil.rmtree(cache)

    shard = await open_shard(store, clock, settings)
    try:
        state = shard.queues[Q].state
        assert all(run.place is not None and run.bodies is None for run in state.runs if run.left)
        gets = store.calls["get"]
        rest = await take_all(shard)
        assert rest == [(ids[i], b"changed" if i == 444 else body(i)) for i in range(150, 500)]
        assert store.calls["get"] == gets
    finally:
        await shard.close()


async def test_a_segment_cache_drops_what_the_log_prunes(tmp_path: Path) -> None:
    store = empty_store("memory", tmp_path)
    cache = tmp_path / "cache"
    settings = msgspec.structs.replace(SETTINGS, segment_cache=str(cache))
    shard = await open_shard(store, ManualClock(), settings)
    try:
        stale = await stale_and_churned(shard)
        before = {p.name for p in cache.rglob("*") if p.is_file()}
        await snapshot_both(shard)
        assert shard.compactions == 1  # STALE's bodies moved: every old object can go
        after = {p.name for p in cache.rglob("*") if p.is_file()}
        listed = {k.rsplit("/", 1)[1] for _, k in await shard.device.segments()}
        assert after == listed
        assert len(after) < len(before) / 5
        assert await stale_bodies(shard) == [(stale[i], body(i)) for i in range(50)]
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


# ---------------------------------------------------------------- compaction

STALE = "stale"  # a queue whose few bodies sit in a segment the other queue has churned
EVERY_MINUTE = msgspec.structs.replace(SETTINGS, snapshot_every_ms=60_000)


async def on(shard: QueueShard, queue: str, *commands: object) -> list[Any]:
    results = await shard.execute_many(queue, list(commands))
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


async def stale_and_churned(shard: QueueShard, n: int = 50, puts: int = 40) -> list[str]:
    """An ``n``-message put on STALE (50: ~5 kB of bodies), then ``puts`` puts of 100 on Q
    (40: ~440 kB), every one taken and acked: the oldest segments only hold STALE's
    bodies alive. Returns STALE's ids."""
    await shard.create(STALE, SERVER_IDS, [])
    [put] = await on(shard, STALE, cmd.Put([cmd.NewMessage(body=body(i)) for i in range(n)]))
    await fill(shard, puts)
    while True:
        [taken] = await run(shard, cmd.Take(max=500))
        if not taken:
            break
        await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))
    return [r.id for r in put]


async def snapshot_both(shard: QueueShard) -> None:
    """Two snapshots of each queue: every record is covered, so only bodies keep segments."""
    for name in (Q, STALE):
        for _ in range(2):
            await on(shard, name, cmd.Checkpoint())
            await shard.queues[name].snapshot()
    await settle(shard)


async def stale_bodies(shard: QueueShard) -> list[tuple[str, bytes]]:
    [taken] = await on(shard, STALE, cmd.Take(max=100, visibility_timeout_ms=600_000))
    return [(d.id, d.body) for d in taken]


@pytest.mark.parametrize("snapshot", [True, False], ids=["graceful", "no-snapshot"])
async def test_a_segment_with_few_live_bodies_is_compacted_and_goes_and_they_survive(
    local: ObjectStore, snapshot: bool
) -> None:
    clock = ManualClock()
    shard = await open_shard(local, clock)
    stale = await stale_and_churned(shard)
    oldest = shard._segments[0].key
    [run_] = shard.queues[STALE].state.runs
    assert run_.place[0] == oldest
    await snapshot_both(shard)
    assert shard.compactions == 1
    assert run_.place[0] != oldest
    assert len(run_.place) == 7  # in a BodiesMoved record now
    assert oldest not in await segments_of(shard)
    assert len(shard._segments) <= 2  # what was left of ~7 segments
    [view] = await on(shard, STALE, cmd.Peek(stale[7]))
    assert view.body == body(7)
    [patched, later] = await on(
        shard,
        STALE,
        cmd.Update(id=stale[8], body=b"patched"),
        cmd.Reschedule(id=stale[9], delay_ms=60_000),
    )
    assert (patched.body, later.body) == (b"patched", body(9))
    await shard.close(snapshot=snapshot)

    shard = await open_shard(local, clock)
    try:
        expected = [(stale[i], body(i)) for i in range(50) if i != 9]
        expected[8] = (stale[8], b"patched")
        assert await stale_bodies(shard) == expected
        clock.advance(60_000)
        assert await stale_bodies(shard) == [(stale[9], body(9))]
    finally:
        await shard.close()


async def test_segments_with_many_live_bodies_are_not_compacted(local: ObjectStore) -> None:
    """The segments that bodies keep are not even 1.5 times those bodies: moving them would
    write much to free little (``compact_over``)."""
    shard = await open_shard(local, ManualClock())
    try:
        await stale_and_churned(shard, 200, puts=10)  # ~21 kB kept, ~110 kB acked
        await fill(shard, 40, queue=STALE)  # ~440 kB more of STALE's, never taken
        oldest = shard._segments[0].key
        await snapshot_both(shard)
        assert shard.compactions == 0
        assert shard._segments[0].key == oldest  # kept for STALE's bodies
        assert spilled(shard) == 0
        assert shard.queues[STALE].state.spilled == 4200
    finally:
        await shard.close()


async def test_a_move_replayed_without_its_snapshots_reads_the_new_place_and_frees_the_old(
    local: ObjectStore,
) -> None:
    """The crash after a BodiesMoved record is durable and before any snapshot reads from
    its place: recovery restores the snapshot (old place: its segment is still there), and
    replaying the record moves the run again."""
    clock = ManualClock()
    settings = msgspec.structs.replace(SETTINGS, compact_over=0.0)  # moves by hand here
    shard = await open_shard(local, clock, settings)
    stale = await stale_and_churned(shard)
    await snapshot_both(shard)
    oldest = shard._segments[0].key
    [run_] = shard.queues[STALE].state.runs
    assert run_.place[0] == oldest  # never compacted by itself
    await on(shard, STALE, cmd.Take(max=5))  # slots 0-4 taken: the move writes 5-49
    [moved] = await on(shard, STALE, cmd.MoveBodies([run_.id]))
    assert moved == 45
    await shard.close(snapshot=False)

    shard = await open_shard(local, clock)  # compact_over back at its default
    try:
        [run_] = shard.queues[STALE].state.runs
        assert run_.place[0] != oldest
        assert run_.place[6] == 5
        clock.advance(60_000)  # the five leases run out
        await snapshot_both(shard)
        assert oldest not in await segments_of(shard)
        assert sorted(await stale_bodies(shard)) == sorted((stale[i], body(i)) for i in range(50))
    finally:
        await shard.close()


async def test_a_crash_in_the_middle_of_a_move_leaves_the_bodies_where_they_were(
    local: ObjectStore,
) -> None:
    """The BodiesMoved block torn by a crash (cut in half on disk): recovery stops the log
    before it, and the run reads its bodies from its put, whose segment was kept."""
    assert isinstance(local, LocalDirStore)
    clock = ManualClock()
    settings = msgspec.structs.replace(SETTINGS, compact_over=0.0)
    shard = await open_shard(local, clock, settings)
    stale = await stale_and_churned(shard)
    await snapshot_both(shard)
    [run_] = shard.queues[STALE].state.runs
    oldest = run_.place[0]
    await on(shard, STALE, cmd.MoveBodies([run_.id]))
    segment, offset, length = run_.place[0], run_.place[1], run_.place[2]
    await shard.close(snapshot=False)
    path = Path(local.root) / segment
    data = bytearray(path.read_bytes())
    data[offset + length // 2 : offset + length] = bytes(length - length // 2)  # torn
    path.write_bytes(bytes(data))

    shard = await open_shard(local, clock)
    try:
        [run_] = shard.queues[STALE].state.runs
        assert run_.place[0] == oldest
        assert len(run_.place) == 5  # its put's place
        assert await stale_bodies(shard) == [(stale[i], body(i)) for i in range(50)]
    finally:
        await shard.close()


async def test_an_idle_shard_prunes_and_compacts_by_itself(local: ObjectStore) -> None:
    """No command comes after the churn: the shard's periodic prune (every snapshot
    interval) has the queues whose snapshots are older than it take new ones, then compacts
    and deletes the old segments."""
    clock = ManualClock()
    settings = msgspec.structs.replace(SETTINGS, snapshot_every_ms=200)  # also the period
    shard = await open_shard(local, clock, settings)
    try:
        stale = await stale_and_churned(shard)
        oldest = shard._segments[0].key
        clock.advance(1_000)  # every queue's snapshot (if any) is now older than 200 ms
        for _ in range(100):
            await asyncio.sleep(0.1)
            if oldest not in await segments_of(shard):
                break
        else:
            raise AssertionError("the idle shard kept its oldest segment")
        await settle(shard)
        assert shard.compactions == 1
        assert len(shard.queues[STALE].snapshots) == 2
        assert await stale_bodies(shard) == [(stale[i], body(i)) for i in range(50)]
    finally:
        await shard.close()


async def test_an_idle_queue_whose_snapshots_alone_read_old_bodies_takes_new_ones(
    local: ObjectStore,
) -> None:
    """Its runs were taken since its snapshots, and it went idle: once they are older than
    the snapshot interval, the next prune (another queue's snapshot here) has it take new
    ones, and the old segments go."""
    clock = ManualClock()
    shard = await open_shard(local, clock, EVERY_MINUTE)
    try:
        await fill(shard, 40)
        queue = shard.queues[Q]
        for _ in range(2):
            await run(shard, cmd.Checkpoint())
            await queue.snapshot()  # both read bodies from the oldest segment
        oldest = shard._segments[0].key
        while taken := (await run(shard, cmd.Take(max=500)))[0]:
            await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))
        assert queue.body_floor is not None  # only its snapshots read there now
        snapshots = list(queue.snapshots)
        clock.advance(61_000)
        await fill(shard, 1, queue=STALE)
        await shard.queues[STALE].snapshot()  # a prune, as any snapshot starts one
        await settle(shard)
        assert queue.snapshots != snapshots
        assert queue.body_floor is None
        assert oldest not in await segments_of(shard)
    finally:
        await shard.close()


async def test_after_a_restart_no_segment_goes_that_a_kept_snapshot_reads_bodies_from(
    local: ObjectStore,
) -> None:
    """A restarted shard does not know where its queues' older snapshots read bodies from:
    it keeps the log until they took new ones (the first prune asks for them). So when the
    newest snapshot turns out to be damaged, the one recovery falls back on still reads
    every body."""
    assert isinstance(local, LocalDirStore)
    clock = ManualClock()
    shard = await open_shard(local, clock)
    ids = await fill(shard, 40)
    queue = shard.queues[Q]
    await run(shard, cmd.Checkpoint())
    await queue.snapshot()  # reads bodies from the oldest segment on
    [taken] = await run(shard, cmd.Take(max=1000))
    await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))
    [taken] = await run(shard, cmd.Take(max=1000))
    await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))
    await run(shard, cmd.Checkpoint())
    await queue.snapshot()  # reads from further on: the first 2000 are gone
    await shard.close(snapshot=False)

    shard = await open_shard(local, clock)
    old = shard.queues[Q].snapshots
    await fill(shard, 1, queue=STALE)
    await shard.queues[STALE].snapshot()  # a prune: Q's snapshots are replaced first
    await settle(shard)
    on_disk = await segments_of(shard)
    kept = shard.queues[Q].snapshots
    assert kept[0] > old[-1]
    for seq in kept:
        path = Path(local.root) / keys.snapshot_key(Q, seq)
        snap = decode_snapshot(decode_snapshot_object(path.read_bytes())[2])
        assert {r.place[0] for r in snap.runs if r.place is not None} <= on_disk
    newest = Path(local.root) / keys.snapshot_key(Q, kept[-1])
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF  # damaged: recovery falls back on the older one
    newest.write_bytes(bytes(data))
    await shard.close(snapshot=False)

    shard = await open_shard(local, clock)
    try:
        assert await take_all(shard) == [(ids[i], body(i)) for i in range(2000, 4000)]
    finally:
        await shard.close()


async def test_a_restarted_shard_knows_each_segments_last_record_of_a_queue(
    local: ObjectStore,
) -> None:
    """Recovery, restoring a snapshot, skips the records it covers; it must still note each
    segment's real last record of the queue (it noted the snapshot's, and so kept every
    segment until snapshots past it)."""
    clock = ManualClock()
    shard = await open_shard(local, clock)
    await fill(shard, 40)
    before = {s.key: s.queues.get(Q) for s in shard._segments}
    await shard.close()  # a snapshot covers every record
    shard = await open_shard(local, clock)
    try:
        after = {s.key: s.queues.get(Q) for s in shard._segments if s.key in before}
        assert after == before
        assert len(set(after.values())) == len(after)  # each segment its own
    finally:
        await shard.close()


# ---------------------------------------------------------------- attributes


def attrs(i: int) -> dict[str, str] | None:
    """Two attributes on two messages of three (None on the third)."""
    return {"tenant": f"t{i % 5}", "trace": f"{i:08x}"} if i % 3 else None


async def churned(shard: QueueShard) -> None:
    """40 puts of 100 on Q, every one taken and acked: the oldest segments only hold
    STALE's bodies alive."""
    await fill(shard, 40)
    while True:
        [taken] = await run(shard, cmd.Take(max=500))
        if not taken:
            return
        await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))


async def pipeline_read_last(store: ObjectStore, tmp_path: Path) -> Any:
    """STALE's newest snapshot as the pipeline reads it (its runs read back from the log);
    closes ``store``."""
    snaps = sorted(k for k in await store.list(keys.queue_prefix(STALE)) if k.endswith(".snap"))
    await store.close()

    def pipeline_read() -> Any:  # the pipeline's reader runs its own event loop
        with SyncStore(str(tmp_path / "store")) as sync:
            return read_snapshot(sync, snaps[-1])

    read = await asyncio.to_thread(pipeline_read)
    assert not isinstance(read, str), read
    return read


async def test_attributes_of_spilled_messages_are_read_from_the_log_moved_and_restored(
    tmp_path: Path,
) -> None:
    """Attributes kept with the bodies in real records: read back by peek and take, written
    again by compaction (BodiesMoved), read after restarts with and without snapshots, and
    by the pipeline from a snapshot whose runs read the moved record."""
    store = empty_store("local", tmp_path)
    clock = ManualClock()
    shard = await open_shard(store, clock)
    await shard.create(STALE, SERVER_IDS, [])
    put = cmd.Put([cmd.NewMessage(body=body(i), attributes=attrs(i)) for i in range(50)])
    [results] = await on(shard, STALE, put)
    stale = [r.id for r in results]
    [run_] = shard.queues[STALE].state.runs
    assert (run_.with_attrs, run_.attrs, run_.place is not None) == (True, None, True)
    [view] = await on(shard, STALE, cmd.Peek(stale[4]))
    assert view.attributes == attrs(4)  # read back from the put's record
    await churned(shard)
    [first] = await on(shard, STALE, cmd.Take(max=2, visibility_timeout_ms=600_000))
    assert [d.attributes for d in first] == [attrs(0), attrs(1)]
    await snapshot_both(shard)
    assert shard.compactions == 1
    assert len(run_.place) == 7  # in a BodiesMoved record now, from slot 2 on
    [view] = await on(shard, STALE, cmd.Peek(stale[5]))
    assert view.attributes == attrs(5)
    await shard.close(snapshot=False)  # the move is replayed from the log

    shard = await open_shard(store, clock)
    try:
        [view] = await on(shard, STALE, cmd.Peek(stale[49]))
        assert (view.body, view.attributes) == (body(49), attrs(49))
        await on(shard, STALE, cmd.Checkpoint())
        await shard.queues[STALE].snapshot()
    finally:
        await shard.close()

    read = await pipeline_read_last(store, tmp_path)
    _, state = read  # its runs read back (unspilled) from the moved record
    held = {m.id: m.attributes for m in state.messages.values()}
    assert held == {int(stale[i]): attrs(i) for i in range(50)}


async def test_an_object_store_shard_restores_attributes_with_the_bodies_it_reads_back(
    tmp_path: Path,
) -> None:
    """With a segment cache, an object store's runs read their bodies and attributes from
    the local copy; restarted without one, on snapshots that say where they are, recovery
    reads them into memory (inline_runs)."""
    store = empty_store("memory", tmp_path)
    cached = msgspec.structs.replace(SETTINGS, segment_cache=str(tmp_path / "cache"))
    clock = ManualClock()
    shard = await open_shard(store, clock, cached)
    await shard.create(Q, SERVER_IDS, [])
    put = cmd.Put([cmd.NewMessage(body=body(i), attributes=attrs(i)) for i in range(60)])
    [results] = await run(shard, put)
    ids = [r.id for r in results]
    await shard.close(snapshot=False)
    try:
        shard = await open_shard(store, clock, cached)  # replayed, read from the copy
        [run_] = shard.queues[Q].state.runs
        assert (run_.with_attrs, run_.place is not None) == (True, True)
        [view] = await run(shard, cmd.Peek(ids[7]))
        assert view.attributes == attrs(7)
        await run(shard, cmd.Update(id=ids[9], body=b"nine"))  # a patch, placed
        await shard.close()  # snapshots that say where the bodies are (and the patch)

        shard = await open_shard(store, clock)  # no cache: read into memory
        [run_] = shard.queues[Q].state.runs
        assert (run_.place, run_.attrs is not None) == (None, True)
        assert run_.patches is not None
        assert run_.patches.held == {9: b"nine"}  # read into memory too
        [taken] = await run(shard, cmd.Take(max=100))
        assert [(d.id, d.body, d.attributes) for d in taken] == [
            (mid, b"nine" if i == 9 else body(i), attrs(i)) for i, mid in enumerate(ids)
        ]
    finally:
        await shard.close()
        await store.close()


async def test_a_batch_given_back_reads_its_put_through_a_compaction_and_a_replay(
    tmp_path: Path,
) -> None:
    """Messages released with a backoff go back into their put's run (a return run,
    runs.py ``Run.lend``): compaction writes their bodies and attributes again with the
    run's own, the release and the move are replayed from the log, and the pipeline reads
    them back with their receive counts from a snapshot."""
    store = empty_store("local", tmp_path)
    clock = ManualClock()
    shard = await open_shard(store, clock)
    await shard.create(STALE, SERVER_IDS, [])
    put = cmd.Put([cmd.NewMessage(body=body(i), attributes=attrs(i)) for i in range(50)])
    [results] = await on(shard, STALE, put)
    stale = [r.id for r in results]
    [taken] = await on(shard, STALE, cmd.Take(max=20, visibility_timeout_ms=600_000))
    items = [cmd.ReleaseItem(id=d.id, lease=d.lease, delay_ms=300_000) for d in taken]
    await on(shard, STALE, cmd.Release(items))
    state = shard.queues[STALE].state
    [(_, _, loan)] = state.later
    assert (loan.off, loan.count, not state.messages) == (0, 20, True)
    await churned(shard)
    await snapshot_both(shard)
    assert shard.compactions == 1
    [put_run] = state.by_id
    assert len(put_run.place) == 7  # in a BodiesMoved record now, the lent slots with it
    [view] = await on(shard, STALE, cmd.Peek(stale[3]))
    assert (view.state, view.body, view.attributes, view.receive_count) == (
        "delayed",
        body(3),
        attrs(3),
        1,
    )
    await shard.close(snapshot=False)  # the release and the move replayed from the log

    shard = await open_shard(store, clock)
    try:
        assert shard.queues[STALE].state.deferred == 20
        await on(shard, STALE, cmd.Checkpoint())
        await shard.queues[STALE].snapshot()
        clock.advance(300_000)
        [got] = await on(shard, STALE, cmd.Take(max=100, visibility_timeout_ms=600_000))
        order = list(range(20, 50)) + list(range(20))  # the untouched ones were ready first
        assert [(d.id, d.body, d.attributes) for d in got] == [
            (stale[i], body(i), attrs(i)) for i in order
        ]
        assert [d.receive_count for d in got] == [1] * 30 + [2] * 20
    finally:
        await shard.close(snapshot=False)

    read = await pipeline_read_last(store, tmp_path)
    _, held = read  # the return run read back (unspilled) from the moved record
    counts = {m.id: (m.body, m.receive_count) for m in held.messages.values()}
    assert counts == {int(stale[i]): (body(i), int(i < 20)) for i in range(50)}


# ---------------------------------------------------------------- bodies updates changed


@pytest.mark.parametrize("snapshot", [True, False], ids=["graceful", "no-snapshot"])
async def test_an_updated_body_stays_in_its_run_read_from_the_updates_record(
    local: ObjectStore, snapshot: bool
) -> None:
    """An update of a spilled message's body leaves it in its run (runs.py, ``Patches``):
    once the update is durable its body is read from the update's record; a snapshot holds
    where (the restore reads it there), and without one the replay places it again."""
    clock = ManualClock()
    shard = await open_shard(local, clock)
    ids = await fill(shard, 3)
    changed = {ids[i]: b"changed %d" % i for i in (5, 150, 299)}
    await run(shard, *[cmd.Update(id=mid, body=b) for mid, b in changed.items()])
    await run(shard, cmd.Update(id=ids[150], body=b"again"))  # its first patch replaced
    changed[ids[150]] = b"again"
    await settle(shard)
    state = shard.queues[Q].state
    assert (state.spilled, len(state.messages)) == (300, 0)  # no message objects
    places = [place for run_ in state.runs for _, place in (run_.patches or _none()).places()]
    assert len(places) == 3
    on_disk = await segments_of(shard)
    assert all(place[0] in on_disk for place in places)
    [view] = await run(shard, cmd.Peek(ids[150]))
    assert view.body == b"again"
    await shard.close(snapshot=snapshot)

    shard = await open_shard(local, clock)
    try:
        state = shard.queues[Q].state
        assert sum(len(run_.patches or ()) for run_ in state.runs) == 3
        assert not any(run_.patches and run_.patches.held for run_ in state.runs)  # placed
        got = dict(await take_all(shard))
        assert {mid: got[mid] for mid in changed} == changed
        assert all(got[ids[i]] == body(i) for i in range(300) if ids[i] not in changed)
    finally:
        await shard.close()


@pytest.mark.parametrize("snapshot", [True, False], ids=["graceful", "no-snapshot"])
async def test_a_compaction_writes_the_updated_bodies_and_their_records_can_go(
    local: ObjectStore, snapshot: bool
) -> None:
    """Bodies updates changed, in the oldest segments with their put: the compaction that
    moves the put's bodies writes the changed ones (the patches go), and the segments go."""
    clock = ManualClock()
    shard = await open_shard(local, clock)
    await shard.create(STALE, SERVER_IDS, [])
    [put] = await on(shard, STALE, cmd.Put([cmd.NewMessage(body=body(i)) for i in range(50)]))
    stale = [r.id for r in put]
    await on(
        shard,
        STALE,
        cmd.Update(id=stale[3], body=b"three"),
        cmd.Update(id=stale[30], body=b"thirty"),
    )
    await settle(shard)
    [run_] = shard.queues[STALE].state.runs
    assert run_.patches is not None
    oldest = shard._segments[0].key
    assert {place[0] for _, place in run_.patches.places()} == {oldest}
    await fill(shard, 40)  # churned: taken and acked, the oldest segments hold STALE's alone
    while True:
        [taken] = await run(shard, cmd.Take(max=500))
        if not taken:
            break
        await run(shard, cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in taken]))
    await snapshot_both(shard)
    assert shard.compactions == 1
    assert run_.patches is None  # the move wrote them
    assert oldest not in await segments_of(shard)
    expected = [(mid, body(i)) for i, mid in enumerate(stale)]
    expected[3], expected[30] = (stale[3], b"three"), (stale[30], b"thirty")
    [peeked] = await on(shard, STALE, cmd.Peek(stale[30]))
    assert peeked.body == b"thirty"
    await shard.close(snapshot=snapshot)

    shard = await open_shard(local, clock)
    try:
        assert await stale_bodies(shard) == expected[:50]
    finally:
        await shard.close()


def _none() -> Any:
    """An empty Patches, for runs with none."""
    from actors.core.runs import Patches

    return Patches()
