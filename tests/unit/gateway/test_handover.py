"""Handing one queue to another shard while the gateway serves it (actors/handover.py):
nothing acknowledged is lost or comes back, leases, idempotency keys, delayed and spilled
messages carry over, a waiting take answers empty, and a handover interrupted at each step
is finished (or called off) by running it again or by a restart."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from actors.core import commands as cmd
from actors.core.snapshot import decode_snapshot
from actors.directory import LocalDirectory, _InProcess
from actors.errors import Moving, WrongShard
from actors.handover import move_queues
from actors.keyspace import partition_of
from actors.log import keys
from actors.log.codec import decode_snapshot_object
from actors.log.placement import Placement, PlacementConflict, read_placement, write_placement
from actors.log.shard_recovery import placement
from actors.settings import QueueSettings
from gateway import native
from tests.unit.gateway.conftest import Api, Serve

Q = "handed"
SOURCE = placement(Q, 2)
TARGET = 1 - SOURCE


def _directory(api: Api) -> LocalDirectory:
    directory = api.app[native.DIRECTORY]
    assert isinstance(directory, LocalDirectory)
    return directory


async def _fill(api: Api) -> dict[str, object]:
    """A queue with a message of every kind: ready, reserved (its lease kept), delayed, put
    with an idempotency key, and 3,000 in runs (spilled: their bodies in the source's log)."""
    await api.create(Q)
    many = await api.put(Q, *[f"bulk-{i}" for i in range(1000)])
    many += await api.put(Q, *[f"bulk-{i}" for i in range(1000, 2000)])
    many += await api.put(Q, *[f"bulk-{i}" for i in range(2000, 3000)])
    [reserved] = await api.take(Q, max=1, visibility_timeout=600)
    [delayed] = await api.put(Q, {"body": "later", "delay": 3600})
    [keyed] = await api.put(Q, {"body": "once", "idempotency_key": "k-1"})
    return {"many": many, "reserved": reserved, "delayed": delayed, "keyed": keyed}


async def _check_carried(api: Api, filled: dict[str, object]) -> None:
    """Everything _fill left is there, on whichever shard holds the queue now."""
    reserved = filled["reserved"]
    assert isinstance(reserved, dict)
    stats = await api.stats(Q)
    assert (stats["ready"], stats["reserved"], stats["delayed"]) == (3000, 1, 1)
    again = await api.put(Q, {"body": "once", "idempotency_key": "k-1"})
    assert again == [filled["keyed"]]  # the key is remembered: no second message
    peek = await api.ok("GET", f"/v1/queues/{Q}/messages/{filled['delayed']}")
    assert (peek["state"], peek["body"]) == ("delayed", "later")
    assert await api.ack(Q, reserved) == ["ok"]  # the lease taken before the move holds
    bodies: list[str] = []
    while batch := await api.take(Q, max=1000):
        bodies += [m["body"] for m in batch]
        assert await api.ack(Q, *batch) == ["ok"] * len(batch)
    expected = {f"bulk-{i}" for i in range(3000)} - {reserved["body"]} | {"once"}
    assert sorted(bodies) == sorted(expected)  # the bodies read back from the snapshot
    assert (await api.stats(Q))["total"] == 1  # the delayed one


async def test_a_queue_moves_with_everything_it_holds_and_the_gateway_follows(
    serve: Serve,
) -> None:
    api = await serve()
    filled = await _fill(api)
    directory = _directory(api)
    placed, paused = await directory.move(Q, TARGET)
    assert (placed.generation, placed.shard_of(Q)) == (1, TARGET)
    assert paused < 10
    assert await directory.shards[TARGET].names() == [Q]
    assert await directory.shards[SOURCE].names() == []
    with pytest.raises(WrongShard):
        await directory.shards[SOURCE].create(Q, QueueSettings(), [])
    directory.routes.clear()  # a gateway that has not seen the move: sent on by a refusal
    directory.placement = Placement(count=2)
    await _check_carried(api, filled)
    doc = await api.ok("GET", "/v1/admin/shards")
    assert doc["generation"] == 1
    assert doc["shards"][TARGET]["queues"] == [Q]


async def test_a_moved_queue_stays_on_its_new_shard_after_a_restart(serve: Serve) -> None:
    first = await serve()
    filled = await _fill(first)
    await _directory(first).move(Q, TARGET)
    await first.put(Q, "after the move")
    await first.client.close()
    again = await serve()
    directory = _directory(again)
    assert await directory.shards[TARGET].names() == [Q]
    assert await directory.shards[SOURCE].names() == []
    assert (await again.stats(Q))["ready"] == 3001
    [extra] = await again.take(Q, max=1)  # the oldest first: a bulk one, then the rest
    assert await again.ack(Q, extra) == ["ok"]
    assert (await again.stats(Q))["ready"] == 3000
    del filled


async def test_a_waiting_take_answers_empty_when_its_queue_is_handed_over(api: Api) -> None:
    await api.create(Q)
    waiting = asyncio.ensure_future(api.call("POST", f"/v1/queues/{Q}/take", {"max": 1, "wait": 5}))
    await asyncio.sleep(0.2)
    await _directory(api).move(Q, TARGET)
    reply = await asyncio.wait_for(waiting, 5)
    assert (reply.status, reply.doc["messages"]) == (200, [])
    [mid] = await api.put(Q, "next")
    assert [m["id"] for m in await api.take(Q, max=1)] == [mid]


async def test_a_handover_cut_before_the_map_keeps_the_queue_fenced_until_it_is_run_again(
    serve: Serve,
) -> None:
    """The coordinator dies after the source's record: the queue answers Moving (503), also
    after a restart of the source; running the move again finishes it."""
    first = await serve()
    filled = await _fill(first)
    directory = _directory(first)
    key = await directory.shards[SOURCE].hand_over(Q, TARGET, 1)
    _, _, body = decode_snapshot_object(await directory.store.get(key))
    snap = decode_snapshot(body)
    assert snap.moving == (SOURCE, TARGET, 1)
    assert snap.runs  # spilled: the 3,000 in runs, and their bodies in the snapshot
    assert all(r.place is None and r.bodies for r in snap.runs)
    refused = await first.call("GET", f"/v1/queues/{Q}")
    assert (refused.status, refused.code) == (503, "Moving")
    await first.client.close()
    again = await serve()
    refused = await again.call("POST", f"/v1/queues/{Q}/take", {"max": 1})
    assert (refused.status, refused.code) == (503, "Moving")
    assert "Retry-After" in refused.headers
    placed, _ = await _directory(again).move(Q, TARGET)
    assert placed.shard_of(Q) == TARGET
    await _check_carried(again, filled)


async def test_a_handover_cut_after_the_map_is_finished_by_the_targets_restart(
    serve: Serve,
) -> None:
    first = await serve()
    filled = await _fill(first)
    directory = _directory(first)
    await directory.shards[SOURCE].hand_over(Q, TARGET, 1)
    start = await read_placement(directory.store, 2)
    await write_placement(directory.store, start, start.moved({Q: TARGET}))
    await first.client.close()  # the coordinator never told the target
    again = await serve()
    assert await _directory(again).shards[TARGET].names() == [Q]
    await _check_carried(again, filled)


async def test_a_handover_that_loses_the_map_is_called_off_and_the_queue_serves_again(
    api: Api,
) -> None:
    filled = await _fill(api)
    directory = _directory(api)
    store = directory.store
    start = await read_placement(store, 2)
    real = directory.shards[SOURCE].hand_over

    async def racing(name: str, to: int, generation: int) -> str:
        key = await real(name, to, generation)
        # another coordinator writes that generation first (another queue's move)
        await write_placement(store, start, start.moved({"other": 1 - placement("other", 2)}))
        return key

    directory.shards[SOURCE].hand_over = racing  # type: ignore[method-assign]
    with pytest.raises(PlacementConflict):
        await directory.move(Q, TARGET)
    del directory.shards[SOURCE].hand_over
    assert await directory.shards[SOURCE].names() == [Q]
    await _check_carried(api, filled)


async def test_the_engine_refuses_every_client_command_while_its_queue_is_handed_over(
    api: Api,
) -> None:
    await api.create(Q)
    [mid] = await api.put(Q, "x")
    shard = _directory(api).shards[SOURCE]
    await shard.hand_over(Q, TARGET, 1)
    for command in (cmd.Take(1), cmd.Peek(mid), cmd.Put([cmd.NewMessage(body=b"y")])):
        [result] = await shard.execute_many(Q, [command])
        assert isinstance(result, Moving)
    assert shard.queues[Q].state.n_ready == 1  # nothing was decided


async def test_clients_see_no_refusal_while_their_queue_moves_back_and_forth(api: Api) -> None:
    """The gateway sends a command refused Moving (no effect) again in a moment: producers
    and consumers working through six handovers all get answers, and every message put is
    taken exactly once."""
    await api.create(Q)
    directory = _directory(api)
    stop = asyncio.Event()
    statuses: list[int] = []
    put_ids: list[str] = []
    taken_ids: list[str] = []

    async def producer(n: int) -> None:
        i = 0
        while not stop.is_set():
            reply = await api.call(
                "POST", f"/v1/queues/{Q}/messages", {"messages": [{"body": f"{n}-{i}"}]}
            )
            statuses.append(reply.status)
            if reply.status == 200:
                put_ids.extend(r["id"] for r in reply.doc["results"])
            i += 1

    async def consumer() -> None:
        while not stop.is_set() or len(taken_ids) < len(put_ids):
            reply = await api.call("POST", f"/v1/queues/{Q}/take", {"max": 10, "wait": 0.05})
            statuses.append(reply.status)
            if reply.status == 200 and reply.doc["messages"]:
                got = reply.doc["messages"]
                taken_ids.extend(m["id"] for m in got)
                acked = await api.items(
                    Q, "ack", *({"id": m["id"], "lease": m["lease"]} for m in got)
                )
                statuses.append(200 if all(r["status"] == "ok" for r in acked) else 500)

    workers = [asyncio.ensure_future(producer(n)) for n in range(3)]
    workers += [asyncio.ensure_future(consumer()) for _ in range(2)]
    for move in range(6):
        await asyncio.sleep(0.1)
        await directory.move(Q, TARGET if move % 2 == 0 else SOURCE)
    await asyncio.sleep(0.1)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), 20)
    assert set(statuses) == {200}
    assert len(put_ids) > 20
    assert sorted(taken_ids) == sorted(put_ids)  # each once: none lost, none twice


