"""Fault injection: the queue actor and its log writer over a store that fails on a schedule.

Each test wraps a real store (a local directory, or obstore's in-memory store where that is
cheap) in :class:`~actors.log.faults.FaultyStore` and checks the guarantees of
``actors/queue_actor.py``:

- a reply, even an error, is released only once every event decided before it is durable;
- a failed write fails exactly the commands whose events it held (``Unavailable``); the
  queue reloads its log and decides again every command that waited behind it; read-only
  commands never fail;
- afterwards the in-memory state is exactly what recovery rebuilds from the store;
- group commit: what arrives while the writes are busy goes out together in one segment;
- snapshots are written, verified, at most two kept, covered segments pruned.

The tests use the public surface of the actor and the writer; they do not depend on how
many writes the writer keeps in flight (``max_in_flight``, 1 if the writer has no such knob).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from obstore.store import MemoryStore

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core import replies as rp
from actors.core.snapshot import decode_snapshot, logical, restore
from actors.errors import MessageNotFound, QueueError, Unavailable
from actors.log import keys
from actors.log.codec import decode_snapshot_object
from actors.log.device import ObjectLogDevice
from actors.log.faults import FaultyStore
from actors.log.obstore_store import ObstoreStore
from actors.log.shard_recovery import read_shard
from actors.log.shardlog import ShardLog
from actors.log.store import LocalDirStore, ObjectStore, StoreError
from actors.queue_actor import QueueActor
from actors.settings import LogSettings
from tests.fault.actor_support import (
    NAME,
    assert_state_is_durable,
    body_of,
    close,
    deletes_id,
    device_of,
    durable_view,
    empty_store,
    open_actor,
    put,
    put_ids,
    puts_id,
    read_log,
    segment_keys,
    segment_with,
    settle,
    spawn,
    state_view,
    wait_until,
    write_started,
)

pytestmark = pytest.mark.fault

DELAY = 0.1  # how long an injected slow write takes: long enough to pile commands up behind


@pytest.fixture(params=["local", "memory"])
async def inner(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """A real, empty store for FaultyStore to wrap."""
    st = empty_store(request.param, tmp_path)
    yield st
    await st.close()


@pytest.fixture
async def local(tmp_path: Path) -> AsyncIterator[LocalDirStore]:
    """A local directory store (when a test looks at the files themselves)."""
    st = LocalDirStore(tmp_path / "store")
    yield st
    await st.close()


@pytest.fixture
async def clock() -> ManualClock:
    return ManualClock()


async def recovered_by_a_fresh_actor(store: ObjectStore, clock: ManualClock) -> Any:
    """The state a new incarnation recovers (it claims a new epoch: use it last)."""
    fresh = await open_actor(store, clock, settings=None)
    try:
        return state_view(fresh.state, clock.now_ms())
    finally:
        await close(fresh, snapshot=False)


def slots(actor: QueueActor) -> int:
    """How many block writes the shard's log runs at once."""
    return int(actor.host.wal.max_in_flight)  # type: ignore[attr-defined]


def ids_of(deliveries: list[rp.Delivery]) -> list[str]:
    return sorted(d.id for d in deliveries)


# ================================================================ the writer on its own


def _wal(store: ObjectStore, epoch: int = 1) -> ShardLog:
    return ShardLog(ObjectLogDevice(store, 0), epoch, 1)


async def test_writer_without_owner_fails_the_failed_batch_and_all_after_it(
    inner: ObjectStore,
) -> None:
    store = FaultyStore(inner).delay("put_if_absent", DELAY).fail_put(1)
    wal = _wal(store)
    first = spawn(wal.append(NAME, 1, [ev.WriterStarted(1, 1)]).wait())
    await write_started(store, 0)
    behind = [spawn(wal.append(NAME, 2 + i, [ev.MessagesAcked(2, [i])]).wait()) for i in range(3)]
    outcomes = await asyncio.gather(first, *behind, return_exceptions=True)
    assert all(isinstance(o, StoreError) for o in outcomes), outcomes
    assert outcomes[0].fields["ambiguous"] is False  # type: ignore[union-attr]
    assert wal.failed is not None
    assert wal.durable_lsn == 0
    with pytest.raises(QueueError):
        wal.append(NAME, 9, [ev.MessagesAcked(3, [9])])  # a broken log takes nothing more
    with pytest.raises(QueueError):
        await wal.drain()
    # The failed write never happened: nothing holds record 1.
    assert keys.wal_segment_key(0, 1) not in await inner.list(keys.wal_prefix(0))


