"""Many queues in one shard log (FORMAT.md, "Shard log" and "Snapshots and pruning").

Real shards over a local directory (preallocated segment files, small ones here) and over
obstore's in-memory store (an object per block), ManualClock, SequentialIds:

- the queues of a shard share group commits: one block holds the groups of several queues;
- recovery hands each queue exactly its own records (the same client ids in every queue, so
  a misrouted record shows), after a graceful close and after one that takes no snapshot;
- pruning: a segment goes only once the *older* of the two snapshots of every queue in it
  covers that queue's records there, oldest segment first, never the one being written;
  an idle queue that pins the oldest segment once the log holds more than
  ``retain_records`` writes a ``Checkpoint`` record and snapshots so the segment can go;
- deleting a queue writes ``QueueDeleted`` and erases its objects; a queue created again
  under that name starts empty and numbers its records on; a deleted queue whose records
  still sit in segments that other queues pin does not come back after a restart.

Covered elsewhere: one queue's snapshots and pruning (``test_faults.py``), deleted and
re-created queues through a reshard (``test_layout.py``), damage to a shard log
(``test_corruption.py``), version-1 queues (``test_legacy_v1.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core import replies as rp
from actors.core.ids import SequentialIds
from actors.errors import QueueError, QueueNotFound
from actors.log import keys
from actors.log.shard_recovery import SHARD_STREAM, read_shard
from actors.log.store import ObjectStore
from actors.log.wal import decode_groups, decode_record, scan_segment
from actors.settings import LogSettings
from actors.shard import QueueShard
from tests.fault.actor_support import CLIENT_IDS, device_of, empty_store, put, state_view
from tests.fault.actor_support import settle_shard as settle

pytestmark = pytest.mark.fault

QUEUES = ["q0", "q1", "q2", "q3", "q4"]
# Local segments of a few blocks each; snapshots only when a test takes them.
NO_AUTO = LogSettings(segment_bytes=700, snapshot_every_records=10**9, snapshot_every_ms=10**12)


@pytest.fixture(params=["local", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """A real, empty store: a local directory, or obstore's in-memory store."""
    st = empty_store(request.param, tmp_path)
    yield st
    await st.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


async def open_shard(
    store: ObjectStore, clock: ManualClock, settings: LogSettings = NO_AUTO
) -> QueueShard:
    shard = QueueShard(0, 1, store, clock=clock, ids=SequentialIds(), log_settings=settings)
    await shard.start()
    return shard


async def create(shard: QueueShard, *names: str) -> None:
    for name in names:
        await shard.create(name, CLIENT_IDS, [])


async def run(shard: QueueShard, name: str, *commands: object) -> list[Any]:
    results = await shard.execute_many(name, list(commands))
    errors = [r for r in results if isinstance(r, QueueError)]
    assert not errors, errors
    return results


def views(shard: QueueShard, now_ms: int) -> dict[str, Any]:
    """Every queue's logical state at ``now_ms``, by name."""
    return {
        name: state_view(queue.state, now_ms)
        for name, queue in shard.queues.items()
        if queue.state.created
    }


Group = tuple[str, int, list[ev.Event]]


async def log_blocks(store: ObjectStore) -> list[tuple[str, list[Group]]]:
    """Every block of shard 0's log, in order: its segment and its groups, decoded."""
    device = device_of(store)
    out = []
    for _, key in await device.segments():
        for block in scan_segment(await device.read(key)).blocks:
            groups = [
                (q, s, [decode_record(r) for r in raws]) for q, s, raws in decode_groups(block)
            ]
            out.append((key, groups))
    return out


async def last_seqs(store: ObjectStore) -> dict[str, dict[str, int]]:
    """For each segment (in order), the last sequence number of each queue in it."""
    out: dict[str, dict[str, int]] = {}
    for key, groups in await log_blocks(store):
        seg = out.setdefault(key, {})
        for queue, first, events in groups:
            if queue != SHARD_STREAM:
                seg[queue] = first + len(events) - 1
    return out


async def segment_keys(store: ObjectStore) -> list[str]:
    return [key for _, key in await device_of(store).segments()]


# ================================================================ group commit