async def test_watchers_of_a_moved_queues_keys_follow_it_to_its_new_shard(api: Api) -> None:
    """Long-poll watches of ``queue:Q`` and of an application key, waiting on the source
    when the queue and the key's partition move, are answered by the new shard's next
    change, well within their timeout."""
    await api.create(Q)
    key = "config"
    partition = partition_of(key)
    queue_v = (await api.ok("GET", f"/v1/keys/queue:{Q}"))["version"]
    key_v = (await api.ok("PUT", f"/v1/keys/{key}", {"value": 1}))["version"]

    def watch(name: str, version: int) -> asyncio.Future[Any]:
        path = f"/v1/watch/{name}?version={version}&timeout=30"
        return asyncio.ensure_future(api.call("GET", path))

    queue_watch, key_watch = watch(f"queue:{Q}", queue_v), watch(key, key_v)
    await asyncio.sleep(0.3)  # both wait on their shards
    directory = _directory(api)
    await directory.move(Q, TARGET)
    home = directory.shard_of(partition)
    await directory.move(partition, 1 - home)
    started = asyncio.get_running_loop().time()
    await api.put(Q, "after the move")
    await api.ok("PUT", f"/v1/keys/{key}", {"value": 2})
    got_queue, got_key = await asyncio.wait_for(asyncio.gather(queue_watch, key_watch), 10)
    assert (got_key.status, got_key.doc["value"]) == (200, 2)
    assert got_key.doc["version"] > key_v
    versions = [queue_v]
    while got_queue.status == 200 and got_queue.doc["value"]["ready"] != 1:
        versions.append(got_queue.doc["version"])  # the new home's state before the put
        got_queue = await asyncio.wait_for(watch(f"queue:{Q}", versions[-1]), 10)
    assert got_queue.status == 200
    assert got_queue.doc["value"]["ready"] == 1
    versions.append(got_queue.doc["version"])
    assert versions == sorted(set(versions))  # versions only grow across the move
    assert asyncio.get_running_loop().time() - started < 10  # not at the watches' timeout


