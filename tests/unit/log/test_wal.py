"""The shard log codec (``actors/log/wal.py``, FORMAT.md "Shard log, version 2"), pure.

- Round trips: random groups of random events, in blocks of random epochs, read back by
  ``scan_segment`` / ``decode_groups`` / ``decode_record`` exactly as written (property).
- Damage: every single-byte change of a block is caught (CRC) and ends the segment before
  that block, never misread; a damaged segment header is a ``DataError``; a block that does
  not continue the LSN, carries an older epoch, unknown flags or a bad length is not used;
  blocks at or past the next segment's first LSN are not this segment's.
- How a segment ends: ``clean``, ``zeros`` (preallocated space), ``torn`` (a partial last
  block) and ``damaged`` (a valid block after bad bytes). The torn tail at every byte offset,
  through a real shard, is in ``tests/fault/test_corruption.py``; here only the codec's
  verdicts.
- Records: compressed exactly when FORMAT.md says (256 bytes or more, at most 90 % once
  compressed); the ``MAX_RECORD`` and ``MAX_BLOCK`` limits; records and block bodies that do
  not decode are ``DataError``.

Blocks are built with ``encode_block`` for round trips and byte by byte with
``tests/unit/log/layout.py`` (FORMAT.md read independently) for damage.
"""

from __future__ import annotations

import random
import re
import zlib
from collections.abc import Callable

import msgspec
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors.core import events as ev
from actors.errors import DataError, ErrorKind
from actors.log import wal
from actors.log.wal import (
    Block,
    WalHeader,
    WalRead,
    decode_groups,
    decode_record,
    decode_wal_header,
    encode_block,
    encode_record,
    encode_wal_header,
    scan_segment,
)
from tests.unit.log import layout

T = 1_700_000_000_000
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Events = list[ev.Event]
GroupSpec = tuple[str, int, Events]  # (queue, first seq, events)
# (header epoch, first LSN, the blocks: each an epoch step up from the one before and groups)
SegmentSpec = tuple[int, int, list[tuple[int, list[GroupSpec]]]]


