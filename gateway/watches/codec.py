"""The WebSocket wire of watch connections, server side (RFC 6455): pure, bytes in and out.

Server frames are made once and written to many connections: a change of a key goes to
every armed watcher with the same bytes, so the gateway builds the frame once and writes it
to each connection's transport — no per-recipient encoding, no per-recipient task. Server
frames are never masked; watch connections never negotiate extensions (no compression), so
a frame is just a header and the payload.

Client frames are read by :class:`MessageReader`, which keeps plain state (the unread bytes,
the parts of a fragmented message) and turns bytes into whole messages; a breach of the
protocol raises :class:`FrameError` with the close code to answer with. The connection
(``gateway.watches.websocket.WsProtocol``) does the I/O.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Mapping

__all__ = [
    "CLOSE_NORMAL",
    "CLOSE_NO_STATUS",
    "OP_BINARY",
    "OP_CLOSE",
    "OP_PING",
    "OP_PONG",
    "OP_TEXT",
    "FrameError",
    "MessageReader",
    "accept_key",
    "close_code",
    "close_frame",
    "handshake_reply",
    "pong_frame",
    "text_frame",
    "valid_client_key",
]

OP_CONTINUATION = 0x0
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
_OPCODES = frozenset((OP_CONTINUATION, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG))

CLOSE_NORMAL = 1000
CLOSE_PROTOCOL_ERROR = 1002
CLOSE_NO_STATUS = 1005  # a close frame without a code (never sent back)
CLOSE_INVALID_DATA = 1007
CLOSE_TOO_BIG = 1009

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


# ------------------------------------------------------------------ server frames


def _frame(first: int, payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        head = bytes((first, n))
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, 126, n)
    else:
        head = struct.pack("!BBQ", first, 127, n)
    return head + payload


def text_frame(payload: bytes) -> bytes:
    """One unmasked, final text frame carrying ``payload`` (UTF-8 JSON)."""
    return _frame(0x80 | OP_TEXT, payload)


def close_frame(code: int, reason: str = "") -> bytes:
    """A close frame with ``code`` and a reason of at most 123 bytes."""
    return _frame(0x80 | OP_CLOSE, struct.pack("!H", code) + reason.encode()[:123])


def pong_frame(payload: bytes) -> bytes:
    """The answer to a ping: the same application data (at most 125 bytes)."""
    return _frame(0x80 | OP_PONG, payload[:125])


# ------------------------------------------------------------------ handshake


def valid_client_key(key: str) -> bool:
    """``Sec-WebSocket-Key`` must be 16 bytes in base64."""
    try:
        return len(base64.b64decode(key.encode("ascii"), validate=True)) == 16
    except (ValueError, UnicodeEncodeError):
        return False


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode()


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def handshake_reply(headers: Mapping[str, str]) -> bytes | None:
    """The ``101 Switching Protocols`` answer to a client's opening handshake (header names
    in lower case), or None when the request is not a valid WebSocket upgrade. No
    subprotocol and no extension is ever selected."""
    key = headers.get("sec-websocket-key", "")
    if (
        "websocket" not in _tokens(headers.get("upgrade", ""))
        or "upgrade" not in _tokens(headers.get("connection", ""))
        or headers.get("sec-websocket-version") != "13"
        or not valid_client_key(key)
    ):
        return None
    return (
        "HTTP/1.1 101 Switching Protocols\r\n"
        "Upgrade: websocket\r\n"
        "Connection: Upgrade\r\n"
        f"Sec-WebSocket-Accept: {accept_key(key)}\r\n\r\n"
    ).encode("ascii")


# ------------------------------------------------------------------ client frames


class FrameError(Exception):
    """The client broke the protocol: close the connection with ``code``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


def _unmask(data: bytes, mask: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return data
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")


def close_code(payload: bytes) -> int:
    """The code of a client's close frame (``CLOSE_NO_STATUS`` when it has none)."""
    if len(payload) < 2:
        return CLOSE_NO_STATUS
    return int.from_bytes(payload[:2], "big")


def _valid_close_payload(payload: bytes) -> bool:
    if not payload:
        return True
    if len(payload) == 1:
        return False
    code = close_code(payload)
    if not (code in (1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011) or 3000 <= code < 5000):
        return False
    try:
        payload[2:].decode()
    except UnicodeDecodeError:
        return False
    return True


class MessageReader:
    """Client frames → whole messages ``(opcode, payload)``; control frames as they come.

    Text payloads are checked to be UTF-8; a message over ``max_size`` bytes, an unmasked
    or malformed frame raises :class:`FrameError`.
    """

    __slots__ = ("_buf", "_op", "_partial", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = b""
        self._partial: bytearray | None = None  # a fragmented message being read
        self._op = 0

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        """The messages ``data`` completes, in order."""
        buf = self._buf + data if self._buf else data
        out: list[tuple[int, bytes]] = []
        pos = 0
        while True:
            frame = self._frame(buf, pos)
            if frame is None:
                break
            fin, op, payload, pos = frame
            message = self._message(fin, op, payload)
            if message is not None:
                out.append(message)
        self._buf = buf[pos:]
        return out

    def _frame(self, buf: bytes, pos: int) -> tuple[bool, int, bytes, int] | None:
        """The frame at ``pos``: (fin, opcode, unmasked payload, end), or None if incomplete."""
        n = len(buf) - pos
        if n < 2:
            return None
        b0, b1 = buf[pos], buf[pos + 1]
        if b0 & 0x70:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "reserved bits set: no extension is in use")
        fin, op = bool(b0 & 0x80), b0 & 0x0F
        if op not in _OPCODES:
            raise FrameError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {op}")
        if not b1 & 0x80:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
        length, head = b1 & 0x7F, 2
        if op >= OP_CLOSE and (not fin or length > 125):
            raise FrameError(CLOSE_PROTOCOL_ERROR, "control frames are final and short")
        if length == 126:
            if n < 4:
                return None
            length, head = int.from_bytes(buf[pos + 2 : pos + 4], "big"), 4
        elif length == 127:
            if n < 10:
                return None
            length, head = int.from_bytes(buf[pos + 2 : pos + 10], "big"), 10
        pending = len(self._partial) if self._partial and op == OP_CONTINUATION else 0
        if length + pending > self.max_size:
            raise FrameError(CLOSE_TOO_BIG, f"messages are at most {self.max_size} bytes")
        start = pos + head + 4
        end = start + length
        if len(buf) < end:
            return None
        return fin, op, _unmask(buf[start:end], buf[start - 4 : start]), end

    def _message(self, fin: bool, op: int, payload: bytes) -> tuple[int, bytes] | None:
        if op >= OP_CLOSE:
            if op == OP_CLOSE and not _valid_close_payload(payload):
                raise FrameError(CLOSE_PROTOCOL_ERROR, "malformed close frame")
            return op, payload
        if op == OP_CONTINUATION:
            if self._partial is None:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "continuation without a message")
            self._partial += payload
            if not fin:
                return None
            op, payload = self._op, bytes(self._partial)
            self._partial = None
        elif self._partial is not None:
            raise FrameError(CLOSE_PROTOCOL_ERROR, "a new message inside a fragmented one")
        elif not fin:
            self._partial, self._op = bytearray(payload), op
            return None
        if op == OP_TEXT:
            try:
                payload.decode()
            except UnicodeDecodeError:
                raise FrameError(CLOSE_INVALID_DATA, "text messages must be UTF-8") from None
        return op, payload
