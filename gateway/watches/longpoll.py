"""Long polls: ``GET /v1/watch/{key}?version=V&timeout=S`` answers with the key's state
once its version is past ``V``, or 204 after ``S`` seconds. A poll that is the first request
of a connection (or follows an answered one) is served without aiohttp by
:class:`PollConn`, handed over by the front door (:mod:`gateway.door`); any other goes
through aiohttp's route, which also answers every error, refusal and limit."""

from __future__ import annotations

import asyncio
import urllib.parse
from typing import Any

from aiohttp import web

from actors.core.keys import validate_key
from actors.errors import BadRequest
from gateway.auth import AUTH, may_read_key, presented
from gateway.door import HEAD_LIMIT, Doorway, Head
from gateway.errors import MSGPACK, prefers_msgpack, wants_msgpack
from gateway.fast import http_date
from gateway.metrics import METRICS
from gateway.watches.hub import Hub
from gateway.watches.watchers import (
    HUB,
    WATCH_OPTIONS,
    WATCHERS,
    encoded,
    request_key,
    watcher_slot,
)
from watch.core import KeyState

__all__ = ["PollConn", "open_long_poll", "poll_args", "routes", "watch_key"]

MAX_TIMEOUT_S = 300.0
DEFAULT_TIMEOUT_S = 30.0

routes = web.RouteTableDef()


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


def _state_response(request: web.Request, state: KeyState) -> web.Response:
    if wants_msgpack(request):
        return web.Response(body=encoded(state, "msgpack"), content_type=MSGPACK)
    return web.Response(body=encoded(state, "json"), content_type="application/json")


@routes.get("/v1/watch/{key:.+}")
async def watch_key(request: web.Request) -> web.Response:
    key = request_key(request)
    version, timeout = _poll_args(request)
    with watcher_slot(request):
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
            body = encoded(state, self.kind)
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
