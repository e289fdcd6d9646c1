"""The watchers of a client process: one connection each on a raw non-blocking socket,
driven by the event loop's ``add_reader`` (no transport, protocol or task per connection).

:class:`WsWatcher` speaks WebSocket ``/v1/ws`` with a minimal client of its own
(:func:`ws_client_frame`); :class:`PollWatcher` long-polls ``GET /v1/watch/{key}`` on one
keep-alive connection. Both follow the one-shot protocol (after each event they arm the key
again with the version they got) and report to their swarm: what they need of it is
:class:`Reporter` (``swarm.client.Swarm`` is one; this module does not import it, so the two
do not import each other).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import random
import socket
import struct
from typing import Protocol

import msgspec

from .common import WS_GUID, now

__all__ = [
    "ARMED",
    "CLOSED",
    "CONNECTING",
    "OPEN",
    "SO_TIMESTAMPNS",
    "PollWatcher",
    "Reporter",
    "Watcher",
    "WsWatcher",
    "ws_client_frame",
]

SO_TIMESTAMPNS = 35  # Linux: the kernel's receive time of the data, with recvmsg
_TIMESPEC = struct.Struct("qq")
_LINGER_RESET = struct.pack("ii", 1, 0)  # close with RST

# Watcher states
CONNECTING, OPEN, ARMED, CLOSED = 0, 1, 2, 3


class Reporter(Protocol):
    """What a watcher needs of the swarm that drives it (``swarm.client.Swarm``)."""

    loop: asyncio.AbstractEventLoop
    closing: bool
    host_header: bytes
    watch_json: list[bytes]
    poll_request: list[bytes]

    def on_event(self, w: Watcher, version: int, t: float, k: float) -> None: ...

    def lost(self, w: Watcher, was: int) -> None: ...

    def note_error(self, what: str) -> None: ...

    def armed(self) -> None: ...


class ServerMsg(msgspec.Struct):
    """What the client reads of a server message (the value is skipped)."""

    op: str
    key: str | None = None
    version: int | None = None
    code: str | None = None
    message: str | None = None


class KeyDoc(msgspec.Struct):
    key: str
    version: int


_ws_decoder = msgspec.json.Decoder(ServerMsg)
_key_decoder = msgspec.json.Decoder(KeyDoc)


def ws_client_frame(payload: bytes, opcode: int = 1) -> bytes:
    """One masked, final client frame (RFC 6455 requires clients to mask)."""
    n = len(payload)
    if n < 126:
        head = bytes((0x80 | opcode, 0x80 | n))
    else:
        head = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    mask = random.randbytes(4)
    rep = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(n, "big")
    return head + mask + masked


class Watcher:
    """One watcher connection on a raw non-blocking socket.

    The event loop calls :meth:`readable` when data is there (``add_reader``: no transport,
    no protocol object, no task); it reads with ``recvmsg`` to get the kernel's receive
    timestamp of the data (``SO_TIMESTAMPNS``, CLOCK_REALTIME) next to the time this process
    handled it (monotonic). Writes are small and go straight to ``send``; what the kernel does
    not take at once waits for ``add_writer``.
    """

    __slots__ = (
        "buf",
        "events",
        "fd",
        "k_event",
        "kidx",
        "opened",
        "out",
        "sock",
        "state",
        "swarm",
        "t_event",
        "version",
    )

    def __init__(self, swarm: Reporter, kidx: int, version: int) -> None:
        self.swarm = swarm
        self.kidx = kidx
        self.version = version
        self.t_event = 0.0  # monotonic: when this process handled the latest event
        self.k_event = 0.0  # realtime: when the kernel received it
        self.events = 0
        self.state = CONNECTING
        self.sock: socket.socket | None = None
        self.fd = -1
        self.opened: asyncio.Future[None] | None = None
        self.buf = b""
        self.out = b""  # bytes the kernel did not take yet

    def start(self, sock: socket.socket) -> None:
        """The TCP connection is up: say hello and listen."""
        self.sock = sock
        self.fd = sock.fileno()
        self.swarm.loop.add_reader(self.fd, self.readable)
        self.write(self.hello())

    def hello(self) -> bytes:
        raise NotImplementedError

    def received(self, data: bytes, t: float, k: float) -> None:
        raise NotImplementedError

    def readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data, anc, _, _ = sock.recvmsg(262144, 64)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        if not data:
            self.lost(None)
            return
        k = 0.0
        for level, kind, stamp in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                sec, nsec = _TIMESPEC.unpack_from(stamp)
                k = sec + nsec * 1e-9
        self.received(data, now(), k)

    def write(self, data: bytes) -> None:
        sock = self.sock
        if sock is None:
            return
        if self.out:
            self.out += data
            return
        try:
            sent = sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self.lost(exc)
            return
        if sent < len(data):
            self.out = data[sent:]
            self.swarm.loop.add_writer(self.fd, self._flush)

    def _flush(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            sent = sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self.lost(exc)
            return
        self.out = self.out[sent:]
        if not self.out:
            self.swarm.loop.remove_writer(self.fd)

    def lost(self, exc: Exception | None) -> None:
        was = self.state
        self.close()
        self._fail_open(ConnectionError(f"connection lost: {exc or 'closed by the server'}"))
        if was in (OPEN, ARMED) and not self.swarm.closing:
            self.swarm.lost(self, was)

    def _fail_open(self, exc: Exception) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_exception(exc)

    def _set_open(self) -> None:
        if self.opened is not None and not self.opened.done():
            self.opened.set_result(None)

    def close(self) -> None:
        """Close at once with a reset (no TIME_WAIT left on this machine's ports)."""
        self.state = CLOSED
        sock, self.sock = self.sock, None
        if sock is None:
            return
        loop = self.swarm.loop
        loop.remove_reader(self.fd)
        if self.out:
            loop.remove_writer(self.fd)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        sock.close()


class WsWatcher(Watcher):
    """A WebSocket watcher: handshake, ``watch`` + ``ping``; each event → ``watch`` again."""

    __slots__ = ("accept",)

    def __init__(self, swarm: Reporter, kidx: int, version: int) -> None:
        super().__init__(swarm, kidx, version)
        self.accept = b""

    def hello(self) -> bytes:
        key = base64.b64encode(random.randbytes(16))
        self.accept = base64.b64encode(hashlib.sha1(key + WS_GUID).digest())
        return (
            b"GET /v1/ws HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
            % (self.swarm.host_header, key)
        )

    def received(self, data: bytes, t: float, k: float) -> None:
        if self.buf:
            data = self.buf + data
            self.buf = b""
        if self.state == CONNECTING:
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self.buf = data
                return
            head, data = data[:end], data[end + 4 :]
            if not head.startswith(b"HTTP/1.1 101") or self.accept not in head:
                self.swarm.note_error(f"handshake: {head[:40]!r}")
                self._fail_open(ConnectionError(f"handshake refused: {head[:40]!r}"))
                self.close()
                return
            self.state = OPEN
            self._set_open()
            self.send_watch(self.version, ping=True)
        pos, n = 0, len(data)
        while n - pos >= 2:
            b0, ln, hl = data[pos], data[pos + 1] & 0x7F, 2
            if ln == 126:
                if n - pos < 4:
                    break
                ln, hl = int.from_bytes(data[pos + 2 : pos + 4], "big"), 4
            elif ln == 127:
                if n - pos < 10:
                    break
                ln, hl = int.from_bytes(data[pos + 2 : pos + 10], "big"), 10
            if n - pos < hl + ln:
                break
            self._frame(b0 & 0x0F, data[pos + hl : pos + hl + ln], t, k)
            pos += hl + ln
        if pos < n:
            self.buf = data[pos:]

    def _frame(self, opcode: int, payload: bytes, t: float, k: float) -> None:
        if opcode == 1:
            msg = _ws_decoder.decode(payload)
            if msg.op == "event":
                assert msg.version is not None
                self.swarm.on_event(self, msg.version, t, k)
                self.send_watch(msg.version)
            elif msg.op == "pong":
                if self.state == OPEN:
                    self.state = ARMED
                    self.swarm.armed()
            else:
                self.swarm.note_error(f"{msg.op}: {msg.code}: {msg.message}")
        elif opcode == 8:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            self.swarm.note_error(f"closed by the server with code {code}")
            self.lost(None)
        elif opcode == 9:  # a protocol ping: answer pong
            self.write(ws_client_frame(payload, 10))

    def send_watch(self, version: int, ping: bool = False) -> None:
        frame = ws_client_frame(self.swarm.watch_json[self.kidx] % version)
        if ping:
            frame += ws_client_frame(b'{"op":"ping","id":1}')
        self.write(frame)


class PollWatcher(Watcher):
    """A long-poll watcher on one keep-alive HTTP/1.1 connection.

    The first request asks with version 0 (answered at once: the key exists), which opens
    the watcher; from then on each answer's version is asked past again, and a 204 (the
    poll timed out) is asked again with the same version.
    """

    __slots__ = ()

    def __init__(self, swarm: Reporter, kidx: int, version: int) -> None:
        super().__init__(swarm, kidx, 0)

    def hello(self) -> bytes:
        return self.request(0)

    def request(self, version: int) -> bytes:
        return self.swarm.poll_request[self.kidx] % version

    def received(self, data: bytes, t: float, k: float) -> None:
        buf = self.buf + data if self.buf else data
        self.buf = b""
        while buf:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end]
            length = _content_length(head)
            if len(buf) < end + 4 + length:
                break
            body = buf[end + 4 : end + 4 + length]
            buf = buf[end + 4 + length :]
            self._response(int(head[9:12]), body, t, k)
        self.buf = buf

    def _response(self, status: int, body: bytes, t: float, k: float) -> None:
        if self.sock is None:
            return
        if status == 200:
            version = _key_decoder.decode(body).version
            if self.state == CONNECTING:
                self.version = version
                self.state = ARMED
                self.swarm.armed()
                self._set_open()
            else:
                self.swarm.on_event(self, version, t, k)
            self.write(self.request(self.version))
        elif status == 204:
            self.write(self.request(self.version))
        else:
            self.swarm.note_error(f"long poll answered {status}: {body[:80]!r}")
            if self.state == CONNECTING:
                self._fail_open(ConnectionError(f"answered {status}"))
                self.close()
                return
            self.swarm.loop.call_later(0.5, self._again)

    def _again(self) -> None:
        self.write(self.request(self.version))


def _content_length(head: bytes) -> int:
    i = head.lower().find(b"\r\ncontent-length:")
    if i < 0:
        return 0
    j = head.find(b"\r\n", i + 2)
    return int(head[i + 17 : j if j > 0 else len(head)])
