"""The segment and snapshot-object codec (FORMAT.md), and the log's object names.

Round trips cover every event type, payloads on both sides of the compression threshold and
snapshot objects small and large. Damage tests build objects byte by byte with
:mod:`tests.unit.log.layout` (an independent reading of FORMAT.md) and check the exact
:class:`~actors.log.codec.Damage`. Property tests truncate and flip bits in a real segment:
the decoder either rejects the header with a ``DataError`` or returns exactly the records
before the first damaged one — never another exception.
"""

from __future__ import annotations

import contextlib
import random
import struct
import tracemalloc
import typing

import msgspec
import pytest
import zstandard
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from actors.core import commands as c
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.snapshot import (
    decode_snapshot,
    encode_snapshot,
    encode_snapshot_parts,
    restore,
    snapshot,
)
from actors.core.state import QueueState
from actors.errors import DataError, ErrorKind
from actors.ids import SequentialIds
from actors.log import codec, keys
from actors.log.codec import (
    Damage,
    SegmentHeader,
    check_snapshot_object,
    decode_segment,
    decode_segment_header,
    decode_snapshot_object,
    encode_payloads,
    encode_segment,
    encode_snapshot_object,
    encode_snapshot_object_parts,
)
from actors.settings import QueueSettings
from tests.unit.log import layout

