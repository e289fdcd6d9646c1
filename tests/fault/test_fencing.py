"""Fencing: two incarnations of one queue over one log, and only the newest may write.

Each incarnation gets an epoch one above the highest in the log and claims the log by
writing a ``WriterStarted`` segment with ``put_if_absent`` (FORMAT.md, "Epochs and
fencing"). An older incarnation that tries to write afterwards finds the name taken by a
newer epoch, fails with ``Fenced`` and stops serving; the new one serves the intact state.

The two incarnations use two store clients over the same storage (two LocalDirStore
instances on one directory, two obstore clients on one in-memory store or one S3 prefix),
as two processes would.
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
from actors.log.codec import encode_payloads, encode_segment
from actors.log.faults import FaultyStore
from actors.log.obstore_store import ObstoreStore
from actors.log.replay import replay
from actors.log.store import LocalDirStore, ObjectStore
from actors.log.writer import GroupCommitWriter, OwnWriteLanded
from actors.queue_actor import QueueActor
from tests.conftest import S3Server
from tests.fault.actor_support import (
    CLIENT_IDS,
    NAME,
    durable_view,
    open_actor,
    put,
    put_ids,
    read_log,
    spawn,
    state_view,
    write_started,
)

pytestmark = pytest.mark.fault


@pytest.fixture(
    params=["local", "memory", pytest.param("s3", marks=pytest.mark.integration)],
)
async def two_clients(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[ObjectStore, ObjectStore]]:
    """Two independent store clients that see the same objects."""
    if request.param == "local":
        pair: tuple[ObjectStore, ObjectStore] = (
            LocalDirStore(tmp_path / "store"),
            LocalDirStore(tmp_path / "store"),
        )
    elif request.param == "memory":
        shared = MemoryStore()
        pair = (ObstoreStore(shared, "memory://"), ObstoreStore(shared, "memory://"))
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        prefix = s3.fresh_prefix()
        pair = (s3.store(prefix), s3.store(prefix))
    yield pair
    for st in pair:
        await st.close()


async def all_objects(store: ObjectStore) -> dict[str, bytes]:
    return {k: await store.get(k) for k in await store.list(keys.queue_prefix(NAME))}


async def claim_seq(store: ObjectStore, epoch: int) -> int:
    """The sequence number of the WriterStarted record of ``epoch``."""
    for _, read in await read_log(store):
        for i, event in enumerate(read.events):
            if isinstance(event, ev.WriterStarted) and event.epoch == epoch:
                return read.header.first_seq + i
    raise AssertionError(f"no WriterStarted of epoch {epoch} in the log")


async def assert_nothing_of_epoch_after(store: ObjectStore, epoch: int, claim: int) -> None:
    """No segment of ``epoch`` (or older) at or after the claim ``claim`` of a newer one."""
    late = [
        (key, read.header.epoch)
        for key, read in await read_log(store)
        if read.header.epoch <= epoch and read.header.first_seq >= claim
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
        claim = await claim_seq(store_b, 2)

        with pytest.raises(Fenced):
            await a.execute(put("a3"))
        # A stops serving: reads and writes alike.
        for command in [cmd.Stats(), put("a4"), cmd.Ack([cmd.LeaseRef("a1", held.lease)])]:
            with pytest.raises(Fenced):
                await a.execute(command)
        before_close = await all_objects(store_b)
        await a.close()  # a fenced incarnation writes nothing when it goes
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
        await a.close()
        if b is not None:
            await b.close()


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
    assert a.writer is not None
    tasks: list[asyncio.Task[object]] = []
    for i in range(max(2, int(getattr(a.writer, "max_in_flight", 1)))):
        started = slow.calls["put_if_absent"]
        tasks.append(spawn(a.execute(put(f"x{i}"))))
        if i < int(getattr(a.writer, "max_in_flight", 1)):
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
        recovered = await replay(store_b, NAME)
        assert sorted(str(m) for m in recovered.state.messages) == ["a1"]
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
        await a.close()
        if b is not None:
            await b.close()


async def test_a_zombies_late_write_is_never_recovered_after_the_owner_snapshots(
    two_clients: tuple[ObjectStore, ObjectStore],
) -> None:
    store_a, store_b = two_clients
    clock = ManualClock()
    a, _, tasks = await _zombie_with_writes_in_flight(store_a, clock)
    try:
        b = await open_actor(store_b, clock, settings=None)
        await b.close()  # B goes at once: it snapshots the state at its claim
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        assert all(isinstance(o, Fenced) for o in outcomes), outcomes
        c = await open_actor(store_b, clock, settings=None)
        try:
            assert sorted(str(m) for m in c.state.messages) == ["a1"], (
                f"a put the old incarnation answered with Fenced was recovered; report: {c.report}"
            )
        finally:
            await c.close()
    finally:
        await a.close()


async def test_a_zombie_that_closes_after_a_takeover_leaves_the_new_owner_intact(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store_a, store_b = LocalDirStore(tmp_path / "s"), LocalDirStore(tmp_path / "s")
    a = await open_actor(store_a, clock)
    await a.execute(put("a1"))
    b = await open_actor(store_b, clock, settings=None)
    try:
        await b.execute(put("b1"))
        await a.close()  # a zombie that never learnt it was fenced: it may snapshot its past
        await b.execute(put("b2"))
        expected = state_view(b.state, clock.now_ms())
        await b.close(snapshot=False)
        c = await open_actor(store_b, clock, settings=None)
        try:
            assert c.report is not None
            assert c.report.clean
            assert c.epoch == 3
            assert state_view(c.state, clock.now_ms()) == expected
        finally:
            await c.close()
    finally:
        await b.close()
        await store_a.close()
        await store_b.close()


# ================================================================ racing incarnations


@pytest.mark.parametrize("existing", [False, True], ids=["new-queue", "existing-queue"])
@pytest.mark.parametrize("clocks", ["same-ms", "different-ms"])
async def test_incarnations_opening_concurrently_leave_exactly_one_owner(
    tmp_path: Path, existing: bool, clocks: str
) -> None:
    for attempt in range(5):
        root = tmp_path / f"store{attempt}"
        store_a, store_b = LocalDirStore(root), LocalDirStore(root)
        clock_a = ManualClock()
        clock_b = ManualClock(clock_a.now_ms() + (0 if clocks == "same-ms" else 1))
        if existing:
            first = await open_actor(store_a, clock_a)
            await first.execute(put("old"))
            await first.close()
        a = QueueActor(NAME, store_a, clock=clock_a, ids=SequentialIds())
        b = QueueActor(NAME, store_b, clock=clock_b, ids=SequentialIds())
        try:
            create = cmd.Create(NAME, CLIENT_IDS)
            opened = await asyncio.gather(a.open(create), b.open(create), return_exceptions=True)
            assert all(not isinstance(o, BaseException) for o in opened), opened
            assert a.epoch != b.epoch, (
                f"attempt {attempt}: both incarnations claimed the log with epoch {a.epoch}"
            )
            owner, loser = (a, b) if a.epoch > b.epoch else (b, a)
            with pytest.raises(Fenced):
                await loser.execute(put("from-loser"))
            assert await owner.execute(put("from-owner")) == [
                rp.PutResult("from-owner", rp.CREATED)
            ]
            ids = put_ids(await read_log(store_a))
            assert "from-loser" not in ids
            assert ids.count("from-owner") == 1
            assert loser.epoch > (1 if existing else 0)  # both above every earlier epoch
        finally:
            await a.close()
            await b.close()
            await store_a.close()
            await store_b.close()


async def test_epochs_strictly_increase_across_reopenings_and_reloads(tmp_path: Path) -> None:
    clock = ManualClock()
    inner = LocalDirStore(tmp_path / "store")
    store = FaultyStore(inner)
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
                await actor.close(snapshot=False)  # keep every segment for the check below
            clock.advance(1)
        assert epochs == [1, 2, 3, 4, 5], epochs

        segments = await read_log(inner)
        headers = [r.header.epoch for _, r in segments]
        assert headers == sorted(headers), headers  # the log never goes back to an older epoch
        starts = []
        for _, read in segments:
            for event in read.events:
                if isinstance(event, ev.WriterStarted):
                    assert event.epoch == read.header.epoch
                    starts.append(event.epoch)
        assert starts == epochs
        reports = await inner.list(f"{keys.queue_prefix(NAME)}reports/")
        assert reports == [keys.report_key(NAME, e) for e in epochs]
    finally:
        await inner.close()


# ================================================================ the writer's verdicts


def _segment(epoch: int, events: list[ev.Event]) -> bytes:
    return encode_segment(epoch, 1, encode_payloads(events))


@pytest.mark.parametrize(
    ("holder", "error"),
    [(2, Fenced), (1, OwnWriteLanded)],
    ids=["newer-epoch", "own-epoch"],
)
async def test_a_writer_that_finds_its_segment_name_taken_says_by_whom(
    holder: int, error: type[QueueError]
) -> None:
    store = ObstoreStore(MemoryStore(), "memory://")
    taken = _segment(holder, [ev.WriterStarted(5, holder)])
    assert await store.put_if_absent(keys.segment_key(NAME, 1), taken)
    writer = GroupCommitWriter(store, NAME, epoch=1, next_seq=1)
    with pytest.raises(error) as info:
        await writer.append_and_wait([ev.WriterStarted(7, 1)])
    assert type(info.value) is error
    if error is Fenced:
        assert info.value.fields["newer"] == 2
    assert writer.failed is not None
    with pytest.raises(QueueError):
        writer.append([ev.WriterStarted(8, 1)])
    assert await store.get(keys.segment_key(NAME, 1)) == taken  # never overwritten


async def test_a_writer_sets_aside_an_older_epochs_segment_under_its_name_and_goes_on() -> None:
    # A fenced writer's late write that landed above our claim: never acknowledged by it.
    store = ObstoreStore(MemoryStore(), "memory://")
    junk = _segment(1, [ev.WriterStarted(5, 1)])
    assert await store.put_if_absent(keys.segment_key(NAME, 1), junk)
    writer = GroupCommitWriter(store, NAME, epoch=2, next_seq=1)
    events: list[ev.Event] = [ev.WriterStarted(7, 2)]
    assert await writer.append_and_wait(events) == 1
    assert writer.failed is None
    assert await store.get(keys.segment_key(NAME, 1)) == _segment(2, events)
    assert await store.get(keys.damaged_key(keys.segment_key(NAME, 1), 2)) == junk


async def test_a_writer_that_finds_its_own_bytes_under_its_name_goes_on() -> None:
    # obstore retries a create whose response was lost and then sees "exists": same bytes.
    store = ObstoreStore(MemoryStore(), "memory://")
    events: list[ev.Event] = [ev.WriterStarted(7, 1)]
    assert await store.put_if_absent(keys.segment_key(NAME, 1), _segment(1, events))
    writer = GroupCommitWriter(store, NAME, epoch=1, next_seq=1)
    assert await writer.append_and_wait(events) == 1
    assert writer.failed is None
    assert writer.durable_seq == 1