async def test_writer_lost_acknowledgement_fails_the_batch_but_the_segment_landed(
    inner: ObjectStore,
) -> None:
    store = FaultyStore(inner).ack_lost_put(1)
    wal = _wal(store, epoch=7)
    events = [ev.WriterStarted(1, 7), ev.MessagesAcked(2, [1, 2])]
    with pytest.raises(StoreError) as info:
        await wal.append(NAME, 1, events).wait()
    assert info.value.fields["ambiguous"] is True
    [(key, segment)] = await read_log(inner)
    assert key == keys.wal_segment_key(0, 1)
    got = (segment.epoch, segment.first_lsn, segment.events, segment.seqs)
    assert got == (7, 1, events, [1, 2])


async def test_writer_gathers_appends_made_while_its_writes_are_busy(inner: ObjectStore) -> None:
    store = FaultyStore(inner).delay("put_if_absent", DELAY)
    wal = _wal(store)
    busy = wal.max_in_flight
    waits = []
    for i in range(busy):  # one append per write slot: each goes out at once, alone
        waits.append(spawn(wal.append(NAME, i + 1, [ev.MessagesAcked(i, [i])]).wait()))
        await write_started(store, i)
    waits += [
        spawn(wal.append(NAME, busy + 1 + i, [ev.MessagesAcked(100, [i])]).wait())
        for i in range(40)
    ]
    await asyncio.gather(*waits)
    assert wal.blocks_written == busy + 1
    segments = await read_log(inner)
    assert [len(seg.events) for _, seg in segments] == [1] * busy + [40]
    assert wal.durable_lsn == busy + 40


# ================================================================ a failed write


