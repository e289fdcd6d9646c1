"""The front door (gateway/door.py) on a real server: WebSocket watchers taken over from
aiohttp after the handshake, everything else handed to aiohttp untouched — whatever way the
first request's bytes are cut — and refused handshakes answered by aiohttp's route."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import struct
from typing import Any

import aiohttp
import msgspec
import pytest

from gateway import door
from gateway.app import AppOptions
from gateway.auth import Token
from gateway.door import parse_head
from gateway.watches import HUB, WATCHERS, WatchOptions, WsProtocol
from tests.unit.gateway.conftest import Api, Serve, until
from tests.unit.gateway.watches.test_codec import client_frame

OP_TEXT, OP_CLOSE, OP_PING = 0x1, 0x8, 0x9
READER = Token(name="reader", token="reader-token-0123456789", queues={"app*": "read"})


def upgrade_head(path: str = "/v1/ws", **extra: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    headers = {
        "Host": "127.0.0.1",
        "Upgrade": "websocket",
        "Connection": "Upgrade",
        "Sec-WebSocket-Key": key,
        "Sec-WebSocket-Version": "13",
        **extra,
    }
    lines = [f"GET {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items() if v)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class Raw:
    """A WebSocket client on a bare connection, to see exactly what the server writes."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, api: Api) -> Raw:
        server = api.client.server
        reader, writer = await asyncio.open_connection(server.host, server.port)
        return cls(reader, writer)

    async def head(self) -> tuple[int, bytes]:
        """The status and the whole head of the server's HTTP answer."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        return int(head.split(b" ", 2)[1]), head

    async def body(self, head: bytes) -> Any:
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        return json.loads(await asyncio.wait_for(self.reader.readexactly(length), 5))

    async def handshake(self, head: bytes | None = None) -> None:
        self.writer.write(head or upgrade_head())
        status, _ = await self.head()
        assert status == 101

    def send(self, op: int, payload: bytes, **kw: Any) -> None:
        self.writer.write(client_frame(op, payload, **kw))

    def send_json(self, doc: Any) -> None:
        self.send(OP_TEXT, json.dumps(doc).encode())

    async def frame(self) -> tuple[int, bytes]:
        first, n = await asyncio.wait_for(self.reader.readexactly(2), 5)
        assert not n & 0x80, "server frames are unmasked"
        n &= 0x7F
        if n == 126:
            n = struct.unpack("!H", await self.reader.readexactly(2))[0]
        elif n == 127:
            n = struct.unpack("!Q", await self.reader.readexactly(8))[0]
        return first, await self.reader.readexactly(n)

    async def doc(self) -> Any:
        first, payload = await self.frame()
        assert first == 0x81, first
        return json.loads(payload)

    async def closed_with(self) -> int:
        """The code of the server's close frame; then the server ends the connection."""
        first, payload = await self.frame()
        assert first == 0x88, (first, payload)
        assert await asyncio.wait_for(self.reader.read(), 5) == b""
        self.close()
        return int(struct.unpack("!H", payload[:2])[0])

    def close(self) -> None:
        self.writer.close()


# ------------------------------------------------------------------ parsing


def test_parse_head() -> None:
    head = parse_head(b"GET /v1/ws?token=a%20b&x=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2")
    assert head is not None
    assert (head.method, head.path, head.query, head.version) == (
        "GET",
        "/v1/ws",
        "token=a%20b&x=1",
        "HTTP/1.1",
    )
    assert head.headers == {"host": "h", "x-a": "1, 2"}
    for bad in (b"GET /v1/ws", b"GET v1/ws HTTP/1.1", b"GET / HTTP/1.1\r\nNoColon", b"\xff"):
        assert parse_head(bad) is None, bad
    assert parse_head(b"GET / HTTP/1.1\r\n Folded: x") is None


# ------------------------------------------------------------------ taken over