T = 1_700_000_000_000
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compressible(n: int) -> bytes:
    """``n`` bytes that zstd shrinks a lot."""
    return (b"evq compressible body; " * (n // 23 + 1))[:n]


def incompressible(n: int, seed: int = 0) -> bytes:
    """``n`` random bytes (zstd cannot shrink them)."""
    return random.Random(seed).randbytes(n)


SETTINGS = QueueSettings(
    visibility_timeout_ms=45_000,
    max_receives=4,
    dead_letter_queue="orders-dlq",
    retention_ms=86_400_000,
    max_message_bytes=1 << 20,
    delay_ms=250,
    idempotency_window_ms=60_000,
)


def samples() -> list[ev.Event]:
    """At least one event of every type, with optional fields both set and unset."""
    return [
        ev.QueueCreated(T, "orders", SETTINGS),
        ev.SettingsChanged(T + 1, QueueSettings(fifo=True, content_based_dedup=True)),
        ev.MessagesPut(T + 2, [ev.PutItem(1, b"one", T + 2)]),
        ev.MessagesPut(
            T + 3,
            [
                ev.PutItem("client-id", b"\x00\xff binary", T + 10, "idem", "g1", {"a": 1}),
                ev.PutItem(2, compressible(4000), T + 3, attributes={"nested": {"x": [1, "y"]}}),
                ev.PutItem(3, incompressible(700), T + 3, group="g2"),
            ],
        ),
        ev.MessagesTaken(T + 4, [1, "client-id"], [1001, 2**63 - 1], T + 30_004),
        ev.MessagesAcked(T + 5, [1]),
        ev.MessagesReleased(T + 6, ["client-id"], [T + 1_006]),
        ev.LeasesExtended(T + 7, [2, 3], [T + 60_000, T + 60_001]),
        ev.MessageUpdated(T + 8, 2, b"new body", T + 9),
        ev.MessageUpdated(T + 8, "client-id"),
        ev.MessagesDeleted(T + 9, [2, "client-id"]),
        ev.QueuePurged(T + 10),
        ev.DeadLettersRouted(T + 11, [4, 5, 6]),
        ev.WriterStarted(T + 12, 7),
        ev.MessagesAcked(T + 13, []),
        ev.KeySet(T + 14, "price:eur", 3, {"bid": 1.5, "tags": ["a", None]}),
        ev.Checkpoint(T + 15),
        ev.QueueDeleted(T + 16),
        ev.MoveTaskStarted(T + 17, "task-1", None, None, 40),
        ev.MoveTaskStarted(T + 18, "task-2", "orders", 50, 0),
        ev.MoveTaskProgressed(T + 19, "task-2", 12),
        ev.MoveTaskCancelling(T + 20, "task-2"),
        ev.MoveTaskEnded(T + 21, "task-2", "CANCELLED"),
        ev.MoveTaskEnded(T + 22, "task-1", "FAILED", "QueueNotFound"),
        ev.BodiesMoved(T + 23, [5, 9], [0, 998], [[b"a", b""], [compressible(3000), b"z"]]),
        ev.QueueHandedOver(T + 24, 0, 3, 2),
        ev.QueueTakenOver(T + 25, 0, 2),
        ev.QueuePaused(T + 26, True),
        ev.QueuePaused(T + 27, False),
    ]


SAMPLES = samples()
# A real segment: every event type, plain and compressed records.
SEGMENT = encode_segment(5, 100, encode_payloads(SAMPLES))
SEGMENT_FRAMES = layout.frames(SEGMENT)


def segment_of(events: list[ev.Event], *, epoch: int = 2, first_seq: int = 1) -> bytes:
    return encode_segment(epoch, first_seq, encode_payloads(events))


def put_of_payload_size(size: int, body: typing.Callable[[int], bytes]) -> ev.MessagesPut:
    """A MessagesPut whose msgpack is exactly ``size`` bytes."""
    for n in range(1, size):
        event = ev.MessagesPut(T, [ev.PutItem(1, body(n), T)])
        if len(encode_payloads([event])[0]) == size:
            return event
    raise AssertionError(f"no body gives a {size}-byte payload")


# ================================================================ segments: round trips


def test_samples_cover_every_event_type() -> None:
    # A new event type must get a sample here (and a record in the next golden file).
    assert {type(e) for e in SAMPLES} == set(typing.get_args(ev.Event))


def test_an_empty_segment_is_just_a_header() -> None:
    data = encode_segment(9, 42, [])
    assert len(data) == layout.SEG_HEADER
    read = decode_segment(data)
    assert read.header == SegmentHeader(version=1, epoch=9, first_seq=42, count=0)
    assert read.events == []
    assert read.damage is None
    assert read.last_seq == 41


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_one_event_round_trips(event: ev.Event) -> None:
    read = decode_segment(segment_of([event], epoch=3, first_seq=7))
    assert read.header == SegmentHeader(1, 3, 7, 1)
    assert read.events == [event]
    assert type(read.events[0]) is type(event)
    assert read.damage is None
    assert read.last_seq == 7


def test_many_events_of_every_type_round_trip() -> None:
    events = SAMPLES * 40
    data = segment_of(events, epoch=2**64 - 1, first_seq=2**63)
    read = decode_segment(data)
    assert read.header == SegmentHeader(1, 2**64 - 1, 2**63, len(events))
    assert read.events == events
    assert read.damage is None
    assert read.last_seq == 2**63 + len(events) - 1


def test_header_fields_are_where_format_md_puts_them() -> None:
    h = layout.seg_header(SEGMENT)
    assert (h.magic, h.version, h.flags, h.epoch, h.first_seq, h.count) == (
        b"EVQS",
        1,
        0,
        5,
        100,
        len(SAMPLES),
    )
    assert SEGMENT[:32] == layout.build_header(epoch=5, first_seq=100, count=len(SAMPLES))


@pytest.mark.parametrize(
    ("make_body", "payload_size", "compressed"),
    [
        (compressible, 255, False),  # under the threshold: plain even if it would shrink
        (compressible, 256, True),  # at the threshold and shrinks by far more than 10 %
        (compressible, 5000, True),
        (incompressible, 256, False),  # would not shrink: stays plain
        (incompressible, 5000, False),
        (lambda n: b"x" * n, 32, False),
    ],
    ids=[
        "compressible-255",
        "compressible-256",
        "compressible-5000",
        "random-256",
        "random-5000",
        "tiny",
    ],
)
def test_records_are_compressed_exactly_when_format_md_says(
    make_body: typing.Callable[[int], bytes], payload_size: int, compressed: bool
) -> None:
    event = put_of_payload_size(payload_size, make_body)
    plain = encode_payloads([event])[0]
    data = segment_of([event])
    [frame] = layout.frames(data)
    assert frame.crc == layout.record_crc(frame.flags, frame.payload)
    if compressed:
        assert frame.flags == 1
        assert frame.payload.startswith(layout.ZSTD_MAGIC)
        # "level 1, content size in the frame", and at least 10 % smaller
        assert zstandard.get_frame_parameters(frame.payload).content_size == payload_size
        assert zstandard.ZstdDecompressor().decompress(frame.payload) == plain
        assert frame.length <= 0.9 * payload_size
    else:
        assert frame.flags == 0
        assert frame.payload == plain
    assert decode_segment(data).events == [event]


def test_plain_and_compressed_records_mix_in_one_segment() -> None:
    flags = [f.flags for f in SEGMENT_FRAMES]
    assert 0 in flags
    assert 1 in flags
    assert decode_segment(SEGMENT).events == SAMPLES


def test_bytes_after_the_last_counted_record_are_ignored() -> None:
    read = decode_segment(SEGMENT + b"\x00garbage after the count")
    assert read.events == SAMPLES
    assert read.damage is None


def test_a_record_over_the_limit_is_not_written(monkeypatch: pytest.MonkeyPatch) -> None:
    # The real limit is 256 MiB; lowering it keeps the test small and exercises the same check.
    monkeypatch.setattr(codec, "MAX_RECORD", 100)
    with pytest.raises(DataError):
        encode_segment(1, 1, [incompressible(101)])
    assert layout.frames(encode_segment(1, 1, [incompressible(100)]))[0].length == 100
    read = decode_segment(layout.build_header(count=1) + layout.build_frame(incompressible(101)))
    assert read.damage is not None
    assert "over the limit" in read.damage.reason


# ================================================================ segments: headers


def _with_header(**fields: typing.Any) -> bytes:
    """SEGMENT with its header rebuilt from ``fields`` (valid CRC unless one is given)."""
    base = {"epoch": 5, "first_seq": 100, "count": len(SAMPLES)}
    return layout.build_header(**{**base, **fields}) + SEGMENT[layout.SEG_HEADER :]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (_with_header(magic=b"EVQP"), "magic"),
        (_with_header(magic=b"\x00\x00\x00\x00"), "magic"),
        (_with_header(version=2), "version 2"),
        (_with_header(version=0), "version 0"),
        (_with_header(flags=1), "flags"),
        (_with_header(flags=0x8000), "flags"),
        (_with_header(crc=0), "checksum"),
        (_with_header(epoch=6, crc=layout.seg_header(SEGMENT).crc), "checksum"),
        (SEGMENT[:31], "shorter"),
        (b"", "shorter"),
    ],
    ids=[
        "snapshot-magic",
        "zero-magic",
        "version-2",
        "version-0",
        "flag-bit-0",
        "flag-bit-15",
        "crc",
        "stale-crc",
        "31-bytes",
        "empty",
    ],
)
def test_a_bad_header_is_a_data_error(data: bytes, message: str) -> None:
    for decode in (decode_segment_header, decode_segment):
        with pytest.raises(DataError) as info:
            decode(data)
        assert info.value.kind is ErrorKind.DATA
        assert message in info.value.message


