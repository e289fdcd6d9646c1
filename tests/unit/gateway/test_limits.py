"""Limits and overload: beyond each limit a clear error, and a server that stays alive with
bounded memory (messages per queue, connections, shard memory budget, request bodies)."""

from __future__ import annotations

import asyncio
import io
import re
from pathlib import Path

import aiohttp

from actors.directory import LocalDirectory
from actors.log.store import LocalDirStore
from actors.shard import resident_bytes
from gateway.app import AppOptions, make_app
from gateway.batcher import SHED_S
from tests.unit.gateway.conftest import Api, Serve


async def test_a_full_queue_refuses_puts_with_429_until_it_drains(api: Api) -> None:
    await api.create("small", max_messages=3)
    assert len(await api.put("small", "a", "b", "c")) == 3
    reply = await api.call("POST", "/v1/queues/small/messages", {"messages": [{"body": "d"}]})
    assert (reply.status, reply.code) == (429, "Overloaded")
    assert "max_messages 3" in reply.doc["error"]["message"]
    assert reply.headers["Retry-After"]
    reply = await api.call(
        "POST", "/v1/queues/small/messages", {"messages": [{"body": "x"}, {"body": "y"}]}
    )
    assert reply.status == 429  # all or nothing: no part of the put was taken
    assert (await api.stats("small"))["total"] == 3
    [d] = await api.take("small", 1)
    await api.ack("small", d)
    assert len(await api.put("small", "d")) == 1
    doc = await api.ok("GET", "/v1/queues/small")
    assert doc["settings"]["max_messages"] == 3
    reply = await api.call("PUT", "/v1/queues/bad", {"max_messages": 0})
    assert (reply.status, reply.code) == (400, "BadRequest")


async def test_past_max_connections_new_connections_get_429_and_are_closed(serve: Serve) -> None:
    api = await serve(AppOptions(max_connections=5))
    sessions = [aiohttp.ClientSession() for _ in range(8)]
    url = api.client.make_url("/v1/queues")
    try:
        statuses = []
        for s in sessions:  # each session keeps its connection open (keep-alive)
            async with s.get(url) as resp:
                statuses.append(resp.status)
                await resp.read()
        # the test client holds a connection of its own: 4 more fit under the limit of 5
        assert statuses[:4] == [200] * 4
        assert statuses[5:] == [429] * 3
        async with sessions[0].get(api.client.make_url("/healthz")) as resp:
            assert resp.status == 200  # health always answers
    finally:
        for s in sessions:
            await s.close()
    async with api.client.get("/v1/queues") as resp:
        assert resp.status == 200  # and the server serves again once they are gone


async def test_a_shard_over_its_memory_budget_refuses_puts_but_serves_takes(
    aiohttp_client: object, tmp_path: Path
) -> None:
    # The budget is compared with the process's real resident size (/proc). A long test
    # process reuses freed memory, so instead of growing it the test moves the budget: first
    # far above the resident size, then far below it, then above again.
    directory = LocalDirectory(LocalDirStore(tmp_path), count=1, memory_budget_bytes=1 << 40)
    client = await aiohttp_client(make_app(directory, AppOptions()))  # type: ignore[operator]
    api = Api(client)
    await api.wait_ready()
    await api.create("mem")
    assert len(await api.put("mem", *[f"m{i}" for i in range(5)])) == 5
    memory = directory.shards[0].memory

    def budget(nbytes: int) -> None:
        memory.budget = nbytes
        memory._checked = 0.0  # read /proc again at the next put

    budget(resident_bytes() // 2)  # far below: giving free memory back cannot reach it
    reply = await api.call("POST", "/v1/queues/mem/messages", {"messages": [{"body": "x"}]})
    assert (reply.status, reply.code) == (429, "Overloaded")
    message = reply.doc["error"]["message"]
    assert "memory budget" in message
    # what counted against it, for an operator to see why
    resident = re.search(r"of (\d+) MiB: (\d+) resident", message)
    assert resident, message
    assert int(resident[1]) == round(memory.budget / (1 << 20))
    assert int(resident[2]) > int(resident[1])
    assert "kept for the next snapshots" in message
    assert "for puts on their way" in message
    assert reply.headers["Retry-After"]
    taken = await api.take("mem", 5)
    assert len(taken) == 5  # takes and acks still work, so memory can come back
    assert await api.ack("mem", *taken) == ["ok"] * 5
    assert (await api.stats("mem"))["total"] == 0  # the refused put left nothing behind
    budget(resident_bytes() + 512 * 1024 * 1024)
    await asyncio.sleep(SHED_S)  # the gateway stands by the shard's refusal that long
    assert len(await api.put("mem", "after")) == 1
    api.raw.close()


async def test_a_flood_of_oversized_bodies_gets_413s_and_memory_stays_bounded(
    serve: Serve,
) -> None:
    api = await serve(AppOptions(max_body_bytes=64 * 1024))
    await api.create("flood")
    before = resident_bytes()
    big = b"{" + b" " * (2 * 1024 * 1024) + b"}"

    async def one() -> int:
        async with api.client.post(
            "/v1/queues/flood/messages",
            data=io.BytesIO(big),
            headers={"Content-Type": "application/json"},
        ) as resp:
            await resp.read()
            return resp.status

    for _ in range(10):
        statuses = await asyncio.gather(*(one() for _ in range(20)))
        assert set(statuses) == {413}
    assert resident_bytes() - before < 100 * 1024 * 1024  # 400 MiB offered, little kept
    assert len(await api.put("flood", "still alive")) == 1


async def test_watchers_do_not_count_toward_max_connections(serve: Serve) -> None:
    api = await serve(AppOptions(max_connections=3))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        sockets = [await session.ws_connect(api.client.make_url("/v1/ws")) for _ in range(10)]
        for ws in sockets:
            await ws.send_json({"op": "watch", "key": "k", "version": 0})
        async with api.client.get("/v1/queues") as resp:
            assert resp.status == 200  # 10 watchers + 1 client connection, limit 3: fine
        for ws in sockets:
            await ws.close()
    finally:
        await session.close()