def compressible(n: int) -> bytes:
    """``n`` bytes that zstd shrinks a lot."""
    return (b"shard log body; " * (n // 16 + 1))[:n]


def incompressible(n: int, seed: int = 0) -> bytes:
    """``n`` random bytes (zstd cannot shrink them)."""
    return random.Random(seed).randbytes(n)


def block_of(epoch: int, first_lsn: int, groups: list[GroupSpec]) -> bytes:
    """A block as the shard log writes it."""
    return encode_block(
        epoch, first_lsn, [(q, s, [encode_record(e) for e in events]) for q, s, events in groups]
    )


def segment_of(
    blocks: list[tuple[int, list[GroupSpec]]], *, epoch: int = 1, first_lsn: int = 1, shard: int = 0
) -> tuple[bytes, list[int]]:
    """A segment of ``(epoch, groups)`` blocks whose LSNs continue from ``first_lsn``; and
    the offset of each block (then the end)."""
    data = bytearray(encode_wal_header(epoch, first_lsn, shard))
    offsets = []
    lsn = first_lsn
    for block_epoch, groups in blocks:
        offsets.append(len(data))
        data += block_of(block_epoch, lsn, groups)
        lsn += sum(len(events) for _, _, events in groups)
    offsets.append(len(data))
    return bytes(data), offsets


def read_back(read: WalRead) -> list[tuple[int, int, list[GroupSpec]]]:
    """``(epoch, first LSN, groups with their events decoded)`` of every valid block."""
    return [
        (
            b.epoch,
            b.first_lsn,
            [(q, s, [decode_record(r) for r in raws]) for q, s, raws in decode_groups(b)],
        )
        for b in read.blocks
    ]


def put(i: int, body: bytes = b"body") -> ev.MessagesPut:
    return ev.MessagesPut(T + i, [ev.PutItem(i, body, T + i)])


# Three blocks of two or three queues each (the shard stream's claim first), one of them
# with a compressed record: the fixed segment the damage tests change.
THREE: list[tuple[int, list[GroupSpec]]] = [
    (3, [("", 1, [ev.WriterStarted(T, 3, 99)]), ("a", 1, [put(1), put(2)]), ("b", 1, [put(3)])]),
    (3, [("b", 2, [put(4, compressible(2000))]), ("c", 1, [ev.MessagesAcked(T + 5, [1, 2])])]),
    (4, [("a", 3, [ev.Checkpoint(T + 6)]), ("c", 2, [ev.QueueDeleted(T + 7)])]),
]
SEGMENT, OFFSETS = segment_of(THREE, epoch=3, first_lsn=40)
CLEAN = scan_segment(SEGMENT)


def test_the_fixed_segment_reads_back_whole() -> None:
    assert (CLEAN.end, CLEAN.valid_end, CLEAN.reason) == ("clean", len(SEGMENT), None)
    assert CLEAN.header == WalHeader(2, 3, 40, 0)
    assert [b.offset for b in CLEAN.blocks] == OFFSETS[:-1]
    assert [b.end for b in CLEAN.blocks] == OFFSETS[1:]
    assert (CLEAN.next_lsn, CLEAN.records) == (40 + 8, 8)
    assert read_back(CLEAN) == [
        (e, lsn, g) for (e, g), lsn in zip(THREE, [40, 44, 46], strict=True)
    ]
    raw = decode_groups(CLEAN.blocks[1])[0][2][0]
    assert isinstance(msgspec.msgpack.decode(bytes(raw)), msgspec.msgpack.Ext)  # compressed


# ================================================================ round trips (property)

_ids = st.one_of(st.integers(0, 2**63 - 1), st.text(min_size=1, max_size=12))
_times = st.integers(0, 2**62)
_bodies = st.one_of(
    st.binary(max_size=300),
    st.integers(0, 3000).map(compressible),
    st.tuples(st.integers(250, 1500), st.integers(0, 9)).map(lambda a: incompressible(*a)),
)
_events = st.one_of(
    st.builds(
        ev.MessagesPut,
        _times,
        st.lists(st.builds(ev.PutItem, _ids, _bodies, _times), min_size=1, max_size=3),
    ),
    st.builds(ev.MessagesAcked, _times, st.lists(_ids, max_size=4)),
    st.builds(ev.WriterStarted, _times, st.integers(1, 2**40), st.integers(0, 2**62)),
    st.builds(
        ev.KeySet,
        _times,
        st.text(max_size=10),
        st.integers(1, 2**40),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=600)),
    ),
    st.builds(ev.Checkpoint, _times),
    st.builds(ev.QueueDeleted, _times),
)
_groups = st.lists(
    st.tuples(
        st.text(max_size=20), st.integers(1, 2**50), st.lists(_events, min_size=1, max_size=4)
    ),
    min_size=1,
    max_size=4,
)
_segments = st.tuples(
    st.integers(1, 2**40),
    st.integers(1, 2**50),
    st.lists(st.tuples(st.integers(0, 2), _groups), min_size=1, max_size=4),
)


def _build(spec: SegmentSpec) -> tuple[bytes, list[int], list[tuple[int, int, list[GroupSpec]]]]:
    """The segment a spec describes, its block offsets, and what each block holds."""
    epoch, first_lsn, steps = spec
    blocks = []
    for step, groups in steps:
        epoch += step
        blocks.append((epoch, groups))
    data, offsets = segment_of(blocks, epoch=spec[0], first_lsn=first_lsn)
    want, lsn = [], first_lsn
    for block_epoch, groups in blocks:
        want.append((block_epoch, lsn, groups))
        lsn += sum(len(events) for _, _, events in groups)
    return data, offsets, want


@PROPERTY
@given(_segments, st.integers(0, 64))
def test_blocks_of_random_groups_read_back_exactly(spec: SegmentSpec, zeros: int) -> None:
    data, offsets, want = _build(spec)
    read = scan_segment(data + bytes(zeros))
    assert read.end == ("zeros" if zeros else "clean")
    assert read.reason is None
    assert read.valid_end == len(data)
    assert [b.offset for b in read.blocks] == offsets[:-1]
    assert read_back(read) == want
    assert [b.count for b in read.blocks] == [
        sum(len(events) for _, _, events in groups) for _, _, groups in want
    ]
    assert read.next_lsn == want[-1][1] + read.blocks[-1].count


