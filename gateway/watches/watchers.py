"""What the watch transports share in one gateway process: the limits
(:class:`WatchOptions`), the watchers held (:class:`Watchers`, against
``WatchOptions.max_watchers``), the app keys of the watch state, and a key's state encoded
once per change for every watcher that gets it (``encoded``: JSON and msgpack for long polls,
a whole WebSocket frame for WebSockets)."""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import msgspec
from aiohttp import web

from actors.core.keys import validate_key
from actors.errors import Overloaded
from gateway.watches.codec import text_frame
from gateway.watches.hub import Hub
from watch.core import KeyState

__all__ = [
    "HUB",
    "WATCHERS",
    "WATCH_OPTIONS",
    "PollWatcher",
    "WatchOptions",
    "Watchers",
    "WsWatcher",
    "encoded",
    "request_key",
    "state_doc",
    "watcher_slot",
]

_json = msgspec.json.Encoder()
_msgpack = msgspec.msgpack.Encoder()


class WsWatcher(Protocol):
    """A WebSocket watcher as the process sees it (:class:`gateway.watches.websocket.WsConn`)."""

    def close(self, code: int, reason: str, *, linger: bool = True) -> None: ...


class PollWatcher(Protocol):
    """A long poll served without aiohttp, as the process sees it
    (:class:`gateway.watches.longpoll.PollConn`)."""

    close_after: bool

    def answer(self, state: KeyState | None) -> None: ...


class WatchOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Limits of the watch endpoints of one gateway process."""

    max_watchers: int = 19_000  # WebSockets + long polls (a process has 20k descriptors)
    max_keys_per_connection: int = 4096  # the console watches every queue (and two sys: keys)
    send_buffer_limit: int = 256 * 1024


class Watchers:
    """The watchers a gateway process holds."""

    __slots__ = ("door", "n", "polls", "ws")

    def __init__(self) -> None:
        self.n = 0  # WebSockets and long polls (against WatchOptions.max_watchers)
        self.door = 0  # watchers served without aiohttp (not in aiohttp's connections)
        self.ws: set[WsWatcher] = set()
        self.polls: set[PollWatcher] = set()  # long polls served without aiohttp

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


def request_key(request: web.Request) -> str:
    """The request's ``{key}``, checked. Raises: BadRequest."""
    return validate_key(request.match_info["key"])


def state_doc(state: KeyState) -> dict[str, Any]:
    """A key's state as a document: ``{"key", "version", "value"}``."""
    return {"key": state.key, "version": state.version, "value": state.value}


def encoded(state: KeyState, kind: str) -> bytes:
    """The state's encoding for ``kind`` (json / msgpack / ws), made once per change."""
    data = state.cache.get(kind)
    if data is None:
        if kind == "ws":
            doc = {"op": "event", **state_doc(state)}
            data = text_frame(_json.encode(doc))
        elif kind == "msgpack":
            data = _msgpack.encode(state_doc(state))
        else:
            data = _json.encode(state_doc(state))
        state.cache[kind] = data
    return data


@contextlib.contextmanager
def watcher_slot(request: web.Request) -> Any:
    """Count a watcher; 429 past the process's limit."""
    watchers = request.app[WATCHERS]
    if not watchers.room(request.app[WATCH_OPTIONS]):
        raise Overloaded("this server process holds as many watchers as it can; retry shortly")
    watchers.n += 1
    try:
        yield
    finally:
        watchers.n -= 1