def test_the_header_alone_decodes_from_a_prefix() -> None:
    assert decode_segment_header(SEGMENT[:32]) == SegmentHeader(1, 5, 100, len(SAMPLES))
    assert decode_segment_header(memoryview(SEGMENT)) == SegmentHeader(1, 5, 100, len(SAMPLES))


# ================================================================ segments: damaged records


def _two_good_then(bad: bytes, *, count: int = 3) -> tuple[bytes, int]:
    """A segment of two valid records followed by ``bad``; and the offset of ``bad``."""
    good = encode_payloads(SAMPLES[:2])
    body = b"".join(layout.build_frame(p) for p in good)
    return layout.build_header(count=count) + body + bad, layout.SEG_HEADER + len(body)


_PAYLOAD = encode_payloads([ev.MessagesAcked(T, [1, 2, 3])])[0]
_NOT_AN_EVENT = msgspec.msgpack.encode(["nope", 1, 2])


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (b"", "torn tail"),
        (layout.build_frame(_PAYLOAD)[:8], "torn tail"),  # frame cut short
        (layout.build_frame(_PAYLOAD)[:-1], "torn tail"),  # payload cut short
        (layout.build_frame(_PAYLOAD, length=256 * 1024 * 1024 + 1), "over the limit"),
        (layout.build_frame(_PAYLOAD, flags=2), "unknown record flags"),
        (layout.build_frame(_PAYLOAD, flags=0x81), "unknown record flags"),
        (layout.build_frame(_PAYLOAD, crc=0), "checksum mismatch"),
        (layout.build_frame(_PAYLOAD, flags=1, crc=layout.record_crc(0, _PAYLOAD)), "checksum"),
        (layout.build_frame(_PAYLOAD, flags=1), "does not decode"),  # not a zstd frame
        (layout.build_frame(_NOT_AN_EVENT), "does not decode"),
        (layout.build_frame(_PAYLOAD + b"\x00"), "does not decode"),  # trailing byte
        (layout.build_frame(b""), "does not decode"),
        (
            layout.build_frame(zstandard.ZstdCompressor().compress(_NOT_AN_EVENT), flags=1),
            "does not decode",
        ),
        (
            # a frame without its content size
            layout.build_frame(
                zstandard.ZstdCompressor(write_content_size=False).compress(_PAYLOAD), flags=1
            ),
            "does not decode",
        ),
    ],
    ids=[
        "missing",
        "frame-cut",
        "payload-cut",
        "over-limit",
        "flag-bit-1",
        "flag-bit-7",
        "crc",
        "crc-without-flag",
        "not-zstd",
        "not-an-event",
        "trailing-byte",
        "empty-payload",
        "zstd-not-an-event",
        "zstd-no-content-size",
    ],
)
def test_a_damaged_record_ends_the_segment_exactly_there(bad: bytes, reason: str) -> None:
    # a valid record follows the damaged one, except where the damage is the end of the data
    follow = b"" if reason == "torn tail" else layout.build_frame(_PAYLOAD)
    data, offset = _two_good_then(bad + follow, count=4)
    read = decode_segment(data)
    assert read.events == SAMPLES[:2]
    assert read.damage is not None
    assert read.damage.offset == offset
    assert read.damage.records_discarded == 2
    assert reason in read.damage.reason
    assert read.last_seq == 2


