"""Golden file of the shard log (format version 2): what a version-2 writer wrote must read
the same forever.

``tests/data/segment-v2.seg`` was written once by ``tests/data/make_golden_v2.py`` (the real
local log device, 4 KiB segments: a header, five blocks of two or three queues' groups, the
preallocated zeros) and committed with ``golden-v2.json``, which says what it contains. These
tests read the committed bytes three ways and compare with the JSON (never with a fresh
encoding, which would move along with a bug):

- byte by byte, with FORMAT.md's layout (``tests/unit/log/layout.py``, struct and zlib; no
  code of ``actors/log/wal.py``);
- with today's codec (``scan_segment``, ``decode_groups``, ``decode_record``);
- with today's recovery of a shard (``read_shard``), on a copy.

One more test encodes the decoded events again with today's writer and demands the same
bytes, so an accidental change of the format is caught where it happens.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import typing
import zlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

from actors.core import events as ev
from actors.core.snapshot import snapshot
from actors.core.state import QueueState
from actors.log import keys, wal
from actors.log.device import LocalLogDevice
from actors.log.shard_recovery import SHARD_STREAM, placement, read_shard
from actors.log.store import LocalDirStore
from actors.log.wal import WalHeader, decode_groups, decode_record, scan_segment
from tests.unit.log import layout
from tests.unit.log.test_golden import assert_matches

DATA = Path(__file__).resolve().parents[2] / "data"
GOLDEN = json.loads((DATA / "golden-v2.json").read_text())
SEGMENT = GOLDEN["segment"]
HEADER = SEGMENT["header"]
BLOCKS = SEGMENT["blocks"]

# The committed file's hash, also kept here: if someone regenerates the file *and* the JSON,
# this still fails. Golden files are never regenerated (tests/data/make_golden_v2.py).
SEGMENT_SHA256 = "525a3943d2ba545371208a9a3f7ac8441e00d444cd7265ab89633439007f35a0"

FORMAT_CHANGED = """\
Today's writer no longer writes the v2 golden segment byte for byte ({detail}).

