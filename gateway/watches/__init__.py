"""Keys and one-shot watches on the HTTP side: ``/v1/keys``, ``/v1/watch`` (long poll) and
``/v1/ws`` (WebSocket). The bookkeeping is :mod:`watch.core`; the per-process fan-out and
upstream watches are :mod:`gateway.watches.hub`.

A WebSocket watcher costs its connection and its table entries: a change is encoded once
per process, framed once, and written to each armed connection's transport without a task
or an await per recipient. A connection whose send buffer stays over ``SEND_BUFFER_LIMIT``
(a client that does not read) is closed with code 4008 and the others never wait for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from actors.core.decide import validate_key
from actors.errors import BadRequest, Overloaded, TooLarge
from actors.keyspace import QUEUE_PREFIX, SYS_PREFIX, set_key_command
from gateway import limits, metrics, native
from gateway.auth import AUTH, TOKEN, Token, may_read_key, presented
from gateway.door import HEAD_LIMIT, UPGRADES, Doorway, Head
from gateway.errors import MSGPACK, prefers_msgpack, wants_msgpack
from gateway.fast import http_date
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
from watch.core import KeyState

__all__ = [
    "HUB",
    "WATCHERS",
    "WATCH_OPTIONS",
    "PollConn",
    "WatchOptions",
    "Watchers",
    "WsConn",
    "WsProtocol",
    "close_watchers",
    "open_long_poll",
    "open_websocket",
    "routes",
]

log = logging.getLogger(__name__)

MAX_VALUE_BYTES = 64 * 1024
MAX_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 30.0
CLOSE_SLOW = 4008  # the client did not read its notifications: its send buffer overflowed
CLOSE_GOING_AWAY = 1001


MAX_WS_MESSAGE = 64 * 1024
CLOSE_LINGER_S = 5.0  # after our close frame, how long the client has to close its side


class WatchOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of the watch endpoints of one gateway process."""

    max_watchers: int = 19_000  # WebSockets + long polls (a process has 20k descriptors)
    max_keys_per_connection: int = 1000
    send_buffer_limit: int = 256 * 1024


class Watchers:
    """The watchers a gateway process holds."""

    __slots__ = ("door", "n", "polls", "ws")

    def __init__(self) -> None:
        self.n = 0  # WebSockets and long polls (against WatchOptions.max_watchers)
        self.door = 0  # watchers served without aiohttp (not in aiohttp's connections)
        self.ws: set[WsConn] = set()
        self.polls: set[PollConn] = set()  # long polls served without aiohttp

    def room(self, options: WatchOptions) -> bool:
        """Whether this process may take one more watcher."""
        return self.n < options.max_watchers

    def enter_door(self, conns: set[Any], conn: Any) -> None:
        """A watcher served by the front door (``conns``: ``ws`` or ``polls``) starts."""
        conns.add(conn)
        self.n += 1
        self.door += 1

    def leave_door(self, conns: set[Any], conn: Any) -> None:
        """It ends (once, however often this is called)."""
        if conn in conns:
            conns.discard(conn)
            self.n -= 1
            self.door -= 1


HUB = web.AppKey("watch_hub", Hub)
WATCH_OPTIONS = web.AppKey("watch_options", WatchOptions)
WATCHERS = web.AppKey("watchers", Watchers)

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
    return poll_args(request.query.get("version"), request.query.get("timeout"))


def poll_args(version: str | None, timeout: str | None) -> tuple[int, float]:
    """A long poll's ``version`` and ``timeout`` from the query. Raises: BadRequest."""
    try:
        v = int(version if version is not None else "0")
        t = float(timeout) if timeout is not None else DEFAULT_TIMEOUT_S
    except ValueError:
        raise BadRequest("version must be an integer and timeout a number of seconds") from None
    if v < 0 or not 0 <= t <= MAX_TIMEOUT_S:
        raise BadRequest(f"version must be >= 0 and timeout within 0..{MAX_TIMEOUT_S:g} s")
    return v, t


@routes.get("/v1/watch/{key:.+}")
async def watch_key(request: web.Request) -> web.Response:
    key = _key(request)
    version, timeout = _poll_args(request)
    with _watcher_slot(request):
        state = await request.app[HUB].wait(key, version, timeout)
    if state is None:
        return web.Response(status=204)
    return _state_response(request, state)