async def test_a_batch_of_commands_on_many_queues_is_one_block(
    store: ObjectStore, clock: ManualClock
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, *QUEUES)
        before = shard.wal.blocks_written
        items: list[tuple[str, object]] = [(q, put("m1", "m2")) for q in QUEUES]
        items += [(q, cmd.Take(max=1)) for q in QUEUES[:3]]
        results = await shard.run_batch(items)
        assert not [r for r in results if isinstance(r, QueueError)], results
        assert shard.wal.blocks_written == before + 1
        *_, (_, groups) = await log_blocks(store)
        assert [q for q, _, _ in groups] == QUEUES  # one group per queue, in arrival order
        for queue, first, events in groups:
            assert first == shard.queues[queue].next_seq - len(events)
            kinds = [type(e) for e in events]
            taken = [ev.MessagesTaken] if queue in QUEUES[:3] else []
            assert kinds == [ev.MessagesPut, *taken], (queue, kinds)
    finally:
        await shard.close(snapshot=False)


async def test_commands_of_separate_callers_on_many_queues_share_one_block(
    store: ObjectStore, clock: ManualClock
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, *QUEUES)
        before = shard.wal.blocks_written
        # one caller per queue, all deciding before the log writes (two turns of the loop
        # after the first append): one block, one write for all of them
        results = await asyncio.gather(*(run(shard, q, put("m1"), put("m2")) for q in QUEUES))
        assert all(r[0][0].status == rp.CREATED for r in results)
        assert shard.wal.blocks_written == before + 1
        *_, (_, groups) = await log_blocks(store)
        assert [(q, s, len(events)) for q, s, events in groups] == [(q, 2, 2) for q in QUEUES]
    finally:
        await shard.close(snapshot=False)


# ================================================================ recovery routes records


async def _interleave(shard: QueueShard, clock: ManualClock) -> None:
    """The queues take turns: the same client ids everywhere, batches across queues, takes
    acks and releases, the clock moving."""
    for round_ in range(4):
        clock.advance(100)
        items: list[tuple[str, object]] = [
            (q, put(f"m{round_}", f"{q}-{round_}")) for q in QUEUES[round_ % 2 :]
        ]
        results = await shard.run_batch(items)
        assert not [r for r in results if isinstance(r, QueueError)], results
        for i, q in enumerate(QUEUES):
            if (i + round_) % 3 == 0:
                [taken] = await run(shard, q, cmd.Take(max=2, visibility_timeout_ms=60_000))
                if taken:
                    head, *rest = taken
                    await run(shard, q, cmd.Ack([cmd.LeaseRef(head.id, head.lease)]))
                    if rest:
                        await run(
                            shard,
                            q,
                            cmd.Release([cmd.ReleaseItem(id=rest[0].id, lease=rest[0].lease)]),
                        )


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "no-snapshot"])
async def test_recovery_gives_every_queue_exactly_its_own_records(
    store: ObjectStore, clock: ManualClock, graceful: bool
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, *QUEUES)
        await _interleave(shard, clock)
        if graceful:  # one queue with snapshots: its records come from both
            await shard.queues["q1"].snapshot()
            await run(shard, "q1", put("after-snapshot"))
        await settle(shard)
        live = views(shard, clock.now_ms())
        next_seqs = {q: shard.queues[q].next_seq for q in QUEUES}
    finally:
        await shard.close(snapshot=graceful)
    assert len({str(v) for v in live.values()}) == len(QUEUES)  # all different
    blocks = await log_blocks(store)
    assert any(len({q for q, _, _ in groups} - {SHARD_STREAM}) > 1 for _, groups in blocks)

    queues, report = await read_shard(store, device_of(store), 0, 1)
    assert report.clean
    assert {n: state_view(q.state, clock.now_ms()) for n, q in queues.items()} == live
    clock.advance(1)
    again = await open_shard(store, clock)
    try:
        assert views(again, clock.now_ms()) == {
            n: state_view(shard.queues[n].state, clock.now_ms()) for n in QUEUES
        }
        assert {q: again.queues[q].next_seq for q in QUEUES} == next_seqs
        for q in QUEUES:  # and each goes on with its own numbering
            [[result]] = await run(again, q, put("new"))
            assert result.status == rp.CREATED
            assert again.queues[q].next_seq == next_seqs[q] + 1
    finally:
        await again.close(snapshot=False)


# ================================================================ pruning


def _covered(seg: dict[str, int], floors: dict[str, int]) -> bool:
    return all(seq <= floors.get(q, 0) for q, seq in seg.items())


