"""The load the resize tests run (issue 34), through ``evq serve`` on one machine
(tests/integration/test_resize.py) or on the two-node cluster (test_two_node.py): producers,
consumers that take and ack, long-poll takes and WebSocket watches, with what each saw kept
for the checks; and ``evq shards resize`` run through the CLI meanwhile."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

import aiohttp

from actors.log.placement import placement
from evq.client import AsyncClient, Client, NewMessage, RetryPolicy
from tests.integration.server import Server

QUEUES = 16
PRODUCERS = 64
CONSUMERS = 16
LONG_POLLS = 4
KEYS = 100
SOCKETS = 10  # each watches every key: 1,000 watches
RETRIES = RetryPolicy(retries=12, backoff=0.05, max_backoff=0.5)


def cli(server: Server, *args: str) -> subprocess.CompletedProcess[str]:
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


async def resize_under_load(
    server: Server,
    queues: list[str],
    steps: tuple[tuple[int, int], ...] = ((4, 1), (2, 4)),
    after: Callable[[int], None] | None = None,
) -> Load:
    """Run the load; meanwhile resize to each ``(count, was)`` of ``steps`` in turn with
    ``evq shards resize count --wait``; stop the load, set every key once more and wait
    until every watcher saw its final version. ``after(count)`` runs (in a thread, the load
    going on) after each step."""
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
        for count, was in steps:
            done = await asyncio.to_thread(cli, server, "shards", "resize", str(count), "--wait")
            assert done.returncode == 0, done.stderr
            assert f"{was} -> {count} shard(s)" in done.stdout
            assert "done" in done.stdout
            if after is not None:
                await asyncio.to_thread(after, count)
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


# A take whose reply was lost leaves its messages reserved until their lease ends (600 s
# here): the at-least-once contract, not a loss. It takes a shard connection that breaks
# with the take in flight (the gateway answers 503, "the call may have happened", and the
# client's retry takes other messages); one CI run on a loaded host left 12 so. Such
# messages are found by browsing, counted as left, and bounded: a lost reply now and then,
# not a habit.
STRANDED_MAX = 2 * 20  # two takes' worth (the consumers take 20)


def drain(c: Client, queues: list[str]) -> list[tuple[str, str]]:
    """Take and ack what is left: (queue, id) of each, with any still reserved by a take
    whose reply was lost (browsed: those come back only when their lease ends)."""
    left: list[tuple[str, str]] = []
    stranded: list[tuple[str, str]] = []
    for queue in queues:
        while batch := c.take(queue, 1000, visibility_timeout=600):
            left += [(queue, m.id) for m in batch]
            c.ack(queue, *batch)
        stranded += [(queue, m.id) for m in c.browse_all(queue, "reserved", limit=1000)]
        stats = c.get_queue(queue).stats
        held = sum(1 for q, _ in stranded if q == queue)
        assert (queue, stats.total) == (queue, held), stats  # nothing but those reserved
    assert len(stranded) <= STRANDED_MAX, stranded
    return left + stranded


async def light_load(server: Server, queues: list[str], during: Any) -> Load:
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


def check_load(server: Server, queues: list[str], load: Load, *, count: int) -> None:
    """What every resize test asks of its load at the end: no error, each message delivered
    once, none acked came back, every queue on the shard the map names (at ``count``
    shards), and what is left (taken and acked now) with what was acked is what was put."""
    twice = {k: v for k, v in load.deliveries.items() if len(v) > 1 or v[0][1] > 1}
    assert not twice  # each message delivered once
    assert not load.errors, load.errors[:20]
    assert len(load.put) > 500  # the producers worked through the resizes
    assert max(load.acked.values()) == 1  # no acked message came back
    with Client(server.url, retries=0, timeout=30) as c:
        shards = c.shards()
        assert (shards["count"], len(shards["shards"])) == (count, count)
        for queue in queues:
            assert queue in shards["shards"][placement(queue, count)]["queues"], queue
        left = drain(c, queues)
    assert not set(left) & set(load.acked)  # none acked came back
    assert set(left) | set(load.acked) == load.put  # none put was lost
