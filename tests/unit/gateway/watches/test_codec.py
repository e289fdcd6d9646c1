"""The WebSocket wire of watch connections: server frames, the handshake, and the reader of
client frames — fed bytes cut anywhere, fragmented messages, control frames in between, and
every way a client can break the protocol."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.watches.codec import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameError,
    MessageReader,
    accept_key,
    close_code,
    close_frame,
    handshake_reply,
    pong_frame,
    text_frame,
    valid_client_key,
)

OP_CONTINUATION = 0


def client_frame(op: int, payload: bytes, *, fin: bool = True, mask: bytes = b"\x0f\xa0\x55\x01",
                 masked: bool = True, rsv: int = 0) -> bytes:  # fmt: skip
    """A frame as a client sends it (masked)."""
    first = (0x80 if fin else 0) | rsv | op
    n = len(payload)
    bit = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, bit | n))
    elif n < 1 << 16:
        head = struct.pack("!BBH", first, bit | 126, n)
    else:
        head = struct.pack("!BBQ", first, bit | 127, n)
    if not masked:
        return head + payload
    body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    return head + mask + body


def server_payload(frame: bytes) -> tuple[int, bytes]:
    """(first byte, payload) of an unmasked server frame."""
    n = frame[1] & 0x7F
    start = 2
    if n == 126:
        n, start = struct.unpack("!H", frame[2:4])[0], 4
    elif n == 127:
        n, start = struct.unpack("!Q", frame[2:10])[0], 10
    assert not frame[1] & 0x80, "server frames are never masked"
    assert len(frame) == start + n
    return frame[0], frame[start:]


# ------------------------------------------------------------------ server frames


@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 70_000])
def test_text_frames_carry_any_size(size: int) -> None:
    payload = b"x" * size
    assert server_payload(text_frame(payload)) == (0x81, payload)


def test_close_and_pong_frames() -> None:
    first, payload = server_payload(close_frame(4008, "r" * 200))
    assert first == 0x88
    assert close_code(payload) == 4008
    assert len(payload) == 125, "a control frame's payload is at most 125 bytes"
    assert server_payload(pong_frame(b"abc")) == (0x8A, b"abc")


# ------------------------------------------------------------------ handshake


def test_the_handshake_answers_rfc_6455s_example() -> None:
    headers = {
        "upgrade": "websocket",
        "connection": "keep-alive, Upgrade",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
    }
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    reply = handshake_reply(headers)
    assert reply is not None
    assert reply.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
    assert b"\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n" in reply
    assert reply.endswith(b"\r\n\r\n")


@pytest.mark.parametrize(
    "change",
    [
        {"upgrade": "h2c"},
        {"connection": "keep-alive"},
        {"sec-websocket-version": "8"},
        {"sec-websocket-key": "short"},
        {"sec-websocket-key": "not base64 at all!!!!!!="},
        {"sec-websocket-key": ""},
    ],
)
def test_invalid_handshakes_are_declined(change: dict[str, str]) -> None:
    headers = {
        "upgrade": "WebSocket",
        "connection": "Upgrade",
        "sec-websocket-key": "dGhlIHNhbXBsZSBub25jZQ==",
        "sec-websocket-version": "13",
    }
    assert handshake_reply(headers) is not None
    assert handshake_reply({**headers, **change}) is None


def test_client_keys_are_16_bytes_of_base64() -> None:
    assert valid_client_key("AAAAAAAAAAAAAAAAAAAAAA==")
    assert not valid_client_key("AAAAAAAAAAAAAAAAAAAA")
    assert not valid_client_key("é")


# ------------------------------------------------------------------ reading client frames


messages = st.lists(
    st.one_of(
        st.tuples(st.just(OP_TEXT), st.text(max_size=300).map(str.encode)),
        st.tuples(st.just(OP_BINARY), st.binary(max_size=300)),
        st.tuples(st.just(OP_PING), st.binary(max_size=125)),
        st.tuples(st.just(OP_PONG), st.binary(max_size=125)),
    ),
    max_size=12,
)


@given(
    messages=messages,
    pieces=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    masks=st.binary(min_size=4, max_size=4),
    cuts=st.lists(st.integers(0, 10_000), max_size=20),
)
def test_messages_survive_any_fragmentation_and_any_cut_of_the_bytes(
    messages: list[tuple[int, bytes]], pieces: list[int], masks: bytes, cuts: list[int]
) -> None:
    wire = b""
    for i, (op, payload) in enumerate(messages):
        if op >= OP_CLOSE:
            wire += client_frame(op, payload, mask=masks)
            continue
        # a data message in k fragments, with a ping between fragments when there are several
        k = min(pieces[i % len(pieces)], max(1, len(payload)))
        step = -(-len(payload) // k) if payload else 0
        parts = [payload[j : j + step] for j in range(0, len(payload), step)] if step else [b""]
        for j, part in enumerate(parts):
            wire += client_frame(
                op if j == 0 else OP_CONTINUATION, part, fin=j == len(parts) - 1, mask=masks
            )
            if j == 0 and len(parts) > 1:
                wire += client_frame(OP_PING, b"between", mask=masks)
    reader = MessageReader(max_size=1 << 20)
    got: list[tuple[int, bytes]] = []
    edges = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})
    for a, b in itertools.pairwise(edges):
        got += reader.feed(wire[a:b])
    assert [m for m in got if m != (OP_PING, b"between")] == messages


def test_a_frame_cut_after_any_byte_waits_for_the_rest() -> None:
    wire = client_frame(OP_TEXT, b"x" * 300)  # a 16-bit length
    reader = MessageReader(max_size=1000)
    for i in range(len(wire) - 1):
        assert reader.feed(wire[i : i + 1]) == []
    assert reader.feed(wire[-1:]) == [(OP_TEXT, b"x" * 300)]


def test_a_close_frame_is_returned_with_its_code() -> None:
    reader = MessageReader(max_size=100)
    [(op, payload)] = reader.feed(client_frame(OP_CLOSE, struct.pack("!H", 1001) + b"bye"))
    assert op == OP_CLOSE
    assert close_code(payload) == 1001
    [(op, payload)] = reader.feed(client_frame(OP_CLOSE, b""))
    assert close_code(payload) == 1005


@pytest.mark.parametrize(
    ("wire", "code"),
    [
        (client_frame(OP_TEXT, b"hi", masked=False), 1002),
        (client_frame(OP_TEXT, b"hi", rsv=0x40), 1002),
        (client_frame(3, b"hi"), 1002),
        (client_frame(OP_CONTINUATION, b"hi"), 1002),
        (client_frame(OP_TEXT, b"a", fin=False) + client_frame(OP_TEXT, b"b"), 1002),
        (client_frame(OP_PING, b"p", fin=False), 1002),
        (client_frame(OP_PING, b"p" * 126), 1002),
        (client_frame(OP_CLOSE, b"\x03"), 1002),
        (client_frame(OP_CLOSE, struct.pack("!H", 999)), 1002),
        (client_frame(OP_CLOSE, struct.pack("!H", 1000) + b"\xff"), 1002),
        (client_frame(OP_TEXT, b"\xff\xfe"), 1007),
        (client_frame(OP_TEXT, b"x" * 101), 1009),
        (client_frame(OP_TEXT, b"x" * 60, fin=False) + client_frame(0, b"x" * 60), 1009),
    ],
    ids=[
        "unmasked",
        "reserved-bit",
        "unknown-opcode",
        "orphan-continuation",
        "message-inside-fragmented-message",
        "fragmented-ping",
        "long-ping",
        "one-byte-close",
        "invalid-close-code",
        "close-reason-not-utf8",
        "text-not-utf8",
        "too-big",
        "too-big-in-fragments",
    ],
)
def test_protocol_breaches_raise_the_close_code_to_send(wire: bytes, code: int) -> None:
    reader = MessageReader(max_size=100)
    with pytest.raises(FrameError) as caught:
        reader.feed(wire)
    assert caught.value.code == code
    assert caught.value.reason
