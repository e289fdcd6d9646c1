"""The gateway's front door: each new connection's first request decides who serves it.

Most connections are plain HTTP and go to aiohttp as they are. A WebSocket upgrade to a path
registered in ``app[UPGRADES]`` (``/v1/ws``) may instead be taken over by that path's
function, which answers the handshake and returns its own :class:`asyncio.Protocol` for
the connection: a watcher then costs its transport and its protocol object, not aiohttp's
request machinery (about 11 KiB per connection, measured in loadtest/RESULTS.md). When the
function declines (a bad token, no room for another watcher, a malformed handshake) the
connection goes to aiohttp with the bytes read so far, and aiohttp's route for the same path
gives the usual error response — one place for every error.

Only the first request of a connection is looked at; a WebSocket upgrade on a connection
that already carried other requests is served by aiohttp's route (same behaviour, aiohttp's
cost).

:class:`DoorRunner` is an :class:`aiohttp.web.AppRunner` whose connections pass the door
(any site works with it: TCP, a socket, a test server); :func:`run` serves an application
with it until SIGINT/SIGTERM, as :func:`aiohttp.web.run_app` does, on uvloop's event loop
(:func:`new_loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable
from typing import Any, NamedTuple

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway.accept import AcceptSite
from gateway.fast import FAST, PREFIX, Fast, FastHttp, may_be_fast
from gateway.limits import FAST_CONNECTIONS, PENALTIES, offend
from gateway.tls import Certificates

__all__ = ["HUP", "UPGRADES", "DoorRunner", "Head", "Upgrade", "new_loop", "parse_head", "run"]

log = logging.getLogger(__name__)

HEAD_LIMIT = 8192  # a longer request head is aiohttp's to refuse
HEAD_TIMEOUT_S = 75.0  # a connection that says nothing is closed (aiohttp's keep-alive time)


class Head(NamedTuple):
    """The head of an HTTP/1.1 request: header names in lower case, repeated ones joined."""

    method: str
    path: str
    query: str
    version: str
    headers: dict[str, str]
    raw: bytes  # as received, with the blank line: what aiohttp gets if it is handed over


def parse_head(data: bytes) -> Head | None:
    """The request head in ``data`` (without the blank line), or None if malformed."""
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        return None
    lines = text.split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[1].startswith("/"):
        return None
    method, target, version = parts
    path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return Head(method, path, query, version, headers, data + b"\r\n\r\n")


# (doorway, head, transport) -> the connection's protocol from now on (it has answered or
# will answer the request), or None to let aiohttp serve the connection
Upgrade = Callable[["Doorway", Head, asyncio.Transport], "asyncio.Protocol | None"]
# {path: Upgrade}; a path ending in "/" takes every path under it
UPGRADES = web.AppKey[dict[str, Upgrade]]("door_upgrades")
# Called on SIGHUP, after this process reloaded its certificate (the main process tells its
# gateway workers)
HUP = web.AppKey[list[Callable[[], None]]]("door_hup")


def _switch(transport: asyncio.Transport, protocol: asyncio.Protocol, data: bytes) -> None:
    """``protocol`` serves ``transport`` from now on, starting with ``data`` (bytes already
    received that are its to read)."""
    transport.set_protocol(protocol)
    protocol.connection_made(transport)
    if data:
        protocol.data_received(data)


class Door(asyncio.Protocol):
    """A new connection until its first request head says who serves it."""

    __slots__ = ("_head", "_timer", "doorway", "fast", "transport")

    def __init__(self, doorway: Doorway, *, fast: bool = True) -> None:
        self.doorway = doorway
        self.fast = fast and doorway.fast is not None  # may go to the fast path
        self.transport: asyncio.Transport | None = None
        self._head = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(HEAD_TIMEOUT_S, transport.close)

    def data_received(self, data: bytes) -> None:
        head = self._head + data if self._head else data
        if self.fast and may_be_fast(head):
            if len(head) < len(PREFIX):
                self._head = head  # not yet sure
            else:
                self._go_fast(head)
            return
        if not self.doorway.may_upgrade(head):
            self._hand_over(head)
            return
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > HEAD_LIMIT:
                self._hand_over(head)
            else:
                self._head = head
            return
        try:
            protocol = self.doorway.upgrade(parse_head(head[:end]), self.transport)
        except Exception:
            log.exception("taking over a connection failed: aiohttp serves it")
            protocol = None
        if protocol is None:
            self._hand_over(head)
            return
        transport = self.transport
        assert transport is not None
        self._decided()
        _switch(transport, protocol, head[end + 4 :])

    def eof_received(self) -> bool:
        return False  # a connection that ends before its first request: close it

    def connection_lost(self, exc: Exception | None) -> None:
        self._decided()

    def _decided(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.transport = None
        self._head = b""

    def _hand_over(self, head: bytes) -> None:
        transport = self.transport
        assert transport is not None
        self._decided()
        self.doorway.hand_over(transport, head)

    def _go_fast(self, data: bytes) -> None:
        transport = self.transport
        assert transport is not None
        fast = self.doorway.fast
        assert fast is not None
        self._decided()
        _switch(transport, FastHttp(fast, self.doorway), data)


class Doorway:
    """The runner's protocol factory: a :class:`Door` per connection; the rest of aiohttp's
    :class:`web.Server` (shutdown, connections) passes through."""

    def __init__(self, server: web.Server, app: web.Application) -> None:
        self.server = server
        self.app = app
        self.fast: Fast | None = app.get(FAST)  # the hot commands' fast path, if installed
        upgrades = app.get(UPGRADES)
        self._upgrades: dict[str, Upgrade] = dict(upgrades) if upgrades else {}
        self._prefixes = [f"GET {path}".encode() for path in self._upgrades]

    def __call__(self) -> asyncio.Protocol:
        if not self._prefixes and self.fast is None:
            return self.server()
        return Door(self)

    def may_upgrade(self, head: bytes) -> bool:
        """Whether ``head`` may still be (the start of) a request to an upgrade path."""
        for prefix in self._prefixes:
            if len(head) <= len(prefix):
                if prefix.startswith(head):
                    return True
            elif head.startswith(prefix) and (prefix.endswith(b"/") or head[len(prefix)] in b" ?"):
                return True
        return False

    def upgrade(self, head: Head | None, transport: Any) -> asyncio.Protocol | None:
        if head is None or head.method != "GET" or head.version != "HTTP/1.1":
            return None
        if head.headers.get("content-length", "0") != "0" or "transfer-encoding" in head.headers:
            return None
        upgrade = self._upgrades.get(head.path)
        if upgrade is None:
            for path, under in self._upgrades.items():
                if path.endswith("/") and head.path.startswith(path) and head.path != path:
                    upgrade = under
                    break
        return upgrade(self, head, transport) if upgrade is not None else None

    def hand_over(self, transport: asyncio.Transport, data: bytes) -> None:
        """aiohttp serves ``transport`` from now on, starting with ``data``."""
        _switch(transport, self.server(), data)

    def reopen(self, transport: asyncio.Transport, data: bytes, *, fast: bool = True) -> None:
        """The connection's next request passes the door again (keep-alive after a request
        a taker served), starting with ``data`` already received; with ``fast=False`` not
        to the fast path (which just gave it back)."""
        _switch(transport, Door(self, fast=fast), data)

    # What aiohttp's runner asks of its server.
    def pre_shutdown(self) -> None:
        self.server.pre_shutdown()
        for connection in list(self.app.get(FAST_CONNECTIONS, ())):
            connection.close()  # idle ones now, busy ones once answered

    async def shutdown(self, timeout: float | None = None) -> None:  # noqa: ASYNC109 (aiohttp's)
        await self.server.shutdown(timeout)
        fast = self.app.get(FAST_CONNECTIONS, set())
        busy = [c.task for c in fast if c.task is not None]
        if busy:  # requests in flight on the fast path finish (their replies go out)
            await asyncio.wait(busy, timeout=timeout)
        for connection in list(fast):
            connection.abort()

    @property
    def connections(self) -> list[Any]:
        return self.server.connections

    def refused(self, peer: str) -> float:
        """How long new connections from ``peer`` are still refused (0: not refused), asked
        by the listening site (:mod:`gateway.accept`) before anything is made for one."""
        refusals = self.app.get(PENALTIES)
        return 0.0 if refusals is None else refusals.refused(peer)

    def silenced(self) -> dict[str, float]:
        """The addresses whose connections the listening site should have the kernel drop,
        and for how long (gateway/penalty.py)."""
        refusals = self.app.get(PENALTIES)
        return {} if refusals is None else refusals.silenced()


class HttpErrors:
    """The logger aiohttp's request handlers get: a request that fails as HTTP
    (``HttpProcessingError``: a malformed head, a line too long) is counted against its
    sender (gateway/penalty.py) and logged at debug level, not with its traceback at error
    level (a line per request of a flood of them); everything else goes to aiohttp's logger."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.logger = logging.getLogger("aiohttp.server")

    def _offence(self, args: tuple[Any, ...], exc_info: Any) -> bool:
        if not isinstance(exc_info, HttpProcessingError):
            return False
        peer = args[1] if len(args) > 1 and isinstance(args[1], str) else None
        offend(self.app, peer, "malformed", type(exc_info).__name__)
        return True

    def exception(self, *args: Any, exc_info: Any = True, **kw: Any) -> None:
        if self._offence(args, exc_info):
            self.logger.debug(*args, **kw)
        else:
            self.logger.exception(*args, exc_info=exc_info, **kw)

    def debug(self, *args: Any, exc_info: Any = None, **kw: Any) -> None:
        if self._offence(args, exc_info):
            self.logger.debug(*args, **kw)
        else:
            self.logger.debug(*args, exc_info=exc_info, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)


