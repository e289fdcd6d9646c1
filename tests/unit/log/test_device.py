"""Where a shard log lives (``actors/log/device.py``): the local device's files, and what both
devices share.

- :class:`LocalLogDevice`: a segment is preallocated to ``segment_bytes`` and zero-filled
  before its header is written; blocks land one after the other; a block that does not fit
  starts a new segment (named by its LSN) and the old one is cut to its blocks; so does a
  segment older than ``roll_after_ms`` (ManualClock, no sleeping); the active segment is
  never deleted; closing cuts it; the ``LOCK`` refuses a second opener until the first
  closes.
- Both devices: ``segments()`` lists segments in LSN order and nothing else (the lock,
  reports, damaged copies); ``truncate`` cuts a segment or removes it when no block is
  left; ``keep_copy`` keeps a copy under ``damaged/``; the object device writes one object
  (a one-block segment) per block.

The object device's verdicts on a name already taken (the same bytes, its own epoch, a newer
or an older one) are in ``tests/fault/test_fencing.py``; two shards competing for one local
log are too.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from actors.clock import ManualClock
from actors.core import events as ev
from actors.errors import Unavailable
from actors.log import keys
from actors.log.device import LocalLogDevice, LogDevice, ObjectLogDevice, open_device
from actors.log.faults import FaultyStore
from actors.log.obstore_store import ObstoreStore
from actors.log.store import KeyNotFound, LocalDirStore, ObjectStore, StoreError
from actors.log.wal import WalHeader, encode_block, encode_record, scan_segment
from tests.unit.log import layout

SEGMENT = 1024  # small segments: a few blocks each
ROLL_MS = 60_000
SHARD = 3


def block(epoch: int, lsn: int, size: int = 100, count: int = 1) -> bytes:
    """A block of ``count`` records of queue q from LSN ``lsn``, about ``size`` bytes long
    (random bodies: they are stored as they are, not compressed)."""
    body = random.Random(lsn).randbytes(max(0, size // count - 40))
    records = [
        encode_record(ev.MessagesPut(lsn + i, [ev.PutItem(i, body, 1)])) for i in range(count)
    ]
    return encode_block(epoch, lsn, [("q", lsn, records)])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalDirStore]:
    st = LocalDirStore(tmp_path / "data")
    yield st
    await st.close()


@pytest.fixture
async def local(store: LocalDirStore, clock: ManualClock) -> AsyncIterator[LocalLogDevice]:
    device = LocalLogDevice(store, SHARD, segment_bytes=SEGMENT, roll_after_ms=ROLL_MS, clock=clock)
    yield device
    await device.close()


def files(store: LocalDirStore) -> dict[str, bytes]:
    """The shard log's segment files, by key."""
    where = store.root / keys.wal_prefix(SHARD)
    return {
        p.relative_to(store.root).as_posix(): p.read_bytes() for p in sorted(where.glob("*.seg"))
    }


# ================================================================ a local segment


