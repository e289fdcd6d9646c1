"""Damaged shard logs on a real disk: torn tails at every byte, flipped bits, broken headers,
gaps, misnamed segments, bad snapshots.

Each test writes a shard's log with the real shard, queue and local log (small segments, so
the log has several) into a :class:`LocalDirStore` under ``tmp_path`` (ManualClock,
SequentialIds), keeps that directory as the pristine copy, damages a copy of it with
ordinary file operations, and recovers it with a real shard. Expectations come from the
pristine log, read with the byte layout of FORMAT.md (``tests/unit/log/layout.py``): the
state recovery must rebuild is the fold of exactly the records before the damage. No mocks.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest

from actors.clock import ManualClock
from actors.core import commands as c
from actors.core import events as ev
from actors.core.snapshot import logical
from actors.core.state import QueueState
from actors.errors import QueueError
from actors.ids import SequentialIds
from actors.log import keys
from actors.log.shard_recovery import SHARD_STREAM, StoredReport
from actors.log.store import LocalDirStore
from actors.log.wal import decode_record
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from actors.status import Discarded, ShardReport
from tests.fault.actor_support import settle_shard
from tests.unit.log import layout

pytestmark = pytest.mark.fault

Q = "q"
T0 = 1_700_000_000_000
SETTINGS = QueueSettings(visibility_timeout_ms=600_000)
# Segments of 450 bytes hold two to four blocks of these tests: the log has several.
LOG = LogSettings(segment_bytes=450, snapshot_every_records=10**9, snapshot_every_ms=10**12)


# ================================================================ writing and reading logs


async def open_shard(root: Path, clock: ManualClock, **options: Any) -> QueueShard:
    shard = QueueShard(
        0, 1, LocalDirStore(root), clock=clock, ids=SequentialIds(), log_settings=LOG, **options
    )
    await shard.start()
    return shard


async def stop(shard: QueueShard) -> None:
    await shard.close(snapshot=False)
    await shard.store.close()


def ok(results: list[Any]) -> list[Any]:
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


class History:
    """Drives a queue through rounds of commands; every round is one block on disk."""

    def __init__(self, queue: QueueActor, clock: ManualClock) -> None:
        self.queue, self.clock = queue, clock
        self.rounds = 0
        self.pending: list[Any] = []  # deliveries of the last take, acked by the next round

    async def round(self) -> None:
        """Put two messages, take one, ack what the previous round took: 2-3 records."""
        self.clock.advance(10)
        i = self.rounds
        commands: list[object] = [
            c.Put([c.NewMessage(body=b"m%d-a" % i), c.NewMessage(body=b"m%d-b" % i)]),
            c.Take(max=1),
        ]
        if self.pending:
            commands.append(c.Ack([c.LeaseRef(d.id, d.lease) for d in self.pending]))
        results = ok(await self.queue.execute_many(commands))
        self.pending = results[1]
        self.rounds += 1

    async def single(self, command: object) -> Any:
        """One command on its own: one block of one record."""
        self.clock.advance(10)
        return await self.queue.execute(command)


async def write_log(
    root: Path, script: Callable[[History], Awaitable[None]]
) -> tuple[ManualClock, bytes]:
    """Create queue ``q`` under ``root``, run ``script``, close without a final snapshot.

    Returns the clock and the closed queue's state (as bytes at the clock's time), which must
    equal what a recovery of the log rebuilds."""
    clock = ManualClock(T0)
    shard = await open_shard(root, clock)
    await shard.create(Q, SETTINGS, [])
    queue = await shard.get(Q)
    await script(History(queue, clock))
    await queue.execute(c.Stats())  # everything decided is durable
    await settle_shard(shard)  # the prune behind the snapshots (and its archiving) is done
    live = state_bytes(queue.state, clock.now_ms())
    await stop(shard)
    return clock, live


@dataclass(frozen=True)
class Segment:
    key: str
    path: Path
    first_lsn: int
    epoch: int
    blocks: list[layout.BlockAt]
    records: list[tuple[int, ev.Event]]  # queue q's (seq, event), in order

    @property
    def count(self) -> int:
        return sum(b.count for b in self.blocks)


def block_records(block: layout.BlockAt) -> list[tuple[str, int, ev.Event]]:
    """(queue, seq, event) of every record of a block."""
    out = []
    for queue, first, records in msgspec.msgpack.decode(block.body):
        for i, raw in enumerate(records):
            out.append((queue, first + i, decode_record(msgspec.msgpack.encode(raw))))
    return out


def segments(root: Path) -> list[Segment]:
    """The shard's log segments on disk, read with FORMAT.md's layout, in order."""
    out = []
    for path in sorted((root / keys.wal_prefix(0)).glob("*.seg")):
        data = path.read_bytes()
        header = layout.wal_header(data)
        key = path.relative_to(root).as_posix()
        assert keys.seq_of(key) == header.first_lsn
        found = layout.blocks(data)
        records = [(s, e) for b in found for q, s, e in block_records(b) if q == Q]
        out.append(Segment(key, path, header.first_lsn, header.epoch, found, records))
    return out


def events_of(segs: list[Segment]) -> list[ev.Event]:
    """Queue q's events in these contiguous segments, checked to be numbered 1, 2, 3 …"""
    lsn = segs[0].first_lsn
    events: list[ev.Event] = []
    for seg in segs:
        assert seg.first_lsn == lsn
        lsn += seg.count
        for seq, event in seg.records:
            assert seq == len(events) + 1
            events.append(event)
    return events


