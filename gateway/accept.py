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
import contextlib
import ctypes
import errno
import ipaddress
import logging
import math
import socket
import struct
from collections.abc import Callable
from typing import Any

from aiohttp import web

__all__ = ["ACCEPT_BATCH", "AcceptSite", "Acceptor"]

log = logging.getLogger(__name__)

ACCEPT_BATCH = 512  # connections taken per readiness of the listening socket, at most
# Out of descriptors (EMFILE, ENFILE) or buffers: stop taking connections for a moment
# instead of spinning on a socket that stays readable (asyncio does the same).
RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
RESOURCE_PAUSE_S = 1.0
_DROPPED = bytearray(65536)  # what a refused connection sent, read and dropped
_REFUSED_BODY = (
    b'{"error": {"code": "Overloaded", "message": "this address sent too many requests'
    b' that failed as HTTP; retry later"}}'
)
_REFUSED = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: %d\r\n"
    b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
)


# Linux socket filters (classic BPF) on the listening socket: SYNs from the silenced
# addresses are dropped before a connection exists. The program reads the IPv4 source
# address (the network header's bytes 12-15, reached at SKF_NET_OFF) and compares it with
# each address: two instructions an address (a jump may not reach past 255 of them).
_SO_ATTACH_FILTER = 26
_SO_DETACH_FILTER = 27
_SKF_NET_OFF = -0x100000
_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_KEEP, _DROP = 0xFFFFFFFF, 0


def _ipv4(address: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(address), ipaddress.IPv4Address)
    except ValueError:
        return False


def _attach_filter(sock: socket.socket, addresses: list[str]) -> None:
    """Drop the TCP segments ``sock`` receives from ``addresses`` (none: no filter)."""
    if not addresses:
        with contextlib.suppress(OSError):  # none attached yet
            sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
        return
    program = [(_BPF_LD_W_ABS, 0, 0, (_SKF_NET_OFF + 12) & 0xFFFFFFFF)]
    for address in addresses:
        program.append((_BPF_JEQ_K, 0, 1, int(ipaddress.IPv4Address(address))))
        program.append((_BPF_RET_K, 0, 0, _DROP))
    program.append((_BPF_RET_K, 0, 0, _KEEP))
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in program))
    # struct sock_fprog {unsigned short len; struct sock_filter *filter;}: the kernel copies it
    fprog = struct.pack("HL", len(program), ctypes.addressof(code))
    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)


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
        # (address) -> seconds its connections are still refused; the factory's, if it
        # has one (gateway.door.Doorway: gateway/penalty.py)
        self._refused: Callable[[str], float] | None = getattr(factory, "refused", None)
        # () -> {address: seconds}: addresses the kernel should drop (gateway.door.Doorway)
        self._silenced: Callable[[], dict[str, float]] | None = getattr(factory, "silenced", None)
        self._dropping: frozenset[str] = frozenset()  # what the socket's filter drops now
        self._lift: asyncio.TimerHandle | None = None
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._ready)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._sock is None else (self._sock,)

    def _ready(self) -> None:
        sock = self._sock
        if sock is None:
            return
        refusals = 0
        for _ in range(ACCEPT_BATCH):
            try:
                conn, address = sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno in RESOURCE_ERRORS:
                    log.error("accepting connections paused for %.0f s: %s", RESOURCE_PAUSE_S, exc)
                    self._loop.remove_reader(sock.fileno())
                    self._loop.call_later(RESOURCE_PAUSE_S, self._resume)
                    break
                continue  # one connection went wrong (ECONNABORTED...): the next ones
            conn.setblocking(False)
            if self._refused is not None and address:
                wait = self._refused(address[0])
                if wait > 0:
                    self._refuse(conn, wait)
                    refusals += 1
                    continue
            if self._dropping:  # the listening socket's filter is for new connections only
                with contextlib.suppress(OSError):
                    conn.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
            task = self._loop.create_task(self._connect(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if refusals:
            self._drop_silenced()

    def _drop_silenced(self) -> None:
        """Have the kernel drop the new connections of the silenced addresses (a filter on
        the listening socket discards their SYNs: they are never accepted, never answered),
        until the first of their bans ends; then look again."""
        sock = self._sock
        if self._lift is not None:
            self._lift.cancel()
            self._lift = None
        if sock is None or self._silenced is None or sock.family != socket.AF_INET:
            return  # the filter reads IPv4 heads; IPv6 addresses keep their 429s
        silenced = self._silenced()
        wanted = frozenset(a for a in silenced if _ipv4(a))
        if wanted != self._dropping:
            try:
                _attach_filter(sock, sorted(wanted))
            except OSError as exc:
                log.warning("could not have the kernel drop refused addresses: %s", exc)
                self._silenced = None  # not on this system: refusing at accept goes on
                return
            for address in sorted(wanted - self._dropping):
                log.warning(
                    "dropping connections from %s unanswered for %.0f s: it goes on "
                    "connecting while refused",
                    address,
                    silenced[address],
                )
            self._dropping = wanted
        if wanted:
            ends = min(silenced[a] for a in wanted)
            self._lift = self._loop.call_later(ends + 0.01, self._drop_silenced)

    def _refuse(self, conn: socket.socket, wait: float) -> None:
        """Close a connection from a refused address at once: on plain HTTP after a 429
        saying for how long (what it sent so far is read and dropped first, so the close
        does not reset the answer away), on TLS without a word (no handshake is spent)."""
        try:
            if self._ssl is None:
                with contextlib.suppress(BlockingIOError):
                    conn.recv_into(_DROPPED)  # no allocation per refused connection
                conn.send(_REFUSED % (math.ceil(wait), len(_REFUSED_BODY), _REFUSED_BODY))
        except OSError:
            pass
        finally:
            conn.close()

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
        if self._lift is not None:
            self._lift.cancel()
            self._lift = None
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