@PROPERTY
@given(st.integers(1, 2**40), st.integers(1, 2**50), _groups)
def test_a_block_of_raw_groups_is_the_block_of_their_records(
    epoch: int, first_lsn: int, groups: list[GroupSpec]
) -> None:
    """The shard's writer keeps groups as ``[queue, first seq, Raw records]``; the block it
    encodes from them must be byte for byte the block of the same records as bytes."""
    plain = [(q, s, [wal.encode_record(e) for e in events]) for q, s, events in groups]
    raw = [[q, s, [msgspec.Raw(r) for r in recs]] for q, s, recs in plain]
    count = sum(len(recs) for _, _, recs in plain)
    block = wal.encode_raw_block(epoch, first_lsn, raw, count)
    assert block == wal.encode_block(epoch, first_lsn, plain)
    [read] = scan_segment(wal.encode_wal_header(epoch, first_lsn, 0) + block).blocks
    assert [(q, s, [bytes(r) for r in recs]) for q, s, recs in decode_groups(read)] == plain


@PROPERTY
@given(st.lists(_events, min_size=1, max_size=20))
def test_records_decode_to_their_events(events: Events) -> None:
    for event in events:
        assert decode_record(encode_record(event)) == event
        assert decode_record(msgspec.Raw(encode_record(event))) == event


# ================================================================ damage to a block


def _changed(data: bytes, at: int, mask: int) -> bytes:
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out)


def _assert_ends_before(read: WalRead, index: int, offsets: list[int], original: WalRead) -> None:
    """The read kept exactly the blocks before block ``index``, unchanged, and says how it
    ended: at damage when a valid block follows the bad one, at a torn write when not."""
    assert [(b.offset, b.body) for b in read.blocks] == [
        (b.offset, b.body) for b in original.blocks[:index]
    ]
    assert read.valid_end == offsets[index]
    assert read.end == ("torn" if index == len(offsets) - 2 else "damaged"), read
    assert read.reason


@pytest.mark.parametrize("index", range(len(THREE)))
@pytest.mark.parametrize("mask", [0x01, 0x80, 0xFF])
def test_every_single_byte_change_of_a_block_is_caught(index: int, mask: int) -> None:
    for at in range(OFFSETS[index], OFFSETS[index + 1]):
        read = scan_segment(_changed(SEGMENT, at, mask))
        _assert_ends_before(read, index, OFFSETS, CLEAN)


@PROPERTY
@given(_segments, st.data())
def test_a_random_byte_change_of_a_random_block_is_caught(
    spec: SegmentSpec, data: st.DataObject
) -> None:
    segment, offsets, _ = _build(spec)
    index = data.draw(st.integers(0, len(offsets) - 2), label="block")
    at = data.draw(st.integers(offsets[index], offsets[index + 1] - 1), label="byte")
    mask = data.draw(st.integers(1, 255), label="xor")
    zeros = data.draw(st.sampled_from([0, 100]), label="zeros after")
    read = scan_segment(_changed(segment, at, mask) + bytes(zeros))
    _assert_ends_before(read, index, offsets, scan_segment(segment))


@pytest.mark.parametrize("at", range(layout.WAL_HEADER))
@pytest.mark.parametrize("mask", [0x01, 0x80])
def test_every_single_bit_change_of_the_segment_header_is_a_data_error(at: int, mask: int) -> None:
    with pytest.raises(DataError) as info:
        scan_segment(_changed(SEGMENT, at, mask))
    assert info.value.kind is ErrorKind.DATA


