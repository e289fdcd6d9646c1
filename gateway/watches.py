"""Keys and one-shot watches on the HTTP side: ``/v1/keys``, ``/v1/watch`` (long poll) and
``/v1/ws`` (WebSocket). The bookkeeping is :mod:`watch.core`; the per-process fan-out and
upstream watches are :mod:`watch.hub`.

A WebSocket watcher costs its connection and its table entries: a change is encoded once
per process, framed once, and written to each armed connection's transport without a task
or an await per recipient. A connection whose send buffer stays over ``SEND_BUFFER_LIMIT``
(a client that does not read) is closed with code 4008 and the others never wait for it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from actors.core.decide import validate_key
from actors.errors import BadRequest, Overloaded, TooLarge
from actors.keyspace import QUEUE_PREFIX, SYS_PREFIX, set_key_command
from gateway import native
from gateway.auth import TOKEN, may_read_key
from gateway.errors import MSGPACK, wants_msgpack
from watch.core import KeyState
from watch.frames import close_frame, text_frame
from watch.hub import Hub

__all__ = ["HUB", "WATCH_OPTIONS", "WatchOptions", "close_watchers", "routes"]

log = logging.getLogger(__name__)

MAX_VALUE_BYTES = 64 * 1024
MAX_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 30.0
CLOSE_SLOW = 4008  # the client did not read its notifications: its send buffer overflowed
CLOSE_GOING_AWAY = 1001


class WatchOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of the watch endpoints of one gateway process."""

    max_watchers: int = 19_000  # WebSockets + long polls (a process has 20k descriptors)
    max_keys_per_connection: int = 1000
    send_buffer_limit: int = 256 * 1024
    ws_heartbeat_s: float | None = None  # protocol pings (clients also have {"op": "ping"})


HUB = web.AppKey("watch_hub", Hub)
WATCH_OPTIONS = web.AppKey("watch_options", WatchOptions)
WATCHERS = web.AppKey("watchers", dict)  # {"n": int, "ws": set[WsConn]}

routes = web.RouteTableDef()

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


class KeyIn(msgspec.Struct, forbid_unknown_fields=True):
    value: Any


class OpIn(msgspec.Struct, forbid_unknown_fields=True):
    op: str
    key: str | None = None
    version: int | None = None
    id: Any = None  # echoed in errors and pongs, for clients that correlate


_op_decoder = msgspec.json.Decoder(OpIn)


def _key(request: web.Request) -> str:
    return validate_key(request.match_info["key"])


def _state_doc(state: KeyState) -> dict[str, Any]:
    return {"key": state.key, "version": state.version, "value": state.value}


def _encoded(state: KeyState, kind: str) -> bytes:
    """The state's encoding for ``kind`` (json / msgpack / ws), made once per change."""
    data = state.cache.get(kind)
    if data is None:
        if kind == "ws":
            doc = {"op": "event", **_state_doc(state)}
            data = text_frame(_json.encode(doc))
        elif kind == "msgpack":
            data = _msgpack.encode(_state_doc(state))
        else:
            data = _json.encode(_state_doc(state))
        state.cache[kind] = data
    return data


def _state_response(request: web.Request, state: KeyState) -> web.Response:
    if wants_msgpack(request):
        return web.Response(body=_encoded(state, "msgpack"), content_type=MSGPACK)
    return web.Response(body=_encoded(state, "json"), content_type="application/json")


# ------------------------------------------------------------------ keys


@routes.put("/v1/keys/{key:.+}")
async def set_key(request: web.Request) -> web.Response:
    key = _key(request)
    if key.startswith((SYS_PREFIX, QUEUE_PREFIX)):
        raise BadRequest("sys: and queue: keys are maintained by the server", key=key)
    req = await native.body(request, KeyIn)
    size = len(_json.encode(req.value))
    if size > MAX_VALUE_BYTES:
        raise TooLarge(f"a key's value is at most {MAX_VALUE_BYTES} bytes as JSON", size=size)
    view = await native.run(request, *set_key_command(key, req.value))
    return native.reply(request, {"key": key, "version": view.version})


@routes.get("/v1/keys/{key:.+}")
async def get_key(request: web.Request) -> web.Response:
    key = _key(request)
    if key.startswith(SYS_PREFIX):
        state = request.app[HUB].state(key)
        doc = _state_doc(state) if state else {"key": key, "version": 0, "value": None}
        return native.reply(request, doc)
    view = await request.app[native.DIRECTORY].watch_key(key, -1)
    return native.reply(request, {"key": key, "version": view.version, "value": view.value})


# ------------------------------------------------------------------ long poll


def _poll_args(request: web.Request) -> tuple[int, float]:
    try:
        version = int(request.query.get("version", "0"))
        timeout = float(request.query.get("timeout", DEFAULT_TIMEOUT_S))
    except ValueError:
        raise BadRequest("version must be an integer and timeout a number of seconds") from None
    if version < 0 or not 0 <= timeout <= MAX_TIMEOUT_S:
        raise BadRequest(f"version must be >= 0 and timeout within 0..{MAX_TIMEOUT_S:g} s")
    return version, timeout