class DoorRunner(web.AppRunner):
    """An AppRunner whose connections pass the :class:`Door`, and whose request handlers
    count the requests that fail as HTTP (:class:`HttpErrors`)."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("logger", HttpErrors(app))
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return Doorway(server, self.app)  # type: ignore[return-value]


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's (libuv), unless ``EVQ_UVLOOP=0`` asks for asyncio's.

    The shards get the same from Ray, which runs an async actor on uvloop when it is installed
    and ``RAY_USE_UVLOOP`` is not ``0`` (:mod:`gateway.server` sets that from ``EVQ_UVLOOP``).
    """
    if os.environ.get("EVQ_UVLOOP", "1") != "0":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(
    app: web.Application,
    *,
    host: str,
    port: int,
    reuse_port: bool = False,
    backlog: int = 4096,
    shutdown_timeout: float = 60.0,
    on_listening: Callable[[], None] | None = None,
    tls: tuple[str, str] | None = None,
) -> None:
    """Serve ``app`` until SIGINT or SIGTERM, then shut it down gracefully; with ``tls``
    (certificate and key files) over HTTPS, the pair reloaded when the files change and on
    SIGHUP (:mod:`gateway.tls`).

    Raises:
        gateway.tls.TlsError: the certificate and key do not load.
    """
    certificates = Certificates(*tls) if tls is not None else None
    loop = new_loop()
    asyncio.set_event_loop(loop)
    main = loop.create_task(
        _serve(app, host, port, reuse_port, backlog, shutdown_timeout, on_listening, certificates)
    )
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main.done():
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(main)
        finally:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


