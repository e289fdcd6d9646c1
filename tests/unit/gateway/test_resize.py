"""Resizing a running server through ``POST /v1/admin/shards`` (actors/resize.py): the
shards grow and shrink queue by queue while producers and consumers work, nothing
acknowledged is lost or comes back, every queue ends on the shard the map names, and the
count holds across a restart. Tasks (``/v1/tasks``) follow, cancel and refuse."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from actors.directory import LocalDirectory, _InProcess
from actors.errors import Unavailable
from actors.log.layout import read_layout, settle_layout
from actors.log.placement import Placement, placement, read_placement, write_placement
from actors.log.store import LocalDirStore
from actors.settings import QueueSettings
from gateway import native
from tests.unit.gateway.conftest import Api, Serve

QUEUES = [f"r{i}" for i in range(12)]


async def _one_shard_with(serve: Serve, prefix: str, count: int) -> tuple[Api, list[str]]:
    """A gateway on one shard with ``count`` queues, one message each (``<name>-body``)."""
    api = await serve(count=1)
    names = [f"{prefix}{i}" for i in range(count)]
    for name in names:
        await api.create(name)
        await api.put(name, f"{name}-body")
    return api, names


def _directory(api: Api) -> LocalDirectory:
    directory = api.app[native.DIRECTORY]
    assert isinstance(directory, LocalDirectory)
    return directory


async def _resize(api: Api, count: int) -> dict[str, Any]:
    """Ask for ``count`` shards and wait for the task: its last view."""
    started = await api.ok("POST", "/v1/admin/shards", {"count": count}, status=202)
    return await _task_end(api, started["task"])


async def _task_end(api: Api, task_id: str) -> dict[str, Any]:
    """Follow a task until it ends: its last view."""
    for _ in range(600):
        task = await api.ok("GET", f"/v1/tasks/{task_id}")
        if task["state"] != "running":
            return dict(task)
        await asyncio.sleep(0.05)
    raise AssertionError(f"task {task_id} did not end")


async def _check_placed(api: Api, count: int) -> None:
    """Every queue is on the shard the stored map names, which is its hash's at ``count``."""
    directory = _directory(api)
    stored = await read_placement(directory.store, count)
    assert (stored.count, stored.queues) == (count, {})
    doc = await api.ok("GET", "/v1/admin/shards")
    assert (doc["count"], len(doc["shards"])) == (count, count)
    assert "task" not in doc
    for name in QUEUES:
        shard = placement(name, count)
        assert name in doc["shards"][shard]["queues"], (name, shard)
    assert sorted(q for s in doc["shards"] for q in s["queues"]) == sorted(QUEUES)
    assert len(directory.shards) == count


async def test_a_server_grows_and_shrinks_under_load_and_loses_nothing(
    serve: Serve, data_dir: Path
) -> None:
    """1 → 4 → 2 while three producers and two consumers work on twelve queues, and a
    message reserved before the resize is acked after it with its lease."""
    api = await serve(count=1)
    for name in QUEUES:
        await api.create(name)
        await api.put(name, *[f"{name}-seed-{i}" for i in range(50)])
    [held] = await api.take(QUEUES[0], max=1, visibility_timeout=600)
    stop = asyncio.Event()
    statuses: list[int] = []
    put: set[str] = set()
    taken: list[str] = []

    async def producer(n: int) -> None:
        i = 0
        while not stop.is_set():
            name = QUEUES[(n + i) % len(QUEUES)]
            reply = await api.call(
                "POST", f"/v1/queues/{name}/messages", {"messages": [{"body": f"{n}-{i}"}]}
            )
            statuses.append(reply.status)
            if reply.status == 200:
                put.update(f"{name}/{r['id']}" for r in reply.doc["results"])
            i += 1

    async def consumer(n: int) -> None:
        i = n
        while not stop.is_set():
            name = QUEUES[i % len(QUEUES)]
            i += 1
            reply = await api.call("POST", f"/v1/queues/{name}/take", {"max": 20})
            statuses.append(reply.status)
            if reply.status == 200 and reply.doc["messages"]:
                got = reply.doc["messages"]
                taken.extend(f"{name}/{m['id']}" for m in got)
                acked = await api.items(
                    name, "ack", *({"id": m["id"], "lease": m["lease"]} for m in got)
                )
                statuses.append(200 if all(r["status"] == "ok" for r in acked) else 500)

    workers = [asyncio.ensure_future(producer(n)) for n in range(3)]
    workers += [asyncio.ensure_future(consumer(n)) for n in range(2)]
    grown = await _resize(api, 4)
    assert (grown["state"], grown["kind"], grown["count"], grown["was"]) == ("done", "resize", 4, 1)
    moved = sum(placement(n, 4) != 0 for n in QUEUES)
    assert grown["done"] == grown["total"] >= moved > 0
    await _check_placed(api, 4)
    shrunk = await _resize(api, 2)
    assert shrunk["state"] == "done"
    await _check_placed(api, 2)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*workers), 30)
    assert set(statuses) == {200}
    assert len(put) > 30  # the producers worked through both resizes
    assert await api.ack(QUEUES[0], held) == ["ok"]  # its lease carried over twice
    # drain: every message put (the seeds and the producers') was taken exactly once
    for name in QUEUES:
        while batch := await api.take(name, max=1000):
            taken.extend(f"{name}/{m['id']}" for m in batch)
            assert await api.ack(name, *batch) == ["ok"] * len(batch)
        assert (await api.stats(name))["total"] == 0
    assert len(taken) == len(set(taken))  # none twice
    assert put <= set(taken)  # none lost
    assert len(taken) == len(put) + len(QUEUES) * 50 - 1
    layout = await read_layout(_directory(api).store)
    assert layout is not None
    assert layout.shards == 2  # a restart runs two shards

    await api.client.close()
    store = LocalDirStore(data_dir)
    assert await settle_layout(store, None, 8) == 2  # what `evq serve` starts with now
    await store.close()
    again = await serve(count=2)
    await _check_placed(again, 2)
    [mid] = await again.put(QUEUES[5], "after the restart")
    assert [m["id"] for m in await again.take(QUEUES[5], max=1)] == [mid]


