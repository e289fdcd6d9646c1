"""WebSocket frames made once and written to many connections (RFC 6455, server side).

A change of a key is sent to every armed watcher with the same bytes, so the gateway builds
the frame once and writes it to each connection's transport — no per-recipient encoding,
no per-recipient task. Server frames are never masked; watch connections never negotiate
compression, so a frame is just a header and the payload.
"""

from __future__ import annotations

import struct

__all__ = ["close_frame", "text_frame"]

_FIN_TEXT = 0x81
_FIN_CLOSE = 0x88


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
    return _frame(_FIN_TEXT, payload)


def close_frame(code: int, reason: str = "") -> bytes:
    """A close frame with ``code`` and a reason of at most 123 bytes."""
    return _frame(_FIN_CLOSE, struct.pack("!H", code) + reason.encode()[:123])
