"""The placement map through a running gateway (two shards in process): a queue the map
moves lives on the map's shard, a shard refuses a queue it does not hold before any effect
(WrongShard), the gateway resends there, and ``GET /v1/admin/shards`` shows it all."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.core import commands as cmd
from actors.directory import LocalDirectory
from actors.errors import WrongShard
from actors.log.placement import Placement, read_placement, write_placement
from actors.log.shard_recovery import placement
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from gateway import native
from gateway.app import AppOptions
from gateway.errors import status_of
from tests.unit.gateway.conftest import Api, Serve

MOVED = "moved-queue"


async def _move(data_dir: Path, name: str) -> int:
    """Write a map (before the server starts) that puts ``name`` on the shard its hash does
    not name; that shard."""
    store = LocalDirStore(data_dir)
    try:
        start = await read_placement(store, 2)
        target = 1 - placement(name, 2)
        await write_placement(store, start, start.moved({name: target}))
    finally:
        await store.close()
    return target


def _directory(api: Api) -> LocalDirectory:
    directory = api.app[native.DIRECTORY]
    assert isinstance(directory, LocalDirectory)
    return directory


async def test_admin_shards_shows_the_count_generation_and_each_shards_queues(api: Api) -> None:
    names = [f"q{i}" for i in range(8)]
    for name in names:
        await api.create(name)
    doc = await api.ok("GET", "/v1/admin/shards")
    assert (doc["count"], doc["generation"]) == (2, 0)
    assert [s["index"] for s in doc["shards"]] == [0, 1]
    assert {s["state"] for s in doc["shards"]} == {"ready"}
    for shard in doc["shards"]:
        assert shard["queues"] == sorted(n for n in names if placement(n, 2) == shard["index"])


async def test_a_moved_queue_lives_on_the_maps_shard_and_the_gateway_learns_the_way(
    serve: Serve, data_dir: Path
) -> None:
    target = await _move(data_dir, MOVED)
    api = await serve()
    directory = _directory(api)
    assert directory.shard_of(MOVED) == 1 - target  # the gateway has not seen the map
    await api.create(MOVED)  # refused by the hash's shard, resent to the map's
    assert directory.shard_of(MOVED) == target  # learned from the refusal
    assert await directory.shards[target].names() == [MOVED]
    assert await directory.shards[1 - target].names() == []
    directory.routes.clear()  # forget it again: the hot path (batchers) learns it too
    ids = await api.put(MOVED, "a", "b", "c")
    assert directory.shard_of(MOVED) == target
    taken = await api.take(MOVED, max=3)
    assert [m["id"] for m in taken] == ids
    assert await api.ack(MOVED, *taken[:2]) == ["ok", "ok"]
    doc = await api.ok("GET", "/v1/admin/shards")
    assert doc["generation"] == 1
    assert [s["generation"] for s in doc["shards"]] == [1, 1]
    assert doc["shards"][target]["queues"] == [MOVED]
    assert MOVED not in doc["shards"][1 - target]["queues"]


async def test_the_shard_that_does_not_hold_a_queue_refuses_it_before_any_effect(
    serve: Serve, data_dir: Path
) -> None:
    target = await _move(data_dir, MOVED)
    api = await serve()
    wrong = _directory(api).shards[1 - target]
    with pytest.raises(WrongShard) as refused:
        await wrong.create(MOVED, QueueSettings(), [])
    assert refused.value.fields == {"queue": MOVED, "shard": target, "generation": 1}
    [result] = await wrong.execute_many(MOVED, [cmd.Stats()])
    assert isinstance(result, WrongShard)
    assert result.fields["shard"] == target
    [result] = await wrong.run_batch([(MOVED, cmd.Put([cmd.NewMessage(body=b"x")]))])
    assert isinstance(result, WrongShard)
    assert await wrong.names() == []  # nothing was created there
    assert status_of(result) == 503  # were it to reach a client: retried like a restart
    # a queue of its own is still unknown as before
    missing = await api.call("GET", "/v1/queues/nothing-here")
    assert (missing.status, missing.code) == (404, "QueueNotFound")


async def test_a_moved_queue_is_recovered_on_the_maps_shard_after_a_restart(
    serve: Serve, data_dir: Path
) -> None:
    target = await _move(data_dir, MOVED)
    first = await serve()
    await first.create(MOVED)
    ids = await first.put(MOVED, "one", "two")
    await first.client.close()  # closes the queues and the store
    again = await serve(AppOptions())
    directory = _directory(again)
    assert await directory.shards[target].names() == [MOVED]
    assert [m["id"] for m in await again.take(MOVED, max=5)] == ids
    assert (await read_placement(directory.store, 2)) == Placement(
        generation=1, count=2, queues={MOVED: target}
    )