async def test_a_fresh_websocket_is_served_by_the_door(api: Api) -> None:
    v = (await api.ok("PUT", "/v1/keys/app:a", {"value": 1}))["version"]
    raw = await Raw.connect(api)
    await raw.handshake()
    watchers = api.app[WATCHERS]
    await until(lambda: watchers.door == 1)
    assert all(isinstance(c, WsProtocol) for c in watchers.ws)
    raw.send_json({"op": "watch", "key": "app:a", "version": 0})
    assert await raw.doc() == {"op": "event", "key": "app:a", "version": v, "value": 1}
    raw.send_json({"op": "watch", "key": "app:a", "version": v})
    await until(lambda: api.app[HUB].table.armed_count("app:a") == 1)
    v2 = (await api.ok("PUT", "/v1/keys/app:a", {"value": 2}))["version"]
    assert (await raw.doc())["version"] == v2
    # protocol ping → pong with the same data; the op ping → pong with the id
    raw.send(OP_PING, b"hello")
    assert await raw.frame() == (0x8A, b"hello")
    raw.send_json({"op": "ping", "id": 7})
    assert await raw.doc() == {"op": "pong", "id": 7}
    # a message in fragments, with a ping between them
    text = json.dumps({"op": "watch", "key": "app:b"}).encode()
    raw.send(OP_TEXT, text[:5], fin=False)
    raw.send(OP_PING, b"")
    raw.send(0, text[5:])
    assert await raw.frame() == (0x8A, b"")
    await until(lambda: api.app[HUB].table.armed_count("app:b") == 1)
    # the client closes: the server answers with the same code and ends the connection
    raw.send(OP_CLOSE, struct.pack("!H", 1001))
    assert await raw.closed_with() == 1001
    await until(lambda: watchers.n == 0 and watchers.door == 0 and not watchers.ws)
    assert api.app[HUB].table.watchers() == 0


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (client_frame(OP_TEXT, b"{}", masked=False), 1002),
        (client_frame(OP_TEXT, b"\xff"), 1007),
        (client_frame(OP_TEXT, b"x" * 70_000), 1009),
    ],
    ids=["unmasked", "not-utf8", "too-big"],
)
async def test_protocol_breaches_close_with_their_code(api: Api, frame: bytes, code: int) -> None:
    raw = await Raw.connect(api)
    await raw.handshake()
    raw.writer.write(frame)
    assert await raw.closed_with() == code
    watchers = api.app[WATCHERS]
    await until(lambda: watchers.n == 0 and not watchers.ws)


async def test_bad_ops_are_answered_and_the_connection_stays(api: Api) -> None:
    raw = await Raw.connect(api)
    await raw.handshake()
    raw.send(0x2, b"\x00")
    assert (await raw.doc())["code"] == "BadRequest"
    raw.send_json({"op": "watch", "key": ""})
    assert (await raw.doc())["code"] == "BadRequest"
    raw.send(OP_TEXT, b"{not json")
    assert (await raw.doc())["code"] == "BadRequest"
    raw.send_json({"op": "watch", "key": "sys:shutdown", "version": 0})
    await until(lambda: api.app[HUB].table.armed_count("sys:shutdown") == 1)
    raw.close()


async def test_a_websocket_whose_head_comes_in_pieces_is_still_taken_over(api: Api) -> None:
    raw = await Raw.connect(api)
    for i, byte in enumerate(upgrade_head()):
        raw.writer.write(bytes([byte]))
        if i % 7 == 0:
            await raw.writer.drain()
            await asyncio.sleep(0)
    status, _ = await raw.head()
    assert status == 101
    await until(lambda: api.app[WATCHERS].door == 1)
    raw.close()


# ------------------------------------------------------------------ handed to aiohttp


async def test_plain_http_in_any_pieces_is_aiohttps(api: Api) -> None:
    await api.ok("PUT", "/v1/keys/app:k", {"value": "v"})
    for request in (
        b"GET /v1/keys/app:k HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /v1/wsx HTTP/1.1\r\nHost: x\r\n\r\n",  # shares a prefix with /v1/ws
        b"GET /v1/w HTTP/1.1\r\nHost: x\r\n\r\n",
    ):
        raw = await Raw.connect(api)
        for byte in request:
            raw.writer.write(bytes([byte]))
            await raw.writer.drain()
        status, head = await raw.head()
        if request.startswith(b"GET /v1/keys"):
            assert status == 200
            assert (await raw.body(head))["value"] == "v"
        else:
            assert status == 404
        raw.close()
    assert api.app[WATCHERS].door == 0


async def test_an_upgrade_after_other_requests_is_served_by_aiohttps_route(api: Api) -> None:
    raw = await Raw.connect(api)
    raw.writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, head = await raw.head()
    assert status == 200
    await raw.body(head)
    await raw.handshake()  # the same connection
    raw.send_json({"op": "ping", "id": "k"})
    assert await raw.doc() == {"op": "pong", "id": "k"}
    watchers = api.app[WATCHERS]
    assert (watchers.n, watchers.door, len(watchers.ws)) == (1, 0, 1)
    raw.send_json({"op": "watch", "key": "app:x"})
    await until(lambda: api.app[HUB].table.armed_count("app:x") == 1)
    raw.close()
    await until(lambda: watchers.n == 0 and not watchers.ws)