def _header(**fields: int) -> bytes:
    """A segment header whose fields are FORMAT.md's defaults but ``fields``, CRC correct."""
    values = {"version": 2, "flags": 0, "epoch": 1, "first_lsn": 1, "shard": 0, **fields}
    head = (
        b"EVQW"
        + values["version"].to_bytes(2, "little")
        + values["flags"].to_bytes(2, "little")
        + values["epoch"].to_bytes(8, "little")
        + values["first_lsn"].to_bytes(8, "little")
        + values["shard"].to_bytes(4, "little")
    )
    return head + zlib.crc32(head).to_bytes(4, "little")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter than its header"),
        (SEGMENT[:31], "shorter than its header"),
        (b"EVQS" + SEGMENT[4:], "bad magic"),
        (_header(version=1), "version 1 is not readable"),
        (_header(version=3), "version 3 is not readable"),
        (_header(flags=1), "unknown segment flags"),
        (layout.build_wal_header(crc=0), "checksum mismatch"),
    ],
)
def test_a_bad_segment_header_says_why(data: bytes, message: str) -> None:
    with pytest.raises(DataError, match=message):
        decode_wal_header(data)


def test_the_header_reads_as_format_md_lays_it_out() -> None:
    head = encode_wal_header(7, 123, 9)
    assert head == layout.build_wal_header(epoch=7, first_lsn=123, shard=9)
    assert decode_wal_header(head + b"whatever follows") == WalHeader(2, 7, 123, 9)


# ================================================================ blocks that cannot follow


def _tail(*blocks: bytes) -> bytes:
    """The fixed segment's first two blocks, then ``blocks``."""
    return SEGMENT[: OFFSETS[2]] + b"".join(blocks)


_NEXT = CLEAN.blocks[1].next_lsn  # the LSN the third block must start at
_LAST_EPOCH = CLEAN.blocks[1].epoch
_BODY = CLEAN.blocks[2].body  # a valid body of 2 records


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (layout.build_block(_BODY, epoch=3, first_lsn=_NEXT + 1, count=2), "says LSN"),  # a gap
        (layout.build_block(_BODY, epoch=3, first_lsn=_NEXT - 2, count=2), "says LSN"),  # repeat
        (layout.build_block(_BODY, epoch=2, first_lsn=_NEXT, count=2), "fenced writer"),
    ],
    ids=["lsn-gap", "lsn-repeated", "older-epoch"],
)
@pytest.mark.parametrize("zeros", [0, 64])
def test_a_valid_block_that_cannot_follow_is_damage(block: bytes, reason: str, zeros: int) -> None:
    read = scan_segment(_tail(block) + bytes(zeros))
    assert (read.end, read.valid_end, len(read.blocks)) == ("damaged", OFFSETS[2], 2)
    assert reason in (read.reason or "")


def test_the_first_block_may_not_be_older_than_the_segment_header() -> None:
    data = encode_wal_header(5, 1, 0) + block_of(4, 1, [("a", 1, [put(1)])])
    read = scan_segment(data)
    assert (read.end, read.blocks, read.valid_end) == ("damaged", [], layout.WAL_HEADER)
    assert "fenced writer" in (read.reason or "")


def test_a_block_may_not_go_back_to_an_epoch_before_the_previous_blocks() -> None:
    # not only the header's epoch: the epoch of the block just before
    blocks = [(3, [("a", 1, [put(1)])]), (5, [("a", 2, [put(2)])]), (4, [("a", 3, [put(3)])])]
    data, offsets = segment_of(blocks, epoch=3)
    read = scan_segment(data)
    assert (read.end, read.valid_end, [b.epoch for b in read.blocks]) == (
        "damaged",
        offsets[2],
        [3, 5],
    )
    assert "block of epoch 4 after epoch 5" in (read.reason or "")


def test_a_newer_or_equal_epoch_may_follow() -> None:
    blocks = [(5, [("a", 1, [put(1)])]), (5, [("a", 2, [put(2)])]), (9, [("a", 3, [put(3)])])]
    read = scan_segment(segment_of(blocks, epoch=5)[0])
    assert (read.end, [b.epoch for b in read.blocks]) == ("clean", [5, 5, 9])


