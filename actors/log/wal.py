"""The shard log (format version 2) ⇄ bytes, as FORMAT.md specifies. Pure: no I/O.

A shard's queues share one log. Each group commit is one *block*: the records of every
queue that committed together, grouped by queue, each queue's records numbered by that
queue's own sequence. Blocks follow each other in *segments*: on a local disk a segment is a
preallocated file that blocks are appended to; on an object store a segment is one object
holding one block. Both are read by the same code (:func:`scan_segment`).

Decoding never raises on a damaged block: it returns the valid blocks and says how and where
the segment ended (cleanly, at zeros, at a torn write, or at damage). A damaged segment
header is a :class:`~actors.errors.DataError`.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Sequence
from typing import Literal

import msgspec
import zstandard

from actors.core.events import Event
from actors.errors import DataError

# One limit for a record of either version, one segment header (magic, version, flags,
# epoch, first LSN, shard, CRC: 32 bytes).
from actors.log.codec import (
    MAX_RECORD,
    SEGMENT_HEADER_SIZE,
    encode_segment_header,
    read_segment_header,
)

__all__ = [
    "BLOCK_HEADER_SIZE",
    "SEGMENT_HEADER_SIZE",
    "WAL_VERSION",
    "Block",
    "Group",
    "WalHeader",
    "WalRead",
    "decode_block",
    "decode_groups",
    "decode_record",
    "decode_wal_header",
    "encode_block",
    "encode_raw_block",
    "encode_record",
    "encode_wal_header",
    "scan_segment",
]

WAL_MAGIC = b"EVQW"
WAL_VERSION = 2

# body length, crc, epoch, first_lsn, count, flags
_BLOCK_HEADER = struct.Struct("<IIQQII")
BLOCK_HEADER_SIZE = _BLOCK_HEADER.size  # 32

MAX_BLOCK = 1 << 30  # a longer block is damage (a put is at most 128 MiB of bodies)
COMPRESS_MIN = 256  # records smaller than this stay plain
COMPRESS_GAIN = 0.9  # keep the compressed form only if it is at most 90 % of the plain one
_ZSTD_EXT = 1  # msgpack extension type of a zstd-compressed record
_ZSTD_LEVEL = 1

_encoder = msgspec.msgpack.Encoder()
_event_decoder: msgspec.msgpack.Decoder[Event] = msgspec.msgpack.Decoder(Event)
_ext_decoder = msgspec.msgpack.Decoder(msgspec.msgpack.Ext)
Group = tuple[str, int, list[msgspec.Raw]]  # (queue, first seq, records)
_groups_decoder = msgspec.msgpack.Decoder(list[tuple[str, int, list[msgspec.Raw]]])


class WalHeader(msgspec.Struct, frozen=True):
    """What a segment's header says."""

    version: int
    epoch: int  # of the incarnation that created the segment
    first_lsn: int
    shard: int


class Block(msgspec.Struct, frozen=True):
    """One valid block: where it is, and its records still encoded (see :func:`decode_groups`)."""

    offset: int
    end: int  # offset of the byte after it
    epoch: int
    first_lsn: int
    count: int
    body: bytes

    @property
    def next_lsn(self) -> int:
        """The first log sequence number after this block."""
        return self.first_lsn + self.count


End = Literal["clean", "zeros", "torn", "damaged"]


class WalRead(msgspec.Struct):
    """The valid blocks of a segment and how it ended.

    ``end`` is ``clean`` (the bytes ran out after the last block), ``zeros`` (preallocated
    space follows: the segment is still being written, or was when its writer stopped),
    ``torn`` (bytes of a write that did not finish follow — never acknowledged, since a block
    is acknowledged only once the whole block is on disk), or ``damaged`` (a block that was
    written whole no longer reads back, or a block that cannot follow the ones before it:
    what follows is lost). ``valid_end`` is the offset just after the last valid block.
    """

    header: WalHeader
    blocks: list[Block]
    end: End
    valid_end: int
    reason: str | None = None

    @property
    def next_lsn(self) -> int:
        """The log sequence number after the last valid block."""
        return self.blocks[-1].next_lsn if self.blocks else self.header.first_lsn

    @property
    def records(self) -> int:
        """Records in the valid blocks."""
        return sum(b.count for b in self.blocks)


# ------------------------------------------------------------------ records


