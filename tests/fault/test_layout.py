"""The store's shard layout (``wal/LAYOUT``) and changing the shard count (``reshard``).

A queue's records live in the log of the shard its name hashes to, so a store opened with
another shard count would hand queues to shards whose logs do not hold them: the first shard
writes the count, later ones with another count are refused, and :func:`actors.reshard.reshard`
changes it through snapshots. These tests run real shards on real stores (a local directory,
the in-memory store and, for one, moto's S3 server).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from obstore.store import MemoryStore

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import replies as rp
from actors.errors import DataError, QueueError, Unavailable
from actors.keyspace import partition_of
from actors.log import keys
from actors.log.faults import FaultyStore
from actors.log.layout import Layout, LayoutMismatch, read_layout, settle_layout
from actors.log.obstore_store import ObstoreStore
from actors.log.shard_recovery import placement
from actors.log.store import LocalDirStore, ObjectStore
from actors.reshard import reshard
from actors.settings import QueueSettings
from actors.shard import QueueShard
from tests.fault.actor_support import state_view

NOW = 1_700_000_000_000
QUEUES = [f"jobs-{i}" for i in range(12)]


def memory() -> ObjectStore:
    return ObstoreStore(MemoryStore(), "memory://")


@pytest.fixture(params=["local", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    st = LocalDirStore(tmp_path / "data") if request.param == "local" else memory()
    yield st
    await st.close()


async def open_shards(store: ObjectStore, count: int, clock: ManualClock) -> list[QueueShard]:
    shards = [QueueShard(i, count, store, clock=clock) for i in range(count)]
    for shard in shards:
        await shard.start()
    return shards


def shard_of(shards: list[QueueShard], name: str) -> QueueShard:
    return shards[placement(name, len(shards))]


async def run(shards: list[QueueShard], name: str, *commands: object) -> list[Any]:
    results = await shard_of(shards, name).execute_many(name, list(commands))
    for result in results:
        if isinstance(result, QueueError):
            raise result
    return results


def new(*bodies: str) -> cmd.Put:
    return cmd.Put([cmd.NewMessage(body=b.encode()) for b in bodies])


async def fill(shards: list[QueueShard]) -> None:
    """Queues in every state a reshard must keep: ready, delayed, taken (under leases), acked,
    released; a deleted queue, a deleted and re-created one, application keys."""
    everything = list(QueueSettings.__struct_fields__)
    for name in [*QUEUES, "gone", "again"]:
        await shard_of(shards, name).create(name, QueueSettings(), everything)
    for i, name in enumerate(QUEUES):
        await run(shards, name, new(*(f"{name}/{j}" for j in range(5))))
        await run(shards, name, cmd.Put([cmd.NewMessage(body=b"later", delay_ms=60_000 * (i + 1))]))
        [taken] = await run(shards, name, cmd.Take(max=3, visibility_timeout_ms=30_000))
        await run(shards, name, cmd.Ack([cmd.LeaseRef(id=taken[0].id, lease=taken[0].lease)]))
        await run(
            shards, name, cmd.Release([cmd.ReleaseItem(id=taken[1].id, lease=taken[1].lease)])
        )
    await run(shards, "gone", new("lost"))
    await shard_of(shards, "gone").delete("gone")
    await run(shards, "again", new("first life"))
    await shard_of(shards, "again").delete("again")
    await shard_of(shards, "again").create("again", QueueSettings(), everything)
    await run(shards, "again", new("second life"))
    for key in ("app:config", "app:flags"):
        await run(shards, partition_of(key), cmd.SetKey(key, {"set": key}))


def views(shards: list[QueueShard], now_ms: int) -> dict[str, Any]:
    """Every queue's state (key partitions too) as plain data, by name."""
    return {
        name: state_view(queue.state, now_ms)
        for shard in shards
        for name, queue in shard.queues.items()
        if queue.state.created
    }


async def close_all(shards: list[QueueShard], *, snapshot: bool = True) -> None:
    for shard in shards:
        await shard.close(snapshot=snapshot)


async def segments(store: ObjectStore) -> list[str]:
    return [k for k in await store.list(keys.WAL_ROOT) if keys.is_wal_segment(k)]


async def test_the_first_shard_writes_the_layout_and_another_count_is_refused(
    store: ObjectStore,
) -> None:
    clock = ManualClock(NOW)
    shards = await open_shards(store, 2, clock)
    await close_all(shards)
    assert await read_layout(store) == Layout(shards=2)

    with pytest.raises(LayoutMismatch) as caught:
        await QueueShard(0, 3, store, clock=clock).start()
    assert "2 shard(s), not 3" in caught.value.message
    assert "evq reshard --shards 3" in caught.value.message
    assert await read_layout(store) == Layout(shards=2)  # untouched
    shards = await open_shards(store, 2, clock)  # the right count still opens
    await close_all(shards)


