"""Every decoder that reads bytes from outside evq, as fuzz targets: ``target(data) -> None``.

A target feeds ``data`` to one decoder the way the server does (and to what the server does
next with a decoded value where that is pure: a put's body becomes a command, a query string
becomes an SQS call's typed parameters). The decoder may refuse the input, but only with the
errors it documents, which the server turns into a clear answer (:data:`EXPECTED`); any other
exception is a crash. ``loadtest/fuzz.py`` runs them under atheris (coverage-guided, with
libFuzzer's hang and memory limits); ``tests/unit/test_fuzz.py`` runs each under hypothesis in
the suite, and replays every crash ever found (``tests/data/fuzz/<target>/``).

Each target also gets seeds (:data:`SEEDS`): valid inputs the mutations start from.
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Callable
from urllib.parse import parse_qsl

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy

from actors import channel, handshake
from actors.core import snapshot as core_snapshot
from actors.errors import QueueError
from actors.log import codec, wal
from gateway import door, wire
from gateway.fast import FastHttp, Malformed, may_be_fast
from gateway.sqs import message_attrs, receipts
from gateway.sqs import sigv4 as sqs_sigv4
from gateway.sqs import wire as sqs_wire
from gateway.sqs.errors import SqsError
from gateway.watches import codec as ws_codec

__all__ = ["EXPECTED", "SEEDS", "TARGETS"]

Target = Callable[[bytes], None]

# What a decoder may raise on bad input: each is answered (400/413, an SQS error, a close
# code, a dropped connection, a damaged record skipped), none is a crash.
EXPECTED: tuple[type[BaseException], ...] = (
    QueueError,  # BadRequest, TooLarge, DataError (the log's damage)…
    SqsError,
    ws_codec.FrameError,
    msgspec.DecodeError,  # msgspec.ValidationError is one
    ConnectionError,  # the channel: a frame over the limit, a handshake refused
)

_NATIVE = [
    (wire.PutIn, wire.put_command),
    (wire.TakeIn, wire.take_command),
    (wire.AckIn, wire.ack_command),
    (wire.ReleaseIn, wire.release_command),
    (wire.TouchIn, wire.touch_command),
    (wire.MessagePatchIn, lambda req: wire.update_command("m-1", req)),
    (wire.QueueSettingsIn, lambda req: wire.new_settings("q", req)),
    (wire.KeyIn, lambda req: req),
]


def http_head(data: bytes) -> None:
    """The front door's and the fast path's reading of a request head."""
    may_be_fast(data)
    end = data.find(b"\r\n\r\n")
    head = data[:end] if end >= 0 else data
    door.parse_head(head)
    try:
        FastHttp._parse(None, data[: end + 4] if end >= 0 else data)  # type: ignore[arg-type]
    except Malformed as exc:  # answered 400 with llhttp's reason: one line of it
        reason = str(exc)
        if not reason or "\n" in reason:
            raise AssertionError(f"a malformed head's reason: {reason!r}") from exc


def _native(data: bytes, *, msgpack: bool) -> None:
    if not data:
        return
    type_, build = _NATIVE[data[0] % len(_NATIVE)]
    build(wire.decode(data[1:], type_, msgpack=msgpack))


def native_json(data: bytes) -> None:
    """A native API body as JSON (first byte: which request), then its command."""
    _native(data, msgpack=False)


def native_msgpack(data: bytes) -> None:
    """A native API body as msgpack, then its command."""
    _native(data, msgpack=True)


def _sqs_call(call: sqs_wire.Call) -> None:
    params = sqs_wire.Params(call.params, query=call.protocol == "query")
    attrs = params.values.get("MessageAttributes") or params.values.get("MessageAttribute")
    if isinstance(attrs, dict):
        message_attrs.parse_attributes(attrs)
    for name in ("QueueUrl", "MessageBody", "ReceiptHandle", "QueueName"):
        params.string(name)
    handle = params.values.get("ReceiptHandle")
    if handle is not None:
        receipts.decode_receipt(handle, None, b"k" * 32)


def sqs_json(data: bytes) -> None:
    """The SQS JSON protocol: X-Amz-Target (up to the first newline) and the body."""
    target, _, body = data.partition(b"\n")
    _sqs_call(sqs_wire.parse_json(target.decode("latin-1"), body))


def sqs_query(data: bytes) -> None:
    """The SQS query protocol: a form body."""
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return  # answered MalformedQueryString before parsing (gateway/sqs/handler.py)
    _sqs_call(sqs_wire.parse_query(parse_qsl(text, keep_blank_values=True)))


def sigv4(data: bytes) -> None:
    """An Authorization header (up to the first newline), and the canonical request of a
    request path (the rest) signed with its headers."""
    header, _, path = data.decode("latin-1").partition("\n")
    signature = sqs_sigv4.parse_authorization(header)
    headers = CIMultiDict({"host": "h", "x-amz-date": "20260101T000000Z"})
    sqs_sigv4.canonical_request(
        "POST", "/" + path, CIMultiDictProxy(headers), signature.signed_headers, "UNSIGNED"
    )


def receipt(data: bytes) -> None:
    """An SQS receipt handle."""
    receipts.decode_receipt(data.decode("latin-1"), None, b"k" * 32)


def websocket(data: bytes) -> None:
    """A WebSocket client's frames, cut in two reads (first byte: where)."""
    if not data:
        return
    reader = ws_codec.MessageReader(64 * 1024)
    cut = data[0] % max(1, len(data))
    reader.feed(data[1 : 1 + cut])
    reader.feed(data[1 + cut :])