@pytest.mark.parametrize(
    ("extra", "status"),
    [
        ({"Sec-WebSocket-Key": ""}, 400),
        ({"Sec-WebSocket-Version": "6"}, 400),
        ({"Upgrade": ""}, 400),
    ],
    ids=["no-key", "old-version", "no-upgrade"],
)
async def test_refused_handshakes_get_aiohttps_answer(
    api: Api, extra: dict[str, str], status: int
) -> None:
    raw = await Raw.connect(api)
    raw.writer.write(upgrade_head(**extra))
    got, _ = await raw.head()
    assert got == status
    assert api.app[WATCHERS].door == 0
    raw.close()


async def test_tokens_at_the_door(serve: Serve) -> None:
    api = await serve(AppOptions(tokens=[READER]))
    for extra, status in (({}, 401), ({"Authorization": "Bearer wrong-token-0123456"}, 401)):
        raw = await Raw.connect(api)
        raw.writer.write(upgrade_head(**extra))
        got, head = await raw.head()
        assert got == status
        assert (await raw.body(head))["error"]["code"] == "Unauthorized"
        raw.close()
    # a header, or (for browsers) the query string
    for head in (
        upgrade_head(Authorization=f"Bearer {READER.token}"),
        upgrade_head(f"/v1/ws?token={READER.token}"),
    ):
        raw = await Raw.connect(api)
        await raw.handshake(head)
        raw.send_json({"op": "watch", "key": "other"})
        doc = await raw.doc()
        assert (doc["code"], doc["key"]) == ("Forbidden", "other")
        raw.send_json({"op": "watch", "key": "app:1"})
        await until(lambda: api.app[HUB].table.armed_count("app:1") == 1)
        assert api.app[WATCHERS].door == 1
        raw.close()
        await until(lambda: api.app[WATCHERS].door == 0)


async def test_past_the_watcher_limit_the_route_answers_429(serve: Serve) -> None:
    api = await serve(AppOptions(watch=WatchOptions(max_watchers=1)))
    first = await Raw.connect(api)
    await first.handshake()
    second = await Raw.connect(api)
    second.writer.write(upgrade_head())
    status, head = await second.head()
    assert status == 429
    assert (await second.body(head))["error"]["code"] == "Overloaded"
    second.close()
    first.close()
    await until(lambda: api.app[WATCHERS].n == 0)
    third = await Raw.connect(api)
    await third.handshake()
    third.close()