async def _assert_pruned_exactly(
    store: ObjectStore, shard: QueueShard, before: dict[str, dict[str, int]]
) -> list[str]:
    """The log lost exactly its oldest segments that the older snapshot of every queue in
    them covers (``before``: what each segment held); returns the keys deleted."""
    await settle(shard)
    floors = {n: q.snapshot_floor for n, q in shard.queues.items()}
    kept = await segment_keys(store)
    order = list(before)
    assert kept == order[len(order) - len(kept) :], "segments go oldest first"
    deleted = order[: len(order) - len(kept)]
    assert all(_covered(before[k], floors) for k in deleted)
    assert kept, "the segment being written stays"
    if len(kept) > 1:  # the oldest kept one holds a record some queue's older snapshot lacks
        assert not _covered(before[kept[0]], floors), (kept[0], before[kept[0]], floors)
    return deleted


async def test_a_segment_goes_once_the_older_snapshot_of_every_queue_in_it_covers_it(
    store: ObjectStore, clock: ManualClock
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, "busy", "quiet")
        await shard.run_batch([("busy", put("b0")), ("quiet", put("q0"))])
        for i in range(1, 12):
            await run(shard, "busy", put(f"b{i}"))
        busy, quiet = shard.queues["busy"], shard.queues["quiet"]
        for _ in range(2):  # busy's older snapshot covers its records in the first segments
            await busy.snapshot()
            await run(shard, "busy", put(f"b-{busy.next_seq}"))
        await settle(shard)  # the prunes these snapshots started are over
        before = await last_seqs(store)
        quiet_segments = [k for k, seqs in before.items() if "quiet" in seqs]
        assert len(before) >= 3
        assert all(before[k].get("busy", 0) <= busy.snapshot_floor for k in quiet_segments)
        # quiet has no snapshot: its records pin their segments, and all after them
        await _assert_pruned_exactly(store, shard, before)
        assert set(quiet_segments) <= set(await segment_keys(store))
        await quiet.snapshot()  # one is not enough: a damaged one needs one to fall back to
        await _assert_pruned_exactly(store, shard, before)
        assert set(quiet_segments) <= set(await segment_keys(store))
        await run(shard, "quiet", put("q1"))
        await settle(shard)
        before = await _since(store, before)
        await quiet.snapshot()  # now the older one covers quiet's records there
        deleted = await _assert_pruned_exactly(store, shard, before)
        assert set(quiet_segments) <= set(deleted)
        live = views(shard, clock.now_ms())
    finally:
        await shard.close(snapshot=False)
    queues, report = await read_shard(store, device_of(store), 0, 1)
    assert report.clean
    assert {n: state_view(q.state, clock.now_ms()) for n, q in queues.items()} == live


async def _since(store: ObjectStore, before: dict[str, dict[str, int]]) -> dict[str, Any]:
    """``before`` and, after it, the segments written since."""
    now = await last_seqs(store)
    return {**before, **{k: v for k, v in now.items() if k not in before}}


async def test_an_idle_queue_pinning_the_oldest_segment_checkpoints_so_it_can_go(
    store: ObjectStore, clock: ManualClock
) -> None:
    settings = LogSettings(
        segment_bytes=700,
        snapshot_every_records=4,
        snapshot_every_ms=10**12,
        retain_records=12,
    )
    shard = await open_shard(store, clock, settings)
    try:
        await create(shard, "idle", "busy")
        await run(shard, "idle", put("i1", "i2"))
        idle = shard.queues["idle"]
        idle_view = state_view(idle.state, clock.now_ms())
        idle_last = idle.next_seq - 1
        idle_segments = [k for k, seqs in (await last_seqs(store)).items() if "idle" in seqs]
        for i in range(30):  # busy snapshots every 4 records; the log grows past 12
            await run(shard, "busy", put(f"b{i}"))
        await settle(shard)
        assert not set(idle_segments) & set(await segment_keys(store))
        # idle wrote a Checkpoint record once its first snapshot covered its last record,
        # then took a second snapshot: both kept ones cover what those segments held
        left = [
            (s + i, type(e))
            for _, groups in await log_blocks(store)
            for q, s, events in groups
            if q == "idle"
            for i, e in enumerate(events)
        ]
        assert left, "no Checkpoint record"
        assert all(kind is ev.Checkpoint for _, kind in left), left
        assert left[0][0] > idle_last
        assert idle.snapshots == [idle.next_seq - 2, idle.next_seq - 1]
        assert idle.snapshot_floor >= idle_last
        snaps = await store.list(keys.snapshot_prefix("idle"))
        assert snaps == [keys.snapshot_key("idle", s) for s in idle.snapshots]
        assert state_view(idle.state, clock.now_ms()) == idle_view  # a checkpoint changes nothing
        live = views(shard, clock.now_ms())
    finally:
        await shard.close(snapshot=False)
    again = await open_shard(store, clock, settings)
    try:
        assert views(again, clock.now_ms()) == live
    finally:
        await again.close(snapshot=False)