async def test_a_failed_write_fails_exactly_its_commands_and_the_rest_succeed(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m1", "m2", "m3"))
        store.delay("put_if_absent", DELAY)
        doomed = store.puts + 1
        store.fail_put(doomed)
        started = store.calls["put_if_absent"]
        lost = spawn(actor.execute(put("x1")))
        await write_started(store, started)
        # Everything below arrives while x1's write is in flight.
        stats = spawn(actor.execute(cmd.Stats()))
        later_put = spawn(actor.execute(put("y1")))
        peek_lost = spawn(actor.execute(cmd.Peek("x1")))
        take = spawn(actor.execute(cmd.Take(max=10)))
        peek_ready = spawn(actor.execute(cmd.PeekReady(max=10)))

        with pytest.raises(Unavailable):
            await lost
        assert await later_put == [rp.PutResult("y1", rp.CREATED)]
        # Read-only commands never fail; they answer from the durable state: x1 never was.
        view = await stats
        assert (view.total, view.enqueued) == (3, 3)
        with pytest.raises(MessageNotFound):
            await peek_lost
        assert ids_of(await take) == ["m1", "m2", "m3", "y1"]
        assert await peek_ready == []

        assert [(i.put, i.fault) for i in store.injected if i.fault != "delay"] == [
            (doomed, "fail")
        ]
        with pytest.raises(MessageNotFound):
            await actor.execute(cmd.Peek("x1"))
        assert await actor.execute(put("z1")) == [rp.PutResult("z1", rp.CREATED)]
        await assert_state_is_durable(actor, inner, clock.now_ms())
        assert sorted(put_ids(await read_log(inner))) == ["m1", "m2", "m3", "y1", "z1"]
        expected = state_view(actor.state, clock.now_ms())
    finally:
        await close(actor, snapshot=False)
    assert await recovered_by_a_fresh_actor(inner, clock) == expected


async def test_a_write_whose_acknowledgement_was_lost_is_found_by_the_reload(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m1"))
        store.delay("put_if_absent", DELAY)
        store.ack_lost_put(store.puts + 1)
        started = store.calls["put_if_absent"]
        landed = spawn(actor.execute(put("x1")))
        await write_started(store, started)
        peek = spawn(actor.execute(cmd.Peek("x1")))
        retry = spawn(actor.execute(put("x1")))  # the client retries while it is unsure
        take = spawn(actor.execute(cmd.Take(max=10)))

        with pytest.raises(Unavailable):
            await landed
        view = await peek
        assert (view.id, view.body) == ("x1", body_of("x1"))  # it landed: the reload has it
        assert await retry == [rp.PutResult("x1", rp.DUPLICATE)]
        assert ids_of(await take) == ["m1", "x1"]

        stats = await actor.execute(cmd.Stats())
        assert (stats.total, stats.enqueued) == (2, 2)  # no duplicate
        await assert_state_is_durable(actor, inner, clock.now_ms())
        assert sorted(put_ids(await read_log(inner))) == ["m1", "x1"]
        expected = state_view(actor.state, clock.now_ms())
    finally:
        await close(actor, snapshot=False)
    assert await recovered_by_a_fresh_actor(inner, clock) == expected


@pytest.mark.parametrize("fault", ["fail", "ack_lost"])
async def test_a_take_behind_a_failed_put_hands_it_out_only_if_it_landed(
    inner: ObjectStore, clock: ManualClock, fault: str
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m0"))
        store.delay("put_if_absent", DELAY)
        n = store.puts + 1
        store.fail_put(n) if fault == "fail" else store.ack_lost_put(n)
        started = store.calls["put_if_absent"]
        doubtful = spawn(actor.execute(put("x")))
        await write_started(store, started)
        take = spawn(actor.execute(cmd.Take(max=10)))

        with pytest.raises(Unavailable):
            await doubtful
        if fault == "fail":
            assert ids_of(await take) == ["m0"]
            with pytest.raises(MessageNotFound):
                await actor.execute(cmd.Peek("x"))
        else:
            assert ids_of(await take) == ["m0", "x"]
            assert (await actor.execute(cmd.Peek("x"))).state == "reserved"
        await assert_state_is_durable(actor, inner, clock.now_ms())
    finally:
        await close(actor, snapshot=False)


@pytest.mark.parametrize("fault", ["fail", "ack_lost"])
async def test_a_failed_claim_during_the_reload_is_retried(
    inner: ObjectStore, clock: ManualClock, fault: str
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m1"))
        segment = store.puts + 1
        claim = segment + 1  # the reload's WriterStarted segment
        store.fail_put(segment)
        store.fail_put(claim) if fault == "fail" else store.ack_lost_put(claim)
        with pytest.raises(Unavailable):
            await actor.execute(put("x1"))
        # The next command waits for the reload, which must get past its failed claim.
        assert await asyncio.wait_for(actor.execute(put("y1")), 10) == [
            rp.PutResult("y1", rp.CREATED)
        ]
        assert actor.epoch == (2 if fault == "fail" else 3)
        await assert_state_is_durable(actor, inner, clock.now_ms())
        starts = [
            e.epoch
            for _, read in await read_log(inner)
            for e in read.events
            if isinstance(e, ev.WriterStarted)
        ]
        assert starts == sorted(set(starts)), starts  # strictly increasing
    finally:
        await close(actor, snapshot=False)


# ================================================================ replies wait for durability


async def test_replies_are_released_only_once_their_segment_is_in_the_store(
    local: LocalDirStore, clock: ManualClock
) -> None:
    store = FaultyStore(local)
    actor = await open_actor(store, clock)
    log_dir = local.root / keys.wal_prefix(0)
    seen: dict[str, set[str]] = {}

    async def call(tag: str, command: object) -> Any:
        try:
            outcome = await actor.execute(command)
        except QueueError as exc:
            outcome = exc
        # Synchronously, the moment the reply arrives: which segments exist on disk?
        seen[tag] = {keys.wal_prefix(0) + n for n in os.listdir(log_dir)}
        return outcome

    try:
        await actor.execute(put("old"))
        store.delay("put_if_absent", DELAY)
        began = time.perf_counter()
        started = store.calls["put_if_absent"]
        first = spawn(call("put m1", put("m1")))
        await write_started(store, started)
        tasks = {
            "peek m1": spawn(call("peek m1", cmd.Peek("m1"))),
            "put m2": spawn(call("put m2", put("m2"))),
            "peek m2": spawn(call("peek m2", cmd.Peek("m2"))),
            "delete old": spawn(call("delete old", cmd.Delete("old"))),
            "delete old again": spawn(call("delete old again", cmd.Delete("old"))),
            "stats": spawn(call("stats", cmd.Stats())),
        }
        assert await first == [rp.PutResult("m1", rp.CREATED)]
        assert time.perf_counter() - began >= DELAY
        out = {tag: await task for tag, task in tasks.items()}
        assert out["peek m1"].id == "m1"
        assert out["peek m2"].id == "m2"
        assert out["delete old"] is None
        assert isinstance(out["delete old again"], MessageNotFound)
        assert out["stats"].total == 2

        segments = await read_log(local)
        m1, m2 = segment_with(segments, puts_id("m1")), segment_with(segments, puts_id("m2"))
        deleted = segment_with(segments, deletes_id("old"))
        needs = {
            "put m1": [m1],
            "peek m1": [m1],
            "put m2": [m2],
            "peek m2": [m2],
            "delete old": [deleted],
            "delete old again": [deleted],  # an error reply tells of the deletion too
            "stats": [m1, m2, deleted],
        }
        for tag, segs in needs.items():
            missing = [s for s in segs if s not in seen[tag]]
            assert not missing, f"{tag!r} was answered before {missing} was in the store"
    finally:
        await close(actor, snapshot=False)


async def test_an_error_reply_waits_for_the_write_it_tells_of(
    local: LocalDirStore, clock: ManualClock
) -> None:
    store = FaultyStore(local)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m"))
        store.delay("put_if_absent", 4 * DELAY)
        started = store.calls["put_if_absent"]
        delete = spawn(actor.execute(cmd.Delete("m")))
        await write_started(store, started)
        again = spawn(actor.execute(cmd.Delete("m")))
        await asyncio.sleep(DELAY)
        # "no such message" is true only once the deletion is durable.
        assert not again.done()
        assert await delete is None
        with pytest.raises(MessageNotFound):
            await again
        segments = await read_log(local)
        assert segment_with(segments, deletes_id("m"))
    finally:
        await close(actor, snapshot=False)


async def test_an_error_reply_behind_a_failed_write_is_decided_again(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("m"))
        store.delay("put_if_absent", DELAY)
        store.fail_put(store.puts + 1)
        started = store.calls["put_if_absent"]
        delete = spawn(actor.execute(cmd.Delete("m")))
        await write_started(store, started)
        again = spawn(actor.execute(cmd.Delete("m")))  # MessageNotFound, were it released now
        with pytest.raises(Unavailable):
            await delete
        assert await again is None  # the first deletion never happened: this one does
        with pytest.raises(MessageNotFound):
            await actor.execute(cmd.Peek("m"))
        await assert_state_is_durable(actor, inner, clock.now_ms())
    finally:
        await close(actor, snapshot=False)


# ================================================================ group commit


async def test_commands_arriving_while_the_writes_are_busy_go_out_in_one_segment(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        before_keys = await segment_keys(inner)
        before = actor.host.wal.blocks_written
        store.delay("put_if_absent", DELAY)
        first = []
        for i in range(slots(actor)):  # occupy every write slot, one command each
            started = store.calls["put_if_absent"]
            first.append(spawn(actor.execute(put(f"s{i}"))))
            await write_started(store, started)
        crowd = [f"p{i}" for i in range(50)]
        replies = await asyncio.gather(*first, *(actor.execute(put(m)) for m in crowd))
        assert all(r[0].status == rp.CREATED for r in replies)

        new = [k for k in await segment_keys(inner) if k not in before_keys]
        assert actor.host.wal.blocks_written - before == len(new) == slots(actor) + 1
        segments = await read_log(inner)
        last = segments[-1][1]
        assert last.count == len(crowd)
        assert sorted(put_ids([segments[-1]])) == sorted(crowd)
    finally:
        await close(actor, snapshot=False)


async def test_an_idle_queue_writes_at_once(inner: ObjectStore, clock: ManualClock) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        before = await segment_keys(inner)
        store.delay("put_if_absent", DELAY)
        for i in range(5):
            calls = store.calls["put_if_absent"]
            task = spawn(actor.execute(put(f"m{i}")))
            for _ in range(5):  # a few turns of the loop, no time for any timer
                await asyncio.sleep(0)
            assert store.calls["put_if_absent"] == calls + 1, "the write did not start at once"
            assert not task.done()  # and the reply waits for it
            await task
        new = [k for k in await segment_keys(inner) if k not in before]
        assert len(new) == 5
        assert [seg.count for k, seg in await read_log(inner) if k in new] == [1] * 5
    finally:
        await close(actor, snapshot=False)


# ================================================================ snapshots


_fresh = itertools.count()


async def _workload(actor: QueueActor, clock: ManualClock, rng: random.Random, steps: int) -> None:
    """Puts, takes (some with short leases that expire), acks, releases; the clock moves."""
    held: list[rp.Delivery] = []
    for _ in range(steps):
        clock.advance(rng.randint(0, 40))
        roll = rng.random()
        if roll < 0.65 and held and roll >= 0.4:
            d = held.pop(rng.randrange(len(held)))
            if roll < 0.55:
                await actor.execute(cmd.Ack([cmd.LeaseRef(d.id, d.lease)]))
            else:
                await actor.execute(cmd.Release([cmd.ReleaseItem(id=d.id, lease=d.lease)]))
        elif roll < 0.8 and roll >= 0.4:
            vt = rng.choice([100, 30_000])
            held += await actor.execute(cmd.Take(max=2, visibility_timeout_ms=vt))
        else:
            await actor.execute(put(*(f"w{next(_fresh)}" for _ in range(rng.randint(1, 3)))))


async def test_snapshots_are_verified_at_most_two_kept_and_covered_segments_pruned(
    inner: ObjectStore, clock: ManualClock
) -> None:
    actor = await open_actor(inner, clock, log_settings=LogSettings(snapshot_every_records=7))
    snap_prefix = keys.snapshot_prefix(NAME)
    ever: set[str] = set()
    try:
        rng = random.Random(1)
        # 30 rounds, and more while fewer than five snapshots were seen: the snapshots are
        # written beside the workload (one at a time), so a starved machine sees fewer.
        for n in range(300):
            if n >= 30 and len(ever) >= 5:
                break
            await _workload(actor, clock, rng, 5)
            ever |= set(await inner.list(snap_prefix))
        await settle(actor)
        now = clock.now_ms()

        assert len(ever) >= 5, f"expected many snapshot cycles, saw {sorted(ever)}"
        snaps = await inner.list(snap_prefix)
        assert len(snaps) == 2, snaps
        restored = {}
        for key in snaps:
            epoch, seq, body = decode_snapshot_object(await inner.get(key))
            assert (epoch, seq) == (actor.epoch, keys.seq_of(key))
            restored[seq] = restore(decode_snapshot(body))
            assert restored[seq].name == NAME
        older, newest = sorted(restored)

        segments = await read_log(inner)
        firsts = [seg.first_lsn for _, seg in segments]
        lasts = [seg.first_lsn + seg.count - 1 for _, seg in segments]
        assert all(b == a + 1 for a, b in zip(lasts, firsts[1:], strict=False)), "gap in the log"
        # Covered by both snapshots means deleted; the older one still has its records.
        queue_seqs = [[q for q in seg.seqs if q] for _, seg in segments]
        assert all(max(q, default=older + 1) > older for q in queue_seqs[:-1]), (
            older,
            queue_seqs,
        )
        assert min(q for qs in queue_seqs for q in qs) <= older + 1
        assert len(segments) < actor.host.wal.blocks_written

        live = state_view(actor.state, now)
        queues, report = await read_shard(inner, device_of(inner), 0, 1)
        assert report.clean
        assert queues[NAME].report.clean
        assert queues[NAME].report.snapshot == keys.snapshot_key(NAME, newest)
        assert state_view(queues[NAME].state, now) == live
        # Were the newest snapshot lost, the older one and the segments after it suffice.
        fallback = restored[older]
        for _, seg in segments:
            for seq, event in zip(seg.seqs, seg.events, strict=True):
                if seq > older:
                    fallback.apply(event)
        assert state_view(fallback, now) == live
    finally:
        await close(actor, snapshot=False)


async def test_recovery_after_many_snapshot_cycles_and_restarts_gives_the_same_state(
    inner: ObjectStore, clock: ManualClock
) -> None:
    rng = random.Random(2)
    settings = LogSettings(snapshot_every_records=5)
    epochs = []
    expected = None
    for life in range(6):
        actor = await open_actor(inner, clock, log_settings=settings)
        try:
            epochs.append(actor.epoch)
            if expected is not None:
                assert state_view(actor.state, clock.now_ms()) == expected, f"restart {life}"
            await _workload(actor, clock, rng, 40)
            await settle(actor)
            expected = state_view(actor.state, clock.now_ms())
        finally:
            await close(actor, snapshot=life % 2 == 0)
        assert len(await inner.list(keys.snapshot_prefix(NAME))) <= 2
    assert epochs == sorted(set(epochs))
    assert await durable_view(inner, clock.now_ms()) == expected


@pytest.mark.parametrize("fault", ["fail", "ack_lost"])
async def test_a_failed_snapshot_write_leaves_the_log_valid_and_the_next_one_works(
    inner: ObjectStore, clock: ManualClock, fault: str
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    try:
        await actor.execute(put("a", "b"))
        n = store.puts + 1
        store.fail_put(n) if fault == "fail" else store.ack_lost_put(n)
        with pytest.raises(QueueError):
            await actor.snapshot()
        assert await actor.execute(put("c")) == [rp.PutResult("c", rp.CREATED)]
        await assert_state_is_durable(actor, inner, clock.now_ms())
        key = await actor.snapshot()
        assert key is not None
        assert keys.seq_of(key) == actor.durable_seq
        queues, _ = await read_shard(inner, device_of(inner), 0, 1)
        assert queues[NAME].report.snapshot == key
        assert state_view(queues[NAME].state, clock.now_ms()) == state_view(
            actor.state, clock.now_ms()
        )
    finally:
        await close(actor, snapshot=False)


async def test_a_snapshot_waiting_behind_a_failed_write_ends_and_snapshots_go_on(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock)
    snap = None
    try:
        await actor.execute(put("m"))
        store.delay("put_if_absent", DELAY)
        store.fail_put(store.puts + 1)
        started = store.calls["put_if_absent"]
        lost = spawn(actor.execute(put("x")))
        await write_started(store, started)
        behind = spawn(actor.execute(put("y")))
        await asyncio.sleep(0)  # y is decided: the snapshot covers it and waits for it
        snap = spawn(actor.snapshot())
        with pytest.raises(Unavailable):
            await lost
        assert await behind == [rp.PutResult("y", rp.CREATED)]
        store.schedule.delays.clear()
        done, _ = await asyncio.wait({snap}, timeout=5)
        assert snap in done, "actor.snapshot() never returned after the write it awaited failed"
        key = await actor.snapshot()
        assert key is not None, "no snapshot is taken any more after a failed write"
    finally:
        if snap is not None and not snap.done():
            snap.cancel()
        await close(actor, snapshot=False)


async def test_automatic_snapshots_go_on_after_failed_writes_under_load(
    inner: ObjectStore, clock: ManualClock
) -> None:
    store = FaultyStore(inner)
    actor = await open_actor(store, clock, log_settings=LogSettings(snapshot_every_records=1))
    stop = False

    async def producer(p: int) -> None:
        n = 0
        while not stop:
            with contextlib.suppress(Unavailable):
                await actor.execute(put(f"p{p}-{n}"))
            n += 1

    try:
        store.delay("put_if_absent", 0.005)
        producers = [spawn(producer(p)) for p in range(8)]
        for _ in range(5):  # each failure may strike while a snapshot waits for a write
            await wait_until(
                lambda: store.puts > 20 + max(store.schedule.fail_puts, default=0),
                "the load went on",
            )
            store.fail_put(store.puts + 2)
        await wait_until(lambda: store.puts > 40 + max(store.schedule.fail_puts), "more load")
        mark = actor.durable_seq
        await wait_until(lambda: store.puts > 80 + max(store.schedule.fail_puts), "more load")
        stop = True
        await asyncio.gather(*producers)
        await wait_until(lambda: actor.host.wal.idle, "writes done")  # type: ignore[attr-defined]
        await asyncio.sleep(0.5)  # time for a snapshot in progress to finish
        assert sum(i.fault == "fail" for i in store.injected) == 5
        newest = max(keys.seq_of(k) for k in await inner.list(keys.snapshot_prefix(NAME)))
        assert newest > mark, (
            f"snapshots stopped after a failed write: the newest covers record {newest}, "
            f"the log was at {mark} long before the load ended ({actor.durable_seq})"
        )
    finally:
        stop = True
        await close(actor, snapshot=False)


# ================================================================ random faults under load


@pytest.mark.parametrize("seed", range(4))
async def test_random_write_faults_under_load_lose_and_invent_nothing(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    inner = ObstoreStore(MemoryStore(), "memory://")
    store = FaultyStore(inner).delay("put_if_absent", 0.002)
    # Snapshots stay off here: a snapshot caught by a failed write hangs (see the snapshot
    # tests above), which would hide what this test checks.
    actor = await open_actor(store, clock)
    doomed = rng.sample(range(store.puts + 1, store.puts + 150), 16)
    store.fail_put(*doomed[:8]).ack_lost_put(*doomed[8:])
    sent: set[str] = set()
    confirmed: set[str] = set()  # puts acknowledged
    acking: set[str] = set()  # acks sent (outcome known or not)
    acked: set[str] = set()  # acks acknowledged
    producers_done = asyncio.Event()

    async def producer(p: int) -> None:
        for n in range(10):
            mids = [f"p{p}-{n}-{i}" for i in range(rng.randint(1, 5))]
            sent.update(mids)
            for _ in range(50):  # retry while unsure; the idempotency keys dedup
                try:
                    results = await actor.execute(put(*mids, key=True))
                except Unavailable:
                    continue
                assert [r.id for r in results] == mids
                confirmed.update(mids)
                break
            else:
                raise AssertionError(f"put of {mids} never succeeded")

    async def consumer() -> None:
        while not producers_done.is_set() or actor.state.n_ready:
            try:
                got = await actor.execute(cmd.Take(max=rng.randint(1, 5)))
            except Unavailable:
                continue
            if not got:
                await asyncio.sleep(0.001)
                continue
            acking.update(d.id for d in got)
            try:
                results = await actor.execute(cmd.Ack([cmd.LeaseRef(d.id, d.lease) for d in got]))
            except Unavailable:
                continue
            acked.update(r.id for r in results if r.status == rp.OK)

    try:
        consumers = [spawn(consumer()) for _ in range(4)]
        await asyncio.gather(*(producer(p) for p in range(12)))
        producers_done.set()
        await asyncio.wait_for(asyncio.gather(*consumers), 30)
        await assert_state_is_durable(actor, inner, clock.now_ms())

        injected = [(i.put, i.fault) for i in store.injected if i.fault != "delay"]
        assert injected, f"seed {seed}: no fault was injected"
        present = {str(msg.id): msg for msg in logical(actor.state).messages}
        assert not confirmed - present.keys() - acking, f"seed {seed}: acknowledged puts lost"
        assert not acked & present.keys(), f"seed {seed}: acknowledged acks undone"
        assert present.keys() <= sent
        assert all(msg.body == body_of(m) for m, msg in present.items())
        stats = await actor.execute(cmd.Stats())
        assert stats.enqueued == stats.total + stats.acked, f"seed {seed}: duplicates"
        expected = state_view(actor.state, clock.now_ms())
    finally:
        await close(actor, snapshot=False)
    assert await recovered_by_a_fresh_actor(inner, clock) == expected