async def test_a_connection_that_says_nothing_is_closed(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(door, "HEAD_TIMEOUT_S", 0.2)
    for said in (b"", b"GET /v1/"):  # nothing, half a head
        raw = await Raw.connect(api)
        raw.writer.write(said)
        assert await asyncio.wait_for(raw.reader.read(), 5) == b""
        raw.close()


async def test_aiohttp_clients_work_through_the_door(api: Api) -> None:
    async with aiohttp.ClientSession() as session:  # a fresh connection: the door serves it
        server = api.client.server
        async with session.ws_connect(f"http://{server.host}:{server.port}/v1/ws") as ws:
            await ws.send_json({"op": "ping", "id": 1})
            assert (await ws.receive_json(timeout=5)) == {"op": "pong", "id": 1}
            assert api.app[WATCHERS].door == 1
        await until(lambda: api.app[WATCHERS].door == 0)


# ------------------------------------------------------------------ long polls


def poll_head(key: str, query: str = "", **extra: str) -> bytes:
    headers = {"Host": "127.0.0.1", **extra}
    target = f"/v1/watch/{key}" + (f"?{query}" if query else "")
    lines = [f"GET {target} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def test_long_polls_on_a_keep_alive_connection_stay_off_aiohttp(api: Api) -> None:
    v = (await api.ok("PUT", "/v1/keys/app:p", {"value": "a"}))["version"]
    raw = await Raw.connect(api)
    # behind: answered at once
    raw.writer.write(poll_head("app:p", "version=0"))
    status, head = await raw.head()
    assert status == 200
    assert await raw.body(head) == {"key": "app:p", "version": v, "value": "a"}
    # up to date: waits (served by the door), answered by the next change
    raw.writer.write(poll_head("app:p", f"version={v}&timeout=10"))
    watchers = api.app[WATCHERS]
    await until(lambda: watchers.door == 1 and len(watchers.polls) == 1)
    v2 = (await api.ok("PUT", "/v1/keys/app:p", {"value": "b"}))["version"]
    status, head = await raw.head()
    assert status == 200
    assert (await raw.body(head))["version"] == v2
    assert (watchers.n, watchers.door, len(watchers.polls)) == (0, 0, 0)
    # nothing within the timeout: 204, no body
    raw.writer.write(poll_head("app:p", f"version={v2}&timeout=0.2"))
    status, head = await raw.head()
    assert status == 204
    assert b"content-length" not in head.lower() or b"content-length: 0" in head.lower()
    # msgpack when asked for
    raw.writer.write(poll_head("app:p", "version=0", Accept="application/msgpack"))
    status, head = await raw.head()
    assert status == 200
    assert b"application/msgpack" in head
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    body = msgspec.msgpack.decode(await raw.reader.readexactly(length))
    assert body["value"] == "b"
    # ... or when the request says it speaks msgpack, as aiohttp's route decides
    raw.writer.write(poll_head("app:p", "version=0", **{"Content-Type": "application/msgpack"}))
    status, head = await raw.head()
    assert b"application/msgpack" in head
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    assert msgspec.msgpack.decode(await raw.reader.readexactly(length))["value"] == "b"
    # then any other request on the same connection: aiohttp's
    raw.writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    status, head = await raw.head()
    assert status == 200
    assert (await raw.body(head))["status"] == "ok"
    assert api.app[HUB].table.watchers() == 0
    raw.close()


async def test_a_pipelined_request_waits_for_the_poll_before_it(api: Api) -> None:
    v = (await api.ok("PUT", "/v1/keys/app:q", {"value": 1}))["version"]
    raw = await Raw.connect(api)
    raw.writer.write(
        poll_head("app:q", f"version={v}&timeout=0.3") + b"GET /readyz HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, _ = await raw.head()
    assert status == 204
    status, head = await raw.head()
    assert status == 200
    assert (await raw.body(head))["status"] == "ready"
    raw.close()


async def test_a_poller_that_leaves_costs_nothing_after(api: Api) -> None:
    raw = await Raw.connect(api)
    raw.writer.write(poll_head("app:gone", "version=5&timeout=30"))
    watchers = api.app[WATCHERS]
    await until(lambda: len(watchers.polls) == 1)
    raw.close()
    await until(lambda: (watchers.n, watchers.door, len(watchers.polls)) == (0, 0, 0))
    assert api.app[HUB].table.watchers() == 0


@pytest.mark.parametrize(
    ("key", "query", "status"),
    [
        ("k", "version=-1", 400),
        ("k", "timeout=301", 400),
        ("k", "version=x", 400),
        ("sp%20ace", "version=0&timeout=0", 204),  # percent-encoded: aiohttp decodes it
    ],
)
async def test_polls_the_door_declines_get_aiohttps_answer(
    api: Api, key: str, query: str, status: int
) -> None:
    raw = await Raw.connect(api)
    raw.writer.write(poll_head(key, query))
    got, _ = await raw.head()
    assert got == status
    raw.close()


async def test_poll_tokens_and_limits_at_the_door(serve: Serve) -> None:
    api = await serve(AppOptions(tokens=[READER], watch=WatchOptions(max_watchers=1)))
    bearer = {"Authorization": f"Bearer {READER.token}"}
    for key, extra, status in (
        ("app:1", {}, 401),
        ("other", bearer, 403),
        ("app:1", {"Authorization": "Bearer nope-nope-nope-nope"}, 401),
    ):
        raw = await Raw.connect(api)
        raw.writer.write(poll_head(key, "version=0&timeout=0", **extra))
        got, _ = await raw.head()
        assert got == status, (key, extra)
        raw.close()
    first = await Raw.connect(api)
    first.writer.write(poll_head("app:1", "version=0&timeout=30", **bearer))
    await until(lambda: len(api.app[WATCHERS].polls) == 1)
    second = await Raw.connect(api)
    second.writer.write(poll_head("app:2", "version=0&timeout=30", **bearer))
    got, head = await second.head()
    assert got == 429
    assert (await second.body(head))["error"]["code"] == "Overloaded"
    second.close()
    first.close()


# ---------------------------------------------------------------- the event loop


@pytest.mark.parametrize(("setting", "uv"), [(None, True), ("1", True), ("0", False)])
def test_the_gateway_runs_on_uvloop_unless_evq_uvloop_is_0(
    monkeypatch: pytest.MonkeyPatch, setting: str | None, uv: bool
) -> None:
    import uvloop

    if setting is None:
        monkeypatch.delenv("EVQ_UVLOOP", raising=False)
    else:
        monkeypatch.setenv("EVQ_UVLOOP", setting)
    loop = door.new_loop()
    try:
        assert isinstance(loop, uvloop.Loop) is uv
        assert loop.run_until_complete(asyncio.sleep(0, "served")) == "served"
    finally:
        loop.close()
