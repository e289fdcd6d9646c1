"""WebSocket watchers: ``/v1/ws`` takes ``watch``, ``unwatch`` and ``ping`` ops and writes
each armed key's next state as an ``event``.

A WebSocket watcher costs its connection and its table entries: a change is encoded once
per process, framed once, and written to each armed connection's transport without a task
or an await per recipient. A connection whose send buffer stays over
``WatchOptions.send_buffer_limit`` (a client that does not read) is closed with code 4008
and the others never wait for it. A handshake that is the first request of a connection is
answered by the front door (:mod:`gateway.door`) and the connection served by
:class:`WsProtocol`; any other goes through aiohttp's route (:func:`websocket`)."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from actors.core.keys import validate_key
from actors.errors import BadRequest
from gateway.auth import AUTH, TOKEN, Token, may_read_key, presented
from gateway.door import Doorway, Head
from gateway.metrics import METRICS
from gateway.watches.codec import (
    CLOSE_NO_STATUS,
    CLOSE_NORMAL,
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_TEXT,
    FrameError,
    MessageReader,
    close_code,
    close_frame,
    handshake_reply,
    pong_frame,
    text_frame,
)
from gateway.watches.hub import Hub
from gateway.watches.watchers import (
    HUB,
    WATCH_OPTIONS,
    WATCHERS,
    Watchers,
    WatchOptions,
    encoded,
    watcher_slot,
)
from watch.core import KeyState

__all__ = [
    "CLOSE_GOING_AWAY",
    "CLOSE_SLOW",
    "WsConn",
    "WsProtocol",
    "open_websocket",
    "routes",
    "websocket",
]

CLOSE_SLOW = 4008  # the client did not read its notifications: its send buffer overflowed
CLOSE_GOING_AWAY = 1001
MAX_WS_MESSAGE = 64 * 1024
CLOSE_LINGER_S = 5.0  # after our close frame, how long the client has to close its side

routes = web.RouteTableDef()

_json = msgspec.json.Encoder()


class OpIn(msgspec.Struct, forbid_unknown_fields=True):
    op: str
    key: str | None = None
    version: int | None = None
    id: Any = None  # echoed in errors and pongs, for clients that correlate


_op_decoder = msgspec.json.Decoder(OpIn)


class WsConn:
    """One WebSocket watcher connection (a :class:`gateway.watches.hub.Sink`): the watch ops it
    receives, the events and replies it writes. Replies and events are whole frames written
    straight to the transport; nothing here awaits."""

    __slots__ = ("closing", "hub", "options", "token", "transport")

    def __init__(
        self, transport: Any, hub: Hub, options: WatchOptions, token: Token | None
    ) -> None:
        self.transport = transport
        self.hub = hub
        self.options = options
        self.token = token
        self.closing = False

    def deliver(self, state: KeyState) -> None:
        self._write(encoded(state, "ws"))

    def send(self, doc: dict[str, Any]) -> None:
        self._write(text_frame(_json.encode(doc)))

    def _write(self, frame: bytes) -> None:
        t = self.transport
        if self.closing or t is None or t.is_closing():
            return
        if t.get_write_buffer_size() > self.options.send_buffer_limit:
            self.close(CLOSE_SLOW, "send buffer over the limit: the client does not read")
            return
        t.write(frame)

    def error(self, op_id: Any, code: str, message: str, **fields: Any) -> None:
        self.send({"op": "error", "code": code, "message": message, "id": op_id, **fields})

    def close(self, code: int, reason: str, *, linger: bool = True) -> None:
        """A close frame, then the end of the connection (:meth:`_end`); at once when the
        client does not read."""
        if self.closing:
            return
        self.closing = True
        self.hub.drop(self)
        t = self.transport
        if t is None or t.is_closing():
            return
        if t.get_write_buffer_size() > self.options.send_buffer_limit:
            t.abort()  # it does not read: it will not read the close frame either
            return
        t.write(close_frame(code, reason))
        self._end(t, linger)

    def _end(self, t: Any, linger: bool) -> None:
        """After the close frame: aiohttp's connection closes without waiting for the
        client."""
        t.close()

    def on_text(self, data: bytes | str) -> None:
        """One text message from the client: ping, watch or unwatch."""
        try:
            op = _op_decoder.decode(data)
        except msgspec.DecodeError as exc:
            self.error(None, "BadRequest", f"invalid message: {exc}")
            return
        if op.op == "ping":
            self.send({"op": "pong", "id": op.id})
            return
        if op.op not in ("watch", "unwatch"):
            self.error(op.id, "BadRequest", f"unknown op {op.op!r}")
            return
        try:
            key = validate_key(op.key)
            if op.version is not None and op.version < 0:
                raise BadRequest("version must be >= 0")
        except BadRequest as exc:
            self.error(op.id, exc.code, exc.message, key=op.key)
            return
        hub = self.hub
        if op.op == "unwatch":
            hub.unwatch(self, key)
            return
        if not may_read_key(self.token, key):
            self.error(op.id, "Forbidden", f"this token may not read {key}", key=key)
            return
        limit = self.options.max_keys_per_connection
        if hub.table.delivered(self, key) is None and hub.table.count_keys(self) >= limit:
            self.error(op.id, "Overloaded", f"at most {limit} keys per connection")
            return
        state = hub.arm(self, key, op.version)
        if state is not None:
            self.deliver(state)


class WsProtocol(WsConn, asyncio.Protocol):
    """A WebSocket watcher served without aiohttp: the connection's own protocol, handed
    over by the front door (:mod:`gateway.door`) after the handshake. It reads frames with
    :class:`gateway.watches.codec.MessageReader`, answers pings, and closes the way RFC 6455 asks:
    a close frame, the end of its side, then what the client still sends is read and
    dropped until it closes too (or ``CLOSE_LINGER_S`` passes) — closing with unread data
    would reset the connection before the client reads why."""

    __slots__ = ("linger", "reader", "watchers")

    def __init__(
        self,
        transport: Any,
        hub: Hub,
        options: WatchOptions,
        token: Token | None,
        watchers: Watchers,
    ) -> None:
        super().__init__(transport, hub, options, token)
        self.reader = MessageReader(MAX_WS_MESSAGE)
        self.watchers = watchers
        self.linger: asyncio.TimerHandle | None = None
        watchers.enter_door(watchers.ws, self)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        try:
            messages = self.reader.feed(data)
        except FrameError as exc:
            self.close(exc.code, exc.reason)
            return
        for op, payload in messages:
            if self.closing:
                return
            if op == OP_TEXT:
                self.on_text(payload)
            elif op == OP_BINARY:
                self.error(None, "BadRequest", "send JSON text frames")
            elif op == OP_PING:
                self._write(pong_frame(payload))
            elif op == OP_CLOSE:
                code = close_code(payload)
                self.close(CLOSE_NORMAL if code == CLOSE_NO_STATUS else code, "")

    def _end(self, t: Any, linger: bool) -> None:
        """After the close frame: the end of our side, then wait for the client's
        (``linger``), or close at once (the server is going away)."""
        if not linger:
            t.close()
            return
        try:
            t.write_eof()
        except OSError:  # the client is gone already
            t.abort()
            return
        self.linger = asyncio.get_running_loop().call_later(CLOSE_LINGER_S, t.abort)

    def eof_received(self) -> bool:
        return False  # the client is done: close (after what is still to be sent)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.hub.drop(self)
        self.transport = None
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self.watchers.leave_door(self.watchers.ws, self)


def open_websocket(doorway: Doorway, head: Head, transport: Any) -> WsProtocol | None:
    """The front door's offer of a ``/v1/ws`` handshake: answer it and return the
    connection's protocol, or None to let aiohttp's route answer (it gives the error)."""
    app = doorway.app
    reply = handshake_reply(head.headers)
    if reply is None:
        return None
    watchers = app[WATCHERS]
    options = app[WATCH_OPTIONS]
    if not watchers.room(options) or app[HUB].closed:
        return None
    auth = app[AUTH]
    token = None
    if auth.enabled:  # last: a request admitted here is not refused after
        query = urllib.parse.parse_qs(head.query)
        token = auth.identify(presented(head.headers.get("authorization"), query.get("token")))
        if token is None or auth.admit(token) is not None:
            return None
    protocol = WsProtocol(transport, app[HUB], options, token, watchers)
    transport.write(reply)
    app[METRICS].observe("/v1/ws", "GET", 101, None)
    return protocol


@routes.get("/v1/ws")
async def websocket(request: web.Request) -> web.WebSocketResponse:
    """``/v1/ws`` through aiohttp: the errors of a refused handshake, and upgrades on a
    connection that carried other requests first (the front door looks only at the first)."""
    app = request.app
    options = app[WATCH_OPTIONS]
    with watcher_slot(request):
        ws = web.WebSocketResponse(compress=False, max_msg_size=MAX_WS_MESSAGE)
        await ws.prepare(request)
        hub = app[HUB]
        conn = WsConn(request.transport, hub, options, request.get(TOKEN))
        watchers = app[WATCHERS]
        watchers.ws.add(conn)
        try:
            async for msg in ws:
                if msg.type is WSMsgType.TEXT:
                    conn.on_text(msg.data)
                elif msg.type is WSMsgType.BINARY:
                    conn.error(None, "BadRequest", "send JSON text frames")
        finally:
            watchers.ws.discard(conn)
            hub.drop(conn)
        return ws