def before(segs: list[Segment], block: layout.BlockAt) -> list[ev.Event]:
    """Queue q's events in the blocks before ``block`` (an LSN tells where it is)."""
    kept = []
    for seg in segs:
        for b in seg.blocks:
            if b.first_lsn >= block.first_lsn:
                return kept
            kept.extend(e for q, _, e in block_records(b) if q == Q)
    return kept


def fold(events: list[ev.Event]) -> QueueState:
    state = QueueState()
    for event in events:
        state.apply(event)
    return state


def state_bytes(state: QueueState, now_ms: int) -> bytes:
    """The logical state at ``now_ms`` (advancing is a projection: equal logs and equal
    times give equal bytes)."""
    state.advance(now_ms)
    return msgspec.msgpack.encode(logical(state))


def damaged_copies(root: Path) -> list[str]:
    where = root / keys.wal_prefix(0) / "damaged"
    return sorted(p.name for p in where.glob("*")) if where.exists() else []


def copy(pristine: Path, tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(pristine, root)
    return root


def stored_report(root: Path, epoch: int) -> ShardReport:
    """What the shard's incarnation ``epoch`` stored about its log's recovery."""
    data = (root / keys.wal_report_key(0, epoch)).read_bytes()
    return msgspec.json.decode(data, type=StoredReport).log


async def recover(root: Path, clock: ManualClock, **options: Any) -> tuple[QueueShard, bytes]:
    """Open a shard on ``root``; return it and queue q's state at the clock's time."""
    shard = await open_shard(root, clock, **options)
    return shard, state_bytes((await shard.get(Q)).state, clock.now_ms())


async def write_and_recover_again(root: Path, clock: ManualClock, epoch: int) -> None:
    """After a recovery: a new message can be put, and a further recovery is clean and
    keeps it."""
    shard = await open_shard(root, clock)
    assert shard.wal.epoch == epoch
    clock.advance(7)
    [created] = await (await shard.get(Q)).execute(c.Put([c.NewMessage(body=b"after")]))
    assert created.status == "created"
    live = state_bytes((await shard.get(Q)).state, clock.now_ms())
    await stop(shard)

    shard = await open_shard(root, clock)
    try:
        assert shard.report is not None
        assert shard.report.clean, shard.report
        assert shard.report.repaired == []
        assert shard.wal.epoch == epoch + 1
        queue = await shard.get(Q)
        assert (await queue.execute(c.Peek(created.id))).body == b"after"
        assert state_bytes(queue.state, clock.now_ms()) == live
    finally:
        await stop(shard)


# ================================================================ torn tail


async def _rounds_then(last: str, history: History) -> None:
    for _ in range(3):
        await history.round()
    if last == "alone":  # the last block is the one record
        taken = await history.single(c.Take(max=1))
        await history.single(c.Ack([c.LeaseRef(d.id, d.lease) for d in taken]))
    else:  # the last block holds three records
        await history.round()


def _tear(path: Path, cut: int, end: int, how: str) -> None:
    """The write of the block ending at ``end`` reached only byte ``cut``: the rest of the
    file is cut off, or left as the zeros the segment was preallocated with."""
    if how == "cut-off":
        os.truncate(path, cut)
    else:
        data = bytearray(path.read_bytes())
        data[cut:end] = bytes(end - cut)
        data += bytes(layout.BLOCK_HEADER)  # and some of the preallocated zeros after it
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["cut-off", "zeros-after"])
@pytest.mark.parametrize("last", ["alone", "three-records"])
async def test_a_torn_last_block_at_every_byte_offset(tmp_path: Path, last: str, how: str) -> None:
    pristine = tmp_path / "pristine"
    clock, live = await write_log(pristine, lambda h: _rounds_then(last, h))
    segs = segments(pristine)
    events = events_of(segs)
    assert state_bytes(fold(events), clock.now_ms()) == live  # the log is the live state
    tail = segs[-1]
    block = tail.blocks[-1]
    assert block.count == (1 if last == "alone" else 3)
    assert block.end == tail.path.stat().st_size  # a closed segment is cut to its blocks
    kept = before(segs, block)
    assert len(kept) == len(events) - block.count

    for cut in range(block.offset, block.end):  # from the block's first byte to its last
        root = copy(pristine, tmp_path, f"cut-{cut}")
        _tear(root / tail.key, cut, block.end, how)
        clock.advance(1)
        shard, state = await recover(root, clock)
        try:
            # exactly the records before the torn block, as a fold of those events
            assert state == state_bytes(fold(kept), clock.now_ms()), f"cut at {cut}"
            report = shard.report
            assert report is not None
            assert report.discarded == [], (cut, report)
            if any((pristine / tail.key).read_bytes()[block.offset : cut]):
                assert report.repaired == [f"{tail.key}: torn tail cut at offset {block.offset}"]
            else:  # nothing but zeros was written: the segment just ends there
                assert report.repaired == []
            assert (report.epoch, shard.wal.epoch) == (2, 2)
            assert stored_report(root, 2).repaired == report.repaired
            assert (await shard.get(Q)).next_seq == len(kept) + 1
        finally:
            await stop(shard)
        # The torn bytes are gone (the segment ends at its last whole block, or is gone when
        # the torn block was its first), nothing was moved aside, and the new epoch's claim
        # starts a segment of its own right after.
        if block.offset > layout.WAL_HEADER:
            assert (root / tail.key).stat().st_size == block.offset
        assert damaged_copies(root) == []
        now = segments(root)
        assert now[-1].first_lsn == block.first_lsn
        assert now[-1].epoch == 2
        [claim] = [e for b in now[-1].blocks for q, _, e in block_records(b) if q == SHARD_STREAM]
        assert isinstance(claim, ev.WriterStarted)
        assert claim.epoch == 2
        assert claim.nonce != 0  # every claim is unique
        assert all(s.epoch == 1 for s in now[:-1])
        if cut in (block.offset, block.offset + 5, block.end - 1):
            await write_and_recover_again(root, clock, epoch=3)
        shutil.rmtree(root)