def encode_record(event: Event) -> bytes:
    """One event as it is stored in a block: its msgpack, or a zstd frame of it when the
    event is large and compresses well (as a msgpack extension).

    Raises:
        DataError: the event's msgpack is over ``MAX_RECORD`` bytes.
    """
    data = _encoder.encode(event)
    # Checked before compressing: a reader refuses a frame whose content is over the limit.
    if len(data) > MAX_RECORD:
        raise DataError(f"record of {len(data)} bytes is over the {MAX_RECORD} limit")
    if len(data) >= COMPRESS_MIN:
        packed = zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data)
        if len(packed) <= COMPRESS_GAIN * len(data):
            return _encoder.encode(msgspec.msgpack.Ext(_ZSTD_EXT, packed))
    return data


def decode_record(raw: bytes | msgspec.Raw) -> Event:
    """The event in one stored record.

    Raises:
        DataError: it does not decompress or decode.
    """
    data = bytes(raw) if isinstance(raw, msgspec.Raw) else raw
    try:
        if data[:1] in _EXT_MARKERS:
            ext = _ext_decoder.decode(data)
            if ext.code != _ZSTD_EXT:
                raise DataError(f"unknown record extension {ext.code}")
            # A decoded Ext holds bytes (bytes() hands them back as they are); the stub
            # says any buffer, as for an Ext built by hand.
            data = _inflate(bytes(ext.data))
        return _event_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, zstandard.ZstdError) as exc:
        raise DataError(f"record does not decode: {exc}") from exc


# msgpack's first bytes of an extension: fixext 1/2/4/8/16, ext 8/16/32
_EXT_MARKERS = frozenset(bytes([b]) for b in (0xD4, 0xD5, 0xD6, 0xD7, 0xD8, 0xC7, 0xC8, 0xC9))


def _inflate(frame: bytes) -> bytes:
    size = zstandard.frame_content_size(frame)
    if size < 0 or size > MAX_RECORD:  # the size comes from untrusted bytes
        raise zstandard.ZstdError(f"frame content size {size} is unknown or over {MAX_RECORD}")
    return zstandard.ZstdDecompressor().decompress(frame, max_output_size=MAX_RECORD)


# ------------------------------------------------------------------ headers and blocks


def encode_wal_header(epoch: int, first_lsn: int, shard: int) -> bytes:
    """The 32-byte header of a segment."""
    return encode_segment_header(WAL_MAGIC, WAL_VERSION, epoch, first_lsn, shard)


def decode_wal_header(data: bytes | memoryview) -> WalHeader:
    """The header of a segment.

    Raises:
        DataError: too short, wrong magic, unknown version or flags, or a CRC mismatch.
    """
    epoch, first_lsn, shard = read_segment_header(data, WAL_MAGIC, WAL_VERSION, "shard log segment")
    return WalHeader(WAL_VERSION, epoch, first_lsn, shard)


def encode_block(
    epoch: int,
    first_lsn: int,
    groups: Sequence[tuple[str, int, list[bytes]]],
    count: int | None = None,
) -> bytes:
    """A block holding ``groups``: ``(queue, first seq, records from encode_record)``;
    ``count``: their number of records, when the caller knows it."""
    raw = msgspec.Raw
    if count is None:
        count = sum(len(recs) for _, _, recs in groups)
    return encode_raw_block(
        epoch, first_lsn, [(q, s, [raw(r) for r in recs]) for q, s, recs in groups], count
    )


def encode_raw_block(
    epoch: int, first_lsn: int, groups: Sequence[Sequence[object]], count: int
) -> bytes:
    """:func:`encode_block` for groups already in the form the body holds: ``[queue, first
    seq, records]`` with each record a ``msgspec.Raw`` of :func:`encode_record`'s bytes
    (the shard's writer keeps its batches so: no copy per group when a block goes out)."""
    body = _encoder.encode(groups)
    if len(body) > MAX_BLOCK:
        raise DataError(f"block of {len(body)} bytes is over the {MAX_BLOCK} limit")
    rest = struct.pack("<QQII", epoch, first_lsn, count, 0)
    crc = zlib.crc32(body, zlib.crc32(rest))
    return struct.pack("<II", len(body), crc) + rest + body


def decode_groups(block: Block) -> list[Group]:
    """The block's records, grouped by queue (each record still encoded).

    Raises:
        DataError: the body is not a list of groups, or its record count is not the header's.
    """
    try:
        groups: list[Group] = _groups_decoder.decode(block.body)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"block at offset {block.offset} does not decode: {exc}") from exc
    if sum(len(recs) for _, _, recs in groups) != block.count:
        raise DataError(f"block at offset {block.offset} holds another count than it says")
    return groups