async def test_a_batch_of_handovers_that_loses_the_map_is_called_off_for_every_queue(
    api: Api,
) -> None:
    """move_queues fences several queues, then loses the map's write to another
    coordinator: every one of them serves again where it was, with what it held."""
    names = [f"b{i}" for i in range(6)]
    for name in names:
        await api.create(name)
        await api.put(name, f"{name}-1", f"{name}-2")
    directory = _directory(api)
    store = directory.store
    start = await read_placement(store, 2)

    class Racing(_InProcess):
        """Another coordinator writes the next generation while the fences go up."""

        async def hand_over(self, shard: int, name: str, to: int, generation: int) -> str:
            key = await super().hand_over(shard, name, to, generation)
            if (await read_placement(store, 2)).generation == start.generation:
                await write_placement(store, start, start.moved({"other": 1}))
            return key

    with pytest.raises(PlacementConflict):
        await move_queues(store, Racing(directory), 2, {n: 1 - placement(n, 2) for n in names})
    calls = _InProcess(directory)
    for name in names:
        assert name in await directory.shards[placement(name, 2)].names()
        got = await api.take(name, max=5)
        assert sorted(m["body"] for m in got) == [f"{name}-1", f"{name}-2"]
    placed, ended = await move_queues(store, calls, 2, {n: 1 - placement(n, 2) for n in names})
    assert sorted(ended) == sorted(names)
    assert all(placed.shard_of(n) == 1 - placement(n, 2) for n in names)
    for name in names:
        assert name in await directory.shards[1 - placement(name, 2)].names()


