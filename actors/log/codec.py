"""Segments and snapshot objects ⇄ bytes, as FORMAT.md specifies. Pure: no I/O.

Decoding never raises on damaged records: it returns what is valid and describes where and
why it stopped, so recovery and the pipeline can keep the valid prefix and report the rest.
A damaged header is a :class:`~actors.errors.DataError`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterable, Sequence

import msgspec
import zstandard

from actors.core.events import Event
from actors.errors import DataError

__all__ = [
    "SEGMENT_VERSION",
    "SNAPSHOT_OBJECT_VERSION",
    "Damage",
    "SegmentHeader",
    "SegmentRead",
    "check_snapshot_object",
    "decode_segment",
    "decode_segment_header",
    "decode_snapshot_object",
    "encode_payloads",
    "encode_segment",
    "encode_segment_header",
    "encode_snapshot_object",
    "encode_snapshot_object_parts",
    "read_segment_header",
    "snapshot_object_header",
]

SEGMENT_MAGIC = b"EVQS"
SEGMENT_VERSION = 1
SNAPSHOT_MAGIC = b"EVQP"
SNAPSHOT_OBJECT_VERSION = 1

_SEG_HEADER = struct.Struct("<4sHHQQII")  # magic, version, flags, epoch, first_seq, count, crc
_FRAME = struct.Struct("<IIB")  # length, crc, flags
_SNAP_HEADER = struct.Struct("<4sHHQQQII")  # magic, version, flags, epoch, seq, len, crcs
SEGMENT_HEADER_SIZE = _SEG_HEADER.size
FRAME_SIZE = _FRAME.size
SNAPSHOT_HEADER_SIZE = _SNAP_HEADER.size

MAX_RECORD = 256 * 1024 * 1024
COMPRESS_MIN = 256  # payloads smaller than this stay plain
COMPRESS_GAIN = 0.9  # keep the compressed form only if it is at most 90 % of the plain one
_ZSTD = 1  # record / snapshot flag bit 0
_ZSTD_LEVEL = 1

_event_encoder = msgspec.msgpack.Encoder()
_event_decoder: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)


class SegmentHeader(msgspec.Struct, frozen=True):
    """What a segment's header says."""

    version: int
    epoch: int
    first_seq: int
    count: int


class Damage(msgspec.Struct, frozen=True):
    """Where and why decoding of a segment stopped before its end."""

    offset: int  # byte offset of the first record not kept
    reason: str
    records_discarded: int | None  # None when the header itself is unreadable


class SegmentRead(msgspec.Struct):
    """The valid prefix of a segment, and what ended it early (if anything)."""

    header: SegmentHeader
    events: list[Event]
    damage: Damage | None = None

    @property
    def last_seq(self) -> int:
        """Sequence number of the last valid record (first_seq - 1 when there is none)."""
        return self.header.first_seq + len(self.events) - 1


# ------------------------------------------------------------------ segments


def encode_payloads(events: Sequence[Event]) -> list[bytes]:
    """msgpack of each event (the writer encodes once, then frames)."""
    encode = _event_encoder.encode
    return [encode(e) for e in events]