def test_a_count_beyond_the_records_present_is_a_torn_tail() -> None:
    data = encode_segment(1, 1, encode_payloads(SAMPLES[:3]))
    lying = layout.build_header(count=1000) + data[layout.SEG_HEADER :]
    read = decode_segment(lying)
    assert read.events == SAMPLES[:3]
    assert read.damage == Damage(len(data), "torn tail: record frame cut short", 997)


def zstd_claiming(size: int) -> bytes:
    """A zstd frame whose header declares ``size`` bytes of content, followed by one RLE
    block of one byte: nothing random produces it under a valid CRC, a buggy writer or a
    forged object can. Allocating the declared size up front exhausts memory."""
    return layout.ZSTD_MAGIC + b"\xe0" + struct.pack("<Q", size) + b"\x0b\x00\x00a"


# beyond any memory: 2**39 (512 GiB) and 2**62
HUGE = [pytest.param(2**39, id="512GiB"), pytest.param(2**62, id="4EiB")]


@pytest.mark.parametrize("size", HUGE)
def test_a_valid_record_claiming_a_huge_decompressed_size_is_damage(size: int) -> None:
    # It must end the segment like any record that does not decompress.
    frame = zstd_claiming(size)
    data, offset = _two_good_then(layout.build_frame(frame, flags=1))
    read = decode_segment(data)
    assert read.events == SAMPLES[:2]
    assert read.damage is not None
    assert (read.damage.offset, read.damage.records_discarded) == (offset, 1)