async def test_a_new_segment_is_preallocated_and_zero_filled(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(7, 41)
    key = keys.wal_segment_key(SHARD, 41)
    assert local.active() == key
    [(name, data)] = files(store).items()
    assert name == key
    assert len(data) == SEGMENT
    header = layout.wal_header(data)
    assert (header.magic, header.version, header.epoch, header.first_lsn, header.shard) == (
        b"EVQW",
        2,
        7,
        41,
        SHARD,
    )
    assert data[layout.WAL_HEADER :] == bytes(SEGMENT - layout.WAL_HEADER)
    read = scan_segment(data)
    assert (read.end, read.blocks, read.valid_end) == ("zeros", [], layout.WAL_HEADER)
    assert await local.segments() == [(41, key)]


async def test_blocks_land_one_after_another_in_the_preallocated_space(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(2, 1)
    written = [(1, block(2, 1, 200)), (2, block(2, 2, 150, count=3)), (5, block(2, 5, 100))]
    offsets = []
    pos = layout.WAL_HEADER
    for lsn, data in written:
        key, at = await local.write(2, lsn, data)
        assert key == keys.wal_segment_key(SHARD, 1)
        assert at == pos  # where the block begins: its bodies are read back from there
        assert local.read_at(key, at, len(data)) == data
        offsets.append(pos)
        pos += len(data)
        # the file as a crash would leave it now: the blocks so far, then zeros
        on_disk = files(store)[key]
        assert len(on_disk) == SEGMENT
        assert on_disk[offsets[-1] : pos] == data
        assert on_disk[pos:] == bytes(SEGMENT - pos)
    read = scan_segment(files(store)[keys.wal_segment_key(SHARD, 1)])
    assert [b.offset for b in read.blocks] == offsets
    assert [b.first_lsn for b in read.blocks] == [1, 2, 5]
    assert (read.end, read.valid_end, read.next_lsn) == ("zeros", pos, 6)


async def test_closing_cuts_the_active_segment_to_its_blocks(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(1, 1)
    data = block(1, 1)
    await local.write(1, 1, data)
    await local.close()
    [on_disk] = files(store).values()
    assert len(on_disk) == layout.WAL_HEADER + len(data)
    assert scan_segment(on_disk).end == "clean"
    assert local.active() is None


async def test_a_block_that_does_not_fit_starts_the_next_segment(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(1, 1)
    first = [block(1, 1, 400), block(1, 2, 400)]  # 32 + 2 x ~400: room for no third
    for lsn, data in enumerate(first, start=1):
        await local.write(1, lsn, data)
    third = block(1, 3, 400)
    assert layout.WAL_HEADER + sum(map(len, first)) + len(third) > SEGMENT
    key, _ = await local.write(1, 3, third)
    assert key == keys.wal_segment_key(SHARD, 3) == local.active()
    segs = files(store)
    assert list(segs) == [keys.wal_segment_key(SHARD, 1), key]
    old = segs[keys.wal_segment_key(SHARD, 1)]
    assert len(old) == layout.WAL_HEADER + sum(map(len, first))  # cut to its blocks
    read = scan_segment(old, stop_lsn=3)
    assert (read.end, [b.first_lsn for b in read.blocks]) == ("clean", [1, 2])
    new = segs[key]
    assert len(new) == SEGMENT
    assert scan_segment(new).header == WalHeader(2, 1, 3, SHARD)
    assert new[layout.WAL_HEADER : layout.WAL_HEADER + len(third)] == third
    assert await local.segments() == [(1, keys.wal_segment_key(SHARD, 1)), (3, key)]


def sized_block(epoch: int, lsn: int, size: int) -> bytes:
    """A one-record block of exactly ``size`` bytes."""
    for n in range(size):
        data = block(epoch, lsn, n + 40)
        if len(data) == size:
            return data
    raise AssertionError(f"no block of {size} bytes")


@pytest.mark.parametrize("over", [0, 1])
async def test_a_block_rolls_exactly_when_it_does_not_fit_in_what_is_left(
    local: LocalLogDevice, store: LocalDirStore, over: int
) -> None:
    await local.begin(1, 1)
    first = block(1, 1, 200)
    await local.write(1, 1, first)
    left = SEGMENT - layout.WAL_HEADER - len(first)
    key, _ = await local.write(1, 2, sized_block(1, 2, left + over))
    assert key == keys.wal_segment_key(SHARD, 2 if over else 1)
    sizes = [len(d) for d in files(store).values()]
    if over:  # the first segment was cut to its block; the block went to a new one
        assert sizes == [layout.WAL_HEADER + len(first), SEGMENT]
    else:  # exactly full: not a byte past the preallocated space
        assert sizes == [SEGMENT]
        assert scan_segment(files(store)[key]).end == "clean"


async def test_a_block_larger_than_a_segment_gets_a_segment_of_its_own(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(1, 1)
    await local.write(1, 1, block(1, 1))
    big = block(1, 2, 3 * SEGMENT)
    key, _ = await local.write(1, 2, big)
    assert len(files(store)[key]) == layout.WAL_HEADER + len(big)  # just big enough
    after, _ = await local.write(1, 3, block(1, 3))
    assert after == keys.wal_segment_key(SHARD, 3)  # and the next block starts another
    assert [scan_segment(d).end for d in files(store).values()] == ["clean", "clean", "zeros"]


async def test_a_segment_older_than_roll_after_ms_is_closed_at_the_next_block(
    local: LocalLogDevice, store: LocalDirStore, clock: ManualClock
) -> None:
    await local.begin(1, 1)
    await local.write(1, 1, block(1, 1, 50))
    clock.advance(ROLL_MS - 1)
    assert (await local.write(1, 2, block(1, 2, 50)))[0] == keys.wal_segment_key(SHARD, 1)
    clock.advance(1)
    assert (await local.write(1, 3, block(1, 3, 50)))[0] == keys.wal_segment_key(SHARD, 3)
    old = files(store)[keys.wal_segment_key(SHARD, 1)]
    assert scan_segment(old).end == "clean"
    assert [b.first_lsn for b in scan_segment(old).blocks] == [1, 2]
    # the age counts from the new segment's start
    clock.advance(ROLL_MS - 1)
    assert (await local.write(1, 4, block(1, 4, 50)))[0] == keys.wal_segment_key(SHARD, 3)


async def test_a_segment_idle_since_it_began_takes_the_next_block_itself(
    local: LocalLogDevice, store: LocalDirStore, clock: ManualClock
) -> None:
    # An idle shard's fresh segment holds no block yet: its age does not matter.
    await local.begin(1, 1)
    clock.advance(10 * ROLL_MS)
    assert (await local.write(1, 1, block(1, 1)))[0] == keys.wal_segment_key(SHARD, 1)
    assert list(files(store)) == [keys.wal_segment_key(SHARD, 1)]


async def test_each_incarnation_begins_a_segment_of_its_own(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(1, 1)
    await local.write(1, 1, block(1, 1))
    await local.begin(2, 2)  # a reload: a new epoch from the next LSN
    assert local.active() == keys.wal_segment_key(SHARD, 2)
    assert (await local.write(2, 2, block(2, 2)))[0] == keys.wal_segment_key(SHARD, 2)
    with pytest.raises(StoreError, match="not open for writing"):
        await local.write(1, 3, block(1, 3))  # the old epoch writes nothing more
    segs = files(store)
    assert [scan_segment(d).header.epoch for d in segs.values()] == [1, 2]
    assert scan_segment(segs[keys.wal_segment_key(SHARD, 1)]).end == "clean"


async def test_a_device_that_has_not_begun_writes_nothing(local: LocalLogDevice) -> None:
    await local.open()
    with pytest.raises(StoreError, match="not open for writing"):
        await local.write(1, 1, block(1, 1))


async def test_the_segment_being_written_is_never_deleted(
    local: LocalLogDevice, store: LocalDirStore
) -> None:
    await local.begin(1, 1)
    await local.write(1, 1, block(1, 1, 600))
    await local.write(1, 2, block(1, 2, 600))  # rolls
    old, active = keys.wal_segment_key(SHARD, 1), keys.wal_segment_key(SHARD, 2)
    await local.delete(active)
    await local.delete(old)
    assert list(files(store)) == [active]
    assert (await local.write(1, 3, block(1, 3)))[0] == active


# ================================================================ the lock


async def test_a_second_opener_is_refused_until_the_first_closes(
    tmp_path: Path, local: LocalLogDevice
) -> None:
    await local.open()
    await local.open()  # again by the holder: nothing changes
    other_store = LocalDirStore(tmp_path / "data")  # as another process would
    second = LocalLogDevice(other_store, SHARD, segment_bytes=SEGMENT)
    try:
        with pytest.raises(Unavailable, match="held by another process"):
            await second.open()
        with pytest.raises(Unavailable):
            await second.begin(2, 1)  # and it never writes a byte
        assert await second.segments() == []
        elsewhere = LocalLogDevice(other_store, SHARD + 1, segment_bytes=SEGMENT)
        await elsewhere.open()  # another shard's log has a lock of its own
        await elsewhere.close()
        await local.close()
        await second.open()
        await second.begin(2, 1)
        assert second.active() == keys.wal_segment_key(SHARD, 1)
    finally:
        await second.close()
        await other_store.close()
    assert (tmp_path / "data" / keys.wal_prefix(SHARD) / "LOCK").exists()


# ================================================================ both devices


@pytest.fixture(params=["local", "object"])
async def any_device(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[LogDevice, ObjectStore]]:
    """Each device over a store of its kind, with nothing written yet."""
    if request.param == "local":
        local_store = LocalDirStore(tmp_path / "data")
        st: ObjectStore = local_store
        device: LogDevice = LocalLogDevice(local_store, SHARD, segment_bytes=SEGMENT)
    else:
        st = ObstoreStore(MemoryStore(), "memory://")
        device = ObjectLogDevice(st, SHARD)
    yield device, st
    await device.close()
    await st.close()


async def _segment_at(store: ObjectStore, lsn: int, blocks: int = 1) -> tuple[str, bytes]:
    """A closed segment of ``blocks`` one-record blocks from ``lsn``, put in the store."""
    data = layout.build_wal_header(first_lsn=lsn, shard=SHARD)
    for i in range(blocks):
        data += block(1, lsn + i)
    key = keys.wal_segment_key(SHARD, lsn)
    await store.put(key, data)
    return key, data


async def test_segments_are_listed_in_lsn_order_and_nothing_else(
    any_device: tuple[LogDevice, ObjectStore],
) -> None:
    device, store = any_device
    assert await device.segments() == []  # not even a directory yet
    lsns = [1_000, 9, 10, 123_456_789_012]
    for lsn in lsns:
        await _segment_at(store, lsn)
    prefix = keys.wal_prefix(SHARD)
    for other in [
        f"{prefix}LOCK",
        keys.wal_report_key(SHARD, 3),
        keys.wal_damaged_key(keys.wal_segment_key(SHARD, 5), 2),
        f"{prefix}not-a-number.seg",
        f"{prefix}{5:020d}.seg.bak",
        f"{prefix}{5:019d}.seg",
        keys.wal_segment_key(SHARD + 1, 7),  # another shard's log
        keys.segment_key("q", 8),  # a version-1 log
    ]:
        await store.put(other, b"x")
    assert await device.segments() == [(n, keys.wal_segment_key(SHARD, n)) for n in sorted(lsns)]


async def test_truncate_cuts_a_segment_or_removes_it_when_no_block_is_left(
    any_device: tuple[LogDevice, ObjectStore],
) -> None:
    device, store = any_device
    cut, data = await _segment_at(store, 1, blocks=3)
    gone, _ = await _segment_at(store, 4)
    end_of_first = layout.blocks(data)[0].end
    await device.truncate(cut, end_of_first)
    await device.truncate(gone, layout.WAL_HEADER)
    assert await store.get(cut) == data[:end_of_first]
    with pytest.raises(KeyNotFound):
        await store.get(gone)
    assert await device.segments() == [(1, cut)]
    await device.truncate(gone, 100)  # already gone: nothing to do
    await device.truncate(cut, 0)
    assert await device.segments() == []


async def test_keep_copy_keeps_a_damaged_segment_beside_the_log(
    any_device: tuple[LogDevice, ObjectStore],
) -> None:
    device, store = any_device
    key, data = await _segment_at(store, 5, blocks=2)
    await device.keep_copy(key, 4)
    await device.keep_copy(keys.wal_segment_key(SHARD, 99), 4)  # gone: nothing to keep
    assert await store.get(keys.wal_damaged_key(key, 4)) == data
    assert await store.list(f"{keys.wal_prefix(SHARD)}damaged/") == [keys.wal_damaged_key(key, 4)]
    assert await device.segments() == [(5, key)]
    assert await device.read(key) == data


# ================================================================ the object device


async def test_the_object_device_writes_one_segment_object_per_block() -> None:
    store = ObstoreStore(MemoryStore(), "memory://")
    device = ObjectLogDevice(store, SHARD)
    await device.open()
    await device.begin(6, 11)
    blocks = {11: block(6, 11, count=2), 13: block(6, 13), 14: block(6, 14, count=4)}
    for lsn, data in blocks.items():
        assert await device.write(6, lsn, data) == (keys.wal_segment_key(SHARD, lsn), 32)
        assert device.active() is None  # every object is whole once written: all prunable
    assert [lsn for lsn, _ in await device.segments()] == list(blocks)
    for lsn, data in blocks.items():
        stored = await store.get(keys.wal_segment_key(SHARD, lsn))
        assert stored == layout.build_wal_header(epoch=6, first_lsn=lsn, shard=SHARD) + data
        read = scan_segment(stored)
        assert (read.end, len(read.blocks), read.blocks[0].first_lsn) == ("clean", 1, lsn)
    await device.delete(keys.wal_segment_key(SHARD, 11))
    assert [lsn for lsn, _ in await device.segments()] == [13, 14]
    await store.close()


async def test_open_device_picks_files_for_a_local_directory_and_objects_elsewhere(
    tmp_path: Path,
) -> None:
    local = LocalDirStore(tmp_path / "data")
    memory = ObstoreStore(MemoryStore(), "memory://")
    wrapped = FaultyStore(local)  # fault injection needs a write per block: objects
    try:
        device = open_device(local, 2, segment_bytes=4096, roll_after_ms=5)
        assert isinstance(device, LocalLogDevice)
        assert (device.segment_bytes, device.roll_after_ms, device.write_slots) == (4096, 5, 1)
        assert isinstance(open_device(memory, 2), ObjectLogDevice)
        assert open_device(memory, 2).write_slots == memory.write_slots
        assert isinstance(open_device(wrapped, 2), ObjectLogDevice)
    finally:
        await memory.close()
        await local.close()
    assert not (tmp_path / "data" / keys.wal_prefix(2)).exists()  # nothing written yet
