"""A listening site that takes every waiting connection when its socket is ready.

libuv (under uvloop) takes one connection per turn of the loop (libuv pull request 3696, 2022:
level-triggered polling brings the next): under load, when a turn of the gateway's loop lasts
tens of milliseconds, a burst of new connections waits in the kernel's accept queue, taken at
~10-20 a second. Measured with
``loadtest/overload.py`` (10x the sustainable puts, open loop, 2 gateway processes on
2 cores): 500 connections queued for seconds, requests on new connections answered after
up to 11 s while the gateway had served each within 2 s of reading it; asyncio's own loop,
which takes up to ``backlog`` connections per readiness, kept the worst answer near 2 s.

:class:`AcceptSite` listens with its own socket and, each time the socket is readable, takes
up to :data:`ACCEPT_BATCH` connections and hands each to the loop
(``loop.connect_accepted_socket``) with the runner's protocol — the same on uvloop and on
asyncio.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

from aiohttp import web

__all__ = ["ACCEPT_BATCH", "AcceptSite", "Acceptor"]

log = logging.getLogger(__name__)

ACCEPT_BATCH = 512  # connections taken per readiness of the listening socket, at most
# Out of descriptors (EMFILE, ENFILE) or buffers: stop taking connections for a moment
# instead of spinning on a socket that stays readable (asyncio does the same).
RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
RESOURCE_PAUSE_S = 1.0


class Acceptor(asyncio.AbstractServer):
    """Takes the connections of one listening socket for a protocol factory."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Any,
        ssl: Any = None,
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._factory = factory
        self._ssl = ssl
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = asyncio.Event()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._ready)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._sock is None else (self._sock,)

    def _ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in RESOURCE_ERRORS:
                    log.error("accepting connections paused for %.0f s: %s", RESOURCE_PAUSE_S, exc)
                    self._loop.remove_reader(sock.fileno())
                    self._loop.call_later(RESOURCE_PAUSE_S, self._resume)
                    return
                continue  # one connection went wrong (ECONNABORTED...): the next ones
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _resume(self) -> None:
        if self._sock is not None:
            self._loop.add_reader(self._sock.fileno(), self._ready)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
        except Exception as exc:  # a TLS handshake that failed, a client already gone
            log.debug("a new connection was not set up: %r", exc)
            conn.close()

    # asyncio.AbstractServer
    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            self._loop.remove_reader(sock.fileno())
            sock.close()
            self._closed.set()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._sock is not None

    async def start_serving(self) -> None:
        return None  # serving since it was made

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def serve_forever(self) -> None:
        await self._closed.wait()


class AcceptSite(web.BaseSite):
    """aiohttp's ``TCPSite``, taking connections through an :class:`Acceptor`."""

    __slots__ = ("_host", "_port", "_reuse_port")

    def __init__(
        self,
        runner: web.BaseRunner,
        host: str,
        port: int,
        *,
        backlog: int = 4096,
        reuse_port: bool = False,
        ssl_context: Any = None,
    ) -> None:
        super().__init__(runner, backlog=backlog, ssl_context=ssl_context)
        self._host, self._port, self._reuse_port = host, port, reuse_port

    @property
    def name(self) -> str:
        scheme = "https" if self._ssl_context else "http"
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"{scheme}://{host}:{self.port}"

    @property
    def port(self) -> int:
        """The bound port (the one asked for, or the one the system chose for 0)."""
        server = self._server
        if isinstance(server, Acceptor) and server.sockets:
            return int(server.sockets[0].getsockname()[1])
        return self._port

    async def start(self) -> None:
        await super().start()
        family = socket.AF_INET6 if ":" in self._host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self._reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self._host, self._port))
            sock.listen(self._backlog)
        except OSError:
            sock.close()
            raise
        server = self._runner.server
        assert server is not None
        self._server = Acceptor(asyncio.get_running_loop(), sock, server, self._ssl_context)
