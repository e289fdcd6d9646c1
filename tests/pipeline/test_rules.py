"""The recovery rule for readers, without I/O: which records of a queue's version-1
segments count (:mod:`pipeline.chain`), which segments of a shard log count and how that
cuts each queue's history (:mod:`pipeline.walchain`)."""

from __future__ import annotations

from typing import Any

import pytest

from actors.status import Discarded
from pipeline.chain import VANISHED, SegmentMeta, cut
from pipeline.walchain import LogChain, WalMeta, cut_logs

# ------------------------------------------------------------------ the recovery rule, per queue


def _meta(first: int, valid: int | None, **kw: Any) -> SegmentMeta:
    announced = kw.pop("announced", valid)
    return SegmentMeta(f"s{first}", first, kw.pop("epoch", 1), announced, valid, **kw)


def test_damage_ends_the_history_and_everything_after_is_reported() -> None:
    got = cut(
        [
            _meta(1, 3),
            _meta(4, 1, announced=3, offset=77, reason="record checksum mismatch"),
            _meta(7, 2),
            _meta(9, 1),
        ]
    )
    assert got.kept == [("s1", 1, 3), ("s4", 4, 4)]
    assert [(d.object, d.offset, d.records, d.reason) for d in got.discarded] == [
        ("s4", 77, 2, "record checksum mismatch"),
        ("s7", 0, 2, "after damage in s4"),
        ("s9", 0, 1, "after damage in s4"),
    ]


def test_a_gap_and_a_fenced_writers_segment_are_damage() -> None:
    assert cut([_meta(1, 2), _meta(5, 1)]).discarded[0].reason == "gap: record 3 is missing"
    fenced = cut([_meta(1, 2, epoch=2), _meta(3, 1, epoch=1)])
    assert fenced.kept == [("s1", 1, 2)]
    assert "fenced writer" in fenced.discarded[0].reason


def test_segments_pruned_while_reading_are_not_damage() -> None:
    gone = SegmentMeta("s1", 1, reason=VANISHED)
    got = cut([gone, _meta(4, 2), SegmentMeta("s6", 6, reason=VANISHED), _meta(9, 1)])
    assert got.discarded == []
    assert got.pruned == ["s1", "s6"]
    assert got.kept == [("s4", 4, 5), ("s9", 9, 9)]


# ------------------------------------------------------------------ the recovery rule, shard logs


def _wal(first: int, records: int | None, end: str = "clean", **kw: Any) -> WalMeta:
    return WalMeta(f"w{first}", first, kw.pop("epoch", 1), records, end, **kw)


@pytest.mark.parametrize(
    ("end", "next_first", "damaged"),
    [
        ("zeros", None, False),  # preallocated space: the last segment ends there
        ("torn", None, False),  # a write that never finished, at the end: the end
        ("torn", 13, False),  # the next segment begins right after the valid blocks
        ("torn", 20, True),  # blocks after the valid ones are missing: damage
        ("damaged", None, True),
    ],
)
def test_how_a_shard_log_segment_ends_decides_whether_the_log_goes_on(
    end: str, next_first: int | None, damaged: bool
) -> None:
    log = LogChain()
    assert log.admit(_wal(1, 12, end, offset=900, reason="block cut short"), next_first)
    assert (log.stopped is not None) is damaged
    assert [d.offset for d in log.result.discarded] == ([900] if damaged else [])


def test_a_gap_an_older_epoch_and_an_unreadable_header_end_the_shard_log() -> None:
    for later in (_wal(14, 2), _wal(13, 2, epoch=1), _wal(13, None, reason="bad magic")):
        log = LogChain()
        assert log.admit(_wal(1, 12, epoch=2), later.first_lsn)
        assert not log.admit(later, None)
        [discarded] = log.result.discarded
        assert discarded.object == later.object
        assert not log.admit(_wal(15, 1), None), "everything after is discarded too"


def test_a_queue_goes_on_from_its_version_1_log_into_the_shard_log() -> None:
    v1 = {"q": [SegmentMeta("v1", 1, 1, 5, 5)]}
    wal = {
        "wal/0000/": [
            _wal(1, 4, queues={"q": [(4, 6)], "r": [(1, 1)]}),  # 4, 5: already in version 1
            _wal(5, 3, "zeros", queues={"q": [(7, 7)], "r": [(2, 3)]}, offset=300),
        ]
    }
    cuts, logs = cut_logs(v1, wal)
    assert cuts["q"].kept == [("v1", 1, 5), ("w1", 6, 6), ("w5", 7, 7)]
    assert cuts["r"].kept == [("w1", 1, 1), ("w5", 2, 3)]
    assert not cuts["q"].discarded
    assert logs["wal/0000/"].discarded == []


def test_shard_log_damage_is_reported_to_the_queues_whose_records_it_discards() -> None:
    wal = {
        "wal/0000/": [
            _wal(
                1, 2, "damaged", queues={"q": [(1, 2)]}, offset=80, reason="block checksum mismatch"
            ),
            _wal(9, 3, queues={"q": [(5, 5)], "r": [(1, 2)]}),
        ]
    }
    cuts, logs = cut_logs({}, wal)
    assert cuts["q"].kept == [("w1", 1, 2)]
    assert cuts["r"].kept == []
    after = "after damage in w1"
    assert cuts["q"].discarded == [Discarded("w9", 0, 1, after)]
    assert cuts["r"].discarded == [Discarded("w9", 0, 2, after)]
    # Damage inside a segment names no queue (what follows it cannot be read): the log's.
    assert logs["wal/0000/"].discarded == [
        Discarded("w1", 80, None, "block checksum mismatch"),
        Discarded("w9", 0, 3, after),
    ]


def test_a_missing_record_ends_one_queue_and_a_pruned_segment_none() -> None:
    wal = {
        "wal/0000/": [
            WalMeta("w1", 1, reason=VANISHED),
            _wal(5, 2, queues={"q": [(3, 3)], "r": [(7, 7)]}),
            _wal(7, 2, queues={"q": [(5, 5)], "r": [(8, 8)]}),
        ]
    }
    cuts, logs = cut_logs({}, wal)
    assert logs["wal/0000/"].pruned == ["w1"]
    assert cuts["r"].kept == [("w5", 7, 7), ("w7", 8, 8)]
    assert cuts["q"].kept == [("w5", 3, 3)]
    assert cuts["q"].discarded == [Discarded("w7", 0, 1, "gap: record 4 is missing")]
