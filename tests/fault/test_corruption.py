"""Damaged logs on a real disk: torn tails, flipped bits, broken headers, gaps, bad snapshots.

Each test writes a queue's log with the real actor and writer into a :class:`LocalDirStore`
under ``tmp_path`` (ManualClock, SequentialIds), keeps that directory as the pristine copy,
damages a copy of it with ordinary file operations, and recovers with the real
:func:`~actors.log.replay.replay` and :meth:`QueueActor.open`. Expectations come from the
pristine log: its events are decoded segment by segment, and the state recovery must
rebuild is the fold of exactly the events before the damage. No mocks.
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
from actors.core.snapshot import snapshot
from actors.core.state import QueueState
from actors.errors import QueueError
from actors.ids import SequentialIds
from actors.log import keys
from actors.log.codec import decode_segment
from actors.log.replay import Discarded, RecoveryReport, replay
from actors.log.store import LocalDirStore
from actors.queue_actor import QueueActor
from actors.settings import QueueSettings
from tests.unit.log import layout

pytestmark = pytest.mark.fault

Q = "q"
T0 = 1_700_000_000_000
SETTINGS = QueueSettings(visibility_timeout_ms=600_000)


# ================================================================ writing and reading logs


def new_actor(root: Path, clock: ManualClock, **options: Any) -> tuple[QueueActor, LocalDirStore]:
    store = LocalDirStore(root)
    return QueueActor(Q, store, clock=clock, ids=SequentialIds(), **options), store


async def stop(actor: QueueActor, store: LocalDirStore) -> None:
    await actor.close(snapshot=False)
    await store.close()


def ok(results: list[Any]) -> list[Any]:
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


class History:
    """Drives an actor through rounds of commands; every round is one segment on disk."""

    def __init__(self, actor: QueueActor, clock: ManualClock) -> None:
        self.actor, self.clock = actor, clock
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
        results = ok(await self.actor.execute_many(commands))
        self.pending = results[1]
        self.rounds += 1

    async def single(self, command: object) -> Any:
        """One command on its own: one segment of one record."""
        self.clock.advance(10)
        return await self.actor.execute(command)


async def write_log(
    root: Path, script: Callable[[History], Awaitable[None]], **options: Any
) -> tuple[ManualClock, bytes]:
    """Create queue ``q`` under ``root``, run ``script``, close without a final snapshot.

    Returns the clock and the closed actor's state (as bytes at the clock's time), which
    must equal what a recovery of the log rebuilds."""
    clock = ManualClock(T0)
    actor, store = new_actor(root, clock, **options)
    await actor.open(c.Create(Q, SETTINGS))
    await script(History(actor, clock))
    await actor.execute(c.Stats())  # everything decided is durable
    live = state_bytes(actor.state, clock.now_ms())
    await stop(actor, store)
    return clock, live


@dataclass(frozen=True)
class Segment:
    key: str
    path: Path
    first_seq: int
    count: int
    epoch: int
    events: list[ev.Event]
    frames: list[layout.Frame]


def segments(root: Path) -> list[Segment]:
    """The queue's segments on disk, decoded, in order (they must be intact)."""
    out = []
    for path in sorted((root / "queues" / Q / "log").glob("*.seg")):
        data = path.read_bytes()
        read = decode_segment(data)
        assert read.damage is None
        key = path.relative_to(root).as_posix()
        assert keys.seq_of(key) == read.header.first_seq
        out.append(
            Segment(
                key,
                path,
                read.header.first_seq,
                read.header.count,
                read.header.epoch,
                read.events,
                layout.frames(data),
            )
        )
    return out


def events_of(segs: list[Segment]) -> list[ev.Event]:
    """The events of contiguous segments, checked to be numbered 1, 2, 3 ..."""
    events: list[ev.Event] = []
    for seg in segs:
        assert seg.first_seq == len(events) + 1
        events.extend(seg.events)
    return events


def fold(events: list[ev.Event]) -> QueueState:
    state = QueueState()
    for event in events:
        state.apply(event)
    return state