@pytest.mark.parametrize(
    ("block", "reason"),
    [
        (layout.build_block(_BODY, first_lsn=_NEXT, count=2, flags=1), "unknown block flags"),
        (layout.build_block(_BODY, first_lsn=_NEXT, count=2, length=0), "length 0"),
        (layout.build_block(b"", first_lsn=_NEXT, count=0), "length 0"),
        (layout.build_block(_BODY, first_lsn=_NEXT, count=2, crc=1), "checksum mismatch"),
        # past the end of the data, or into the next block's bytes (then its CRC cannot match)
        (
            layout.build_block(_BODY, first_lsn=_NEXT, count=2, length=len(_BODY) + 1),
            "cut short|checksum mismatch",
        ),
    ],
    ids=["flags", "length-0", "empty", "crc", "length-past-end"],
)
@pytest.mark.parametrize("after", ["nothing", "a-valid-block"])
def test_an_invalid_block_ends_the_segment_torn_or_damaged(
    block: bytes, reason: str, after: str
) -> None:
    # With a valid block after it, the bad bytes are damage to acknowledged data; with
    # nothing valid after it, a write that never finished (FORMAT.md's table).
    follow = b"" if after == "nothing" else layout.build_block(_BODY, first_lsn=_NEXT + 5, count=2)
    read = scan_segment(_tail(block, follow))
    assert (read.valid_end, len(read.blocks)) == (OFFSETS[2], 2)
    assert read.end == ("torn" if after == "nothing" else "damaged")
    assert re.search(reason, read.reason or ""), read.reason


def test_a_block_longer_than_max_block_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = [len(b.body) for b in CLEAN.blocks]
    longest = sizes.index(max(sizes))
    monkeypatch.setattr(wal, "MAX_BLOCK", max(sizes) - 1)
    read = scan_segment(SEGMENT)
    assert read.blocks == CLEAN.blocks[:longest]
    assert read.reason == f"block length {max(sizes)} is not valid"
    assert read.end == ("torn" if longest == len(sizes) - 1 else "damaged")


# ================================================================ how a segment ends


def test_a_header_alone_is_a_clean_empty_segment_and_zeros_after_it_are_space() -> None:
    head = encode_wal_header(1, 77, 0)
    for data, end in [(head, "clean"), (head + bytes(4096), "zeros")]:
        read = scan_segment(data)
        assert (read.end, read.blocks, read.valid_end, read.next_lsn) == (end, [], 32, 77)


_LAST = CLEAN.blocks[-1]


@pytest.mark.parametrize(
    "cut",
    [_LAST.offset + 1, _LAST.offset + 20, _LAST.offset + 40, _LAST.end - 1],
    ids=["length", "block-header", "body", "last-byte"],
)
@pytest.mark.parametrize("zeros", [0, 100])
def test_a_partial_last_block_is_a_torn_tail(cut: int, zeros: int) -> None:
    assert any(SEGMENT[_LAST.offset : cut])  # some of the block's bytes were written
    read = scan_segment(SEGMENT[:cut] + bytes(zeros))
    assert (read.end, read.valid_end, len(read.blocks)) == ("torn", _LAST.offset, 2)


def test_a_partial_block_followed_by_a_valid_one_is_damage() -> None:
    partial = SEGMENT[_LAST.offset : _LAST.offset + 40] + bytes(8)
    later = layout.build_block(_BODY, epoch=4, first_lsn=_LAST.first_lsn, count=2)
    read = scan_segment(SEGMENT[: _LAST.offset] + partial + later + bytes(64))
    assert (read.end, read.valid_end, len(read.blocks)) == ("damaged", _LAST.offset, 2)


# ================================================================ the next segment's LSN


def test_blocks_from_the_next_segments_first_lsn_on_are_not_this_segments() -> None:
    third = CLEAN.blocks[2].first_lsn
    read = scan_segment(SEGMENT, stop_lsn=third)
    assert (read.end, read.valid_end, len(read.blocks)) == ("damaged", OFFSETS[2], 2)
    assert read.reason == "a later segment begins here"
    # ... unless only zeros follow: the segment just ended there
    read = scan_segment(SEGMENT[: OFFSETS[2]] + bytes(50), stop_lsn=third)
    assert (read.end, read.valid_end) == ("zeros", OFFSETS[2])
    # and a segment that stops exactly where the next begins is whole
    read = scan_segment(SEGMENT, stop_lsn=CLEAN.next_lsn)
    assert (read.end, len(read.blocks)) == ("clean", 3)


