"""Reading a run's contents back from a real block (actors/log/bodies.py): bodies and
attributes from a put's record or a compaction's BodiesMoved, and a record whose arrays
do not match is damage (DataError), never contents shifted onto the wrong messages."""

from __future__ import annotations

import msgspec
import pytest

from actors.core import events as ev
from actors.core.runs import Contents, RunRecord
from actors.core.snapshot import decode_snapshot, encode_snapshot, snapshot
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log.bodies import Bodies, bodies_in
from actors.log.wal import encode_block, encode_record

T = 1_700_000_000_000


def block(event: ev.Event, seq: int = 5) -> bytes:
    return encode_block(1, 1, [("q", seq, [encode_record(event)])])


def test_a_puts_record_gives_its_bodies_and_attributes() -> None:
    put = ev.MessagesPut(T, [ev.PutItem(1, b"a", T, attributes={"k": "v"}), ev.PutItem(2, b"b", T)])
    place = ("seg", 0, 0, 5, 1)
    assert bodies_in(block(put), "q", place) == Contents([b"a", b"b"], [{"k": "v"}, None])
    plain = ev.MessagesPut(T, [ev.PutItem(1, b"a", T)])
    assert bodies_in(block(plain), "q", place) == Contents([b"a"], None)


def test_a_moves_record_gives_the_slots_it_wrote_and_blanks_before() -> None:
    moved = ev.BodiesMoved(T, [10, 20], [1, 0], [[b"y"], [b"z"]], [[{"n": 1}], None])
    assert bodies_in(block(moved), "q", ("seg", 0, 0, 5, 1, 0, 1)) == Contents(
        [b"", b"y"], [None, {"n": 1}]
    )
    assert bodies_in(block(moved), "q", ("seg", 0, 0, 5, 1, 1, 0)) == Contents([b"z"], None)


@pytest.mark.parametrize(
    "attributes",
    [[[{"n": 1}, {"n": 2}], None], [[{"n": 1}]]],
    ids=["more-attributes-than-bodies", "fewer-runs"],
)
def test_a_moves_record_whose_attributes_do_not_match_its_bodies_is_damage(
    attributes: list,
) -> None:
    moved = ev.BodiesMoved(T, [10, 20], [1, 0], [[b"y"], [b"z"]], attributes)
    with pytest.raises(DataError):
        bodies_in(block(moved), "q", ("seg", 0, 0, 5, 1, 0, 1))


def _snapshot_with(record: RunRecord) -> bytes:
    return encode_snapshot(msgspec.structs.replace(snapshot(QueueState()), runs=[record]))


@pytest.mark.parametrize(
    "fields",
    [
        {"lengths": b"\x01\x00\x00"},  # 3 bytes for one slot
        {"times": b"\x00" * 4, "order": b"\x00" * 3},  # an order of 1.5 slots
        {"times": b"\x00" * 5, "order": b"\x00" * 2},
        {"acts": b"\x00" * 7},
        {"attrs": [None, None], "bodies": [b"x"]},
        {"patches": [[0, ["seg", 1 << 63, 0, 0, 0]]]},  # a place past what an array holds
        {"patches": [[1, None, b"y"]]},  # a slot past the run's one
        {"patches": [[0, ["seg", 1, 2]]]},  # a place of three
        {"patches": [[0, None]]},  # held, without its body
    ],
    ids=[
        "lengths",
        "order",
        "times",
        "acts",
        "attrs",
        "patch-range",
        "patch-slot",
        "place",
        "held",
    ],
)
def test_a_snapshot_whose_run_arrays_do_not_match_its_count_is_damage(fields: dict) -> None:
    good = RunRecord(1, 1, T, 1, 0, [], b"\x01\x00\x00\x00", None, [b"x"])
    assert decode_snapshot(_snapshot_with(good)).runs == [good]
    patched = msgspec.structs.replace(good, patches=[[0, ["seg", 1, 2, 3, 4]], [0, None, b"y"]])
    assert decode_snapshot(_snapshot_with(patched)).runs == [patched]
    bad = RunRecord(**{**{f: getattr(good, f) for f in good.__struct_fields__}, **fields})
    with pytest.raises(DataError):
        decode_snapshot(_snapshot_with(bad))


class Device:
    """A log device holding blocks at offsets of one segment; counts its reads."""

    def __init__(self, blocks: list[bytes]) -> None:
        self.data = b"".join(blocks)
        self.reads = 0

    def read_at(self, key: str, offset: int, length: int) -> bytes:
        self.reads += 1
        return self.data[offset : offset + length]


def test_the_puts_of_one_block_are_read_with_one_read_and_the_blocks_kept_are_bounded() -> None:
    puts = [ev.MessagesPut(T, [ev.PutItem(i, b"x%d" % i, T)]) for i in range(3)]
    first = encode_block(1, 1, [("q", 5, [encode_record(p) for p in puts])])
    second = block(ev.MessagesPut(T, [ev.PutItem(9, b"other", T)]), seq=8)
    device = Device([first, second])
    bodies = Bodies(device, cache_bytes=4 * (len(first) + len(second)))
    at_first = ("seg", 0, len(first))
    for k in range(3):
        assert bodies.read("q", (*at_first, 5 + k, 1)) == Contents([b"x%d" % k], None)
    assert (device.reads, bodies.blocks_read) == (1, 1)  # three puts, one block read
    assert bodies.read("q", ("seg", len(first), len(second), 8, 2)).bodies == [b"other"]
    assert device.reads == 2
    bodies.clear()  # a shard short of memory drops the blocks kept too
    assert bodies.read("q", (*at_first, 6, 1)).bodies == [b"x1"]
    assert device.reads == 3
    small = Bodies(Device([first, second]), cache_bytes=4 * len(first))
    small.read("q", (*at_first, 5, 1))
    small.read("q", ("seg", len(first), len(second), 8, 2))
    assert small.blocked <= max(len(second), small.cache_bytes // 4)  # the older block went
    assert len(small._blocks) == 1
