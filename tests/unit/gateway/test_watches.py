"""Keys and one-shot watches through real HTTP and WebSockets (in process, no Ray).

Immediate answer when behind; exactly one event per arm; coalescing; unwatch; many keys per
socket; disconnect clean-up; a client that never reads does not slow the others; versions
survive a restart; ``queue:`` keys follow puts, takes and acks; ``sys:shutdown``; errors.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.app import AppOptions
from gateway.watches import CLOSE_SLOW, HUB, WATCHERS, WatchOptions
from tests.unit.gateway.conftest import Api, Serve, until


async def ws_connect(api: Api) -> aiohttp.ClientWebSocketResponse:
    return await api.client.ws_connect("/v1/ws")


async def recv(ws: aiohttp.ClientWebSocketResponse, within: float = 5.0) -> dict[str, Any]:
    msg = await ws.receive(timeout=within)
    assert msg.type is aiohttp.WSMsgType.TEXT, msg
    return json.loads(msg.data)  # type: ignore[no-any-return]


async def nothing_within(ws: aiohttp.ClientWebSocketResponse, seconds: float = 0.3) -> None:
    try:
        msg = await ws.receive(timeout=seconds)
    except TimeoutError:
        return
    pytest.fail(f"unexpected message {msg}")


async def set_key(api: Api, key: str, value: Any) -> int:
    doc = await api.ok("PUT", f"/v1/keys/{key}", {"value": value})
    assert doc["key"] == key
    return doc["version"]  # type: ignore[no-any-return]


# ------------------------------------------------------------------ keys


async def test_keys_set_and_get_with_growing_versions(api: Api) -> None:
    assert await api.ok("GET", "/v1/keys/app:price") == {
        "key": "app:price",
        "version": 0,
        "value": None,
    }
    v1 = await set_key(api, "app:price", {"eur": 1.5})
    v2 = await set_key(api, "app:price", [1, "two", None])
    assert v2 == v1 + 1
    assert await api.ok("GET", "/v1/keys/app:price") == {
        "key": "app:price",
        "version": v2,
        "value": [1, "two", None],
    }
    # msgpack both ways
    reply = await api.call("PUT", "/v1/keys/app:mp", {"value": {"b": 1}}, fmt="msgpack")
    assert reply.status == 200
    assert reply.doc["version"] == 1


async def test_key_errors(api: Api) -> None:
    for key in ("sys:shutdown", "queue:orders"):
        reply = await api.call("PUT", f"/v1/keys/{key}", {"value": 1})
        assert (reply.status, reply.code) == (400, "BadRequest")
    reply = await api.call("PUT", "/v1/keys/k", {"nope": 1})
    assert (reply.status, reply.code) == (400, "BadRequest")
    reply = await api.call("PUT", "/v1/keys/k", raw=b"{not json")
    assert (reply.status, reply.code) == (400, "BadRequest")
    reply = await api.call("PUT", "/v1/keys/k", {"value": "x" * 70_000})
    assert (reply.status, reply.code) == (413, "TooLarge")
    reply = await api.call("PUT", "/v1/keys/" + "k" * 300, {"value": 1})
    assert (reply.status, reply.code) == (400, "BadRequest")
    assert await api.ok("GET", "/v1/keys/k") == {"key": "k", "version": 0, "value": None}


async def test_versions_survive_a_restart(serve: Serve, data_dir: Path) -> None:
    api = await serve()
    for i in range(3):
        await set_key(api, "app:durable", i)
    await api.client.close()  # closes the app: queues finish writes and snapshot
    again = await serve()
    assert (await again.ok("GET", "/v1/keys/app:durable"))["version"] == 3
    assert await set_key(again, "app:durable", "after") == 4


# ------------------------------------------------------------------ long poll


async def test_long_poll_answers_at_once_when_behind_and_204_on_timeout(api: Api) -> None:
    v = await set_key(api, "lp", "a")
    assert await api.ok("GET", "/v1/watch/lp?version=0") == {
        "key": "lp",
        "version": v,
        "value": "a",
    }
    started = time.monotonic()
    reply = await api.call("GET", f"/v1/watch/lp?version={v}&timeout=0.3")
    assert reply.status == 204
    assert time.monotonic() - started >= 0.25


async def test_long_poll_is_answered_by_the_next_change(api: Api) -> None:
    v = await set_key(api, "lp2", "a")
    poll = asyncio.ensure_future(api.call("GET", f"/v1/watch/lp2?version={v}&timeout=10"))
    await asyncio.sleep(0.2)
    assert not poll.done()
    v2 = await set_key(api, "lp2", "b")
    reply = await asyncio.wait_for(poll, 5)
    assert reply.status == 200
    assert reply.doc == {"key": "lp2", "version": v2, "value": "b"}


async def test_long_poll_argument_errors(api: Api) -> None:
    for query in ("version=x", "version=-1", "timeout=301", "timeout=abc"):
        reply = await api.call("GET", f"/v1/watch/k?{query}")
        assert (reply.status, reply.code) == (400, "BadRequest"), query


# ------------------------------------------------------------------ WebSocket


async def test_ws_subscribe_state_one_notification_resubscribe(api: Api) -> None:
    v1 = await set_key(api, "w", "one")
    ws = await ws_connect(api)
    await ws.send_json({"op": "watch", "key": "w"})  # no version: the state at once
    assert await recv(ws) == {"op": "event", "key": "w", "version": v1, "value": "one"}
    await ws.send_json({"op": "watch", "key": "w"})  # re-arm: since what it was sent
    await nothing_within(ws)
    v2 = await set_key(api, "w", "two")
    assert await recv(ws) == {"op": "event", "key": "w", "version": v2, "value": "two"}
    # Disarmed now: further changes send nothing until it asks again ...
    await set_key(api, "w", "three")
    v4 = await set_key(api, "w", "four")
    await nothing_within(ws)
    # ... and then it gets the newest state at once (coalesced).
    await ws.send_json({"op": "watch", "key": "w"})
    assert await recv(ws) == {"op": "event", "key": "w", "version": v4, "value": "four"}
    await ws.close()


async def test_ws_a_key_never_set_waits_for_its_first_value(api: Api) -> None:
    ws = await ws_connect(api)
    await ws.send_json({"op": "watch", "key": "fresh", "version": 0})
    await nothing_within(ws)
    v = await set_key(api, "fresh", 42)
    assert await recv(ws) == {"op": "event", "key": "fresh", "version": v, "value": 42}
    await ws.close()


async def test_ws_many_keys_per_socket_and_unwatch(api: Api) -> None:
    ws = await ws_connect(api)
    keys = [f"many:{i}" for i in range(20)]
    for key in keys:
        await ws.send_json({"op": "watch", "key": key, "version": 0})
    await ws.send_json({"op": "unwatch", "key": keys[0]})
    await asyncio.sleep(0.2)
    for key in keys:
        await set_key(api, key, key.upper())
    got = {}
    for _ in keys[1:]:
        event = await recv(ws)
        got[event["key"]] = event["value"]
    assert got == {k: k.upper() for k in keys[1:]}
    await nothing_within(ws)
    await ws.close()


async def test_ws_errors_keep_the_connection(api: Api) -> None:
    ws = await ws_connect(api)
    await ws.send_str("{not json")
    assert (await recv(ws))["code"] == "BadRequest"
    await ws.send_json({"op": "dance", "key": "k"})
    assert (await recv(ws))["code"] == "BadRequest"
    await ws.send_json({"op": "watch", "key": ""})
    assert (await recv(ws))["code"] == "BadRequest"
    await ws.send_json({"op": "watch", "key": "k", "version": -3})
    assert (await recv(ws))["code"] == "BadRequest"
    await ws.send_bytes(b"\x00")
    assert (await recv(ws))["code"] == "BadRequest"
    await ws.send_json({"op": "ping", "id": 7})
    assert await recv(ws) == {"op": "pong", "id": 7}
    await ws.close()


async def test_queue_keys_follow_puts_takes_and_acks(api: Api) -> None:
    await api.create("watched")
    ws = await ws_connect(api)
    await ws.send_json({"op": "watch", "key": "queue:watched"})
    first = await recv(ws)
    assert first["value"]["ready"] == 0
    seen = first["version"]

    async def next_value(predicate: Any) -> dict[str, Any]:
        nonlocal seen
        while True:
            await ws.send_json({"op": "watch", "key": "queue:watched", "version": seen})
            event = await recv(ws)
            assert event["version"] > seen
            seen = event["version"]
            if predicate(event["value"]):
                return event["value"]  # type: ignore[no-any-return]

    await api.put("watched", "a", "b", "c")
    assert (await next_value(lambda v: v["ready"] == 3))["total"] == 3
    [d1, d2] = await api.take("watched", 2)
    value = await next_value(lambda v: v["reserved"] == 2)
    assert value["ready"] == 1
    await api.ack("watched", d1, d2)
    value = await next_value(lambda v: v["total"] == 1)
    assert (value["acked"], value["reserved"]) == (2, 0)
    await ws.close()


async def test_a_put_storm_is_coalesced_but_the_final_state_arrives(api: Api) -> None:
    await api.create("storm")
    ws = await ws_connect(api)
    await ws.send_json({"op": "watch", "key": "queue:storm"})
    seen = (await recv(ws))["version"]
    events = 0
    await asyncio.gather(*(api.put("storm", f"m{i}") for i in range(200)))
    last: dict[str, Any] = {}
    while last.get("total") != 200:
        await ws.send_json({"op": "watch", "key": "queue:storm", "version": seen})
        event = await recv(ws)
        seen, last = event["version"], event["value"]
        events += 1
    assert events < 200  # 200 puts did not become 200 notifications
    await ws.close()


async def test_one_upstream_watch_per_key_whatever_the_watchers(api: Api) -> None:
    hub = api.app[HUB]
    sockets = [await ws_connect(api) for _ in range(30)]
    for ws in sockets:
        await ws.send_json({"op": "watch", "key": "fan", "version": 0})
    await until(lambda: hub.table.armed_count("fan") == 30 and hub.state("fan") is not None)
    assert hub.following() == ["fan"]
    before = hub.upstream_calls
    v = await set_key(api, "fan", "go")
    for ws in sockets:
        assert (await recv(ws))["version"] == v
    assert hub.upstream_calls - before == 1  # one answer from the shard fed all 30
    for ws in sockets:
        await ws.close()


async def test_2k_connect_disconnect_cycles_leave_nothing_behind(api: Api) -> None:
    hub = api.app[HUB]
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = api.client.make_url("/v1/ws")

    async def cycle(i: int) -> None:
        ws = await session.ws_connect(url)
        await ws.send_json({"op": "watch", "key": f"cycle:{i % 5}", "version": 0})
        await ws.send_json({"op": "watch", "key": "cycle:hot", "version": 0})
        await ws.close()

    for start in range(0, 2_000, 200):  # each leak would show: the counts must reach 0
        await asyncio.gather(*(cycle(i) for i in range(start, start + 200)))
    await session.close()
    await until(lambda: hub.table.watchers() == 0 and api.app[WATCHERS].n == 0, within=10)
    assert hub.table.armed_keys() == []
    assert hub.interest() == {}
    assert not api.app[WATCHERS].ws


async def test_a_client_that_never_reads_is_closed_and_does_not_slow_the_others(
    serve: Serve,
) -> None:
    api = await serve(AppOptions(watch=WatchOptions(send_buffer_limit=64 * 1024)))
    await set_key(api, "big", "x" * 60_000)
    host, port = api.client.server.host, api.client.server.port
    # A raw WebSocket client that sends watches but never reads; a tiny receive buffer.
    stuck = socket.socket()
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stuck.connect((host, port))
    stuck.sendall(
        b"GET /v1/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    frame = _masked_text(json.dumps({"op": "watch", "key": "big", "version": 0}).encode())
    good = await ws_connect(api)
    await good.send_json({"op": "watch", "key": "other", "version": 0})
    hub = api.app[HUB]
    await until(lambda: hub.table.armed_count("other") == 1)
    closed_slow = False
    for _ in range(200):  # each watch answers at once with 60 kB it never reads
        try:
            stuck.sendall(frame)
        except OSError:
            closed_slow = True
            break
        await asyncio.sleep(0.005)
        if len(api.app[WATCHERS].ws) == 1:
            closed_slow = True
            break
    assert closed_slow, "the stuck client was not closed"
    started = time.monotonic()
    v = await set_key(api, "other", "fine")
    assert (await recv(good, within=2))["version"] == v
    assert time.monotonic() - started < 2
    stuck.close()
    await good.close()
    assert CLOSE_SLOW == 4008


def _masked_text(payload: bytes) -> bytes:
    mask = b"\x01\x02\x03\x04"
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    assert len(payload) < 126
    return bytes((0x81, 0x80 | len(payload))) + mask + body


async def test_graceful_shutdown_tells_sys_shutdown_watchers(serve: Serve) -> None:
    api = await serve()
    ws = await ws_connect(api)
    await ws.send_json({"op": "watch", "key": "sys:shutdown"})
    await nothing_within(ws, 0.2)
    poll = asyncio.ensure_future(api.call("GET", "/v1/watch/app:k?timeout=30"))
    await asyncio.sleep(0.2)
    closing = asyncio.ensure_future(api.client.server.close())
    event = await recv(ws)
    assert event["key"] == "sys:shutdown"
    assert event["version"] > 0
    msg = await ws.receive(timeout=5)
    assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    reply = await asyncio.wait_for(poll, 10)
    assert reply.status == 204
    await closing


async def test_a_few_thousand_watchers_all_end_at_the_final_version(serve: Serve) -> None:
    api = await serve()
    n = 2000
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = api.client.make_url("/v1/ws")
    sockets = list(await asyncio.gather(*(session.ws_connect(url) for _ in range(n))))
    for ws in sockets:
        await ws.send_json({"op": "watch", "key": "crowd", "version": 0})
    hub = api.app[HUB]
    await until(lambda: hub.table.armed_count("crowd") == n, within=20)
    last = 0
    for i in range(20):  # a burst of changes
        last = await set_key(api, "crowd", i)

    async def final(ws: aiohttp.ClientWebSocketResponse) -> int:
        version = 0
        while version < last:
            event = await recv(ws, within=10)
            version = event["version"]
            if version < last:
                await ws.send_json({"op": "watch", "key": "crowd", "version": version})
        return version

    versions = await asyncio.gather(*(final(ws) for ws in sockets))
    assert set(versions) == {last}
    await asyncio.gather(*(ws.close() for ws in sockets))
    await session.close()