def encode_segment_header(magic: bytes, version: int, epoch: int, first: int, last: int) -> bytes:
    """The 32-byte header of a segment of either version: ``magic``, ``version``, no flags,
    ``epoch``, ``first`` (its first sequence number or LSN), a 32-bit ``last`` field (version
    1: its record count; version 2: its shard) and a CRC-32 of the rest (FORMAT.md)."""
    head = _SEG_HEADER.pack(magic, version, 0, epoch, first, last, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def read_segment_header(
    data: bytes | memoryview, magic: bytes, version: int, what: str
) -> tuple[int, int, int]:
    """``(epoch, first, last)`` of a segment header written by :func:`encode_segment_header`
    with ``magic`` and ``version`` (``what``: the kind of segment, for errors).

    Raises:
        DataError: too short, wrong magic, unknown version or flags, or a CRC mismatch.
    """
    if len(data) < SEGMENT_HEADER_SIZE:
        raise DataError(f"segment of {len(data)} bytes is shorter than its header")
    found, found_version, flags, epoch, first, last, crc = _SEG_HEADER.unpack_from(data)
    if found != magic:
        raise DataError(f"not a {what} (bad magic)")
    if zlib.crc32(bytes(data[: SEGMENT_HEADER_SIZE - 4])) != crc:
        raise DataError("segment header checksum mismatch")
    if found_version != version:
        raise DataError(f"{what} format version {found_version} is not readable by this version")
    if flags:
        raise DataError(f"unknown segment flags {flags:#x}")
    return epoch, first, last


def encode_segment(epoch: int, first_seq: int, payloads: Sequence[bytes]) -> bytes:
    """A segment holding ``payloads`` (from :func:`encode_payloads`) from ``first_seq`` on."""
    header = encode_segment_header(SEGMENT_MAGIC, SEGMENT_VERSION, epoch, first_seq, len(payloads))
    parts = [header]
    compressor: zstandard.ZstdCompressor | None = None
    for payload in payloads:
        flags = 0
        if len(payload) >= COMPRESS_MIN:
            if compressor is None:
                compressor = zstandard.ZstdCompressor(level=_ZSTD_LEVEL)
            packed = compressor.compress(payload)
            if len(packed) <= COMPRESS_GAIN * len(payload):
                payload, flags = packed, _ZSTD
        if len(payload) > MAX_RECORD:
            raise DataError(f"record of {len(payload)} bytes is over the {MAX_RECORD} limit")
        flag_byte = b"\x01" if flags else b"\x00"
        crc = zlib.crc32(payload, zlib.crc32(flag_byte))
        parts.append(_FRAME.pack(len(payload), crc, flags))
        parts.append(payload)
    return b"".join(parts)


def decode_segment_header(data: bytes | memoryview) -> SegmentHeader:
    """The header of a segment.

    Raises:
        DataError: too short, wrong magic, unknown version or flags, or a CRC mismatch.
    """
    epoch, first_seq, count = read_segment_header(data, SEGMENT_MAGIC, SEGMENT_VERSION, "segment")
    return SegmentHeader(SEGMENT_VERSION, epoch, first_seq, count)


def decode_segment(data: bytes) -> SegmentRead:
    """The valid records of a segment, stopping at the first damaged one.

    Raises:
        DataError: the header is damaged (nothing in the segment can be trusted).
    """
    header = decode_segment_header(data)
    view = memoryview(data)
    events: list[Event] = []
    pos = SEGMENT_HEADER_SIZE
    end = len(data)
    decompressor: zstandard.ZstdDecompressor | None = None
    decode = _event_decoder.decode
    damage: Damage | None = None
    for _ in range(header.count):
        reason = None
        if end - pos < FRAME_SIZE:
            reason = "torn tail: record frame cut short"
        else:
            length, crc, flags = _FRAME.unpack_from(data, pos)
            body_at = pos + FRAME_SIZE
            if length > MAX_RECORD:
                reason = f"record length {length} over the limit"
            elif body_at + length > end:
                reason = "torn tail: record payload cut short"
            elif flags & ~_ZSTD:
                reason = f"unknown record flags {flags:#x}"
            else:
                payload = view[body_at : body_at + length]
                if zlib.crc32(payload, zlib.crc32(b"\x01" if flags else b"\x00")) != crc:
                    reason = "record checksum mismatch"
                else:
                    try:
                        record: memoryview | bytes = payload
                        if flags:
                            if decompressor is None:
                                decompressor = zstandard.ZstdDecompressor()
                            record = _inflate(decompressor, payload, MAX_RECORD)
                        events.append(decode(record))
                    except (zstandard.ZstdError, msgspec.DecodeError, UnicodeDecodeError) as exc:
                        reason = f"record does not decode: {exc}"
        if reason is not None:
            damage = Damage(pos, reason, header.count - len(events))
            break
        pos = body_at + length
    return SegmentRead(header, events, damage)


# ------------------------------------------------------------------ snapshots


def encode_snapshot_object(epoch: int, seq: int, body: bytes) -> bytes:
    """A snapshot object around ``body`` (msgpack of a Snapshot), compressed when it pays."""
    flags = 0
    if len(body) >= COMPRESS_MIN:
        packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0).compress(body)
        if len(packed) <= COMPRESS_GAIN * len(body):
            body, flags = packed, _ZSTD
    return snapshot_object_header(epoch, seq, flags, body) + body


def snapshot_object_header(epoch: int, seq: int, flags: int, body: bytes) -> bytes:
    """The 40-byte header of a snapshot object whose stored body is ``body``."""
    return _snapshot_header(epoch, seq, flags, len(body), zlib.crc32(body))


def _snapshot_header(epoch: int, seq: int, flags: int, size: int, body_crc: int) -> bytes:
    head = struct.pack(
        "<4sHHQQQI", SNAPSHOT_MAGIC, SNAPSHOT_OBJECT_VERSION, flags, epoch, seq, size, body_crc
    )
    return head + struct.pack("<I", zlib.crc32(head))


