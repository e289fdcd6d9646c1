"""Golden files: what a version-1 writer wrote must decode to exactly the same thing forever.

``tests/data/segment-v1.seg`` and ``tests/data/snapshot-v1.snap`` were written once by
``tests/data/make_golden.py`` and committed with ``golden-v1.json``, which says what they
contain. These tests decode the committed bytes with today's code and compare with the JSON
(never with a fresh encoding, which would move along with a bug). One more test re-encodes
the decoded events with today's writer and demands the same bytes, so an accidental change
of the format is caught where it happens.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zstandard

from actors.core import commands as c
from actors.core import events as ev
from actors.core.decide import execute
from actors.core.snapshot import decode_snapshot, restore
from actors.ids import SequentialIds
from actors.log import codec
from actors.log.codec import SegmentHeader, decode_segment, decode_snapshot_object
from tests.unit.log import layout

DATA = Path(__file__).resolve().parents[2] / "data"
GOLDEN = json.loads((DATA / "golden-v1.json").read_text())
SEGMENT_JSON = GOLDEN["segment"]
SNAPSHOT_JSON = GOLDEN["snapshot"]

# The committed files' hashes, also kept here: if someone regenerates the files *and* the
# JSON, these still fail. Golden files are never regenerated (tests/data/make_golden.py).
SEGMENT_SHA256 = "83337d261e7ca303eb592b921a41516277d033ea01b5f0aa90d567a9e5e5ee19"
SNAPSHOT_SHA256 = "6afbb62d09e2446684e6ac6ba057a0abcac5fa8f83d1406019922a3e4e14c9e5"

FORMAT_CHANGED = """\
Today's writer no longer writes the v1 golden segment byte for byte ({detail}).