def state_bytes(state: QueueState, now_ms: int) -> bytes:
    """The logical state at ``now_ms`` (advancing is a projection: equal logs and equal
    times give equal bytes)."""
    state.advance(now_ms)
    return msgspec.msgpack.encode(snapshot(state))


def listing(root: Path, folder: str) -> list[str]:
    where = root / "queues" / Q / folder
    return sorted(p.relative_to(root).as_posix() for p in where.glob("*")) if where.exists() else []


def copy(pristine: Path, tmp_path: Path, name: str) -> Path:
    root = tmp_path / name
    shutil.copytree(pristine, root)
    return root


async def replay_of(root: Path) -> Any:
    store = LocalDirStore(root)
    try:
        return await replay(store, Q)
    finally:
        await store.close()


def stored_report(root: Path, epoch: int) -> RecoveryReport:
    data = (root / keys.report_key(Q, epoch)).read_bytes()
    return msgspec.json.decode(data, type=RecoveryReport)


async def write_and_recover_again(root: Path, clock: ManualClock, epoch: int) -> None:
    """After a recovery: a new message can be put, and a further recovery is clean and
    keeps it."""
    actor, store = new_actor(root, clock)
    await actor.open()
    assert actor.epoch == epoch
    clock.advance(7)
    [created] = await actor.execute(c.Put([c.NewMessage(body=b"after the repair")]))
    assert created.status == "created"
    live = state_bytes(actor.state, clock.now_ms())
    await stop(actor, store)

    actor, store = new_actor(root, clock)
    try:
        report = await actor.open()
        assert report.clean, report.discarded
        assert actor.epoch == epoch + 1
        view = await actor.execute(c.Peek(created.id))
        assert view.body == b"after the repair"
        assert state_bytes(actor.state, clock.now_ms()) == live
    finally:
        await stop(actor, store)


# ================================================================ torn tail


async def _rounds_then(last: str, history: History) -> None:
    for _ in range(3):
        await history.round()
    if last == "alone":  # the last segment is the one record
        taken = await history.single(c.Take(max=1))
        await history.single(c.Ack([c.LeaseRef(d.id, d.lease) for d in taken]))
    else:  # the last record ends a segment of three
        await history.round()


@pytest.mark.parametrize("last", ["alone", "third-of-three"])
async def test_a_torn_last_record_at_every_byte_offset(tmp_path: Path, last: str) -> None:
    pristine = tmp_path / "pristine"
    clock, live = await write_log(pristine, lambda h: _rounds_then(last, h))
    segs = segments(pristine)
    events = events_of(segs)
    assert state_bytes(fold(events), clock.now_ms()) == live  # the log is the live state
    tail = segs[-1]
    assert tail.count == (1 if last == "alone" else 3)
    assert isinstance(tail.events[-1], ev.MessagesAcked)
    record = tail.frames[-1]
    size = tail.path.stat().st_size
    assert record.end == size
    kept = events[:-1]
    assert (events[-1], len(kept)) == (tail.events[-1], tail.first_seq + tail.count - 2)

    for cut in range(record.offset, size):  # from the frame's first byte to the last one
        root = copy(pristine, tmp_path, f"cut-{cut}")
        os.truncate(root / tail.key, cut)
        torn = (root / tail.key).read_bytes()
        clock.advance(1)
        actor, store = new_actor(root, clock)
        try:
            report = await actor.open()
            # exactly the records before the torn one, as a fold of those events
            expected = state_bytes(fold(kept), clock.now_ms())
            assert state_bytes(actor.state, clock.now_ms()) == expected, f"cut at {cut}"
        finally:
            await stop(actor, store)

        assert report.last_seq == len(kept), cut
        assert report.records_replayed == len(kept), cut
        [discarded] = report.discarded
        assert discarded == Discarded(tail.key, record.offset, 1, discarded.reason), cut
        assert discarded.reason.startswith("torn tail"), (cut, discarded.reason)
        assert (report.epoch, actor.epoch) == (2, 2)
        assert stored_report(root, 2) == report
        # moved aside, unchanged; what was kept is in a snapshot; the new epoch's claim
        # starts right after it
        assert listing(root, "damaged") == [keys.damaged_key(tail.key, 2)]
        assert (root / keys.damaged_key(tail.key, 2)).read_bytes() == torn
        assert keys.snapshot_key(Q, len(kept)) in listing(root, "snap")
        now = segments(root)
        assert now[-1].first_seq == len(kept) + 1
        [claim] = now[-1].events
        assert now[-1].epoch == 2
        assert isinstance(claim, ev.WriterStarted)
        assert claim.epoch == 2
        assert claim.nonce != 0  # every claim is unique
        assert all(s.epoch == 1 for s in now[:-1])

        await write_and_recover_again(root, clock, epoch=3)
        shutil.rmtree(root)