class PollConn(asyncio.Protocol):
    """One long poll served without aiohttp (a :class:`gateway.watches.hub.Sink`): the front door
    hands over a connection whose request is a valid ``GET /v1/watch/{key}``; the answer is
    written here, and the connection's next request passes the door again (so a client that
    polls on a keep-alive connection stays off aiohttp's request path, and any other request
    goes to aiohttp). Waiting costs this object and a timer."""

    __slots__ = ("close_after", "doorway", "kind", "pending", "timer", "transport", "waiting")

    def __init__(self, doorway: Doorway, transport: Any, kind: str, close_after: bool) -> None:
        self.doorway = doorway
        self.transport = transport
        self.kind = kind  # "json" or "msgpack"
        self.close_after = close_after
        self.pending = b""  # the client's next request(s), received while this one waits
        self.timer: asyncio.TimerHandle | None = None
        self.waiting = False

    def start(self, hub: Hub, key: str, version: int, timeout: float) -> None:
        """Arm ``key``: answer now if the client is behind, else when it changes or after
        ``timeout`` seconds (204)."""
        if self.transport is None:
            return  # the client left before its poll started
        state = hub.arm(self, key, version)
        if state is not None or hub.closed:
            self.answer(state)
            return
        self.waiting = True
        watchers = self.doorway.app[WATCHERS]
        watchers.enter_door(watchers.polls, self)
        self.timer = asyncio.get_running_loop().call_later(timeout, self.answer, None)

    def deliver(self, state: KeyState) -> None:
        self.answer(state)

    def answer(self, state: KeyState | None) -> None:
        """Write the answer (the state, or 204), then let the next request through."""
        app = self.doorway.app
        hub = app[HUB]
        self._stop_waiting()
        hub.drop(self)
        t = self.transport
        if t is None or t.is_closing():
            return
        date = http_date(hub.clock.now_ms()).decode()
        close = "Connection: close\r\n" if self.close_after else ""
        if state is None:
            t.write(f"HTTP/1.1 204 No Content\r\nDate: {date}\r\n{close}\r\n".encode())
            status = 204
        else:
            body = _encoded(state, self.kind)
            ctype = MSGPACK if self.kind == "msgpack" else "application/json"
            t.write(
                f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                f"Date: {date}\r\n{close}\r\n".encode()
                + body
            )
            status = 200
        app[METRICS].observe("/v1/watch/{key}", "GET", status, None)
        self.transport = None
        if self.close_after:
            t.close()
        else:
            self.doorway.reopen(t, self.pending)

    def _stop_waiting(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.waiting:
            self.waiting = False
            watchers = self.doorway.app[WATCHERS]
            watchers.leave_door(watchers.polls, self)

    def data_received(self, data: bytes) -> None:
        self.pending += data  # a pipelined request: served after this answer
        if len(self.pending) > 2 * HEAD_LIMIT:
            self.transport.close()  # not a client that waits for its answer

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        self.doorway.app[HUB].drop(self)
        self.transport = None


def open_long_poll(doorway: Doorway, head: Head, transport: Any) -> PollConn | None:
    """The front door's offer of a ``GET /v1/watch/{key}``: serve it, or None to let
    aiohttp's route answer (every error, refusal and limit is answered there)."""
    app = doorway.app
    raw_key = head.path[len("/v1/watch/") :]
    if "%" in raw_key or "%" in head.query:
        return None  # percent-decoding is aiohttp's
    query = urllib.parse.parse_qs(head.query, keep_blank_values=True)
    if any(len(v) > 1 for v in query.values()):
        return None
    try:
        key = validate_key(raw_key)
        version, timeout = poll_args(
            query.get("version", [None])[0], query.get("timeout", [None])[0]
        )
    except BadRequest:
        return None
    if not app[WATCHERS].room(app[WATCH_OPTIONS]):
        return None
    auth = app[AUTH]
    if auth.enabled:
        token = auth.identify(presented(head.headers.get("authorization"), None))
        if token is None or not may_read_key(token, key) or auth.admit(token) is not None:
            return None
    content_type = head.headers.get("content-type", "").partition(";")[0].strip().lower()
    kind = "msgpack" if prefers_msgpack(head.headers.get("accept", ""), content_type) else "json"
    close = "close" in head.headers.get("connection", "").lower()
    conn = PollConn(doorway, transport, kind, close)
    asyncio.get_running_loop().call_soon(conn.start, app[HUB], key, version, timeout)
    return conn


@contextlib.contextmanager
def _watcher_slot(request: web.Request) -> Any:
    """Count a watcher; 429 past the process's limit."""
    watchers = request.app[WATCHERS]
    if not watchers.room(request.app[WATCH_OPTIONS]):
        raise Overloaded("this server process holds as many watchers as it can; retry shortly")
    watchers.n += 1
    try:
        yield
    finally:
        watchers.n -= 1


# ------------------------------------------------------------------ WebSocket


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
        self._write(_encoded(state, "ws"))

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
    with _watcher_slot(request):
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


async def close_watchers(app: web.Application) -> None:
    """Graceful shutdown: publish ``sys:shutdown``, answer long polls, close WebSockets."""
    hub = app[HUB]
    hub.publish_sys("sys:shutdown", {"reason": "the server is shutting down"})
    await hub.close()
    for conn in list(app[WATCHERS].ws):
        conn.close(CLOSE_GOING_AWAY, "server shutdown", linger=False)
    for poll in list(app[WATCHERS].polls):
        poll.close_after = True
        poll.answer(None)


def install(app: web.Application, options: WatchOptions | None = None) -> None:
    """Add the watch endpoints and their state to ``app``."""
    directory = app[native.DIRECTORY]
    app[HUB] = Hub(directory.watch_key)
    app[WATCH_OPTIONS] = options or WatchOptions()
    watchers = app[WATCHERS] = Watchers()
    # Watchers on aiohttp's connections have a limit of their own, not the HTTP one.
    app.setdefault(limits.EXEMPT, []).append(lambda: watchers.n - watchers.door)
    app[UPGRADES] = {"/v1/ws": open_websocket, "/v1/watch/": open_long_poll}
    app.add_routes(routes)
    metrics.register_gauge(
        app,
        "evq_watchers",
        "Watchers held by this process",
        lambda: _watcher_counts(app[WATCHERS]),
        labels=["kind"],
    )
    metrics.register_gauge(
        app,
        "evq_watch_upstream_keys",
        "Keys this process follows upstream (one watch each)",
        lambda: len(app[HUB].following()),
    )


def _watcher_counts(watchers: Watchers) -> dict[tuple[str, ...], float]:
    """Watchers by kind, for ``/metrics``."""
    ws = len(watchers.ws)
    return {("websocket",): ws, ("long_poll",): max(0, watchers.n - ws)}