async def test_snapshots_in_one_turn_prune_the_log_once_and_leave_no_gap(
    store: ObjectStore, clock: ManualClock
) -> None:
    """Two snapshots finishing in one turn of the loop start one prune, not two: a second
    prune racing the first dropped a segment from the shard's list without deleting it, then
    deleted the ones after it, and the next recovery stopped at that gap (acknowledged
    records lost)."""
    shard = await open_shard(store, clock)
    try:
        await create(shard, "q")
        for i in range(8):  # across several 700-byte segments
            await run(shard, "q", put(f"m{i}"))
        await create(shard, "pin")  # never snapshotted: its segment must stay
        for i in range(8, 16):
            await run(shard, "q", put(f"m{i}"))
        queue = shard.queues["q"]
        await queue.snapshot()
        await settle(shard)
        await run(shard, "q", put("m16"))
        await queue.snapshot()  # the second snapshot: q's segments may go now...
        shard.snapshot_taken(queue)  # ...and another queue's snapshot lands in the same turn
        await settle(shard)
        listed = await segment_keys(store)
        assert listed == [info.key for info in shard._segments]  # nothing dropped unseen
        assert "pin" in (await last_seqs(store))[listed[0]]  # pruned up to pin's segment
        await run(shard, "q", put("after"))
        live = views(shard, clock.now_ms())
    finally:
        await shard.close(snapshot=False)
    again = await open_shard(store, clock)
    try:
        assert again.report is not None
        assert again.report.clean, again.report
        assert views(again, clock.now_ms()) == live
    finally:
        await again.close(snapshot=False)


# ================================================================ deleting queues


async def test_a_deleted_queue_is_erased_and_one_created_again_starts_empty_and_numbers_on(
    store: ObjectStore, clock: ManualClock
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, "gone", "stays")
        await run(shard, "gone", put("old-1", "old-2"))
        await shard.queues["gone"].snapshot()
        await run(shard, "gone", put("old-3"))
        await shard.queues["gone"].snapshot()
        deleted_at = shard.queues["gone"].next_seq  # the QueueDeleted record's number
        await shard.delete("gone")
        await settle(shard)
        assert await store.list(keys.queue_prefix("gone")) == []  # snapshots, reports
        with pytest.raises(QueueNotFound):
            await shard.get("gone")
        assert await shard.names() == ["stays"]
        [dropped] = [
            (s + i, e)
            for _, groups in await log_blocks(store)
            for q, s, events in groups
            if q == "gone"
            for i, e in enumerate(events)
            if isinstance(e, ev.QueueDeleted)
        ]
        assert dropped[0] == deleted_at

        await create(shard, "gone")
        gone = shard.queues["gone"]
        assert gone.state.messages == {}
        assert gone.next_seq == deleted_at + 2  # QueueCreated took deleted_at + 1
        await run(shard, "gone", put("new-1"))
        live = views(shard, clock.now_ms())
    finally:
        await shard.close(snapshot=False)
    for life in range(2):
        again = await open_shard(store, clock)
        try:
            assert views(again, clock.now_ms()) == live
            assert sorted(str(m) for m in again.queues["gone"].state.messages) == ["new-1"]
            assert again.queues["gone"].next_seq == deleted_at + 3
        finally:
            await again.close(snapshot=life == 0)


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful", "no-snapshot"])
async def test_a_queue_deleted_while_other_queues_pin_its_records_stays_deleted(
    store: ObjectStore, clock: ManualClock, graceful: bool
) -> None:
    shard = await open_shard(store, clock)
    try:
        await create(shard, "gone", "pin")
        await shard.run_batch([("gone", put("g1", "g2")), ("pin", put("p1"))])
        await shard.queues["gone"].snapshot()
        await settle(shard)  # the prune this snapshot starts is over before the deletion
        await run(shard, "gone", cmd.Take(max=1))
        await shard.delete("gone")
        await settle(shard)
        # pin has no snapshot: every segment stays, with gone's creation, puts and deletion
        gone_records = [
            type(e)
            for _, groups in await log_blocks(store)
            for q, _, es in groups
            if q == "gone"
            for e in es
        ]
        assert gone_records[0] is ev.QueueCreated
        assert gone_records[-1] is ev.QueueDeleted
        assert await store.list(keys.queue_prefix("gone")) == []
        live = views(shard, clock.now_ms())
        assert set(live) == {"pin"}
    finally:
        await shard.close(snapshot=graceful)
    for _ in range(2):  # recovery finishes nothing twice, and forgets nothing
        again = await open_shard(store, clock)
        try:
            assert await again.names() == ["pin"]
            with pytest.raises(QueueNotFound):
                await again.get("gone")
            assert views(again, clock.now_ms()) == live
            assert await store.list(keys.queue_prefix("gone")) == []
        finally:
            await again.close(snapshot=False)
    queues, _ = await read_shard(store, device_of(store), 0, 1)
    assert set(queues) == {"pin"}