async def test_a_cancelled_resize_leaves_every_queue_served_and_a_second_one_finishes_it(
    serve: Serve,
) -> None:
    api, names = await _one_shard_with(serve, "c", 40)
    directory = _directory(api)
    release, moving = asyncio.Event(), asyncio.Event()
    real = directory.shards[0].hand_over

    async def slow(name: str, to: int, generation: int) -> str:
        moving.set()
        await release.wait()  # the first move waits until the cancel is in
        return await real(name, to, generation)

    directory.shards[0].hand_over = slow  # type: ignore[method-assign]
    started = await api.ok("POST", "/v1/admin/shards", {"count": 3}, status=202)
    busy = await api.call("POST", "/v1/admin/shards", {"count": 2})
    assert (busy.status, busy.code) == (409, "Conflict")  # one resize at a time
    await asyncio.wait_for(moving.wait(), 10)  # the shards started, the map pinned
    cancelled = await api.ok("DELETE", f"/v1/tasks/{started['task']}")
    assert cancelled["state"] == "running"  # it stops after the move under way
    release.set()
    for _ in range(200):
        task = await api.ok("GET", f"/v1/tasks/{started['task']}")
        if task["state"] != "running":
            break
        await asyncio.sleep(0.05)
    assert (task["state"], task["error"]["code"]) == ("cancelled", "Cancelled")
    assert task["done"] < task["total"]
    again = await api.call("DELETE", f"/v1/tasks/{started['task']}")
    assert (again.status, again.code) == (409, "Conflict")  # not running any more
    stored = await read_placement(directory.store, 1)
    assert stored.count == 3
    assert stored.queues  # pinned where they are: all still served
    for name in names:
        [m] = await api.take(name, max=1, visibility_timeout=600)
        assert m["body"] == f"{name}-body"
        assert await api.ack(name, m) == ["ok"]
        await api.put(name, f"{name}-again")
    done = await _resize(api, 3)
    assert done["state"] == "done"
    assert (await read_placement(directory.store, 1)).queues == {}
    for name in names:
        assert [m["body"] for m in await api.take(name, max=5)] == [f"{name}-again"]
    listed = await api.ok("GET", "/v1/tasks")
    assert [t["state"] for t in listed["tasks"]] == ["cancelled", "done"]


async def test_bad_resizes_and_unknown_tasks_are_refused(api: Api) -> None:
    for body in ({"count": 0}, {"count": 257}, {"count": "two"}, {}, {"count": 2, "x": 1}):
        reply = await api.call("POST", "/v1/admin/shards", body)
        assert (reply.status, reply.code) == (400, "BadRequest"), body
    missing = await api.call("GET", "/v1/tasks/resize-nope")
    assert (missing.status, missing.code) == (404, "TaskNotFound")
    missing = await api.call("DELETE", "/v1/tasks/resize-nope")
    assert (missing.status, missing.code) == (404, "TaskNotFound")
    same = await _resize(api, 2)  # the count it has: nothing to move
    assert (same["state"], same["total"]) == ("done", 0)