async def test_settling_the_count_asked_stored_default(store: ObjectStore) -> None:
    assert await settle_layout(store, None, 3) == 3  # a fresh store: the default, written
    assert await read_layout(store) == Layout(shards=3)
    assert await settle_layout(store, None, 5) == 3  # then the stored count
    assert await settle_layout(store, 3, 5) == 3
    with pytest.raises(LayoutMismatch):
        await settle_layout(store, 4, 5)

    other = memory()
    assert await settle_layout(other, 2, 5) == 2  # asked for on a fresh store
    assert (await read_layout(other)).shards == 2  # type: ignore[union-attr]


class _ClaimedWhileListing(ObstoreStore):
    """A store on which another gateway claims the layout and starts a shard between this
    gateway's read of the layout and its listing of the logs."""

    async def list(self, prefix: str) -> list[str]:
        if await read_layout(self) is None:
            await self.put_if_absent(keys.LAYOUT, b'{"format": 2, "shards": 3}\n')
            await self.put(keys.wal_segment_key(0, 1), b"the other gateway's shard 0")
        return await super().list(prefix)


async def test_a_layout_claimed_by_a_gateway_starting_alongside_is_taken_up() -> None:
    store = _ClaimedWhileListing(MemoryStore(), "memory://")
    assert await settle_layout(store, None, 5) == 3
    store = _ClaimedWhileListing(MemoryStore(), "memory://")
    with pytest.raises(LayoutMismatch):
        await settle_layout(store, 4, 5)


async def test_shard_logs_without_a_layout_and_a_bad_layout_are_refused() -> None:
    store = memory()
    await store.put(keys.wal_segment_key(0, 1), b"a segment of unknown provenance")
    with pytest.raises(DataError, match="no wal/LAYOUT"):
        await settle_layout(store, None, 1)

    for data, why in (
        (b"{not json", "does not decode"),
        (b'{"format": 9, "shards": 2}', "format 9"),
        (b'{"format": 2, "shards": 0}', "below 1"),
        (b'{"format": 2, "shards": 2, "surprise": 1}', "does not decode"),
    ):
        store = memory()
        await store.put(keys.LAYOUT, data)
        with pytest.raises(DataError, match=why):
            await read_layout(store)


async def test_resharding_keeps_every_queue_message_lease_and_key(store: ObjectStore) -> None:
    clock = ManualClock(NOW)
    shards = await open_shards(store, 2, clock)
    await fill(shards)
    clock.advance(1_000)
    before = views(shards, clock.now_ms())
    epochs = [s.wal.epoch for s in shards]
    await close_all(shards, snapshot=False)  # as if killed: the records are in the logs only
    assert {"gone", "again", partition_of("app:config")} & set(before) == {
        "again",
        partition_of("app:config"),
    }

    report = await reshard(store, 3, clock=clock)
    assert (report.before, report.after, report.resumed) == (2, 3, False)
    assert report.removed > 0
    assert report.queues >= len(QUEUES) + 1
    layout = await read_layout(store)
    assert layout is not None
    assert (layout.shards, layout.resharding_to) == (3, None)
    assert layout.epoch_floor >= max(epochs)  # the reshard's own incarnations claimed more
    assert await segments(store) == []
    archived = await store.list(keys.ARCHIVE_ROOT)
    retired = [k for k in archived if f"/resharded-{layout.epoch_floor}/wal/" in k]
    assert len(retired) >= report.removed  # the old logs are kept, out of the new logs' way
    assert not [k for k in archived if keys.is_wal_segment(keys.unarchived(k))]
    assert not [k for k in archived if k.startswith(keys.ARCHIVE_MARKERS)]

    shards = await open_shards(store, 3, clock)
    assert all(s.wal.epoch > layout.epoch_floor for s in shards)
    assert views(shards, clock.now_ms()) == before
    assert "gone" not in {n for s in shards for n in s.queues}
    [taken] = await run(shards, QUEUES[0], cmd.Take(max=10))
    assert sorted(m.body for m in taken) == sorted(
        [*(f"{QUEUES[0]}/{j}".encode() for j in (1, 3, 4))]
    )
    [key] = await run(shards, partition_of("app:flags"), cmd.GetKey("app:flags"))
    assert isinstance(key, rp.KeyView)
    assert key.value == {"set": "app:flags"}
    await run(shards, "again", new("third"))
    await close_all(shards)

    shards = await open_shards(store, 3, clock)  # and it all recovers from the new logs
    view = views(shards, clock.now_ms())
    assert view[QUEUES[0]] != before[QUEUES[0]]  # the take above is durable
    assert view[QUEUES[1]] == before[QUEUES[1]]
    await close_all(shards)