Do NOT regenerate tests/data/*-v1.*: they are what v1 writers wrote, and readers must decode
them forever (the other tests in this module check that).

- If the change is intended (framing, header, compression rule, or how an event encodes),
  it is a new format version (FORMAT.md, "Compatibility rules"): bump SEGMENT_VERSION in
  actors/log/codec.py, keep a decoder for version 1 (the version field selects it), run
  `.venv/bin/python tests/data/make_golden.py` to add the -v2 files and golden-v2.json, add
  tests like these for v2, make this byte check compare against the newest version, and
  record the change in FORMAT.md's version table and in CHANGELOG.md.
- If an event only gained a field appended with a default (allowed within v1 by
  actors/core/events.py), old records still decode with the default (the decode test here
  proves it) but new records are longer: limit this check to the records whose event types
  did not change, and note the new field in FORMAT.md.
- If only zstd-compressed records differ and they decompress to the same payloads, the
  zstandard library changed its output, not the format: old and new bytes are both valid;
  limit this check to the uncompressed records and the decompressed payloads.
- Otherwise it is an accidental format change: fix the writer.
"""


def _read(name: str) -> bytes:
    return (DATA / name).read_bytes()


# ---------------------------------------------------------------- comparing with the JSON


# Python classes renamed since a golden file was made (names are not in the bytes: structs are
# arrays on disk). The engine's Message became QueuedMessage in issue 21.
RENAMED = {"Message": "QueuedMessage"}


def assert_matches(value: Any, expected: Any, path: str = "") -> None:
    """``value`` (decoded today) is what ``expected`` (golden JSON) describes.

    Structs are ``{"struct": name, "fields": {...}}``; a field the JSON does not mention
    must hold its default (fields may only be appended, with defaults). Bytes are
    ``{"bytes_hex": ...}``; lists and tuples are JSON lists; maps are JSON objects.
    """
    if isinstance(expected, dict) and expected.keys() == {"struct", "fields"}:
        assert isinstance(value, msgspec.Struct), f"{path}: {value!r} is not a struct"
        assert type(value).__name__ == RENAMED.get(expected["struct"], expected["struct"]), path
        names = {f.name for f in msgspec.structs.fields(value)}
        assert set(expected["fields"]) <= names, f"{path}: fields missing from today's struct"
        for f in msgspec.structs.fields(value):
            got = getattr(value, f.name)
            if f.name in expected["fields"]:
                assert_matches(got, expected["fields"][f.name], f"{path}.{f.name}")
            else:  # appended after the golden file was written
                assert f.required is False, f"{path}.{f.name}: a new field needs a default"
                default = (
                    f.default if f.default_factory is msgspec.NODEFAULT else f.default_factory()
                )
                assert got == default, f"{path}.{f.name}: an appended field decodes to its default"
    elif isinstance(expected, dict) and expected.keys() == {"bytes_hex"}:
        assert type(value) is bytes, f"{path}: {value!r} is not bytes"
        assert value.hex() == expected["bytes_hex"], path
    elif isinstance(expected, list):
        assert isinstance(value, list | tuple), f"{path}: {value!r} is not a sequence"
        assert len(value) == len(expected), path
        for i, (v, e) in enumerate(zip(value, expected, strict=True)):
            assert_matches(v, e, f"{path}[{i}]")
    elif isinstance(expected, dict):
        assert isinstance(value, dict), f"{path}: {value!r} is not a map"
        assert value.keys() == expected.keys(), path
        for k in expected:
            assert_matches(value[k], expected[k], f"{path}[{k!r}]")
    else:
        assert type(value) is type(expected), f"{path}: {value!r} vs {expected!r}"
        assert value == expected, path


# ---------------------------------------------------------------- the files themselves


@pytest.mark.parametrize(
    ("facts", "sha256"), [(SEGMENT_JSON, SEGMENT_SHA256), (SNAPSHOT_JSON, SNAPSHOT_SHA256)]
)
def test_the_golden_files_are_the_ones_written_once(facts: dict[str, Any], sha256: str) -> None:
    data = _read(facts["file"])
    assert len(data) == facts["size"]
    assert hashlib.sha256(data).hexdigest() == facts["sha256"] == sha256, (
        f"tests/data/{facts['file']} changed: golden files are never regenerated or edited"
    )


def test_the_golden_files_are_version_1() -> None:
    assert GOLDEN["format_version"] == SEGMENT_JSON["version"] == 1
    assert SNAPSHOT_JSON["version"] == 1
    assert layout.seg_header(_read(SEGMENT_JSON["file"])).version == 1
    assert layout.snap_header(_read(SNAPSHOT_JSON["file"])).version == 1


# ---------------------------------------------------------------- segment


def test_the_golden_segment_decodes_to_exactly_what_the_json_says() -> None:
    read = decode_segment(_read(SEGMENT_JSON["file"]))
    assert read.header == SegmentHeader(
        version=SEGMENT_JSON["version"],
        epoch=SEGMENT_JSON["epoch"],
        first_seq=SEGMENT_JSON["first_seq"],
        count=SEGMENT_JSON["count"],
    )
    assert (read.header.epoch, read.header.first_seq) == (3, 10)
    assert read.damage is None
    records = SEGMENT_JSON["records"]
    assert len(read.events) == len(records) == read.header.count
    for i, (event, record) in enumerate(zip(read.events, records, strict=True)):
        assert record["seq"] == read.header.first_seq + i
        assert_matches(event, record["event"], f"record {record['seq']}")
        assert event.__struct_config__.tag == record["tag"]
    assert read.last_seq == records[-1]["seq"]


def test_the_golden_segment_has_the_framing_the_json_says() -> None:
    data = _read(SEGMENT_JSON["file"])
    frames = layout.frames(data)
    got = [(f.offset, f.length, bool(f.flags & 1)) for f in frames]
    want = [(r["offset"], r["stored_length"], r["compressed"]) for r in SEGMENT_JSON["records"]]
    assert got == want
    assert True in [w[2] for w in want]  # it holds a compressed record ...
    assert False in [w[2] for w in want]  # ... and plain ones
    for frame, record in zip(frames, SEGMENT_JSON["records"], strict=True):
        assert frame.crc == layout.record_crc(frame.flags, frame.payload)
        payload = frame.payload
        if frame.flags & 1:
            assert zstandard.get_frame_parameters(payload).content_size == record["payload_length"]
            payload = zstandard.ZstdDecompressor().decompress(payload)
        assert len(payload) == record["payload_length"]
        # FORMAT.md: an array whose first element is the event's tag
        assert msgspec.msgpack.decode(payload)[0] == record["tag"]


def test_the_golden_segment_holds_every_kind_of_v1_event() -> None:
    v1_types = {
        "QueueCreated",
        "SettingsChanged",
        "MessagesPut",
        "MessagesTaken",
        "MessagesAcked",
        "MessagesReleased",
        "LeasesExtended",
        "MessageUpdated",
        "MessagesDeleted",
        "QueuePurged",
        "DeadLettersRouted",
        "WriterStarted",
    }
    assert {r["event"]["struct"] for r in SEGMENT_JSON["records"]} == v1_types
    assert v1_types <= set(ev.__all__)  # event types are never removed


def _frame_diff(golden: bytes, today: bytes) -> str:
    """Which records differ, and whether only their compressed bytes do."""
    try:
        old, new = layout.frames(golden), layout.frames(today)
    except Exception as exc:  # the framing itself changed
        return f"the framing differs: {exc!r}"
    if golden[:32] != today[:32]:
        return "the header differs"
    if len(old) != len(new):
        return f"{len(old)} records became {len(new)}"
    notes = []
    for seq, (a, b) in enumerate(zip(old, new, strict=True), start=SEGMENT_JSON["first_seq"]):
        if (a.flags, a.payload) == (b.flags, b.payload):
            continue
        same = a.flags == b.flags == 1 and (
            zstandard.ZstdDecompressor().decompress(a.payload)
            == zstandard.ZstdDecompressor().decompress(b.payload)
        )
        notes.append(f"record {seq}" + (" (compressed bytes only)" if same else ""))
    return "differing: " + ", ".join(notes)


def test_re_encoding_the_golden_events_today_gives_the_golden_bytes() -> None:
    golden = _read(SEGMENT_JSON["file"])
    assert codec.SEGMENT_VERSION == 1, FORMAT_CHANGED.format(
        detail=f"the writer now writes version {codec.SEGMENT_VERSION}"
    )
    read = decode_segment(golden)
    today = codec.encode_segment(
        read.header.epoch, read.header.first_seq, codec.encode_payloads(read.events)
    )
    golden_frames, today_frames = layout.frames(golden), layout.frames(today)
    assert len(today_frames) == len(golden_frames)
    for i, (event, old, new) in enumerate(
        zip(read.events, golden_frames, today_frames, strict=True)
    ):
        if type(event) in GAINED_FIELDS_IN_V1:
            # Appended fields with defaults (FORMAT.md): today's record is longer, and the
            # decode tests above prove the old record still reads with the defaults.
            continue
        same = (new.length, new.crc, new.flags, new.payload) == (
            old.length,
            old.crc,
            old.flags,
            old.payload,
        )
        assert same, FORMAT_CHANGED.format(detail=f"record {i} ({type(event).__name__}) differs")


# Event types that gained an appended field with a default after the v1 golden files were
# written (allowed within v1; see FORMAT.md, "Compatibility rules").
GAINED_FIELDS_IN_V1 = {
    ev.WriterStarted,  # nonce
    ev.QueueCreated,  # settings.meta; take_rate, put_rate, max_in_flight
    ev.SettingsChanged,  # the same
    ev.MessagesTaken,  # attempt
    ev.MessagesReleased,  # reasons
    ev.MessagesDeleted,  # forced
}


# ---------------------------------------------------------------- snapshot


def test_the_golden_snapshot_decodes_to_exactly_what_the_json_says() -> None:
    data = _read(SNAPSHOT_JSON["file"])
    epoch, seq, body = decode_snapshot_object(data)
    assert (epoch, seq) == (SNAPSHOT_JSON["epoch"], SNAPSHOT_JSON["seq"])
    assert SNAPSHOT_JSON["compressed"] is True
    assert bool(layout.snap_header(data).flags & 1) is True
    assert len(body) == SNAPSHOT_JSON["body_length"]
    snap = decode_snapshot(body)
    assert_matches(snap, SNAPSHOT_JSON["snapshot"], "snapshot")
    assert snap.settings.fifo is True
    assert len(snap.idem) == 1  # an idempotency key
    assert len(snap.outbox) == 1  # a dead letter


def test_the_golden_snapshot_restores_to_the_stats_the_json_says() -> None:
    _, _, body = decode_snapshot_object(_read(SNAPSHOT_JSON["file"]))
    state = restore(decode_snapshot(body))
    _, stats = execute(state, c.Stats(), SNAPSHOT_JSON["stats_at_ms"], SequentialIds())
    doc = msgspec.to_builtins(stats)
    assert doc.pop("paused") is False  # appended to the stats after the golden files
    assert doc == SNAPSHOT_JSON["stats"]
    # ready, delayed, reserved and a FIFO group held back by its reserved head
    assert (stats.ready, stats.delayed, stats.reserved, stats.groups) == (2, 1, 1, 3)