async def _publish(directory: LocalDirectory) -> Placement:
    """Write the next map with Q on TARGET and give it to every shard (a coordinator's step 2)."""
    start = await read_placement(directory.store, 2)
    new = start.moved({Q: TARGET})
    await write_placement(directory.store, start, new)
    for shard in directory.shards:
        shard.placed(new)
    directory.placed(new)
    return new


async def test_the_target_takes_over_from_the_snapshot_it_read_ahead(api: Api) -> None:
    """The target reads the handover's snapshot while the map is written (``fetch``): the
    take-over then reads nothing."""
    filled = await _fill(api)
    directory = _directory(api)
    source, target = directory.shards[SOURCE], directory.shards[TARGET]
    key = await source.hand_over(Q, TARGET, 1)
    await target.fetch(Q, key)
    await _publish(directory)
    reads: list[str] = []
    real_get, real_list = target.store.get, target.store.list

    async def get(k: str) -> bytes:
        reads.append(k)
        return await real_get(k)

    async def listing(prefix: str) -> list[str]:
        reads.append(prefix)
        return await real_list(prefix)

    target.store.get, target.store.list = get, listing  # type: ignore[method-assign]
    try:
        assert await target.take_over(Q, key)
    finally:
        del target.store.get, target.store.list
    assert reads == []
    await _check_carried(api, filled)


async def test_a_read_ahead_of_a_handover_that_was_called_off_is_not_used(api: Api) -> None:
    """A handover called off (its map lost) after the target read its snapshot ahead; the
    queue serves on its source, changes, and is handed over again: the target takes it over
    from the new snapshot, not the one it read first."""
    await api.create(Q)
    await api.put(Q, "first")
    directory = _directory(api)
    source, target = directory.shards[SOURCE], directory.shards[TARGET]
    stale = await source.hand_over(Q, TARGET, 1)
    await target.fetch(Q, stale)
    await source.take_back(Q, 1)
    await api.put(Q, "late")
    fresh = await source.hand_over(Q, TARGET, 1)
    assert fresh != stale
    await _publish(directory)
    assert await target.take_over(Q, fresh)
    got = await api.take(Q, max=10)
    assert sorted(m["body"] for m in got) == ["first", "late"]


async def test_a_map_that_does_not_move_the_queue_drops_its_read_ahead(api: Api) -> None:
    await api.create(Q)
    directory = _directory(api)
    key = await directory.shards[SOURCE].hand_over(Q, TARGET, 1)
    target = directory.shards[TARGET]
    await target.fetch(Q, key)
    assert Q in target._fetched
    start = await read_placement(directory.store, 2)
    target.placed(start.moved({"other": 1 - placement("other", 2)}))  # another coordinator's
    assert Q not in target._fetched


async def test_the_target_deletes_the_snapshots_older_than_the_handovers(api: Api) -> None:
    """They came before records in the source's log, which the target cannot replay."""
    await api.create(Q)
    directory = _directory(api)
    source = directory.shards[SOURCE]
    for i in range(3):
        await api.put(Q, f"m{i}")
        assert await source.queues[Q].snapshot() is not None
    store = directory.store
    before = sorted(keys.seq_of(k) for k in await store.list(keys.snapshot_prefix(Q)))
    assert len(before) == 2  # the source keeps two
    await directory.move(Q, TARGET)
    handed = max(keys.seq_of(k) for k in await store.list(keys.snapshot_prefix(Q)))
    assert handed > before[-1]
    for _ in range(200):  # a clean-up after the take-over
        left = sorted(keys.seq_of(k) for k in await store.list(keys.snapshot_prefix(Q)))
        if left == [handed]:
            break
        await asyncio.sleep(0.01)
    assert left == [handed]
    # the handover's snapshot holds its bodies: the target's log owes it nothing, so no
    # snapshot is due to replace it (they slowed the next moves down on S3)
    arrived = directory.shards[TARGET].queues[Q]
    assert not arrived.floors_unknown
    assert not arrived.reads_old_bodies(1 << 40)
    got = await api.take(Q, max=10)
    assert sorted(m["body"] for m in got) == ["m0", "m1", "m2"]