async def test_an_interrupted_reshard_is_refused_until_it_is_finished(tmp_path: Path) -> None:
    inner = LocalDirStore(tmp_path / "data")
    clock = ManualClock(NOW)
    shards = await open_shards(inner, 2, clock)
    await fill(shards)
    before = views(shards, clock.now_ms())
    await close_all(shards, snapshot=False)

    failing = FaultyStore(inner).fail("delete", 2)  # dies while removing the old logs
    with pytest.raises(QueueError):
        await reshard(failing, 4, clock=clock)
    layout = await read_layout(inner)
    assert layout is not None
    assert (layout.shards, layout.resharding_to) == (2, 4)
    assert await segments(inner)  # some of the old logs are still there

    for count in (2, 4):  # neither count serves a half-changed store
        with pytest.raises(LayoutMismatch, match="interrupted"):
            await QueueShard(0, count, inner, clock=clock).start()
    with pytest.raises(LayoutMismatch, match="interrupted"):
        await settle_layout(inner, None, 1)
    with pytest.raises(DataError, match="--shards 4"):
        await reshard(inner, 3)  # another count must wait for this one

    report = await reshard(inner, 4, clock=clock)
    assert (report.resumed, report.after) == (True, 4)
    assert await segments(inner) == []
    shards = await open_shards(inner, 4, clock)
    assert views(shards, clock.now_ms()) == before
    await close_all(shards)


async def test_a_reshard_is_refused_while_a_shard_holds_its_local_log(tmp_path: Path) -> None:
    store = LocalDirStore(tmp_path / "data")
    clock = ManualClock(NOW)
    shards = await open_shards(store, 2, clock)
    await fill(shards)
    with pytest.raises(Unavailable):
        await reshard(LocalDirStore(tmp_path / "data"), 3)
    assert await read_layout(store) == Layout(shards=2)  # nothing changed
    views_now = views(shards, clock.now_ms())
    await close_all(shards)
    shards = await open_shards(store, 2, clock)
    assert views(shards, clock.now_ms()) == views_now
    await close_all(shards)


async def test_reshard_to_the_same_count_or_of_a_fresh_store_only_writes_the_layout() -> None:
    store = memory()
    report = await reshard(store, 3)
    assert (report.before, report.removed) == (None, 0)
    assert await read_layout(store) == Layout(shards=3)
    report = await reshard(store, 3)
    assert (report.before, report.after, report.removed, report.queues) == (3, 3, 0, 0)
    with pytest.raises(DataError):
        await reshard(store, 0)


async def test_a_zombie_of_before_the_reshard_is_fenced_on_s3(s3_server: Any) -> None:
    """The new logs claim epochs above the old ones, so a segment a pre-reshard incarnation
    writes late (with its old epoch) is recognised as fenced and never recovered."""
    store = s3_server.store()
    clock = ManualClock(NOW)
    shards = await open_shards(store, 1, clock)
    await fill(shards)
    old_epoch = shards[0].wal.epoch
    await close_all(shards)
    await reshard(store, 2, clock=clock)
    shards = await open_shards(store, 2, clock)
    before = views(shards, clock.now_ms())
    assert min(s.wal.epoch for s in shards) > old_epoch
    target = shard_of(shards, QUEUES[0])
    await close_all(shards)

    # The late write of an old incarnation, right after the new log's claim.
    from actors.core import events as ev
    from actors.log.wal import encode_block, encode_record, encode_wal_header

    lsn = max(keys.seq_of(k) for k in await segments(store) if f"/{target.index:04d}/" in k) + 1
    zombie = ev.MessagesPut(NOW, [ev.PutItem(id="zombie", body=b"z", activate_at_ms=NOW)])
    block = encode_block(old_epoch, lsn, [(QUEUES[0], 10**6, [encode_record(zombie)])])
    await store.put_if_absent(
        keys.wal_segment_key(target.index, lsn),
        encode_wal_header(old_epoch, lsn, target.index) + block,
    )
    shards = await open_shards(store, 2, clock)
    assert views(shards, clock.now_ms()) == before
    await close_all(shards)