# ================================================================ bit flips in a middle block


async def _rounds(n: int, history: History) -> None:
    for _ in range(n):
        await history.round()


FLIPS = {
    "length-bit-0": lambda b: b.offset * 8,
    "length-bit-9": lambda b: b.offset * 8 + 9,
    "length-bit-31": lambda b: b.offset * 8 + 31,
    "crc-bit-17": lambda b: (b.offset + 4) * 8 + 17,
    "epoch-bit-0": lambda b: (b.offset + 8) * 8,
    "lsn-bit-1": lambda b: (b.offset + 16) * 8 + 1,
    "count-bit-0": lambda b: (b.offset + 24) * 8,
    "flags-bit-3": lambda b: (b.offset + 28) * 8 + 3,
    "body-first-bit": lambda b: (b.offset + layout.BLOCK_HEADER) * 8,
    "body-last-bit": lambda b: b.end * 8 - 1,
}


@dataclass(frozen=True)
class Pristine:
    root: Path
    now_ms: int  # the clock when the log was closed
    live: bytes  # the closed queue's state at now_ms

    def clock(self) -> ManualClock:
        return ManualClock(self.now_ms)


@pytest.fixture(scope="module")
def rounds_log(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """A pristine log, shared read-only: the claim, the creation and eleven rounds, in several
    segments of two or more blocks."""
    root = tmp_path_factory.mktemp("rounds") / "pristine"
    clock, live = asyncio.run(write_log(root, lambda h: _rounds(11, h)))
    segs = segments(root)
    assert len(segs) >= 4, [len(s.blocks) for s in segs]
    assert all(len(s.blocks) >= 2 for s in segs[:-1]), [len(s.blocks) for s in segs]
    assert state_bytes(fold(events_of(segs)), clock.now_ms()) == live  # the log is the state
    return Pristine(root, clock.now_ms(), live)


def _middle(segs: list[Segment]) -> int:
    return len(segs) // 2


@pytest.mark.parametrize("where", list(FLIPS))
async def test_a_flipped_bit_in_a_middle_block_of_a_middle_segment(
    tmp_path: Path, rounds_log: Pristine, where: str
) -> None:
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    middle = _middle(segs)
    hit = segs[middle]
    block = hit.blocks[1]
    root = copy(pristine, tmp_path, "damaged")
    data = (root / hit.key).read_bytes()
    (root / hit.key).write_bytes(layout.flip_bit(data, FLIPS[where](block)))

    kept = before(segs, block)
    later = segs[middle + 1 :]
    shard, state = await recover(root, clock)
    try:
        now = clock.now_ms()
        assert state == state_bytes(fold(kept), now)
        report = shard.report
        assert report is not None
        [first, *rest] = report.discarded
        assert (first.object, first.offset, first.records) == (hit.key, block.offset, None)
        assert first.reason
        assert rest == [Discarded(s.key, 0, None, f"after damage in {hit.key}") for s in later]
    finally:
        await stop(shard)
    # A copy of each damaged segment was kept; the hit one is cut before the damage, the
    # later ones are gone; the new epoch starts right after what was kept.
    assert damaged_copies(root) == sorted(f"{Path(s.key).name}.2" for s in [hit, *later])
    assert (root / keys.wal_prefix(0) / "damaged" / f"{Path(hit.key).name}.2").read_bytes() == (
        layout.flip_bit(data, FLIPS[where](block))
    )
    assert (root / hit.key).stat().st_size == block.offset
    assert [s.key for s in segments(root)] == [
        *[s.key for s in segs[: middle + 1]],
        keys.wal_segment_key(0, block.first_lsn),  # the new epoch's claim
    ]
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ a damaged segment header


HEADER_DAMAGE = {
    "magic": lambda d: layout.flip_bit(d, 0),
    "version": lambda d: layout.flip_bit(d, 4 * 8 + 1),
    "flags": lambda d: layout.flip_bit(d, 6 * 8),
    "epoch": lambda d: layout.flip_bit(d, 8 * 8 + 3),
    "first-lsn": lambda d: layout.flip_bit(d, 16 * 8),
    "shard": lambda d: layout.flip_bit(d, 24 * 8 + 2),
    "crc": lambda d: layout.flip_bit(d, 28 * 8 + 7),
    "cut-inside": lambda d: d[:20],
    "empty": lambda d: b"",
}


@pytest.mark.parametrize("how", list(HEADER_DAMAGE))
async def test_a_damaged_segment_header_discards_that_segment_and_the_rest(
    tmp_path: Path, rounds_log: Pristine, how: str
) -> None:
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    middle = _middle(segs)
    hit = segs[middle]
    root = copy(pristine, tmp_path, "damaged")
    (root / hit.key).write_bytes(HEADER_DAMAGE[how]((root / hit.key).read_bytes()))

    kept = before(segs, hit.blocks[0])
    shard, state = await recover(root, clock)
    try:
        assert state == state_bytes(fold(kept), clock.now_ms())
        assert shard.report is not None
        [first, *rest] = shard.report.discarded
        assert (first.object, first.offset, first.records) == (hit.key, 0, None)
        assert rest == [
            Discarded(s.key, 0, None, f"after damage in {hit.key}") for s in segs[middle + 1 :]
        ]
    finally:
        await stop(shard)
    assert [s.key for s in segments(root)] == [
        *[s.key for s in segs[:middle]],
        hit.key,  # the claim of epoch 2 at the same LSN
    ]
    assert len(damaged_copies(root)) == len(segs) - middle
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ a gap


async def test_a_missing_middle_segment_stops_replay_at_the_gap(
    tmp_path: Path, rounds_log: Pristine
) -> None:
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    middle = _middle(segs)
    root = copy(pristine, tmp_path, "gap")
    (root / segs[middle].key).unlink()

    kept = before(segs, segs[middle].blocks[0])
    shard, state = await recover(root, clock)
    try:
        assert state == state_bytes(fold(kept), clock.now_ms())
        gap = f"gap: LSN {segs[middle].first_lsn} is missing"
        assert shard.report is not None
        assert shard.report.discarded == [
            Discarded(s.key, 0, None, gap) for s in segs[middle + 1 :]
        ]
    finally:
        await stop(shard)
    assert damaged_copies(root) == sorted(f"{Path(s.key).name}.2" for s in segs[middle + 1 :])
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ a misnamed segment


@pytest.mark.parametrize("source", ["next", "previous"])
async def test_a_segment_whose_header_names_another_lsn_is_damage(
    tmp_path: Path, rounds_log: Pristine, source: str
) -> None:
    # FORMAT.md: first_lsn "equals the object name". An intact segment under the wrong name
    # (copied or restored by hand, a store or tool bug) passes every CRC; replaying it would
    # put its records at the wrong place. Replay must stop there like at any other damage.
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    middle = _middle(segs)
    hit = segs[middle]
    other = segs[middle + 1] if source == "next" else segs[middle - 1]
    root = copy(pristine, tmp_path, "misnamed")
    (root / hit.key).write_bytes((root / other.key).read_bytes())

    kept = before(segs, hit.blocks[0])
    shard, state = await recover(root, clock)
    try:
        assert state == state_bytes(fold(kept), clock.now_ms())
        assert shard.report is not None
        assert shard.report.discarded[0].object == hit.key
        assert shard.report.discarded[0].offset == 0
        assert [d.object for d in shard.report.discarded] == [s.key for s in segs[middle:]]
    finally:
        await stop(shard)


# ================================================================ damaged newest snapshot


async def _with_two_snapshots(history: History) -> None:
    for _ in range(3):
        await history.round()
    assert await history.queue.snapshot() is not None
    for _ in range(3):
        await history.round()
    assert await history.queue.snapshot() is not None
    for _ in range(2):
        await history.round()


SNAPSHOT_DAMAGE: dict[str, Callable[[bytes], bytes | None]] = {
    "deleted": lambda d: None,
    "empty": lambda d: b"",
    "cut-in-header": lambda d: d[:25],
    "cut-after-header": lambda d: d[: layout.SNAP_HEADER],
    "cut-in-body": lambda d: d[: (layout.SNAP_HEADER + len(d)) // 2],
    "last-byte-missing": lambda d: d[:-1],
    "byte-flipped-in-body": lambda d: layout.flip_bit(d, (len(d) - 5) * 8 + 2),
    "byte-flipped-in-header": lambda d: layout.flip_bit(d, 17 * 8),
    "garbage": lambda d: b"\x00" * len(d),
}


def snapshots(root: Path) -> list[str]:
    where = root / keys.snapshot_prefix(Q)
    return sorted(p.relative_to(root).as_posix() for p in where.glob("*"))


@pytest.mark.parametrize("how", list(SNAPSHOT_DAMAGE))
async def test_a_damaged_newest_snapshot_falls_back_to_the_previous_one(
    tmp_path: Path, how: str
) -> None:
    pristine = tmp_path / "pristine"
    clock, live = await write_log(pristine, _with_two_snapshots)
    older, newest = snapshots(pristine)
    # the log was pruned behind the older snapshot: it is needed
    first_seq = min(s for seg in segments(pristine) for s, _ in seg.records)
    assert 1 < first_seq <= keys.seq_of(older) + 1

    root = copy(pristine, tmp_path, "damaged")
    damaged = SNAPSHOT_DAMAGE[how]((root / newest).read_bytes())
    if damaged is None:
        (root / newest).unlink()
    else:
        (root / newest).write_bytes(damaged)

    shard, state = await recover(root, clock)
    try:
        assert state == live
        [report] = [r for r in shard.reports if r.queue == Q]
        assert (report.snapshot, report.snapshot_seq) == (older, keys.seq_of(older))
        if damaged is None:
            assert report.discarded == []
        else:
            [discarded] = report.discarded
            assert (discarded.object, discarded.offset, discarded.records) == (newest, 0, None)
            assert discarded.reason.startswith("snapshot unusable"), discarded.reason
    finally:
        await stop(shard)
    damaged_dir = root / keys.queue_prefix(Q) / "damaged"
    if damaged is None:
        assert not damaged_dir.exists()
    else:
        assert (root / keys.damaged_key(newest, 2)).read_bytes() == damaged
    assert snapshots(root) == [older]
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ progress


async def test_recovery_reports_progress_segment_by_segment(tmp_path: Path) -> None:
    root = tmp_path / "many"

    async def many(history: History) -> None:
        for i in range(40):
            await history.single(c.Put([c.NewMessage(body=b"x%d" % i)]))

    clock, live = await write_log(root, many)
    segs = segments(root)
    assert len(segs) > 5

    calls: list[tuple[int, int, int]] = []
    shard, state = await recover(root, clock, progress=lambda *a: calls.append(a))
    await stop(shard)
    assert state == live
    assert [done for done, _, _ in calls] == list(range(1, len(segs) + 1))
    assert {total for _, total, _ in calls} == {len(segs)}
    records = [n for _, _, n in calls]
    assert records == sorted(records)
    assert records[-1] == len(events_of(segs))
