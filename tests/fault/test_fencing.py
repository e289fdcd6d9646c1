"""Fencing: two incarnations of one shard over one log, and only the newest may write.

On an object store each incarnation gets an epoch one above the highest in the log and
claims the log by writing a block with ``put_if_absent`` at the next LSN (FORMAT.md,
"Fencing"). An older incarnation that tries to write afterwards finds the name taken by a
newer epoch, fails with ``Fenced`` and stops serving; the new one serves the intact state.
On a local disk the log's exclusive lock refuses a second incarnation outright, and a block
of an older epoch after a newer one (a writer that got around the lock) is never recovered.

The two incarnations use two store clients over the same storage (two obstore clients on one
in-memory store or one S3 prefix, two LocalDirStore instances on one directory), as two
processes would.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from obstore.store import MemoryStore

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core import replies as rp
from actors.core.ids import SequentialIds
from actors.errors import Fenced, QueueError, Unavailable
from actors.log import keys
from actors.log.device import ObjectLogDevice, OwnWriteLanded
from actors.log.faults import FaultyStore
from actors.log.obstore_store import ObstoreStore
from actors.log.store import LocalDirStore, ObjectStore
from actors.log.wal import encode_block, encode_record, encode_wal_header
from actors.queue_actor import QueueActor
from actors.shard import QueueShard
from tests.conftest import S3Server
from tests.fault.actor_support import (
    CLIENT_IDS,
    NAME,
    close,
    durable_view,
    open_actor,
    put,
    put_ids,
    read_log,
    recovered,
    spawn,
    state_view,
    write_started,
)

pytestmark = pytest.mark.fault


@pytest.fixture(
    params=["memory", pytest.param("s3", marks=pytest.mark.integration)],
)
async def two_clients(
    request: pytest.FixtureRequest,
) -> AsyncIterator[tuple[ObjectStore, ObjectStore]]:
    """Two independent object-store clients that see the same objects."""
    if request.param == "memory":
        shared = MemoryStore()
        pair: tuple[ObjectStore, ObjectStore] = (
            ObstoreStore(shared, "memory://"),
            ObstoreStore(shared, "memory://"),
        )
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        prefix = s3.fresh_prefix()
        pair = (s3.store(prefix), s3.store(prefix))
    yield pair
    for st in pair:
        await st.close()


async def all_objects(store: ObjectStore) -> dict[str, bytes]:
    return {k: await store.get(k) for k in await store.list("")}


async def claim_lsn(store: ObjectStore, epoch: int) -> int:
    """The LSN of the block that holds the claim (``WriterStarted``) of ``epoch``."""
    for _, seg in await read_log(store):
        for event in seg.events:
            if isinstance(event, ev.WriterStarted) and event.epoch == epoch:
                return seg.first_lsn
    raise AssertionError(f"no WriterStarted of epoch {epoch} in the log")


async def assert_nothing_of_epoch_after(store: ObjectStore, epoch: int, claim: int) -> None:
    """No segment of ``epoch`` (or older) at or after the claim ``claim`` of a newer one."""
    late = [
        (key, seg.epoch)
        for key, seg in await read_log(store)
        if seg.epoch <= epoch and seg.first_lsn >= claim
    ]
    assert not late, f"the fenced epoch {epoch} wrote after the claim at {claim}: {late}"


# ================================================================ a takeover


async def test_a_newer_incarnation_fences_the_older_one(
    two_clients: tuple[ObjectStore, ObjectStore],
) -> None:
    store_a, store_b = two_clients
    clock = ManualClock()
    a = await open_actor(store_a, clock)
    b: QueueActor | None = None
    try:
        assert a.epoch == 1
        await a.execute(put("a1", "a2"))
        (held,) = await a.execute(cmd.Take(max=1))
        assert held.id == "a1"

        clock.advance(10)
        b = await open_actor(store_b, clock, settings=None)
        assert b.epoch == 2
        claim = await claim_lsn(store_b, 2)

        with pytest.raises(Fenced):
            await a.execute(put("a3"))
        # A stops serving: reads and writes alike.
        for command in [cmd.Stats(), put("a4"), cmd.Ack([cmd.LeaseRef("a1", held.lease)])]:
            with pytest.raises(Fenced):
                await a.execute(command)
        before_close = await all_objects(store_b)
        await close(a)  # a fenced incarnation writes nothing when it goes
        assert await all_objects(store_b) == before_close
        await assert_nothing_of_epoch_after(store_b, 1, claim)
        assert "a3" not in put_ids(await read_log(store_b))
        assert "a4" not in put_ids(await read_log(store_b))

        # B has everything A made durable, and serves it.
        view = await b.execute(cmd.Peek("a1"))
        assert (view.state, view.receive_count) == ("reserved", 1)
        assert (await b.execute(cmd.Peek("a2"))).state == "ready"
        assert await b.execute(cmd.Ack([cmd.LeaseRef("a1", held.lease)])) == [
            rp.ItemResult("a1", rp.OK)
        ]
        assert await b.execute(put("b1")) == [rp.PutResult("b1", rp.CREATED)]
        assert sorted(d.id for d in await b.execute(cmd.Take(max=10))) == ["a2", "b1"]
        stats = await b.execute(cmd.Stats())
        assert (stats.total, stats.acked, stats.enqueued) == (2, 1, 3)
        assert state_view(b.state, clock.now_ms()) == await durable_view(store_a, clock.now_ms())
    finally:
        await close(a)
        if b is not None:
            await close(b)


async def _zombie_with_writes_in_flight(
    store_a: ObjectStore, clock: ManualClock
) -> tuple[QueueActor, FaultyStore, list[asyncio.Task[object]]]:
    """Incarnation A with a1 durable and, in flight for a second, a put of x, then as many
    more commands as its writer has write slots (each a write of its own if there are
    several slots), then read-only commands riding on them."""
    slow = FaultyStore(store_a)
    a = await open_actor(slow, clock)
    await a.execute(put("a1"))
    slow.delay("put_if_absent", 1.0)  # A's writes wait: B claims the log meanwhile
    slots = a.host.wal.max_in_flight  # type: ignore[attr-defined]
    tasks: list[asyncio.Task[object]] = []
    for i in range(max(2, slots)):
        started = slow.calls["put_if_absent"]
        tasks.append(spawn(a.execute(put(f"x{i}"))))
        if i < slots:
            await write_started(slow, started)
    tasks += [spawn(a.execute(cmd.Stats())), spawn(a.execute(cmd.Take(max=5)))]
    return a, slow, tasks


async def test_commands_in_flight_at_a_takeover_fail_with_fenced_and_never_count(
    two_clients: tuple[ObjectStore, ObjectStore],
) -> None:
    store_a, store_b = two_clients
    clock = ManualClock()
    a, _, tasks = await _zombie_with_writes_in_flight(store_a, clock)
    b: QueueActor | None = None
    try:
        b = await open_actor(store_b, clock, settings=None)
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, Fenced) for o in outcomes), outcomes
        with pytest.raises(Fenced):
            await a.execute(cmd.Stats())
        # A's writes have all finished (its failure is reported only then). Whatever of them
        # landed above B's claim was never acknowledged and must never be recovered.
        rebuilt = await recovered(store_b)
        assert sorted(str(m) for m in rebuilt.messages) == ["a1"]
        assert sorted(str(m) for m in b.state.messages) == ["a1"]

        # B serves, also after A's late writes.
        try:
            reply = await b.execute(put("b1"))
        except Unavailable as exc:
            raise AssertionError(
                f"the new owner's first write failed because of the old one's late writes: {exc}"
            ) from exc
        assert reply == [rp.PutResult("b1", rp.CREATED)]
        assert sorted(d.id for d in await b.execute(cmd.Take(max=5))) == ["a1", "b1"]
        assert state_view(b.state, clock.now_ms()) == await durable_view(store_b, clock.now_ms())
    finally:
        await close(a)
        if b is not None:
            await close(b)


async def test_a_zombies_late_write_is_never_recovered_after_the_owner_snapshots(
    two_clients: tuple[ObjectStore, ObjectStore],
) -> None:
    store_a, store_b = two_clients
    clock = ManualClock()
    a, _, tasks = await _zombie_with_writes_in_flight(store_a, clock)
    try:
        b = await open_actor(store_b, clock, settings=None)
        await close(b)  # B goes at once: it snapshots the state at its claim
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, Fenced) for o in outcomes), outcomes
        c = await open_actor(store_b, clock, settings=None)
        try:
            assert sorted(str(m) for m in c.state.messages) == ["a1"], (
                "a put the old incarnation answered with Fenced was recovered; "
                f"report: {c.host.report}"  # type: ignore[attr-defined]
            )
        finally:
            await close(c)
    finally:
        await close(a)


async def test_a_zombie_that_closes_after_a_takeover_leaves_the_new_owner_intact(
    two_clients: tuple[ObjectStore, ObjectStore],
) -> None:
    store_a, store_b = two_clients
    clock = ManualClock()
    a = await open_actor(store_a, clock)
    await a.execute(put("a1"))
    b = await open_actor(store_b, clock, settings=None)
    try:
        await b.execute(put("b1"))
        await close(a)  # a zombie that never learnt it was fenced: it may snapshot its past
        await b.execute(put("b2"))
        expected = state_view(b.state, clock.now_ms())
        await close(b, snapshot=False)
        c = await open_actor(store_b, clock, settings=None)
        try:
            shard = c.host
            assert shard.report is not None  # type: ignore[attr-defined]
            assert shard.report.clean  # type: ignore[attr-defined]
            assert c.epoch == 3
            assert state_view(c.state, clock.now_ms()) == expected
        finally:
            await close(c)
    finally:
        await close(b)


# ================================================================ racing incarnations


@pytest.mark.parametrize("existing", [False, True], ids=["new-queue", "existing-queue"])
@pytest.mark.parametrize("clocks", ["same-ms", "different-ms"])
async def test_incarnations_opening_concurrently_leave_exactly_one_owner(
    existing: bool, clocks: str
) -> None:
    for attempt in range(5):
        shared = MemoryStore()
        store_a, store_b = ObstoreStore(shared, "memory://"), ObstoreStore(shared, "memory://")
        clock_a = ManualClock()
        clock_b = ManualClock(clock_a.now_ms() + (0 if clocks == "same-ms" else 1))
        if existing:
            first = await open_actor(store_a, clock_a)
            await first.execute(put("old"))
            await close(first)
        a = QueueShard(0, 1, store_a, clock=clock_a, ids=SequentialIds())
        b = QueueShard(0, 1, store_b, clock=clock_b, ids=SequentialIds())
        try:
            opened = await asyncio.gather(a.start(), b.start(), return_exceptions=True)
            assert all(not isinstance(o, BaseException) for o in opened), opened
            assert a.wal.epoch != b.wal.epoch, (
                f"attempt {attempt}: both incarnations claimed the log with epoch {a.wal.epoch}"
            )
            owner, loser = (a, b) if a.wal.epoch > b.wal.epoch else (b, a)
            with pytest.raises(Fenced):
                await create_and_put(loser, "from-loser")
            assert await create_and_put(owner, "from-owner") == [
                rp.PutResult("from-owner", rp.CREATED)
            ]
            ids = put_ids(await read_log(store_a))
            assert "from-loser" not in ids
            assert ids.count("from-owner") == 1
            assert loser.wal.epoch > (1 if existing else 0)  # both above every earlier epoch
        finally:
            await a.close()
            await b.close()
            await store_a.close()
            await store_b.close()


async def create_and_put(shard: QueueShard, mid: str) -> object:
    await shard.create(NAME, CLIENT_IDS, [])
    return await (await shard.get(NAME)).execute(put(mid))


async def test_epochs_strictly_increase_across_reopenings_and_reloads(tmp_path: Path) -> None:
    clock = ManualClock()
    inner = LocalDirStore(tmp_path / "store")
    store = FaultyStore(inner)  # so the log is objects, one per block
    epochs = []
    try:
        for life in range(4):
            actor = await open_actor(store, clock)
            try:
                epochs.append(actor.epoch)
                await actor.execute(put(f"m{life}"))
                if life == 2:  # a failed write makes the incarnation reload: a new epoch
                    store.fail_put(store.puts + 1)
                    with pytest.raises(Unavailable):
                        await actor.execute(put("lost"))
                    await actor.execute(put("after-reload"))
                    epochs.append(actor.epoch)
            finally:
                await close(actor, snapshot=False)  # keep every segment for the check below
            clock.advance(1)
        assert epochs == [1, 2, 3, 4, 5], epochs

        segments = await read_log(inner)
        headers = [seg.epoch for _, seg in segments]
        assert headers == sorted(headers), headers  # the log never goes back to an older epoch
        starts = []
        for _, seg in segments:
            for event in seg.events:
                if isinstance(event, ev.WriterStarted):
                    assert event.epoch == seg.epoch
                    starts.append(event.epoch)
        assert starts == epochs
        reports = await inner.list(f"{keys.wal_prefix(0)}reports/")
        assert reports == [keys.wal_report_key(0, e) for e in epochs]
    finally:
        await inner.close()


# ================================================================ the writer's verdicts


def _object(epoch: int, events: list[ev.Event]) -> bytes:
    """A segment object of one block holding ``events`` of queue NAME from LSN 1."""
    block = encode_block(epoch, 1, [(NAME, 1, [encode_record(e) for e in events])])
    return encode_wal_header(epoch, 1, 0) + block


def _block(epoch: int, events: list[ev.Event]) -> bytes:
    return encode_block(epoch, 1, [(NAME, 1, [encode_record(e) for e in events])])


@pytest.mark.parametrize(
    ("holder", "error"),
    [(2, Fenced), (1, OwnWriteLanded)],
    ids=["newer-epoch", "own-epoch"],
)
async def test_a_writer_that_finds_its_segment_name_taken_says_by_whom(
    holder: int, error: type[QueueError]
) -> None:
    store = ObstoreStore(MemoryStore(), "memory://")
    key = keys.wal_segment_key(0, 1)
    taken = _object(holder, [ev.WriterStarted(5, holder)])
    assert await store.put_if_absent(key, taken)
    device = ObjectLogDevice(store, 0)
    with pytest.raises(error) as info:
        await device.write(1, 1, _block(1, [ev.WriterStarted(7, 1)]))
    assert type(info.value) is error
    if error is Fenced:
        assert info.value.fields["newer"] == 2
    assert await store.get(key) == taken  # never overwritten


async def test_a_writer_sets_aside_an_older_epochs_segment_under_its_name_and_goes_on() -> None:
    # A fenced writer's late write that landed above our claim: never acknowledged by it.
    store = ObstoreStore(MemoryStore(), "memory://")
    key = keys.wal_segment_key(0, 1)
    junk = _object(1, [ev.WriterStarted(5, 1)])
    assert await store.put_if_absent(key, junk)
    events: list[ev.Event] = [ev.WriterStarted(7, 2)]
    assert await ObjectLogDevice(store, 0).write(2, 1, _block(2, events)) == (key, 32)
    assert await store.get(key) == _object(2, events)
    assert await store.get(keys.wal_damaged_key(key, 2)) == junk


async def test_a_writer_that_finds_its_own_bytes_under_its_name_goes_on() -> None:
    # obstore retries a create whose response was lost and then sees "exists": same bytes.
    store = ObstoreStore(MemoryStore(), "memory://")
    events: list[ev.Event] = [ev.WriterStarted(7, 1)]
    key = keys.wal_segment_key(0, 1)
    assert await store.put_if_absent(key, _object(1, events))
    assert await ObjectLogDevice(store, 0).write(1, 1, _block(1, events)) == (key, 32)
    assert await store.get(key) == _object(1, events)


# ================================================================ a local log: one writer


async def test_a_second_process_is_refused_the_local_log_until_the_first_lets_go(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store_a, store_b = LocalDirStore(tmp_path / "s"), LocalDirStore(tmp_path / "s")
    a = await open_actor(store_a, clock)
    try:
        await a.execute(put("a1"))
        second = QueueShard(0, 1, store_b, clock=clock, ids=SequentialIds())
        with pytest.raises(Unavailable, match="held by another process"):
            await second.start()
        assert await a.execute(put("a2")) == [rp.PutResult("a2", rp.CREATED)]
    finally:
        await close(a, snapshot=False)
    b = await open_actor(store_b, clock, settings=None)
    try:
        assert b.epoch == 2
        assert sorted(str(m) for m in b.state.messages) == ["a1", "a2"]
        assert state_view(b.state, clock.now_ms()) == await durable_view(store_b, clock.now_ms())
    finally:
        await close(b)
        await store_a.close()
        await store_b.close()


async def test_a_shard_that_waits_for_its_log_starts_once_the_older_incarnation_lets_go(
    tmp_path: Path,
) -> None:
    """How a Ray shard starts while its older incarnation still runs (paused: a zombie, or
    closing): it waits for the lock (``wait_for_log``), writing nothing, and recovers what
    the older one wrote once that one lets go."""
    clock = ManualClock()
    store_a, store_b = LocalDirStore(tmp_path / "s"), LocalDirStore(tmp_path / "s")
    a = await open_actor(store_a, clock)
    second = QueueShard(0, 1, store_b, clock=clock, ids=SequentialIds(), wait_for_log=True)
    starting = asyncio.ensure_future(second.start())
    try:
        await asyncio.sleep(0.6)  # two tries at least
        assert not starting.done()
        assert await a.execute(put("a1")) == [
            rp.PutResult("a1", rp.CREATED)
        ]  # the older one writes on
    finally:
        await close(a, snapshot=False)
    await asyncio.wait_for(starting, 10)
    try:
        assert second.wal.epoch == 2
        queue = second.queues["q"]
        assert [str(m) for m in queue.state.messages] == ["a1"]
    finally:
        await second.close()
        await store_a.close()


async def test_a_block_of_an_older_epoch_after_a_newer_one_is_never_recovered(
    tmp_path: Path,
) -> None:
    # A writer that got around the lock (a broken lock on a network file system, say) and
    # appended after a newer incarnation: its block is a fenced writer's, and discarded.
    clock = ManualClock()
    store = LocalDirStore(tmp_path / "s")
    a = await open_actor(store, clock)
    await a.execute(put("a1"))
    await close(a, snapshot=False)
    b = await open_actor(store, clock, settings=None)
    await b.execute(put("b1"))
    seq = b.next_seq
    await close(b, snapshot=False)
    [*_, (last_key, last)] = await read_log(store)
    assert last.epoch == 2
    path = store.root / last_key
    late = encode_block(1, last.first_lsn + last.count, [(NAME, seq, [encode_record(put_event())])])
    with path.open("ab") as f:
        f.write(late)
    c = await open_actor(store, clock, settings=None)
    try:
        assert sorted(str(m) for m in c.state.messages) == ["a1", "b1"]
        report = c.host.report  # type: ignore[attr-defined]
        (discarded,) = report.discarded
        assert discarded.object == last_key
        assert "fenced writer" in discarded.reason
        assert await c.execute(put("c1")) == [rp.PutResult("c1", rp.CREATED)]
    finally:
        await close(c)
        await store.close()


def put_event() -> ev.Event:
    return ev.MessagesPut(1, [ev.PutItem("zombie", b"late", 1)])
