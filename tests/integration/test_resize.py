"""Resizing a running ``evq serve`` (shards on a real local Ray) with ``evq shards resize``
while it works (issue 34): 1 → 4 → 2 under 64 producers, 16 consumers that take and ack,
long-poll takes and 1,000 WebSocket watches. Nothing acknowledged is lost, no acked message
comes back, every watcher ends at its key's final version, every queue ends on the shard
the map names, and a restart serves the new count."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import aiohttp
import pytest

from actors.log.placement import placement
from evq.client import AsyncClient, Client, NewMessage, RetryPolicy
from tests.integration.conftest import Names, ServerFactory
from tests.integration.server import Server, cmdline

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

QUEUES = 16
PRODUCERS = 64
CONSUMERS = 16
LONG_POLLS = 4
KEYS = 100
SOCKETS = 10  # each watches every key: 1,000 watches
RETRIES = RetryPolicy(retries=12, backoff=0.05, max_backoff=0.5)


def _cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "evq", "--server", server.url, *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


class Load:
    """What producers put, consumers acked, and watchers saw."""

    def __init__(self, queues: list[str]) -> None:
        self.queues = queues
        self.stop = asyncio.Event()
        self.put: set[tuple[str, str]] = set()
        self.acked: Counter[tuple[str, str]] = Counter()
        self.errors: list[str] = []
        self.seen: dict[tuple[int, str], int] = {}  # (socket, key) -> version last delivered
        self.deliveries: dict[tuple[str, str], list[Any]] = {}

    async def producer(self, client: AsyncClient, n: int) -> None:
        i = 0
        while not self.stop.is_set():
            queue = self.queues[(n + i) % len(self.queues)]
            try:
                [r] = await client.put(queue, [NewMessage(body=f"{n}-{i}")])
                self.put.add((queue, r.id))
            except Exception as exc:  # counted: the test fails on any
                self.errors.append(f"put: {exc!r}")
            i += 1

    async def consumer(self, client: AsyncClient, n: int, wait: float | None) -> None:
        i = n
        while not self.stop.is_set():
            queue = self.queues[i % len(self.queues)]
            i += 1
            try:
                got = await client.take(queue, 20, visibility_timeout=600, wait=wait)
                if got:
                    for m in got:
                        self.deliveries.setdefault((queue, m.id), []).append(
                            (asyncio.get_running_loop().time(), m.receive_count, m.lease, wait)
                        )
                    results = await client.ack(queue, *got)
                    for m, r in zip(got, results, strict=True):
                        if r.status != "ok":
                            self.errors.append(f"ack {queue} {m.id}: {r.status}")
                        self.acked[(queue, m.id)] += 1
            except Exception as exc:
                self.errors.append(f"take/ack: {exc!r}")

    async def watcher(self, ws: aiohttp.ClientWebSocketResponse, index: int) -> None:
        async for message in ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            event = json.loads(message.data)
            if event.get("op") != "event":
                continue
            key, version = event["key"], event["version"]
            self.seen[(index, key)] = max(self.seen.get((index, key), 0), version)
            await ws.send_json({"op": "watch", "key": key, "version": version})  # one-shot


async def _run(server: Server, queues: list[str]) -> Load:
    load = Load(queues)
    keys = [f"resize:key-{k}" for k in range(KEYS)]
    clients = [AsyncClient(server.url, retries=RETRIES, timeout=30) for _ in range(8)]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    try:
        sockets = [await session.ws_connect(f"{server.url}/v1/ws") for _ in range(SOCKETS)]
        for ws in sockets:
            for key in keys:
                await ws.send_json({"op": "watch", "key": key, "version": 0})
        jobs = [asyncio.ensure_future(load.watcher(ws, i)) for i, ws in enumerate(sockets)]
        jobs += [asyncio.ensure_future(load.producer(clients[n % 8], n)) for n in range(PRODUCERS)]
        jobs += [
            asyncio.ensure_future(load.consumer(clients[n % 8], n, None)) for n in range(CONSUMERS)
        ]
        jobs += [
            asyncio.ensure_future(load.consumer(clients[n % 8], n, 1.0)) for n in range(LONG_POLLS)
        ]

        async def setter() -> None:
            i = 0
            while not load.stop.is_set():
                await clients[0].set_key(keys[i % KEYS], i)
                i += 1
                await asyncio.sleep(0.01)

        setting = asyncio.ensure_future(setter())
        await asyncio.sleep(2)
        for count, was in ((4, 1), (2, 4)):
            done = await asyncio.to_thread(_cli, server, "shards", "resize", str(count), "--wait")
            assert done.returncode == 0, done.stderr
            assert f"{was} -> {count} shard(s)" in done.stdout
            assert "done" in done.stdout
            await asyncio.sleep(1)
        load.stop.set()
        await setting
        finals = {key: await clients[0].set_key(key, "final") for key in keys}
        for _ in range(300):  # every watcher at its key's final version
            if all(
                load.seen.get((i, k), 0) >= v for i in range(SOCKETS) for k, v in finals.items()
            ):
                break
            await asyncio.sleep(0.1)
        behind = [
            (i, k)
            for i in range(SOCKETS)
            for k, v in finals.items()
            if load.seen.get((i, k), 0) < v
        ]
        assert not behind, behind[:5]
        for ws in sockets:
            await ws.close()
        await asyncio.wait_for(asyncio.gather(*jobs), 60)
    finally:
        await session.close()
        for client in clients:
            await client.close()
    return load


def test_a_served_store_grows_and_shrinks_under_load_and_loses_nothing(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "1")
    queues = [names(f"rz{i}") for i in range(QUEUES)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)

    load = asyncio.run(_run(server, queues))
    twice = {k: v for k, v in load.deliveries.items() if len(v) > 1 or v[0][1] > 1}
    assert not twice  # each message delivered once
    assert load.errors == []
    assert len(load.put) > 500  # the producers worked through both resizes
    assert max(load.acked.values()) == 1  # no acked message came back

    with Client(server.url, retries=0, timeout=30) as c:
        shards = c.shards()
        assert (shards["count"], len(shards["shards"])) == (2, 2)
        assert "task" not in shards
        for queue in queues:
            assert queue in shards["shards"][placement(queue, 2)]["queues"], queue
        listed = _cli(server, "--json", "tasks")
        tasks = json.loads(listed.stdout)["tasks"]
        assert [(t["kind"], t["state"], t["count"]) for t in tasks] == [
            ("resize", "done", 4),
            ("resize", "done", 2),
        ]
        assert all(t["done"] == t["total"] > 0 for t in tasks)
        left = _drain(c, queues)
    assert not set(left) & set(load.acked)  # none acked came back
    assert set(left) | set(load.acked) == load.put  # none put was lost

    assert server.stop() == 0
    server.args = [a for a in server.args if a not in ("--shards", "1")]
    server.start()  # the store's count now: 2
    with Client(server.url, retries=0, timeout=30) as c:
        assert c.shards()["count"] == 2
        c.put(queues[3], "after the restart")
        assert [m.body for m in c.take(queues[3], 5)] == [b"after the restart"]


def _drain(c: Client, queues: list[str]) -> list[tuple[str, str]]:
    """Take and ack what is left: (queue, id) of each."""
    left: list[tuple[str, str]] = []
    for queue in queues:
        while batch := c.take(queue, 1000, visibility_timeout=600):
            left += [(queue, m.id) for m in batch]
            c.ack(queue, *batch)
        stats = c.get_queue(queue).stats
        assert (queue, stats.total) == (queue, 0), stats  # none reserved by a lost reply
    return left


async def _light_load(server: Server, queues: list[str], during: Any) -> Load:
    """16 producers and 6 consumers (2 long-polling) while ``during()`` runs in a thread."""
    load = Load(queues)
    clients = [AsyncClient(server.url, retries=RETRIES, timeout=30) for _ in range(4)]
    try:
        jobs = [asyncio.ensure_future(load.producer(clients[n % 4], n)) for n in range(16)]
        jobs += [asyncio.ensure_future(load.consumer(clients[n % 4], n, None)) for n in range(4)]
        jobs += [asyncio.ensure_future(load.consumer(clients[n % 4], n, 1.0)) for n in range(2)]
        await asyncio.sleep(1)
        await asyncio.to_thread(during)
        await asyncio.sleep(0.5)
        load.stop.set()
        await asyncio.wait_for(asyncio.gather(*jobs), 60)
    finally:
        for client in clients:
            await client.close()
    return load


def test_a_rolling_restart_gives_every_shard_a_new_process_and_fails_no_operation(
    make_server: ServerFactory, names: Names
) -> None:
    server = make_server("--shards", "2")
    queues = [names(f"rr{i}") for i in range(8)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)
        c.put(queues[0], "held")
        [held] = c.take(queues[0], 1, visibility_timeout=600)
    before = server.shard_pids()
    assert sorted(before) == [0, 1]

    def restart() -> None:
        done = _cli(server, "shards", "restart", "--wait")
        assert done.returncode == 0, done.stderr
        assert "restart  done  2/2" in done.stdout
        assert "2/2 shard(s) restarted" in done.stderr

    load = asyncio.run(_light_load(server, queues, restart))
    assert load.errors == []
    assert len(load.put) > 100
    assert max(load.acked.values()) == 1
    after = server.shard_pids()
    assert sorted(after) == [0, 1]
    assert not set(after.values()) & set(before.values())  # every shard a new process
    with Client(server.url, retries=0, timeout=30) as c:
        assert c.ack(queues[0], held)[0].status == "ok"  # its lease outlived two handovers
        shards = c.shards()
        assert (shards["count"], len(shards["shards"])) == (2, 2)
        for queue in queues:
            assert queue in shards["shards"][placement(queue, 2)]["queues"], queue
        left = _drain(c, queues)
    assert set(left) | set(load.acked) == load.put
    assert not set(left) & set(load.acked)


def _fresh(server: Server, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
    """One request on a connection of its own (the kernel picks the gateway process)."""
    import urllib.error
    import urllib.request

    data = None if doc is None else json.dumps(doc).encode()
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_every_gateway_process_answers_for_the_tasks_the_main_one_runs(
    make_server: ServerFactory, names: Names
) -> None:
    """With --workers 2, a resize asked of either process runs in the main one, and every
    process shows it and its progress (requests on fresh connections land on both)."""
    server = make_server("--shards", "1", "--workers", "2")
    queues = [names(f"wk{i}") for i in range(6)]
    with Client(server.url, retries=0, timeout=30) as c:
        for queue in queues:
            c.create_queue(queue)
    status, doc = _fresh(server, "POST", "/v1/admin/shards", {"count": 2})
    assert status == 202, doc
    task = doc["task"]
    for _ in range(300):
        views = [_fresh(server, "GET", f"/v1/tasks/{task}") for _ in range(4)]
        assert {s for s, _ in views} == {200}, views
        if all(v["state"] == "done" for _, v in views):
            break
        time.sleep(0.1)
    listed = {json.dumps(_fresh(server, "GET", "/v1/tasks")[1], sort_keys=True) for _ in range(6)}
    assert len(listed) == 1  # the same list from every process
    busy = [_fresh(server, "POST", "/v1/admin/shards", {"count": 3}) for _ in range(2)]
    assert busy[0][0] == 202
    assert busy[1][0] in (202, 409)  # the second lands on the running one, or after it
    pids = {p for p in server.pids() if "gateway.workers" in cmdline(p)}
    assert len(pids) == 1  # the worker process took part
    with Client(server.url, retries=0, timeout=30) as c:
        for _ in range(300):
            if c.shards()["count"] == 3 and c.tasks()[-1]["state"] != "running":
                break
            time.sleep(0.1)
        shards = c.shards()
        assert shards["count"] == 3
        for queue in queues:
            assert queue in shards["shards"][placement(queue, 3)]["queues"]