# ================================================================ bit flips in a middle record


async def _rounds(n: int, history: History) -> None:
    for _ in range(n):
        await history.round()


FLIPS = {
    "length-bit-0": lambda f: f.offset * 8,
    "length-bit-9": lambda f: f.offset * 8 + 9,
    "length-bit-31": lambda f: f.offset * 8 + 31,
    "crc-bit-17": lambda f: (f.offset + 4) * 8 + 17,
    "flags-bit-0": lambda f: (f.offset + 8) * 8,
    "flags-bit-5": lambda f: (f.offset + 8) * 8 + 5,
    "payload-first-bit": lambda f: (f.offset + 9) * 8,
    "payload-last-bit": lambda f: f.end * 8 - 1,
}


@dataclass(frozen=True)
class Pristine:
    root: Path
    now_ms: int  # the clock when the log was closed
    live: bytes  # the closed actor's state at now_ms

    def clock(self) -> ManualClock:
        return ManualClock(self.now_ms)


@pytest.fixture(scope="module")
def rounds_log(tmp_path_factory: pytest.TempPathFactory) -> Pristine:
    """A pristine log, shared read-only: the create segment and seven of 2-3 records."""
    root = tmp_path_factory.mktemp("rounds") / "pristine"
    clock, live = asyncio.run(write_log(root, lambda h: _rounds(7, h)))
    segs = segments(root)
    assert [s.count for s in segs] == [2, 2, 3, 3, 3, 3, 3, 3]
    assert state_bytes(fold(events_of(segs)), clock.now_ms()) == live  # the log is the state
    return Pristine(root, clock.now_ms(), live)


@pytest.mark.parametrize("where", list(FLIPS))
async def test_a_flipped_bit_in_a_middle_record_of_a_middle_segment(
    tmp_path: Path, rounds_log: Pristine, where: str
) -> None:
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    events = events_of(segs)
    middle = len(segs) // 2
    hit = segs[middle]
    assert hit.count == 3
    record = hit.frames[1]
    root = copy(pristine, tmp_path, "damaged")
    data = (root / hit.key).read_bytes()
    (root / hit.key).write_bytes(layout.flip_bit(data, FLIPS[where](record)))

    kept = hit.first_seq  # records 1 .. first_seq: every earlier segment and one record
    later = segs[middle + 1 :]
    expected_discarded = [
        Discarded(hit.key, record.offset, 2, "?"),
        *[Discarded(s.key, 0, s.count, f"after damage in {hit.key}") for s in later],
    ]

    replayed = await replay_of(root)
    report = replayed.report
    assert [msgspec.structs.replace(d, reason="?") for d in report.discarded[:1]] == (
        expected_discarded[:1]
    )
    assert report.discarded[1:] == expected_discarded[1:]
    assert replayed.damaged == [hit.key, *[s.key for s in later]]
    assert (report.last_seq, report.records_replayed) == (kept, kept)
    now = clock.now_ms()
    assert state_bytes(replayed.state, now) == state_bytes(fold(events[:kept]), now)

    actor, store = new_actor(root, clock)
    try:
        report = await actor.open()
        assert (report.discarded[0].object, report.discarded[0].offset) == (hit.key, record.offset)
        assert report.discarded[0].records == 2
        assert report.discarded[1:] == expected_discarded[1:]
        assert state_bytes(actor.state, now) == state_bytes(fold(events[:kept]), now)
    finally:
        await stop(actor, store)
    assert listing(root, "damaged") == sorted(
        keys.damaged_key(k, 2) for k in [hit.key, *[s.key for s in later]]
    )
    assert [s.key for s in segments(root)] == [
        *[s.key for s in segs[:middle]],
        keys.segment_key(Q, kept + 1),  # the new epoch's claim
    ]
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ a damaged segment header