@pytest.mark.parametrize("again", [True, False], ids=["created-again", "left-deleted"])
async def test_a_deleted_queue_whose_first_segments_were_pruned_reads_as_deleted(
    store: ObjectStore, clock: ManualClock, again: bool
) -> None:
    # FORMAT.md lets a deleted queue's segments go once its objects are erased, oldest
    # first: the end of its history can outlive its beginning in a segment another queue
    # pins. Recovery must take that for the deleted life it is, not for a gap, and a queue
    # created again after it (without a snapshot yet) must come back whole.
    shard = await open_shard(store, clock)
    try:
        await create(shard, "gone")
        for i in range(10):  # past the first local segment
            await run(shard, "gone", put(f"old-{i}"))
        await create(shard, "pin")
        await run(shard, "gone", put("old-last"))
        deleted_at = shard.queues["gone"].next_seq
        await shard.delete("gone")
        await shard.queues["pin"].snapshot()  # prunes what nothing pins any more
        await settle(shard)
        left = [s for _, groups in await log_blocks(store) for q, s, _ in groups if q == "gone"]
        assert left, "the test needs the end of gone's history in the log"
        assert left[0] > 1, "the test needs the beginning of gone's history pruned"
        assert left[-1] == deleted_at
        if again:
            await create(shard, "gone")
            await run(shard, "gone", put("new"))
        live = views(shard, clock.now_ms())
    finally:
        await shard.close(snapshot=False)  # the new life is in the log only
    for life in range(2):
        reopened = await open_shard(store, clock)
        try:
            assert views(reopened, clock.now_ms()) == live
            assert all(r.clean for r in reopened.reports), reopened.reports
            assert reopened.report is not None
            assert reopened.report.clean
            if again:
                assert list(reopened.queues["gone"].state.messages) == ["new"]
                assert reopened.queues["gone"].next_seq == deleted_at + 3
            elif life == 1:  # created now, it numbers on after the deletion
                await create(reopened, "gone")
                assert reopened.queues["gone"].next_seq == deleted_at + 2
                assert reopened.queues["gone"].state.messages == {}
        finally:
            await reopened.close(snapshot=False)


async def test_records_whose_beginning_and_snapshots_are_lost_are_reported_as_a_gap(
    store: ObjectStore, clock: ManualClock
) -> None:
    # Not a deleted life: the queue's snapshots were removed behind the shard's back after
    # its first segments were pruned. What is left cannot be a queue; it is damage.
    shard = await open_shard(store, clock)
    try:
        await create(shard, "lost")
        for i in range(10):  # past the first local segment
            await run(shard, "lost", put(f"m{i}"))
        await create(shard, "other")
        lost = shard.queues["lost"]
        for i in range(2):
            await lost.snapshot()
            await run(shard, "lost", put(f"after-{i}"))
        await settle(shard)
        left = [s for _, groups in await log_blocks(store) for q, s, _ in groups if q == "lost"]
        assert left[0] > 1, "the test needs the beginning of lost's history pruned"
    finally:
        await shard.close(snapshot=False)
    for key in await store.list(keys.snapshot_prefix("lost")):
        await store.delete(key)
    reopened = await open_shard(store, clock)
    try:
        assert await reopened.names() == ["other"]
        [report] = [r for r in reopened.reports if r.queue == "lost"]
        [gap] = report.discarded
        assert gap.reason == "gap: record 1 of queue lost is missing"
    finally:
        await reopened.close(snapshot=False)
