"""FORMAT.md's byte layout, read and written independently of ``actors/log/codec.py``.

Tests use these helpers to look inside segments and snapshot objects (where each record
starts, which flags it carries) and to build damaged objects byte by byte. They are written
from the format contract, not from the codec, so a codec that drifts from FORMAT.md disagrees
with them.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

SEG_MAGIC = b"EVQS"
SNAP_MAGIC = b"EVQP"
SEG_HEADER = 32  # magic, version, flags, epoch, first_seq, count, header_crc
SNAP_HEADER = 40  # magic, version, flags, epoch, seq, body_length, body_crc, header_crc
FRAME = 9  # length, crc, flags
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


@dataclass(frozen=True)
class Frame:
    """One record as stored: where it starts and what its frame says."""

    offset: int  # byte offset of the record's frame in the segment
    length: int
    crc: int
    flags: int
    payload: bytes  # as stored (compressed when flags bit 0 is set)

    @property
    def end(self) -> int:
        """Offset of the byte after the record."""
        return self.offset + FRAME + self.length


@dataclass(frozen=True)
class SegHeader:
    magic: bytes
    version: int
    flags: int
    epoch: int
    first_seq: int
    count: int
    crc: int


def seg_header(data: bytes) -> SegHeader:
    """The header fields of an intact segment."""
    return SegHeader(*struct.unpack_from("<4sHHQQII", data))


def frames(data: bytes) -> list[Frame]:
    """Every record frame of an intact segment, in order."""
    count = seg_header(data).count
    out = []
    pos = SEG_HEADER
    for _ in range(count):
        length, crc, flags = struct.unpack_from("<IIB", data, pos)
        out.append(Frame(pos, length, crc, flags, data[pos + FRAME : pos + FRAME + length]))
        pos += FRAME + length
    assert pos == len(data), "an intact segment ends right after its last record"
    return out


def record_crc(flags: int, payload: bytes) -> int:
    """CRC-32 of the flags byte and the stored payload."""
    return zlib.crc32(payload, zlib.crc32(bytes([flags])))


def build_header(
    *,
    version: int = 1,
    flags: int = 0,
    epoch: int = 1,
    first_seq: int = 1,
    count: int = 0,
    magic: bytes = SEG_MAGIC,
    crc: int | None = None,
) -> bytes:
    """A segment header; its CRC is correct unless ``crc`` is given."""
    head = struct.pack("<4sHHQQI", magic, version, flags, epoch, first_seq, count)
    return head + struct.pack("<I", zlib.crc32(head) if crc is None else crc)


def build_frame(
    payload: bytes, *, flags: int = 0, length: int | None = None, crc: int | None = None
) -> bytes:
    """A record frame and payload; length and CRC are correct unless given."""
    return (
        struct.pack(
            "<IIB",
            len(payload) if length is None else length,
            record_crc(flags & 1, payload) if crc is None else crc,
            flags,
        )
        + payload
    )


@dataclass(frozen=True)
class SnapHeader:
    magic: bytes
    version: int
    flags: int
    epoch: int
    seq: int
    body_length: int
    body_crc: int
    crc: int


def snap_header(data: bytes) -> SnapHeader:
    """The header fields of an intact snapshot object."""
    return SnapHeader(*struct.unpack_from("<4sHHQQQII", data))


def build_snapshot(
    body: bytes,
    *,
    epoch: int = 1,
    seq: int = 1,
    flags: int = 0,
    version: int = 1,
    magic: bytes = SNAP_MAGIC,
    body_length: int | None = None,
    body_crc: int | None = None,
    crc: int | None = None,
) -> bytes:
    """A snapshot object around ``body`` as stored; fields are correct unless given."""
    head = struct.pack(
        "<4sHHQQQI",
        magic,
        version,
        flags,
        epoch,
        seq,
        len(body) if body_length is None else body_length,
        zlib.crc32(body) if body_crc is None else body_crc,
    )
    return head + struct.pack("<I", zlib.crc32(head) if crc is None else crc) + body


def flip_bit(data: bytes, bit: int) -> bytes:
    """``data`` with bit ``bit`` (counted from the first byte's lowest bit) inverted."""
    out = bytearray(data)
    out[bit // 8] ^= 1 << (bit % 8)
    return bytes(out)


# ---------------------------------------------------------------- shard logs (version 2)

WAL_MAGIC = b"EVQW"
WAL_HEADER = 32  # magic, version, flags, epoch, first_lsn, shard, header_crc
BLOCK_HEADER = 32  # length, crc, epoch, first_lsn, count, flags


@dataclass(frozen=True)
class WalHeader:
    magic: bytes
    version: int
    flags: int
    epoch: int
    first_lsn: int
    shard: int
    crc: int


@dataclass(frozen=True)
class BlockAt:
    """One block as stored: where it starts and what its header says."""

    offset: int
    length: int
    crc: int
    epoch: int
    first_lsn: int
    count: int
    flags: int
    body: bytes

    @property
    def end(self) -> int:
        """Offset of the byte after the block."""
        return self.offset + BLOCK_HEADER + self.length


def wal_header(data: bytes) -> WalHeader:
    """The header fields of a shard log segment."""
    return WalHeader(*struct.unpack_from("<4sHHQQII", data))


def build_wal_header(
    *, epoch: int = 1, first_lsn: int = 1, shard: int = 0, version: int = 2, crc: int | None = None
) -> bytes:
    """A segment header; fields are correct unless given."""
    head = struct.pack("<4sHHQQI", WAL_MAGIC, version, 0, epoch, first_lsn, shard)
    return head + struct.pack("<I", zlib.crc32(head) if crc is None else crc)


def blocks(data: bytes) -> list[BlockAt]:
    """Every block of an intact segment, in order, up to its end or its zero padding."""
    out = []
    pos = WAL_HEADER
    while pos + BLOCK_HEADER <= len(data):
        length, crc, epoch, first_lsn, count, flags = struct.unpack_from("<IIQQII", data, pos)
        if length == 0:
            break
        body = data[pos + BLOCK_HEADER : pos + BLOCK_HEADER + length]
        assert zlib.crc32(body, zlib.crc32(data[pos + 8 : pos + BLOCK_HEADER])) == crc
        out.append(BlockAt(pos, length, crc, epoch, first_lsn, count, flags, body))
        pos += BLOCK_HEADER + length
    return out


def build_block(
    body: bytes,
    *,
    epoch: int = 1,
    first_lsn: int = 1,
    count: int = 1,
    flags: int = 0,
    length: int | None = None,
    crc: int | None = None,
) -> bytes:
    """A block around ``body`` as stored; length and CRC are correct unless given."""
    rest = struct.pack("<QQII", epoch, first_lsn, count, flags)
    return (
        struct.pack(
            "<II",
            len(body) if length is None else length,
            zlib.crc32(body, zlib.crc32(rest)) if crc is None else crc,
        )
        + rest
        + body
    )