def test_a_block_running_past_the_next_segments_first_lsn_is_damage() -> None:
    read = scan_segment(SEGMENT, stop_lsn=CLEAN.blocks[2].first_lsn + 1)
    assert (read.end, read.valid_end, len(read.blocks)) == ("damaged", OFFSETS[2], 2)
    assert "runs past LSN" in (read.reason or "")


# ================================================================ block bodies


def _block(body: bytes, count: int) -> Block:
    return scan_segment(layout.build_wal_header() + layout.build_block(body, count=count)).blocks[0]


@pytest.mark.parametrize("count", [0, 1, 3, 2**32 - 1])
def test_a_block_whose_count_is_not_its_records_is_a_data_error(count: int) -> None:
    body = msgspec.msgpack.encode(
        [["a", 1, [encode_record(put(1))]], ["b", 1, [encode_record(put(2))]]]
    )
    assert len(decode_groups(_block(body, 2))) == 2
    with pytest.raises(DataError, match="another count"):
        decode_groups(_block(body, count))


def test_encode_block_trusts_the_count_it_is_given_and_readers_catch_a_wrong_one() -> None:
    data = layout.build_wal_header() + encode_block(1, 1, [("a", 1, [encode_record(put(1))])], 2)
    [block] = scan_segment(data).blocks  # the CRC is right: the header is what was written
    assert block.count == 2
    with pytest.raises(DataError):
        decode_groups(block)


@pytest.mark.parametrize(
    "body",
    [
        msgspec.msgpack.encode({"a": 1}),
        msgspec.msgpack.encode([["a", "not a seq", []]]),
        msgspec.msgpack.encode([["a", 1]]),
        b"\xc1",  # never used in msgpack
        msgspec.msgpack.encode([["a", 1, []]])[:-1],
    ],
    ids=["map", "bad-seq", "short-group", "bad-byte", "cut"],
)
def test_a_body_that_is_not_a_list_of_groups_is_a_data_error(body: bytes) -> None:
    with pytest.raises(DataError, match="does not decode"):
        decode_groups(_block(body, 0))


# ================================================================ records


def _event_of_size(size: int, body: Callable[[int], bytes]) -> ev.MessagesPut:
    """A MessagesPut whose msgpack is exactly ``size`` bytes."""
    for n in range(size):
        event = ev.MessagesPut(T, [ev.PutItem(1, body(n), T)])
        if len(msgspec.msgpack.encode(event)) == size:
            return event
    raise AssertionError(f"no body gives a {size}-byte record")


def _is_compressed(record: bytes) -> bool:
    value = msgspec.msgpack.decode(record)
    if not isinstance(value, msgspec.msgpack.Ext):
        return False
    assert value.code == 1
    assert value.data[:4] == layout.ZSTD_MAGIC
    return True


@pytest.mark.parametrize(
    ("size", "body", "compressed"),
    [
        (255, compressible, False),  # under the threshold however well it compresses
        (256, compressible, True),
        (4000, compressible, True),
        (256, incompressible, False),  # compressing does not pay
        (4000, incompressible, False),
    ],
)
def test_records_are_compressed_exactly_when_format_md_says(
    size: int, body: Callable[[int], bytes], compressed: bool
) -> None:
    event = _event_of_size(size, body)
    plain = msgspec.msgpack.encode(event)
    record = encode_record(event)
    assert _is_compressed(record) is compressed
    if compressed:
        frame = bytes(msgspec.msgpack.decode(record).data)
        assert zstandard.get_frame_parameters(frame).content_size == size
        assert zstandard.ZstdDecompressor().decompress(frame) == plain
    else:
        assert record == plain
    assert decode_record(record) == event