async def test_a_queue_created_under_the_older_map_is_pinned_where_it_is(serve: Serve) -> None:
    """A create that reached a shard before it was given the resize's first map (a stray)
    stays served there; the shard names it, and the resize pins it by one more generation."""
    api = await serve(count=1)
    name = next(n for n in (f"s{i}" for i in range(100)) if placement(n, 2) == 1)
    await api.create(name)
    shard = _directory(api).shards[0]
    assert shard.placed(Placement(generation=1, count=2)) == [name]
    assert await shard.names() == [name]  # still served here
    await shard.create(name, QueueSettings(), [])  # and found, not refused
    store = _directory(api).store
    current = await read_placement(store, 1)
    await write_placement(store, current, Placement(generation=1, count=2))
    done = await _resize(api, 2)
    assert done["state"] == "done"
    assert (await read_placement(store, 2)).queues == {}
    assert await _directory(api).shards[1].names() == [name]


async def test_the_layout_follows_a_map_written_by_a_resize_that_stopped_before_it(
    serve: Serve,
) -> None:
    api = await serve(count=2)
    await api.create("kept")
    store = _directory(api).store
    current = await read_placement(store, 2)
    where = {"kept": placement("kept", 2)}
    await write_placement(store, current, current.resized(3, where))  # then it died
    assert (await read_layout(store)).shards == 2  # type: ignore[union-attr]
    assert await settle_layout(store, None, 8) == 3
    assert (await read_layout(store)).shards == 3  # type: ignore[union-attr]