Do NOT regenerate tests/data/*-v2.*: they are what v2 writers wrote, and readers must read
them forever (the other tests in this module check that).

- If the change is intended (header, block framing, grouping, compression rule, or how an
  event encodes), it is a new format version (FORMAT.md, "Compatibility rules"): bump
  WAL_VERSION in actors/log/wal.py, keep a reader for version 2 (the version field selects
  it), add a golden file of the new version and tests like these for it, and record the
  change in FORMAT.md's version table and in CHANGELOG.md.
- If an event only gained a field appended with a default (allowed by
  actors/core/events.py), old records still decode with the default (the decode test here
  proves it) but new records are longer: add its type to GAINED_FIELDS_IN_V2 below and
  note the new field in FORMAT.md.
- If only zstd-compressed records differ and they decompress to the same msgpack, the
  zstandard library changed its output, not the format: old and new bytes are both valid.
- Otherwise it is an accidental format change: fix the writer.
"""

# Event types that gained an appended field with a default after the v2 golden file was
# written (allowed; see FORMAT.md, "Compatibility rules"). Their blocks are not compared
# byte for byte.
GAINED_FIELDS_IN_V2: set[type] = {
    ev.MessagesTaken,  # attempt
    ev.MessagesReleased,  # reasons (issue 36)
    ev.MessagesDeleted,  # forced (issue 36)
    ev.QueueCreated,  # settings.take_rate, put_rate, max_in_flight (issue 36)
    ev.SettingsChanged,  # the same
}

# Event types added to format version 2 after its golden file was written (a new tag each,
# allowed; FORMAT.md). Their records are frozen here instead: T, then the msgpack of one of
# each, as the writer wrote them when they were added. Never change these bytes.
T = 1_700_000_000_000
ADDED_IN_V2: dict[type, tuple[ev.Event, str]] = {
    ev.MoveTaskStarted: (
        ev.MoveTaskStarted(T, "t", "orders", 50, 3),
        "96ac6d6f76655f73746172746564cf0000018bcfe56800a174a66f72646572733203",
    ),
    ev.MoveTaskProgressed: (
        ev.MoveTaskProgressed(T, "t", 12),
        "94ad6d6f76655f70726f6772657373cf0000018bcfe56800a1740c",
    ),
    ev.MoveTaskCancelling: (
        ev.MoveTaskCancelling(T, "t"),
        "93af6d6f76655f63616e63656c6c696e67cf0000018bcfe56800a174",
    ),
    ev.MoveTaskEnded: (
        ev.MoveTaskEnded(T, "t", "FAILED", "QueueNotFound"),
        "95aa6d6f76655f656e646564cf0000018bcfe56800a174a64641494c4544ad51756575654e6f74466f756e64",
    ),
    ev.BodiesMoved: (
        ev.BodiesMoved(T, [7, 1_700_000_000_123_456], [2, 0], [[b"x", b""], [b"yz"]]),
        "95a56d6f766564cf0000018bcfe568009207cf00060a24182022409202009292c40178c40091c402797a",
    ),
    # a queue handed from one shard to another (issue 34)
    ev.QueueHandedOver: (
        ev.QueueHandedOver(T, 0, 3, 12),
        "95ab68616e6465645f6f766572cf0000018bcfe5680000030c",
    ),
    ev.QueueTakenOver: (
        ev.QueueTakenOver(T, 0, 12),
        "94aa74616b656e5f6f766572cf0000018bcfe56800000c",
    ),
    # a queue's takes paused by an operator (issue 36)
    ev.QueuePaused: (ev.QueuePaused(T, True), "93a6706175736564cf0000018bcfe56800c3"),
}


def _data() -> bytes:
    return (DATA / SEGMENT["file"]).read_bytes()


def _records(block: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for g in block["groups"] for r in g["records"]]


# ---------------------------------------------------------------- the file itself


def test_the_golden_segment_is_the_one_written_once() -> None:
    data = _data()
    assert len(data) == SEGMENT["size"] == SEGMENT["segment_bytes"]
    assert hashlib.sha256(data).hexdigest() == SEGMENT["sha256"] == SEGMENT_SHA256, (
        f"tests/data/{SEGMENT['file']} changed: golden files are never regenerated or edited"
    )


def test_the_golden_segment_is_version_2_and_holds_what_it_was_written_to_hold() -> None:
    assert GOLDEN["format_version"] == HEADER["version"] == 2
    assert SEGMENT["layout"] == "local"
    every_type = {t.__name__ for t in typing.get_args(ev.Event)}
    held = {r["event"]["struct"] for b in BLOCKS for r in _records(b)}
    added = {t.__name__ for t in ADDED_IN_V2}
    assert held == every_type - added  # one record of every type known when it was written
    assert any(r["compressed"] for b in BLOCKS for r in _records(b))
    assert all(2 <= len(b["groups"]) <= 3 for b in BLOCKS)
    [claim] = [g for b in BLOCKS for g in b["groups"] if g["queue"] == SHARD_STREAM]
    assert claim is BLOCKS[0]["groups"][0]
    assert [r["event"]["struct"] for r in claim["records"]] == ["WriterStarted"]
    assert claim["records"][0]["event"]["fields"]["epoch"] == HEADER["epoch"]


# ---------------------------------------------------------------- bytes, as FORMAT.md says


def test_the_golden_header_is_laid_out_as_format_md_says() -> None:
    data = _data()
    magic, version, flags, epoch, first_lsn, shard, crc = struct.unpack_from("<4sHHQQII", data)
    assert (magic, version, flags) == (b"EVQW", 2, 0)
    assert crc == zlib.crc32(data[:28])  # CRC-32 (zlib) of bytes 0..27
    assert (epoch, first_lsn, shard, crc) == (
        HEADER["epoch"],
        HEADER["first_lsn"],
        HEADER["shard"],
        HEADER["header_crc"],
    )
    assert magic.decode() == HEADER["magic"]
    assert layout.wal_header(data) == layout.WalHeader(
        magic, version, flags, epoch, first_lsn, shard, crc
    )
    # the name a local disk gives it: the LSN of its first record
    assert keys.seq_of(keys.wal_segment_key(shard, first_lsn)) == first_lsn


def test_the_golden_blocks_are_framed_as_format_md_says() -> None:
    data = _data()
    found = layout.blocks(data)  # checks each block's CRC with zlib
    got = [(b.offset, b.length, b.crc, b.epoch, b.first_lsn, b.count, b.flags) for b in found]
    want = [
        (b["offset"], b["length"], b["crc"], b["epoch"], b["first_lsn"], b["count"], b["flags"])
        for b in BLOCKS
    ]
    assert got == want
    pos, lsn = layout.WAL_HEADER, HEADER["first_lsn"]
    for block in found:
        # one after another without gaps; the LSN continues; CRC of bytes 8..31 and the body
        assert (block.offset, block.first_lsn, block.flags) == (pos, lsn, 0)
        assert block.length > 0
        assert block.epoch >= HEADER["epoch"]
        head = data[block.offset + 8 : block.offset + layout.BLOCK_HEADER]
        assert block.crc == zlib.crc32(block.body, zlib.crc32(head))
        pos, lsn = block.end, lsn + block.count
    assert (pos, lsn) == (SEGMENT["valid_end"], SEGMENT["next_lsn"])
    # then the preallocated zeros, to the end of the file
    assert data[pos:] == bytes(len(data) - pos)


def test_the_golden_block_bodies_are_groups_of_records_as_format_md_says() -> None:
    data = _data()
    for block, described in zip(layout.blocks(data), BLOCKS, strict=True):
        # msgpack: an array of groups [queue, first_seq, [record, ...]]
        groups = msgspec.msgpack.decode(block.body, type=list[tuple[str, int, list[msgspec.Raw]]])
        assert [(q, s) for q, s, _ in groups] == [
            (g["queue"], g["first_seq"]) for g in described["groups"]
        ]
        assert sum(len(recs) for _, _, recs in groups) == block.count
        for (_, _, raws), group in zip(groups, described["groups"], strict=True):
            for raw, record in zip(raws, group["records"], strict=True):
                stored = bytes(raw)
                assert len(stored) == record["stored_length"]
                plain = _plain_record(stored, record)
                assert len(plain) == record["plain_length"]
                # an event: an array whose first element is its tag
                assert msgspec.msgpack.decode(plain)[0] == record["tag"]


def _plain_record(stored: bytes, record: dict[str, Any]) -> bytes:
    """The msgpack of a stored record: itself, or the zstd frame in its extension type 1."""
    value = msgspec.msgpack.decode(stored)
    if not record["compressed"]:
        assert not isinstance(value, msgspec.msgpack.Ext)
        assert record["stored_length"] == record["plain_length"]
        return stored
    assert isinstance(value, msgspec.msgpack.Ext)
    assert value.code == 1
    frame = bytes(value.data)
    assert frame[:4] == layout.ZSTD_MAGIC
    # 256 bytes or more, at most 90 % once compressed, content size in the frame
    assert record["plain_length"] >= 256
    assert len(frame) <= 0.9 * record["plain_length"]
    assert zstandard.get_frame_parameters(frame).content_size == record["plain_length"]
    return zstandard.ZstdDecompressor().decompress(frame)


# ---------------------------------------------------------------- today's codec


def test_the_golden_segment_scans_to_exactly_what_the_json_says() -> None:
    read = scan_segment(_data())
    assert read.header == WalHeader(
        HEADER["version"], HEADER["epoch"], HEADER["first_lsn"], HEADER["shard"]
    )
    assert (read.end, read.valid_end, read.reason) == ("zeros", SEGMENT["valid_end"], None)
    assert read.next_lsn == SEGMENT["next_lsn"]
    assert [(b.offset, b.epoch, b.first_lsn, b.count) for b in read.blocks] == [
        (b["offset"], b["epoch"], b["first_lsn"], b["count"]) for b in BLOCKS
    ]
    assert [b.end for b in read.blocks] == [b["offset"] + 32 + b["length"] for b in BLOCKS]
    for block, described in zip(read.blocks, BLOCKS, strict=True):
        groups = decode_groups(block)
        assert [(q, s) for q, s, _ in groups] == [
            (g["queue"], g["first_seq"]) for g in described["groups"]
        ]
        for (queue, first_seq, raws), group in zip(groups, described["groups"], strict=True):
            assert len(raws) == len(group["records"])
            for i, (raw, record) in enumerate(zip(raws, group["records"], strict=True)):
                assert record["seq"] == first_seq + i
                event = decode_record(raw)
                assert_matches(event, record["event"], f"{queue!r} record {record['seq']}")
                assert event.__struct_config__.tag == record["tag"]


def test_re_encoding_the_golden_events_today_gives_the_golden_bytes() -> None:
    data = _data()
    assert wal.WAL_VERSION == 2, FORMAT_CHANGED.format(
        detail=f"the writer now writes version {wal.WAL_VERSION}"
    )
    read = scan_segment(data)
    header = read.header
    assert wal.encode_wal_header(header.epoch, header.first_lsn, header.shard) == data[:32], (
        FORMAT_CHANGED.format(detail="the segment header differs")
    )
    for block in read.blocks:
        groups = decode_groups(block)
        events = [(q, s, [decode_record(r) for r in raws]) for q, s, raws in groups]
        if any(type(e) in GAINED_FIELDS_IN_V2 for _, _, evs in events for e in evs):
            continue  # longer today by an appended field; its decoding is checked above
        today = wal.encode_block(
            block.epoch,
            block.first_lsn,
            [(q, s, [wal.encode_record(e) for e in evs]) for q, s, evs in events],
        )
        golden = data[block.offset : block.end]
        assert today == golden, FORMAT_CHANGED.format(
            detail=f"block at LSN {block.first_lsn}: {_block_diff(golden, today, groups)}"
        )


def _block_diff(golden: bytes, today: bytes, groups: list[wal.Group]) -> str:
    """Which records of a block differ, and whether only their compressed bytes do."""
    if golden[8:32] != today[8:32]:
        return "the block header differs"
    notes = []
    for queue, first, raws in groups:
        for i, raw in enumerate(raws):
            event = decode_record(raw)
            again = wal.encode_record(event)
            if again == bytes(raw):
                continue
            same = msgspec.msgpack.encode(event) == msgspec.msgpack.encode(decode_record(again))
            notes.append(
                f"{queue!r} record {first + i}" + (" (compressed bytes only)" if same else "")
            )
    return "differing: " + (", ".join(notes) or "the grouping")


# ---------------------------------------------------------------- today's recovery


async def test_recovery_of_shard_2_of_4_rebuilds_every_queue_of_the_golden_segment(
    tmp_path: Path,
) -> None:
    key = keys.wal_segment_key(HEADER["shard"], HEADER["first_lsn"])
    (tmp_path / key).parent.mkdir(parents=True)
    shutil.copyfile(DATA / SEGMENT["file"], tmp_path / key)
    store = LocalDirStore(tmp_path)
    try:
        shard, count = HEADER["shard"], SEGMENT["shards"]
        assert all(placement(q, count) == shard for q in SEGMENT["queues"])
        queues, report = await read_shard(store, LocalLogDevice(store, shard), shard, count)
    finally:
        await store.close()
    assert report.clean
    assert (report.epoch, report.segments) == (HEADER["epoch"], 1)
    # every record but the shard's own claim; a deleted queue reads as never created
    events = _events_by_queue()
    assert report.records == sum(len(e) for q, e in events.items())
    deleted = {q for q, e in events.items() if isinstance(e[-1], ev.QueueDeleted)}
    assert deleted == {"temp"}
    assert set(queues) == set(events) - deleted
    for name, queue in queues.items():
        assert queue.next_seq - 1 == SEGMENT["queues"][name]
        assert queue.report.clean
        folded = QueueState()
        for event in events[name]:
            folded.apply(event)
        assert msgspec.to_builtins(snapshot(queue.state)) == msgspec.to_builtins(snapshot(folded))
    assert hashlib.sha256(_data()).hexdigest() == SEGMENT_SHA256  # read a copy only


def _events_by_queue() -> dict[str, list[ev.Event]]:
    """Each queue's events in the golden segment, decoded by today's code."""
    out: dict[str, list[ev.Event]] = {}
    for block in scan_segment(_data()).blocks:
        for queue, _, raws in decode_groups(block):
            if queue != SHARD_STREAM:
                out.setdefault(queue, []).extend(decode_record(r) for r in raws)
    return out


# Events that gained a field since: what today's writer writes for the same event (the
# old bytes, plus the appended fields' defaults). The old bytes still decode the same.
APPENDED_SINCE = {
    # BodiesMoved.attributes (issue 33: runs of messages with attributes), a trailing nil
    ev.BodiesMoved: "96a56d6f766564cf0000018bcfe568009207cf00060a24182022409202009292c40178c4"
    "0091c402797ac0",
}


@pytest.mark.parametrize("kind", list(ADDED_IN_V2), ids=lambda t: t.__name__)
def test_events_added_to_version_2_keep_the_bytes_they_were_added_with(kind: type) -> None:
    event, frozen = ADDED_IN_V2[kind]
    assert ev.decode_event(bytes.fromhex(frozen)) == event
    now = APPENDED_SINCE.get(kind, frozen)
    assert ev.encode_event(event).hex() == now
    assert now[2:].startswith(frozen[2:])  # past the array's length: the same fields first