def test_a_record_is_compressed_when_it_shrinks_to_exactly_the_gain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "compresses to at most 90 %": find a record whose frame is an exact fraction of it,
    # make that fraction the gain, and the record is compressed; a hair less, it is not.
    for n in range(300, 2000):
        event = ev.MessagesPut(T, [ev.PutItem(1, compressible(n), T)])
        plain = msgspec.msgpack.encode(event)
        packed = zstandard.ZstdCompressor(level=1).compress(plain)
        gain = len(packed) / len(plain)
        if gain * len(plain) == len(packed):
            break
    else:
        raise AssertionError("no record whose frame is an exact fraction of it")
    monkeypatch.setattr(wal, "COMPRESS_GAIN", gain)
    assert _is_compressed(encode_record(event))
    monkeypatch.setattr(wal, "COMPRESS_GAIN", gain - 1e-9)
    assert encode_record(event) == plain


@PROPERTY
@given(st.lists(_events, min_size=1, max_size=10))
def test_compression_follows_the_rule_for_any_event(events: Events) -> None:
    for event in events:
        plain = msgspec.msgpack.encode(event)
        packed = zstandard.ZstdCompressor(level=1).compress(plain)
        should = len(plain) >= 256 and len(packed) <= 0.9 * len(plain)
        assert _is_compressed(encode_record(event)) is should


@pytest.mark.parametrize("body", [compressible, incompressible], ids=["compressible", "random"])
def test_a_record_over_max_record_is_not_written(
    monkeypatch: pytest.MonkeyPatch, body: Callable[[int], bytes]
) -> None:
    # The real limit is 256 MiB; lowering it keeps the test small and exercises the same check.
    # A compressible record is refused too: a reader refuses a frame whose content is over
    # the limit, so a writer must never write one.
    event = _event_of_size(400, body)
    monkeypatch.setattr(wal, "MAX_RECORD", 399)
    with pytest.raises(DataError, match="over the 399 limit") as info:
        encode_record(event)
    assert info.value.kind is ErrorKind.DATA
    monkeypatch.setattr(wal, "MAX_RECORD", 400)
    assert decode_record(encode_record(event)) == event


def test_a_compressed_record_over_max_record_does_not_decode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    record = encode_record(_event_of_size(4000, compressible))
    monkeypatch.setattr(wal, "MAX_RECORD", 3999)
    with pytest.raises(DataError, match="over 3999"):
        decode_record(record)


def test_a_block_over_max_block_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    groups = [("a", 1, [encode_record(put(1, incompressible(300)))])]
    size = len(encode_block(1, 1, groups)) - layout.BLOCK_HEADER
    monkeypatch.setattr(wal, "MAX_BLOCK", size - 1)
    with pytest.raises(DataError, match="over the"):
        encode_block(1, 1, groups)
    monkeypatch.setattr(wal, "MAX_BLOCK", size)
    assert len(encode_block(1, 1, groups)) == size + layout.BLOCK_HEADER


def _ext(code: int, data: bytes) -> bytes:
    return msgspec.msgpack.encode(msgspec.msgpack.Ext(code, data))


_PLAIN = msgspec.msgpack.encode(put(1, compressible(1000)))


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (_ext(2, zstandard.ZstdCompressor().compress(_PLAIN)), "unknown record extension 2"),
        (_ext(1, b"not a zstd frame"), "does not decode"),
        (_ext(1, zstandard.ZstdCompressor(write_content_size=False).compress(_PLAIN)), "unknown"),
        (_ext(1, zstandard.ZstdCompressor().compress(_PLAIN)[:-3]), "does not decode"),
        (_ext(1, zstandard.ZstdCompressor().compress(b"\x93\xa3nop\x01\x02")), "does not decode"),
        (_PLAIN[:-1], "does not decode"),
        (msgspec.msgpack.encode(["no-such-tag", 1]), "does not decode"),
        (b"", "does not decode"),
    ],
    ids=[
        "other-extension",
        "garbage-frame",
        "no-content-size",
        "cut-frame",
        "unknown-event-inside",
        "cut-plain",
        "unknown-tag",
        "empty",
    ],
)
def test_a_record_that_does_not_decode_is_a_data_error(record: bytes, message: str) -> None:
    with pytest.raises(DataError, match=message):
        decode_record(record)