# ================================================================ segments: properties


def _record_at(byte: int) -> int:
    """Index of the record whose frame or payload holds ``byte`` of SEGMENT."""
    for i, frame in enumerate(SEGMENT_FRAMES):
        if frame.offset <= byte < frame.end:
            return i
    raise AssertionError(byte)


def _assert_prefix(data: bytes, kept: int) -> None:
    """decode_segment(data) keeps exactly SAMPLES[:kept] and reports the rest exactly."""
    read = decode_segment(data)
    assert read.header == SegmentHeader(1, 5, 100, len(SAMPLES))
    assert read.events == SAMPLES[:kept]
    if kept == len(SAMPLES):
        assert read.damage is None
    else:
        assert read.damage is not None
        assert read.damage.offset == SEGMENT_FRAMES[kept].offset
        assert read.damage.records_discarded == len(SAMPLES) - kept
    assert read.last_seq == 100 + kept - 1


@PROPERTY
@given(cut=st.integers(0, len(SEGMENT)))
@example(cut=0)
@example(cut=layout.SEG_HEADER - 1)
@example(cut=layout.SEG_HEADER)
@example(cut=len(SEGMENT) - 1)
@example(cut=len(SEGMENT))
def test_truncation_keeps_exactly_the_whole_records_before_the_cut(cut: int) -> None:
    data = SEGMENT[:cut]
    if cut < layout.SEG_HEADER:
        with pytest.raises(DataError):
            decode_segment(data)
        return
    kept = sum(1 for f in SEGMENT_FRAMES if f.end <= cut)
    _assert_prefix(data, kept)


def test_truncation_at_every_offset_of_the_last_two_records() -> None:
    # The property test samples; this walks every byte of the tail deterministically.
    for cut in range(SEGMENT_FRAMES[-2].offset, len(SEGMENT) + 1):
        _assert_prefix(SEGMENT[:cut], sum(1 for f in SEGMENT_FRAMES if f.end <= cut))


