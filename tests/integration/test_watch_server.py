"""Watches against a real ``evq serve`` with Ray: several gateway processes on one port.

Connections spread over the worker processes; a key set through any of them reaches
watchers held by all of them; ``queue:`` keys follow a queue's counts; key versions survive a
restart; a shard killed by the test is restarted and watches resume; SIGTERM stops the whole
server (workers included) with exit 0 after telling ``sys:shutdown`` watchers.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.integration.conftest import ServerFactory
from tests.integration.server import Server, eventually, request

pytestmark = pytest.mark.integration


def _connector() -> aiohttp.TCPConnector:
    # A new connection per request, so SO_REUSEPORT spreads them over the processes.
    return aiohttp.TCPConnector(limit=0, force_close=True)


async def _ws_watchers(server: Server, n: int, key: str) -> tuple[Any, list[Any], set[int]]:
    session = aiohttp.ClientSession(connector=_connector())
    sockets = [await session.ws_connect(f"{server.url}/v1/ws") for _ in range(n)]
    for ws in sockets:
        await ws.send_json({"op": "watch", "key": key, "version": 0})
    pids = set()
    for _ in range(40):
        async with session.get(f"{server.url}/healthz") as resp:
            pids.add((await resp.json())["pid"])
    return session, sockets, pids


def _worker_pids(server: Server) -> list[int]:
    return [p for p in server.pids() if "gateway.workers" in _cmd(p)]


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_workers_share_the_port_and_every_watcher_gets_the_change(
    make_server: ServerFactory,
) -> None:
    server = make_server("--shards", "2", "--workers", "3")
    assert len(_worker_pids(server)) == 2

    async def scenario() -> None:
        session, sockets, pids = await _ws_watchers(server, 60, "app:fleet")
        try:
            assert len(pids) >= 2, "connections did not spread over the gateway processes"
            await asyncio.sleep(0.5)
            status, doc = await asyncio.to_thread(
                request, "PUT", f"{server.url}/v1/keys/app:fleet", {"value": {"go": True}}
            )
            assert status == 200
            events = await asyncio.gather(*(ws.receive_json(timeout=10) for ws in sockets))
            assert {json.dumps(e, sort_keys=True) for e in events} == {
                json.dumps(
                    {
                        "op": "event",
                        "key": "app:fleet",
                        "version": doc["version"],
                        "value": {"go": True},
                    },
                    sort_keys=True,
                )
            }
        finally:
            for ws in sockets:
                await ws.close()
            await session.close()

    asyncio.run(scenario())


def test_queue_keys_and_long_polls_through_workers(make_server: ServerFactory) -> None:
    server = make_server("--shards", "2", "--workers", "2")
    assert request("PUT", f"{server.url}/v1/queues/jobs", {})[0] == 201
    status, first = request("GET", f"{server.url}/v1/watch/queue:jobs?version=0&timeout=5")
    assert status == 200
    assert first["value"]["ready"] == 0

    async def poll() -> dict[str, Any]:
        async with aiohttp.ClientSession(connector=_connector()) as session:
            url = f"{server.url}/v1/watch/queue:jobs?version={first['version']}&timeout=20"
            async with session.get(url) as resp:
                assert resp.status == 200
                return await resp.json()  # type: ignore[no-any-return]

    async def scenario() -> list[dict[str, Any]]:
        polls = [asyncio.ensure_future(poll()) for _ in range(10)]
        await asyncio.sleep(0.5)
        body = {"messages": [{"body": f"m{i}"} for i in range(5)]}
        status, _ = await asyncio.to_thread(
            request, "POST", f"{server.url}/v1/queues/jobs/messages", body
        )
        assert status == 200
        return await asyncio.gather(*polls)

    answers = asyncio.run(scenario())
    for answer in answers:
        assert answer["version"] > first["version"]
        assert answer["value"]["total"] >= 1
    # The final state always arrives: a poll from the newest version sees all five.
    status, now = request("GET", f"{server.url}/v1/keys/queue:jobs")
    assert status == 200
    assert now["value"]["ready"] == 5


def test_key_versions_survive_a_restart_and_sigterm_stops_every_process(
    make_server: ServerFactory,
) -> None:
    server = make_server("--shards", "2", "--workers", "2")
    for i in range(3):
        assert request("PUT", f"{server.url}/v1/keys/app:counter", {"value": i})[0] == 200

    async def shutdown_watch() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session:
            ws = await session.ws_connect(f"{server.url}/v1/ws")
            await ws.send_json({"op": "watch", "key": "sys:shutdown"})
            await asyncio.sleep(0.3)
            os.kill(server.pid, signal.SIGTERM)
            return await ws.receive_json(timeout=20)  # type: ignore[no-any-return]

    workers = _worker_pids(server)
    assert len(workers) == 1
    event = asyncio.run(shutdown_watch())
    assert event["key"] == "sys:shutdown"
    assert server.proc is not None
    assert server.proc.wait(60) == 0
    eventually(lambda: not any(_cmd(p) for p in workers), timeout=20)
    assert server.stop() == 0  # reaps what is left of its session

    server.start()
    status, doc = request("GET", f"{server.url}/v1/keys/app:counter")
    assert (status, doc["version"], doc["value"]) == (200, 3, 2)
    assert request("PUT", f"{server.url}/v1/keys/app:counter", {"value": "x"})[1]["version"] == 4


def test_a_killed_worker_is_started_again(make_server: ServerFactory) -> None:
    server = make_server("--shards", "1", "--workers", "2")
    [worker] = _worker_pids(server)
    os.kill(worker, signal.SIGKILL)
    eventually(
        lambda: len(_worker_pids(server)) == 1 and _worker_pids(server) != [worker], timeout=30
    )
    deadline = time.monotonic() + 30
    seen = set()
    while len(seen) < 2 and time.monotonic() < deadline:

        async def pid() -> int:
            async with (
                aiohttp.ClientSession(connector=_connector()) as session,
                session.get(f"{server.url}/healthz") as resp,
            ):
                return (await resp.json())["pid"]  # type: ignore[no-any-return]

        seen.add(asyncio.run(pid()))
    assert len(seen) == 2