async def _serve(
    app: web.Application,
    host: str,
    port: int,
    reuse_port: bool,
    backlog: int,
    shutdown_timeout: float,
    on_listening: Callable[[], None] | None,
    certificates: Certificates | None,
) -> None:
    runner = DoorRunner(
        app,
        handle_signals=True,
        access_log=None,
        shutdown_timeout=shutdown_timeout,
        # A client that hangs up cancels its handler: a waiting take must not go on
        # waiting (and reserve a message) for a connection that is gone.
        handler_cancellation=True,
    )
    await runner.setup()
    watch: asyncio.Future[None] | None = None
    try:
        # Not web.TCPSite: under uvloop it takes one new connection per turn of the loop
        # (gateway.accept says what that did under overload).
        context = certificates.context if certificates is not None else None
        site = AcceptSite(
            runner, host, port, backlog=backlog, reuse_port=reuse_port, ssl_context=context
        )
        await site.start()
        if certificates is not None:
            watch = asyncio.ensure_future(certificates.watch())
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, _hangup, certificates, app.get(HUP, []))
        if on_listening is not None:
            on_listening()
        await asyncio.Event().wait()
    finally:
        if watch is not None:
            watch.cancel()
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await runner.cleanup()


def _hangup(certificates: Certificates, hooks: list[Callable[[], None]]) -> None:
    certificates.reload()
    for hook in hooks:
        hook()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