@PROPERTY
@given(bits=st.lists(st.integers(0, len(SEGMENT) * 8 - 1), min_size=1, max_size=2, unique=True))
def test_bit_flips_keep_exactly_the_records_before_the_first_damaged_one(bits: list[int]) -> None:
    data = SEGMENT
    for bit in bits:
        data = layout.flip_bit(data, bit)
    if min(bits) < layout.SEG_HEADER * 8:
        with pytest.raises(DataError):
            decode_segment(data)
        return
    _assert_prefix(data, min(_record_at(bit // 8) for bit in bits))


@pytest.mark.parametrize("record", range(len(SEGMENT_FRAMES)))
def test_every_single_bit_flip_in_a_record_is_caught(record: int) -> None:
    frame = SEGMENT_FRAMES[record]
    for bit in range(frame.offset * 8, min(frame.end, frame.offset + 80) * 8):
        _assert_prefix(layout.flip_bit(SEGMENT, bit), record)


@PROPERTY
@given(tail=st.binary(max_size=300), count=st.integers(0, 2**32 - 1))
def test_any_bytes_after_a_valid_header_decode_without_raising(tail: bytes, count: int) -> None:
    read = decode_segment(layout.build_header(count=count) + tail)
    assert read.header.count == count
    assert len(read.events) <= count
    if read.damage is not None:
        assert read.damage.records_discarded == count - len(read.events)
        assert layout.SEG_HEADER <= read.damage.offset <= layout.SEG_HEADER + len(tail)


@PROPERTY
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_are_a_segment_or_a_data_error(data: bytes) -> None:
    for candidate in (data, b"EVQS" + data, b"EVQS\x01\x00" + data):
        with contextlib.suppress(DataError):
            decode_segment(candidate)


# ================================================================ snapshot objects


def _state_with(n: int, body: typing.Callable[[int], bytes]) -> QueueState:
    state = QueueState()
    ids = SequentialIds()
    execute(state, c.Create("snap", QueueSettings()), T, ids)
    for i in range(0, n, 100):
        batch = [c.NewMessage(body=body(i + j + 1)) for j in range(min(100, n - i))]
        execute(state, c.Put(batch), T + i, ids)
    if n:
        execute(state, c.Take(max=min(n, 3)), T + n, ids)
    return state


def _body(state: QueueState) -> bytes:
    return encode_snapshot(snapshot(state))


@pytest.mark.parametrize(
    ("messages", "make_body", "compressed"),
    [
        (0, compressible, False),  # a small body stays plain
        (2000, lambda i: compressible(50 + i % 7), True),
        (300, lambda i: incompressible(600, seed=i), False),
    ],
    ids=["small", "large-compressible", "large-incompressible"],
)
def test_snapshot_objects_round_trip(
    messages: int, make_body: typing.Callable[[int], bytes], compressed: bool
) -> None:
    state = _state_with(messages, make_body)
    body = _body(state)
    data = encode_snapshot_object(11, 12345, body)
    head = layout.snap_header(data)
    assert (head.magic, head.version, head.epoch, head.seq) == (b"EVQP", 1, 11, 12345)
    assert head.flags == (1 if compressed else 0)
    stored = data[layout.SNAP_HEADER :]
    assert head.body_length == len(stored)
    assert (
        data[: layout.SNAP_HEADER]
        == layout.build_snapshot(stored, epoch=11, seq=12345, flags=head.flags)[
            : layout.SNAP_HEADER
        ]
    )
    if compressed:
        assert len(stored) <= 0.9 * len(body)
        assert zstandard.ZstdDecompressor().decompress(stored) == body
    else:
        assert stored == body
    epoch, seq, got = decode_snapshot_object(data)
    assert (epoch, seq, got) == (11, 12345, body)
    assert type(got) is bytes
    # and the body is the state again
    assert _body(restore(decode_snapshot(got))) == body


@pytest.mark.parametrize(
    ("messages", "make_body"),
    [
        (0, compressible),
        (2000, lambda i: compressible(50 + i % 7)),
        (300, lambda i: incompressible(600, seed=i)),
        (70_000, lambda i: b"x"),  # more messages than an array 16 holds
    ],
    ids=["small", "large-compressible", "large-incompressible", "array-32"],
)
@pytest.mark.parametrize("part_bytes", [1, 1000, 70_000, 1 << 20])
def test_a_snapshot_object_written_in_parts_is_the_same_snapshot(
    messages: int, make_body: typing.Callable[[int], bytes], part_bytes: int
) -> None:
    snap = snapshot(_state_with(messages, make_body))
    body = encode_snapshot(snap)
    assert b"".join(encode_snapshot_parts(snap, part_bytes)) == body
    data = encode_snapshot_object_parts(3, 99, lambda: encode_snapshot_parts(snap, part_bytes))
    whole = encode_snapshot_object(3, 99, body)
    assert decode_snapshot_object(data) == (3, 99, body)
    assert check_snapshot_object(data) == (3, 99)
    # the same flags (compressed exactly when one-shot is), and a plain one byte for byte
    assert layout.snap_header(data).flags == layout.snap_header(whole).flags
    if not layout.snap_header(whole).flags:
        assert data == whole


def test_a_big_snapshot_is_never_whole_in_memory_in_plain() -> None:
    """Written in parts, a compressible snapshot of 40 MB takes a few MB of memory beyond the
    state, not the plain 40 MB (the shard's memory budget: loadtest/RESULTS.md "Overload")."""
    snap = snapshot(_state_with(40_000, lambda i: compressible(1000)))
    plain = len(encode_snapshot(snap))
    tracemalloc.start()
    try:
        data = encode_snapshot_object_parts(1, 2, lambda: encode_snapshot_parts(snap))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert plain > 40_000_000
    assert len(data) < plain // 20
    assert peak < plain // 10


def test_the_read_back_check_catches_what_decoding_would_without_decompressing() -> None:
    good = encode_snapshot_object(4, 77, _body(_state_with(400, lambda i: compressible(40))))
    assert check_snapshot_object(good) == (4, 77)
    for bad in (good[:-1], layout.flip_bit(good, 8 * 60), layout.flip_bit(good, 8)):
        with pytest.raises(DataError):
            check_snapshot_object(bad)


SNAP_BODY = _body(_state_with(400, lambda i: compressible(40)))
SNAPSHOT = encode_snapshot_object(4, 77, SNAP_BODY)
assert layout.snap_header(SNAPSHOT).flags == 1  # the property tests below cover zstd bodies


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "shorter"),
        (SNAPSHOT[:39], "shorter"),
        (layout.build_snapshot(b"x", magic=b"EVQS"), "magic"),
        (layout.build_snapshot(b"x", version=2), "version 2"),
        (layout.build_snapshot(b"x", flags=2), "flags"),
        (layout.build_snapshot(b"x", crc=1), "checksum"),
        (layout.build_snapshot(b"x", body_length=2), "body is 1 bytes"),
        (layout.build_snapshot(b"x", body_crc=0), "body checksum"),
        (SNAPSHOT[:-1], "header says"),
        (SNAPSHOT + b"\x00", "header says"),
        (layout.build_snapshot(b"not zstd", flags=1), "decompress"),
    ],
    ids=[
        "empty",
        "39-bytes",
        "segment-magic",
        "version-2",
        "flag-bit-1",
        "crc",
        "length",
        "body-crc",
        "body-cut",
        "body-extra",
        "not-zstd",
    ],
)
def test_a_bad_snapshot_object_is_a_data_error(data: bytes, message: str) -> None:
    with pytest.raises(DataError) as info:
        decode_snapshot_object(data)
    assert info.value.kind is ErrorKind.DATA
    assert message in info.value.message