@routes.get("/v1/watch/{key:.+}")
async def watch_key(request: web.Request) -> web.Response:
    key = _key(request)
    version, timeout = _poll_args(request)
    with _watcher_slot(request):
        state = await request.app[HUB].wait(key, version, timeout)
    if state is None:
        return web.Response(status=204)
    return _state_response(request, state)


@contextlib.contextmanager
def _watcher_slot(request: web.Request) -> Any:
    """Count a watcher; 429 past the process's limit."""
    watchers = request.app[WATCHERS]
    if watchers["n"] >= request.app[WATCH_OPTIONS].max_watchers:
        raise Overloaded("this server process holds as many watchers as it can; retry shortly")
    watchers["n"] += 1
    try:
        yield
    finally:
        watchers["n"] -= 1


# ------------------------------------------------------------------ WebSocket


class WsConn:
    """One WebSocket watcher connection (a :class:`watch.hub.Sink`)."""

    __slots__ = ("closing", "hub", "limit", "transport", "ws")

    def __init__(self, ws: web.WebSocketResponse, transport: Any, hub: Hub, limit: int) -> None:
        self.ws = ws
        self.transport = transport
        self.hub = hub
        self.limit = limit
        self.closing = False

    def deliver(self, state: KeyState) -> None:
        t = self.transport
        if self.closing or t is None or t.is_closing():
            return
        if t.get_write_buffer_size() > self.limit:
            self.close(CLOSE_SLOW, "send buffer over the limit: the client does not read")
            return
        t.write(_encoded(state, "ws"))

    def close(self, code: int, reason: str) -> None:
        """Close without waiting for the client: a close frame, then the connection."""
        if self.closing:
            return
        self.closing = True
        self.hub.drop(self)
        t = self.transport
        if t is not None and not t.is_closing():
            if t.get_write_buffer_size() > self.limit:
                t.abort()  # it does not read: it will not read the close frame either
            else:
                t.write(close_frame(code, reason))
                t.close()


@routes.get("/v1/ws")
async def websocket(request: web.Request) -> web.WebSocketResponse:
    app = request.app
    options = app[WATCH_OPTIONS]
    with _watcher_slot(request):
        ws = web.WebSocketResponse(
            compress=False, heartbeat=options.ws_heartbeat_s, max_msg_size=64 * 1024
        )
        await ws.prepare(request)
        hub = app[HUB]
        conn = WsConn(ws, request.transport, hub, options.send_buffer_limit)
        app[WATCHERS]["ws"].add(conn)
        try:
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    await _on_text(conn, msg.data, options, request.get(TOKEN))
                elif msg.type is WSMsgType.BINARY:
                    await _ws_error(ws, None, "BadRequest", "send JSON text frames")
        finally:
            app[WATCHERS]["ws"].discard(conn)
            hub.drop(conn)
        return ws


async def _on_text(conn: WsConn, data: str, options: WatchOptions, token: Any) -> None:
    try:
        op = _op_decoder.decode(data)
    except msgspec.DecodeError as exc:
        await _ws_error(conn.ws, None, "BadRequest", f"invalid message: {exc}")
        return
    hub = conn.hub
    if op.op == "ping":
        await conn.ws.send_str(_json.encode({"op": "pong", "id": op.id}).decode())
        return
    if op.op not in ("watch", "unwatch"):
        await _ws_error(conn.ws, op.id, "BadRequest", f"unknown op {op.op!r}")
        return
    try:
        key = validate_key(op.key)
        if op.version is not None and op.version < 0:
            raise BadRequest("version must be >= 0")
    except BadRequest as exc:
        await _ws_error(conn.ws, op.id, exc.code, exc.message, key=op.key)
        return
    if op.op == "unwatch":
        hub.unwatch(conn, key)
        return
    if not may_read_key(token, key):
        await _ws_error(conn.ws, op.id, "Forbidden", f"this token may not read {key}", key=key)
        return
    watched = hub.table.watched_keys(conn)
    if len(watched) >= options.max_keys_per_connection and key not in watched:
        limit = options.max_keys_per_connection
        await _ws_error(conn.ws, op.id, "Overloaded", f"at most {limit} keys per connection")
        return
    state = hub.arm(conn, key, op.version)
    if state is not None:
        conn.deliver(state)


async def _ws_error(
    ws: web.WebSocketResponse, op_id: Any, code: str, message: str, **fields: Any
) -> None:
    doc = {"op": "error", "code": code, "message": message, "id": op_id, **fields}
    with contextlib.suppress(ConnectionError):
        await ws.send_str(_json.encode(doc).decode())


async def close_watchers(app: web.Application) -> None:
    """Graceful shutdown: publish ``sys:shutdown``, answer long polls, close WebSockets."""
    hub = app[HUB]
    hub.publish_sys("sys:shutdown", {"reason": "the server is shutting down"})
    await hub.close()
    for conn in list(app[WATCHERS]["ws"]):
        conn.close(CLOSE_GOING_AWAY, "server shutdown")


def install(app: web.Application, options: WatchOptions | None = None) -> None:
    """Add the watch endpoints and their state to ``app``."""
    directory = app[native.DIRECTORY]
    app[HUB] = Hub(directory.watch_key)
    app[WATCH_OPTIONS] = options or WatchOptions()
    app[WATCHERS] = {"n": 0, "ws": set()}
    app.add_routes(routes)