def websocket_handshake(data: bytes) -> None:
    """A WebSocket opening handshake's headers."""
    head = door.parse_head(data)
    if head is not None:
        ws_codec.handshake_reply(head.headers)


def channel_frames(data: bytes) -> None:
    """The data channel: frames, the shard's reading of a request, the gateway's of a reply,
    a handshake's answer."""
    frames = channel._Frames()
    refused = (msgspec.DecodeError, UnicodeDecodeError)  # what both ends catch
    for frame in frames.feed(data):
        for decoder in (
            channel._request_decoder,  # the shard's reading
            channel._reply_decoder,  # the gateway's
            channel._challenge_decoder,  # the gateway's first frame
            channel._welcome_decoder,
        ):
            with contextlib.suppress(*refused):
                decoder.decode(frame)
    if len(data) >= 64:
        handshake.Server(b"s" * 16, True).accept(data[:32], data[32:64])


def segment(data: bytes) -> None:
    """A log segment object (header, framed records, zstd)."""
    codec.decode_segment(data)


def wal_block(data: bytes) -> None:
    """A local write-ahead log block and its groups."""
    block = wal.decode_block(data)
    wal.decode_groups(block)


def snapshot(data: bytes) -> None:
    """A snapshot object, then the state it holds."""
    _, _, body = codec.decode_snapshot_object(data)
    core_snapshot.restore(core_snapshot.decode_snapshot(body))


TARGETS: dict[str, Target] = {
    "http_head": http_head,
    "native_json": native_json,
    "native_msgpack": native_msgpack,
    "sqs_json": sqs_json,
    "sqs_query": sqs_query,
    "sigv4": sigv4,
    "receipt": receipt,
    "websocket": websocket,
    "websocket_handshake": websocket_handshake,
    "channel": channel_frames,
    "segment": segment,
    "wal_block": wal_block,
    "snapshot": snapshot,
}