@pytest.mark.parametrize("size", HUGE)
def test_a_snapshot_claiming_a_huge_decompressed_size_is_a_data_error(size: int) -> None:
    with pytest.raises(DataError):
        decode_snapshot_object(layout.build_snapshot(zstd_claiming(size), flags=1))


@PROPERTY
@given(cut=st.integers(0, len(SNAPSHOT) - 1))
def test_a_truncated_snapshot_object_is_a_data_error(cut: int) -> None:
    with pytest.raises(DataError):
        decode_snapshot_object(SNAPSHOT[:cut])


@PROPERTY
@given(bits=st.lists(st.integers(0, len(SNAPSHOT) * 8 - 1), min_size=1, max_size=3, unique=True))
def test_a_bit_flipped_snapshot_object_is_a_data_error(bits: list[int]) -> None:
    data = SNAPSHOT
    for bit in bits:
        data = layout.flip_bit(data, bit)
    with pytest.raises(DataError):
        decode_snapshot_object(data)


@PROPERTY
@given(data=st.binary(max_size=100))
def test_arbitrary_bytes_are_a_snapshot_object_or_a_data_error(data: bytes) -> None:
    for candidate in (data, b"EVQP\x01\x00" + data):
        with contextlib.suppress(DataError):
            decode_snapshot_object(candidate)


# ================================================================ object names


@pytest.mark.parametrize("seq", [0, 1, 9, 10, 99, 100, 12345, 2**32, 2**63, 2**64 - 1])
def test_names_carry_their_sequence_number(seq: int) -> None:
    seg, snap = keys.segment_key("q-1", seq), keys.snapshot_key("q-1", seq)
    assert seg == f"queues/q-1/log/{seq:020d}.seg"
    assert snap == f"queues/q-1/snap/{seq:020d}.snap"
    assert seg.startswith(keys.log_prefix("q-1"))
    assert snap.startswith(keys.snapshot_prefix("q-1"))
    assert keys.log_prefix("q-1").startswith(keys.queue_prefix("q-1"))
    assert keys.seq_of(seg) == keys.seq_of(snap) == seq
    assert keys.queue_of(seg) == keys.queue_of(snap) == "q-1"


