"""What a client and an operator see of the disk faults of ``test_disk_faults.py``, through
the real gateway app (real HTTP on 127.0.0.1, shards in this process, no Ray), faults
injected through :class:`FaultyDisk` into a real local log:

- a full disk: puts answer 503 Unavailable with Retry-After and a message saying the
  shard's disk is full, takes and acks answer 200, ``/readyz`` stays 200 and names the
  degraded shard, ``evq_shard_disk_full`` is 1 — and all of that ends by itself when space
  returns;
- a failed fsync: every command answers 503, ``/readyz`` answers 503 with the reason,
  ``evq_shard_log_failed`` is 1.
"""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from actors.directory import LocalDirectory
from actors.log.device import SPACE_CHECK_S, LocalLogDevice
from actors.log.faults import FaultyDisk
from actors.log.store import LocalDirStore
from actors.settings import LogSettings
from gateway.app import make_app

pytestmark = pytest.mark.fault

SEGMENT = 8192
Q = "q"
Client = Callable[[Any], Awaitable[TestClient[Any, Any]]]


async def start(aiohttp_client: Client, root: Path, disk: FaultyDisk) -> TestClient[Any, Any]:
    store = LocalDirStore(root)
    device = LocalLogDevice(store, 0, segment_bytes=SEGMENT, disk=disk)
    settings = LogSettings(segment_bytes=SEGMENT)
    client = await aiohttp_client(
        make_app(LocalDirectory(store, count=1, log_settings=settings, device=device))
    )
    for _ in range(200):
        if (await client.get("/readyz")).status == 200:
            break
        await asyncio.sleep(0.02)
    resp = await client.put(f"/v1/queues/{Q}", json={})
    assert resp.status == 201, await resp.text()
    return client


async def put(client: TestClient[Any, Any], body: str) -> tuple[int, Any, Any]:
    resp = await client.post(f"/v1/queues/{Q}/messages", json={"messages": [{"body": body}]})
    return resp.status, await resp.json(), resp.headers


async def gauge(client: TestClient[Any, Any], name: str) -> float:
    text = await (await client.get("/metrics")).text()
    lines = [line for line in text.splitlines() if line.startswith(f'{name}{{shard="0"}}')]
    assert len(lines) == 1, f"no {name} for shard 0 in /metrics"
    return float(lines[0].split()[-1])


async def test_a_full_disk_answers_503_to_puts_and_200_to_takes_acks_and_readyz(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    disk = FaultyDisk()
    client = await start(aiohttp_client, tmp_path / "data", disk)
    assert (await put(client, "before"))[0] == 200
    assert await gauge(client, "evq_shard_disk_full") == 0
    disk.no_space()
    for i in range(500):
        status, doc, headers = await put(client, f"message {i:04d} " + "x" * 100)
        if status != 200:
            break
    else:
        raise AssertionError("500 puts went through a full disk")
    assert status == 503
    assert doc["error"]["code"] == "Unavailable"
    assert "disk of its log is full" in doc["error"]["message"]
    assert headers["Retry-After"] == "1"
    ready = await client.get("/readyz")
    assert ready.status == 200
    degraded = (await ready.json())["degraded"]
    assert [d["index"] for d in degraded] == [0]
    assert await gauge(client, "evq_shard_disk_full") == 1

    resp = await client.post(f"/v1/queues/{Q}/take", json={"max": 2})
    assert resp.status == 200
    taken = (await resp.json())["messages"]
    assert len(taken) == 2
    items = [{"id": m["id"], "lease": m["lease"]} for m in taken]
    resp = await client.post(f"/v1/queues/{Q}/ack", json={"items": items})
    assert resp.status == 200
    assert [r["status"] for r in (await resp.json())["results"]] == ["ok", "ok"]

    disk.space_back()
    await asyncio.sleep(SPACE_CHECK_S)
    for _ in range(200):
        if (await put(client, "after"))[0] == 200:
            break
        await asyncio.sleep(0.02)
    else:
        raise AssertionError("puts did not resume once space returned")
    assert await gauge(client, "evq_shard_disk_full") == 0
    assert await (await client.get("/readyz")).json() == {"status": "ready"}


async def test_a_failed_fsync_answers_503_everywhere_and_readyz_says_why(
    aiohttp_client: Client, tmp_path: Path
) -> None:
    disk = FaultyDisk()
    client = await start(aiohttp_client, tmp_path / "data", disk)
    assert (await put(client, "before"))[0] == 200
    assert await gauge(client, "evq_shard_log_failed") == 0
    disk.fail("fdatasync", errno.EIO)
    status, doc, _ = await put(client, "lost?")
    assert status == 503
    assert doc["error"]["code"] == "Unavailable"
    disk.heal()
    status, doc, headers = await put(client, "after")
    assert status == 503
    assert "EIO" in doc["error"]["message"]
    assert headers["Retry-After"] == "1"
    resp = await client.post(f"/v1/queues/{Q}/take", json={"max": 1})
    assert resp.status == 503
    ready = await client.get("/readyz")
    assert ready.status == 503
    body = await ready.json()
    assert body["status"] == "failed"
    [shard] = body["shards"]
    assert shard["index"] == 0
    assert "fdatasync" in shard["log_failed"]
    assert "EIO" in shard["log_failed"]
    assert await gauge(client, "evq_shard_log_failed") == 1