def _log_seeds() -> tuple[bytes, bytes, bytes]:
    """A segment, a WAL block and a snapshot object of a queue with a few messages."""
    from actors.core import commands as c
    from actors.core.decide import execute
    from actors.core.state import QueueState
    from actors.ids import SequentialIds
    from actors.settings import QueueSettings

    state, ids, now = QueueState(), SequentialIds(), 1_700_000_000_000
    events = []
    for command in (
        c.Create("q", QueueSettings()),
        c.Put([c.NewMessage(body=b"m%d" % i, delay_ms=i * 1000) for i in range(5)]),
        c.Take(max=2),
    ):
        events += execute(state, command, now, ids)[0]
    segment = codec.encode_segment(1, 1, codec.encode_payloads(events))
    block = wal.encode_block(1, 1, [("q", 1, [wal.encode_record(e) for e in events])])
    snap = codec.encode_snapshot_object(
        1, len(events), core_snapshot.encode_snapshot(core_snapshot.snapshot(state))
    )
    return segment, block, snap


def _seeds() -> dict[str, list[bytes]]:
    segment, block, snap = _log_seeds()
    put = {"messages": [{"body": "aGk=", "delay": 1.5, "attributes": {"a": "b"}, "group": "g"}]}
    json_seeds = [
        bytes([i]) + json.dumps(doc).encode()
        for i, doc in enumerate(
            [
                put,
                {"max": 10, "wait": 1, "visibility_timeout": 30},
                {"items": [{"id": "m", "lease": "l"}]},
                {"items": [{"id": "m", "lease": "l", "delay": 2}]},
                {"items": [{"id": "m", "lease": "l", "visibility_timeout": 3}]},
                {"body": "x", "delay": 3},
                {"visibility_timeout": 30, "max_receives": 3, "fifo": False},
                {"value": {"a": [1, 2]}},
            ]
        )
    ]
    msgpack_seeds = [bytes([s[0]]) + msgspec.msgpack.encode(json.loads(s[1:])) for s in json_seeds]
    handle = receipts.encode_receipt("q", "m-1", "lease", b"k" * 32)
    return {
        "http_head": [
            b"POST /v1/queues/q/messages HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n"
            b"Content-Type: application/json\r\nAuthorization: Bearer t\r\n\r\n{}",
            b"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        ],
        "native_json": json_seeds,
        "native_msgpack": msgpack_seeds,
        "sqs_json": [
            b"AmazonSQS.SendMessage\n"
            + json.dumps(
                {
                    "QueueUrl": "http://h/000000000000/q",
                    "MessageBody": "x",
                    "MessageAttributes": {"a": {"DataType": "String", "StringValue": "v"}},
                }
            ).encode(),
            b"AmazonSQS.DeleteMessage\n" + json.dumps({"ReceiptHandle": handle}).encode(),
        ],
        "sqs_query": [
            b"Action=SendMessage&QueueUrl=http%3A%2F%2Fh%2Fq&MessageBody=x"
            b"&MessageAttribute.1.Name=a&MessageAttribute.1.Value.DataType=String"
            b"&MessageAttribute.1.Value.StringValue=v",
            b"Action=DeleteMessage&ReceiptHandle=" + handle.encode(),
        ],
        "sigv4": [
            b"AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/sqs/aws4_request, "
            b"SignedHeaders=host;x-amz-date, Signature=" + b"0" * 64
        ],
        "receipt": [handle.encode()],
        "websocket": [  # a masked text frame (a zero mask), cut after 5 bytes
            b"\x05\x81" + bytes([0x80 | 24]) + b"\x00" * 4 + b'{"op":"watch","key":"k"}'
        ],
        "websocket_handshake": [
            b"GET /v1/ws HTTP/1.1\r\nHost: h\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: "
            + base64.b64encode(b"0123456789abcdef")
            + b"\r\nSec-WebSocket-Version: 13"
        ],
        "channel": [
            channel._frame(channel._encoder.encode(channel.Status(1, True)))
            + channel._frame(channel._encoder.encode(channel.Challenge(b"k" * 32, True)))
        ],
        "segment": [segment],
        "wal_block": [block],
        "snapshot": [snap],
    }


SEEDS: dict[str, list[bytes]] = _seeds()