@given(seqs=st.lists(st.integers(0, 2**64 - 1), max_size=50, unique=True))
def test_sorting_names_is_sorting_numbers(seqs: list[int]) -> None:
    for make in (keys.segment_key, keys.snapshot_key):
        names = [make("q.fifo", s) for s in seqs]
        assert sorted(names) == [make("q.fifo", s) for s in sorted(seqs)]
        assert [keys.seq_of(n) for n in sorted(names)] == sorted(seqs)


def test_other_names() -> None:
    seg = keys.segment_key("q", 5)
    assert keys.damaged_key(seg, 3) == "queues/q/damaged/00000000000000000005.seg.3"
    assert keys.damaged_key(keys.snapshot_key("q", 5), 12) == (
        "queues/q/damaged/00000000000000000005.snap.12"
    )
    assert keys.report_key("q", 7) == "queues/q/reports/0000000007.json"
    assert sorted([keys.report_key("q", 10), keys.report_key("q", 9)])[0].endswith("09.json")


@pytest.mark.parametrize(
    "name",
    [
        "",
        "queues/q/log/",
        "queues/q/log/1.seg",
        "queues/q/log/0000000000000000001.seg",  # 19 digits
        "queues/q/log/000000000000000000001.seg",  # 21 digits
        "queues/q/log/00000000000000000001",
        "queues/q/log/00000000000000000001.",
        "queues/q/log/00000000000000000001.json",
        "queues/q/log/00000000000000000001.seg.3",  # a damaged object's name
        "queues/q/log/00000000000000000001.seg~",
        "queues/q/log/00000000000000000001.SEG",
        "queues/q/log/-0000000000000000001.seg",
        "queues/q/log/+0000000000000000001.seg",
        "queues/q/log/ 0000000000000000001.seg",
        "queues/q/log/0000000000_000000001.seg",
        "queues/q/log/.00000000000000000001.seg",
        "queues/q/log/0x000000000000000001.seg",
        # Digits that are not ASCII: str.isdigit() accepts them, a log name must not. int()
        # rejects superscript two with a ValueError and reads the other two as numbers.
        pytest.param("queues/q/log/" + "\u00b2" * 20 + ".seg", id="superscript-two"),
        pytest.param("queues/q/log/" + "\u0661" * 20 + ".seg", id="arabic-indic-one"),
        pytest.param("queues/q/snap/" + "\uff10" * 19 + "\uff11.snap", id="fullwidth-digits"),
    ],
)
def test_seq_of_rejects_junk(name: str) -> None:
    with pytest.raises(DataError):
        keys.seq_of(name)


@pytest.mark.parametrize("key", ["", "queues/", "queues/q", "other/q/log/x", "q/log/x"])
def test_queue_of_rejects_keys_outside_a_queue(key: str) -> None:
    with pytest.raises(DataError):
        keys.queue_of(key)


def test_a_snapshot_of_many_runs_is_written_in_parts_too() -> None:
    """The runs of a spilling queue (the packed client ids of a 100M queue: 1.7 GB) are
    encoded a part at a time, as messages are, not as one object before compression."""
    state = QueueState()
    state.spill, state.run_min_put = True, 1
    execute(state, c.Create("q", QueueSettings(id_mode="client")), 1, SequentialIds())
    for r in range(600):
        put = [c.NewMessage(body=b"b", id=f"{r:04d}-{k:011d}") for k in range(1000)]
        execute(state, c.Put(put), 2, SequentialIds())
    snap = snapshot(state)
    assert len(snap.runs) == 600
    body = encode_snapshot(snap)
    assert b"".join(encode_snapshot_parts(snap, 1 << 16)) == body
    tracemalloc.start()
    try:
        for _ in encode_snapshot_parts(snap):
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(body) > 12_000_000
    assert peak < len(body) // 3  # whole, it was the body and more; in parts ~3 MB