HEADER_DAMAGE = {
    "magic": lambda d: layout.flip_bit(d, 0),
    "version": lambda d: layout.flip_bit(d, 4 * 8 + 1),
    "flags": lambda d: layout.flip_bit(d, 6 * 8),
    "epoch": lambda d: layout.flip_bit(d, 8 * 8 + 3),
    "first-seq": lambda d: layout.flip_bit(d, 16 * 8),
    "count": lambda d: layout.flip_bit(d, 24 * 8 + 2),
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
    events = events_of(segs)
    middle = len(segs) // 2
    hit = segs[middle]
    root = copy(pristine, tmp_path, "damaged")
    (root / hit.key).write_bytes(HEADER_DAMAGE[how]((root / hit.key).read_bytes()))

    kept = hit.first_seq - 1
    replayed = await replay_of(root)
    report = replayed.report
    [first, *rest] = report.discarded
    assert (first.object, first.offset, first.records) == (hit.key, 0, None)
    assert rest == [
        Discarded(s.key, 0, s.count, f"after damage in {hit.key}") for s in segs[middle + 1 :]
    ]
    assert report.last_seq == kept
    now = clock.now_ms()
    assert state_bytes(replayed.state, now) == state_bytes(fold(events[:kept]), now)

    actor, store = new_actor(root, clock)
    try:
        await actor.open()
        assert state_bytes(actor.state, now) == state_bytes(fold(events[:kept]), now)
    finally:
        await stop(actor, store)
    assert [s.key for s in segments(root)] == [
        *[s.key for s in segs[:middle]],
        hit.key,  # the claim of epoch 2 at the same sequence number
    ]
    assert len(listing(root, "damaged")) == len(segs) - middle


# ================================================================ a gap


async def test_a_missing_middle_segment_stops_replay_at_the_gap(
    tmp_path: Path, rounds_log: Pristine
) -> None:
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    events = events_of(segs)
    middle = len(segs) // 2
    root = copy(pristine, tmp_path, "gap")
    (root / segs[middle].key).unlink()

    kept = segs[middle].first_seq - 1
    replayed = await replay_of(root)
    gap = f"gap: record {kept + 1} is missing"
    assert replayed.report.discarded == [
        Discarded(s.key, 0, s.count, gap) for s in segs[middle + 1 :]
    ]
    assert replayed.report.last_seq == kept
    now = clock.now_ms()
    assert state_bytes(replayed.state, now) == state_bytes(fold(events[:kept]), now)

    actor, store = new_actor(root, clock)
    try:
        report = await actor.open()
        assert report.discarded == replayed.report.discarded
        assert state_bytes(actor.state, now) == state_bytes(fold(events[:kept]), now)
    finally:
        await stop(actor, store)
    assert listing(root, "damaged") == sorted(
        keys.damaged_key(s.key, 2) for s in segs[middle + 1 :]
    )
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ a misnamed segment


@pytest.mark.parametrize("source", ["next", "previous"])
async def test_a_segment_whose_header_names_another_sequence_number_is_damage(
    tmp_path: Path, rounds_log: Pristine, source: str
) -> None:
    # FORMAT.md: first_seq is "the sequence number of the first record (equals the object
    # name)". An intact segment under the wrong name (an object copied or restored by hand,
    # a store or tool bug) passes every CRC; replaying it would put its records at the
    # wrong sequence numbers. Replay must stop there like at any other damage.
    pristine, clock = rounds_log.root, rounds_log.clock()
    segs = segments(pristine)
    events = events_of(segs)
    middle = len(segs) // 2
    hit = segs[middle]
    other = segs[middle + 1] if source == "next" else segs[middle - 1]
    assert other.count == hit.count  # the same size: only the names disagree
    root = copy(pristine, tmp_path, "misnamed")
    (root / hit.key).write_bytes((root / other.key).read_bytes())

    kept = hit.first_seq - 1
    replayed = await replay_of(root)
    now = clock.now_ms()
    assert replayed.report.last_seq == kept, replayed.report
    assert state_bytes(replayed.state, now) == state_bytes(fold(events[:kept]), now)
    assert replayed.report.discarded[0].object == hit.key
    assert replayed.report.discarded[0].offset == 0
    assert replayed.damaged == [s.key for s in segs[middle:]]


# ================================================================ damaged newest snapshot


async def _with_two_snapshots(history: History) -> None:
    for _ in range(3):
        await history.round()
    assert await history.actor.snapshot() is not None
    for _ in range(3):
        await history.round()
    assert await history.actor.snapshot() is not None
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


@pytest.mark.parametrize("how", list(SNAPSHOT_DAMAGE))
async def test_a_damaged_newest_snapshot_falls_back_to_the_previous_one(
    tmp_path: Path, how: str
) -> None:
    pristine = tmp_path / "pristine"
    clock, live = await write_log(pristine, _with_two_snapshots)
    older, newest = listing(pristine, "snap")
    # the older snapshot is needed: the segments it covers are gone
    assert segments(pristine)[0].first_seq == keys.seq_of(older) + 1
    before = await replay_of(pristine)
    assert before.report.snapshot == newest
    now = clock.now_ms()
    assert state_bytes(before.state, now) == live

    root = copy(pristine, tmp_path, "damaged")
    damaged = SNAPSHOT_DAMAGE[how]((root / newest).read_bytes())
    if damaged is None:
        (root / newest).unlink()
    else:
        (root / newest).write_bytes(damaged)

    replayed = await replay_of(root)
    report = replayed.report
    assert (report.snapshot, report.snapshot_seq) == (older, keys.seq_of(older))
    assert report.last_seq == before.report.last_seq
    assert state_bytes(replayed.state, now) == live
    if damaged is None:
        assert report.discarded == []
    else:
        [discarded] = report.discarded
        assert (discarded.object, discarded.offset, discarded.records) == (newest, 0, None)
        assert discarded.reason.startswith("snapshot unusable"), discarded.reason

    actor, store = new_actor(root, clock)
    try:
        opened = await actor.open()
        assert opened.discarded == report.discarded
        assert state_bytes(actor.state, now) == live
    finally:
        await stop(actor, store)
    if damaged is None:
        assert listing(root, "damaged") == []
    else:
        assert listing(root, "damaged") == [keys.damaged_key(newest, 2)]
        assert (root / keys.damaged_key(newest, 2)).read_bytes() == damaged
    assert listing(root, "snap") == [older]
    await write_and_recover_again(root, clock, epoch=3)


# ================================================================ progress


async def test_recovery_reports_progress_segment_by_segment(tmp_path: Path) -> None:
    root = tmp_path / "many"

    async def many(history: History) -> None:
        for i in range(40):
            await history.single(c.Put([c.NewMessage(body=b"x%d" % i)]))

    clock, live = await write_log(root, many)
    segs = segments(root)
    assert len(segs) == 41

    calls: list[tuple[int, int, int]] = []
    actor, store = new_actor(root, clock, progress=lambda *a: calls.append(a))
    try:
        report = await actor.open()
        assert state_bytes(actor.state, clock.now_ms()) == live
    finally:
        await stop(actor, store)
    assert [done for done, _, _ in calls] == list(range(1, len(segs) + 1))
    assert {total for _, total, _ in calls} == {len(segs)}
    records = [n for _, _, n in calls]
    assert records == [sum(s.count for s in segs[:i]) for i in range(1, len(segs) + 1)]
    assert records[-1] == report.records_replayed == len(events_of(segs))