class Traffic:
    """Producers and consumers on raw HTTP: what they put, what they acked, what failed."""

    def __init__(self, api: Api, names: list[str]) -> None:
        self.api = api
        self.names = names
        self.stop = asyncio.Event()
        self.errors: list[Any] = []
        self.put: set[tuple[str, str]] = set()
        self.acked: list[tuple[str, str]] = []

    async def producer(self, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            name = self.names[(n + i) % len(self.names)]
            body = {"messages": [{"body": f"{n}-{i}"}]}
            reply = await self.api.call("POST", f"/v1/queues/{name}/messages", body)
            if reply.status != 200:
                self.errors.append(("put", reply.status, reply.doc))
            else:
                self.put.update((name, r["id"]) for r in reply.doc["results"])
            i += 1

    async def consumer(self, n: int, wait: float | None) -> None:
        i = n
        while not self.stop.is_set():
            name = self.names[i % len(self.names)]
            i += 1
            body: dict[str, Any] = {"max": 20, "visibility_timeout": 600}
            if wait is not None:
                body["wait"] = wait
            reply = await self.api.call("POST", f"/v1/queues/{name}/take", body)
            if reply.status != 200:
                self.errors.append(("take", reply.status, reply.doc))
            elif got := reply.doc["messages"]:
                await self._ack(name, got)

    async def _ack(self, name: str, got: list[dict[str, Any]]) -> None:
        leases = ({"id": m["id"], "lease": m["lease"]} for m in got)
        results = await self.api.items(name, "ack", *leases)
        for m, r in zip(got, results, strict=True):
            if r["status"] != "ok":
                self.errors.append(("ack", name, m["id"], r["status"]))
            self.acked.append((name, m["id"]))


async def test_many_clients_get_only_answers_through_two_resizes(serve: Serve) -> None:
    """64 producers and 20 consumers (4 of them long-polling) on 16 queues: a command sent
    to a shard just before its queue left gets there through the refusal, even when the
    gateway already routes the queue to the shard the refusal names."""
    api = await serve(count=1)
    names = [f"m{i}" for i in range(16)]
    for name in names:
        await api.create(name)
    traffic = Traffic(api, names)
    jobs = [asyncio.ensure_future(traffic.producer(n)) for n in range(64)]
    jobs += [asyncio.ensure_future(traffic.consumer(n, None)) for n in range(16)]
    jobs += [asyncio.ensure_future(traffic.consumer(n, 1.0)) for n in range(4)]
    await asyncio.sleep(0.5)
    assert (await _resize(api, 4))["state"] == "done"
    await asyncio.sleep(0.3)
    assert (await _resize(api, 2))["state"] == "done"
    traffic.stop.set()
    await asyncio.wait_for(asyncio.gather(*jobs), 30)
    assert traffic.errors == []
    acked = traffic.acked
    assert len(acked) == len(set(acked))
    for name in names:
        while batch := await api.take(name, max=1000):
            acked.extend((name, m["id"]) for m in batch)
            await api.ack(name, *batch)
    assert sorted(acked) == sorted(traffic.put)


async def test_a_rolling_restart_replaces_every_shard_while_clients_get_only_answers(
    serve: Serve,
) -> None:
    """Each shard in turn hands its queues to a spare, is stopped and started afresh, and
    takes them back: the shard objects are new, the queues where they were, a lease taken
    before is acked after, and producers and consumers see no error."""
    api = await serve(count=2)
    names = [f"k{i}" for i in range(10)]
    for name in names:
        await api.create(name)
    [held] = await api.put(names[0], "held")
    [lease] = await api.take(names[0], max=1, visibility_timeout=600)
    assert lease["id"] == held
    directory = _directory(api)
    before = list(directory.shards)
    traffic = Traffic(api, names)
    jobs = [asyncio.ensure_future(traffic.producer(n)) for n in range(16)]
    jobs += [asyncio.ensure_future(traffic.consumer(n, None)) for n in range(4)]
    jobs += [asyncio.ensure_future(traffic.consumer(n, 0.5)) for n in range(2)]
    await asyncio.sleep(0.3)
    started = await api.ok("POST", "/v1/admin/shards/restart", status=202)
    busy = await api.call("POST", "/v1/admin/shards", {"count": 3})
    assert (busy.status, busy.code) == (409, "Conflict")  # one change of the shards at a time
    shown = await api.ok("GET", "/v1/admin/shards")
    assert shown["task"] == started["task"]
    task = await _task_end(api, started["task"])
    assert (task["kind"], task["state"], task["done"], task["total"]) == ("restart", "done", 2, 2)
    traffic.stop.set()
    await asyncio.wait_for(asyncio.gather(*jobs), 30)
    assert traffic.errors == []
    assert len(traffic.put) > 20
    assert len(directory.shards) == 2  # the spare is gone
    assert all(new is not old for new, old in zip(directory.shards, before, strict=True))
    await _check_queues_home(api, names, 2)
    assert await api.ack(names[0], lease) == ["ok"]
    acked = traffic.acked
    for name in names:
        while batch := await api.take(name, max=1000):
            acked.extend((name, m["id"]) for m in batch)
            await api.ack(name, *batch)
    assert sorted(acked) == sorted(traffic.put)


async def _check_queues_home(api: Api, names: list[str], count: int) -> None:
    doc = await api.ok("GET", "/v1/admin/shards")
    assert len(doc["shards"]) == count
    for name in names:
        assert name in doc["shards"][placement(name, count)]["queues"]
    assert (await read_placement(_directory(api).store, count)).queues == {}


async def test_a_restart_with_a_body_is_refused(api: Api) -> None:
    reply = await api.call("POST", "/v1/admin/shards/restart", {"count": 2})
    assert (reply.status, reply.code) == (400, "BadRequest")
    assert (await api.ok("GET", "/v1/tasks"))["tasks"] == []


async def test_a_resize_whose_takeovers_failed_is_finished_by_the_next_one(serve: Serve) -> None:
    """The map of a batch is written but its targets fail to take over (a target
    restarting): the queues wait, fenced, for their new shard; asking again takes them over,
    though no queue is pinned any more."""
    api, names = await _one_shard_with(serve, "t", 6)
    directory = _directory(api)
    real = _InProcess.take_over
    failing = [True]

    async def take_over(self: _InProcess, shard: int, name: str, key: str | None = None) -> bool:
        if failing[0]:
            raise Unavailable("the target is restarting")
        return await real(self, shard, name, key)

    _InProcess.take_over = take_over  # type: ignore[method-assign]
    try:
        first = await _resize(api, 2)
        assert (first["state"], first["error"]["code"]) == ("failed", "Unavailable")
        moved = [n for n in names if placement(n, 2) == 1]
        assert moved
        assert (await read_placement(directory.store, 1)).queues == {}  # the map was written
        stuck = await api.call("POST", f"/v1/queues/{moved[0]}/take", {"max": 1})
        assert (stuck.status, stuck.code) == (503, "Moving")  # waits for its new shard
        failing[0] = False
        again = await _resize(api, 2)
        assert again["state"] == "done"
    finally:
        _InProcess.take_over = real  # type: ignore[method-assign]
    for name in names:
        [m] = await api.take(name, max=5)
        assert m["body"] == f"{name}-body"
    await _check_queues_home(api, names, 2)