def decode_block(data: bytes) -> Block:
    """The one block ``data`` holds (a block read back from where it was written), its
    checksum verified.

    Raises:
        DataError: it is not a whole valid block.
    """
    found = _block_at(data, 0)
    if isinstance(found, str):
        raise DataError(f"a block read back is not valid: {found}")
    return found


def _block_at(data: bytes, pos: int) -> Block | str:
    """The valid block at ``pos``, or why there is none there."""
    end = len(data)
    if end - pos < BLOCK_HEADER_SIZE:
        return "block header cut short"
    length, crc, epoch, first_lsn, count, flags = _BLOCK_HEADER.unpack_from(data, pos)
    if length == 0 or length > MAX_BLOCK:
        return f"block length {length} is not valid"
    body_at = pos + BLOCK_HEADER_SIZE
    if body_at + length > end:
        return "block cut short"
    view = memoryview(data)
    if zlib.crc32(view[body_at : body_at + length], zlib.crc32(view[pos + 8 : body_at])) != crc:
        return "block checksum mismatch"
    if flags:
        return f"unknown block flags {flags:#x}"
    return Block(pos, body_at + length, epoch, first_lsn, count, data[body_at : body_at + length])


def scan_segment(data: bytes, *, stop_lsn: int | None = None) -> WalRead:
    """The valid blocks of a segment, in order, and how it ends.

    A block must continue the one before it (its first LSN is the previous block's next) and
    may not carry an older epoch than the one before it (a fenced writer's late write). With
    ``stop_lsn`` (the next segment's first LSN), blocks from there on are not part of this
    segment: a writer that lost the log wrote them after the next segment began.

    Raises:
        DataError: the segment header is damaged.
    """
    header = decode_wal_header(data)
    blocks: list[Block] = []
    pos = SEGMENT_HEADER_SIZE
    lsn, epoch = header.first_lsn, header.epoch
    end = len(data)
    while pos < end:
        if stop_lsn is not None and lsn >= stop_lsn:
            return _ended(header, blocks, data, pos, "a later segment begins here", late=True)
        found = _block_at(data, pos)
        if isinstance(found, str):
            return _ended(header, blocks, data, pos, found)
        if found.first_lsn != lsn:
            why = f"block says LSN {found.first_lsn}, {lsn} was next"
            return WalRead(header, blocks, "damaged", pos, why)
        if found.epoch < epoch:
            why = f"block of epoch {found.epoch} after epoch {epoch}: a fenced writer's write"
            return WalRead(header, blocks, "damaged", pos, why)
        if stop_lsn is not None and found.next_lsn > stop_lsn:
            why = f"block runs past LSN {stop_lsn}, where the next segment begins"
            return WalRead(header, blocks, "damaged", pos, why)
        blocks.append(found)
        lsn, epoch, pos = found.next_lsn, found.epoch, found.end
    return WalRead(header, blocks, "clean", pos)


def _ended(
    header: WalHeader, blocks: list[Block], data: bytes, pos: int, why: str, *, late: bool = False
) -> WalRead:
    """How a segment ends at ``pos``, where no valid block continues it."""
    if data.count(b"\0", pos) == len(data) - pos:  # only zeros follow (counted without a copy)
        return WalRead(header, blocks, "zeros", pos)
    if late:
        return WalRead(header, blocks, "damaged", pos, why)
    lsn = blocks[-1].next_lsn if blocks else header.first_lsn
    if _valid_block_after(data, pos, lsn):
        # A block written whole follows the bad bytes: they are not a write that never
        # finished (nothing is written after a block before it is durable) but damage to
        # data that was acknowledged.
        return WalRead(header, blocks, "damaged", pos, why)
    return WalRead(header, blocks, "torn", pos, why)


def _valid_block_after(data: bytes, pos: int, lsn: int) -> bool:
    """Whether a valid block of LSN ``lsn`` or later starts anywhere after ``pos`` (before
    the zeros that end the written part). A torn write leaves one partial block followed by
    zeros, so this looks at most at one block's worth of bytes then."""
    end = len(data.rstrip(b"\0"))  # a block starts before the last byte that is not zero
    size = len(data)
    unpack = _BLOCK_HEADER.unpack_from
    for p in range(pos + 1, min(end, size - BLOCK_HEADER_SIZE + 1)):
        length, _, _, first_lsn, count, flags = unpack(data, p)
        if (
            0 < length <= size - p - BLOCK_HEADER_SIZE
            and first_lsn >= lsn
            and count > 0
            and not flags
            and isinstance(_block_at(data, p), Block)
        ):
            return True
    return False