def encode_snapshot_object_parts(
    epoch: int, seq: int, parts: Callable[[], Iterable[bytes | memoryview]]
) -> bytes:
    """:func:`encode_snapshot_object` of the concatenation of ``parts()``, compressed part by
    part: memory holds the compressed body and one part, not the whole plain body as well.
    ``parts`` is called a second time only when the body stays plain (compressed, it would
    not be at most ``COMPRESS_GAIN`` of it)."""
    deflater = zstandard.ZstdCompressor(level=_ZSTD_LEVEL, threads=0).compressobj()
    packed: list[bytes] = []
    size = 0
    for part in parts():
        size += len(part)
        packed.append(deflater.compress(part))
    packed.append(deflater.flush())
    packed_size = sum(map(len, packed))
    if size >= COMPRESS_MIN and packed_size <= COMPRESS_GAIN * size:
        return _snapshot_object(epoch, seq, _ZSTD, packed, packed_size)
    del packed
    return _snapshot_object(epoch, seq, 0, list(parts()), size)


def _snapshot_object(
    epoch: int, seq: int, flags: int, body: list[bytes | memoryview] | list[bytes], size: int
) -> bytes:
    """Header and ``body`` (in parts, ``size`` bytes in all) joined once."""
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    return b"".join([_snapshot_header(epoch, seq, flags, size, crc), *body])


def _snapshot_object_parts(data: bytes) -> tuple[int, int, int, memoryview]:
    """``(epoch, seq, flags, stored body)`` of a snapshot object whose header and body check.

    Raises:
        DataError: too short, bad magic, version, flags, length or CRC.
    """
    if len(data) < SNAPSHOT_HEADER_SIZE:
        raise DataError("snapshot shorter than its header")
    magic, version, flags, epoch, seq, length, body_crc, crc = _SNAP_HEADER.unpack_from(data)
    if magic != SNAPSHOT_MAGIC:
        raise DataError("not a snapshot (bad magic)")
    if zlib.crc32(data[: SNAPSHOT_HEADER_SIZE - 4]) != crc:
        raise DataError("snapshot header checksum mismatch")
    if version != SNAPSHOT_OBJECT_VERSION:
        raise DataError(f"snapshot format version {version} is not readable by this version")
    if flags & ~_ZSTD:
        raise DataError(f"unknown snapshot flags {flags:#x}")
    body = memoryview(data)[SNAPSHOT_HEADER_SIZE:]
    if len(body) != length:
        raise DataError(f"snapshot body is {len(body)} bytes, header says {length}")
    if zlib.crc32(body) != body_crc:
        raise DataError("snapshot body checksum mismatch")
    return epoch, seq, flags, body


def check_snapshot_object(data: bytes) -> tuple[int, int]:
    """``(epoch, seq)`` of a snapshot object whose header and stored body check (lengths,
    CRCs), without decompressing it: a written snapshot's read-back check, which must not
    hold the whole plain state in memory a second time.

    Raises:
        DataError: a check fails.
    """
    epoch, seq, _, _ = _snapshot_object_parts(data)
    return epoch, seq


def decode_snapshot_object(data: bytes) -> tuple[int, int, bytes]:
    """``(epoch, seq, body)`` of a snapshot object, checked and decompressed.

    Raises:
        DataError: any check fails (header, length, CRC, decompression).
    """
    epoch, seq, flags, body = _snapshot_object_parts(data)
    if not flags:
        return epoch, seq, bytes(body)
    try:
        # Streamed: memory grows with the real output, not with the size the frame claims.
        inflater = zstandard.ZstdDecompressor().decompressobj()
        out = inflater.decompress(body)
        if not inflater.eof:
            raise zstandard.ZstdError("the frame is cut short")
    except zstandard.ZstdError as exc:
        raise DataError(f"snapshot body does not decompress: {exc}") from exc
    claimed = zstandard.frame_content_size(body)
    if claimed >= 0 and claimed != len(out):
        raise DataError(f"snapshot body is {len(out)} bytes, its frame says {claimed}")
    return epoch, seq, out


def _inflate(decompressor: zstandard.ZstdDecompressor, frame: memoryview, limit: int) -> bytes:
    """Decompress one frame, refusing (ZstdError) one that claims to be over ``limit``: the
    size comes from untrusted bytes, and allocating it first could exhaust memory."""
    size = zstandard.frame_content_size(frame)
    if size < 0 or size > limit:  # -1: unknown size; every frame we write carries it
        raise zstandard.ZstdError(f"frame content size {size} is unknown or over {limit}")
    return decompressor.decompress(frame, max_output_size=limit)
