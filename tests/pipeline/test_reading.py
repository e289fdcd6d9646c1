"""The pipeline's pure parts and its reader, without Spark: rows ⇄ events, the recovery
rule for readers, and the engine fold on logs the real queue actor wrote."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.clock import ManualClock
from actors.core import commands as cmd
from actors.core import events as ev
from actors.core.ids import SequentialIds
from actors.log import keys
from actors.log.codec import decode_segment, encode_payloads, encode_segment
from actors.log.store import LocalDirStore
from actors.queue_actor import QueueActor
from actors.settings import LogSettings, QueueSettings
from pipeline.chain import VANISHED, SegmentMeta, cut
from pipeline.logread import SyncStore, fold_queue, read_segment
from pipeline.rows import EventRows, event_rows, events_from_rows
from pipeline.timeline import TIMELINE_SCHEMA

# ------------------------------------------------------------------ rows ⇄ events

_ids = st.one_of(st.integers(1, 2**62), st.text(min_size=1, max_size=8))
_times = st.integers(0, 2**45)
_attrs = st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3)
_items = st.builds(
    ev.PutItem,
    _ids,
    st.binary(min_size=1, max_size=300),
    _times,
    st.none() | st.text(max_size=6),
    st.none() | st.text(max_size=6),
    _attrs,
)
_events = st.one_of(
    st.builds(ev.MessagesPut, _times, st.lists(_items, max_size=4)),
    st.builds(
        lambda at, ids, d: ev.MessagesTaken(at, ids, list(range(1, len(ids) + 1)), d),
        _times,
        st.lists(_ids, max_size=4),
        _times,
    ),
    st.builds(ev.MessagesAcked, _times, st.lists(_ids, max_size=4)),
    st.builds(ev.MessagesDeleted, _times, st.lists(_ids, max_size=3)),
    st.builds(
        lambda at, ids: ev.MessagesReleased(at, ids, [at + i for i in range(len(ids))]),
        _times,
        st.lists(_ids, max_size=4),
    ),
    st.builds(
        lambda at, ids: ev.LeasesExtended(at, ids, [at + 7 * i for i in range(len(ids))]),
        _times,
        st.lists(_ids, max_size=3),
    ),
    st.builds(
        ev.MessageUpdated, _times, _ids, st.none() | st.binary(min_size=1), st.none() | _times
    ),
    st.builds(ev.QueuePurged, _times),
    st.builds(ev.DeadLettersRouted, _times, st.lists(st.integers(1, 10**9), max_size=3)),
    st.builds(ev.WriterStarted, _times, st.integers(1, 99), st.integers(0, 2**62)),
    st.builds(
        ev.QueueCreated,
        _times,
        st.just("q"),
        st.builds(QueueSettings, visibility_timeout_ms=st.integers(0, 10**6)),
    ),
    st.builds(ev.SettingsChanged, _times, st.builds(QueueSettings, max_receives=st.integers(1, 9))),
    st.builds(
        ev.KeySet, _times, st.text(max_size=5), st.integers(0, 99), st.integers(-(2**63), 2**63 - 1)
    ),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_events, min_size=1, max_size=12))
def test_event_rows_rebuild_the_exact_events(events: list[ev.Event]) -> None:
    data = encode_segment(3, 41, encode_payloads(events))
    out = EventRows()
    event_rows(out, "q", "queues/q/log/x.seg", decode_segment(data))
    rows = pa.Table.from_batches([out.batch()]).to_pylist()
    rebuilt = list(events_from_rows(reversed(rows)))  # any order
    assert [seq for _, seq, _ in rebuilt] == list(range(41, 41 + len(events)))
    assert [e for _, _, e in rebuilt] == events


# ------------------------------------------------------------------ the recovery rule


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


# ------------------------------------------------------------------ the fold, against the engine


async def _pruned_log(root: Path) -> tuple[int, dict[str, Any]]:
    """A queue that snapshots every few records, so old segments are pruned."""
    store = LocalDirStore(root)
    clock = ManualClock()
    actor = QueueActor(
        "q",
        store,
        clock=clock,
        ids=SequentialIds(),
        log_settings=LogSettings(snapshot_every_records=7, snapshot_every_ms=10**12),
    )
    settings_ = QueueSettings(visibility_timeout_ms=5_000, max_receives=2, retention_ms=200_000)
    await actor.open(cmd.Create("q", settings_))
    for round_ in range(12):
        await actor.execute(cmd.Put([cmd.NewMessage(body=b"m%d" % i) for i in range(3)]))
        clock.advance(4_000)
        taken = await actor.execute(cmd.Take(max=4))
        if taken:
            await actor.execute(cmd.Ack([cmd.LeaseRef(taken[0].id, taken[0].lease)]))
        if round_ % 4 == 3:
            clock.advance(70_000)
    await actor.execute(cmd.Put([cmd.NewMessage(body=b"left to expire")]))
    clock.advance(250_000)  # past retention
    await actor.execute(cmd.Put([cmd.NewMessage(body=b"last")]))  # dead letters go now
    for _ in range(500):
        if not actor.state.outbox and not actor._background:  # routed; snapshots written
            break
        await asyncio.sleep(0.01)
    stats = msgspec.structs.asdict(await actor.execute(cmd.Stats()))
    await actor.close(snapshot=False)
    await store.close()
    return clock.now_ms(), stats


def _fold(root: Path, now_ms: int) -> list[dict[str, Any]]:
    with SyncStore(str(root)) as store:
        batches = list(fold_queue(store, "q", now_ms))
    return pa.Table.from_batches(batches, schema=TIMELINE_SCHEMA).to_pylist()


def _final(rows: list[dict[str, Any]]) -> dict[str, Any]:
    [final] = [r for r in rows if r["type"] == "final"]
    stats = msgspec.json.decode(final["detail"])
    stats.pop("settings")
    return stats  # type: ignore[no-any-return]


def test_a_pruned_history_starts_at_a_snapshot_and_ends_where_the_engine_is(
    tmp_path: Path,
) -> None:
    now, stats = asyncio.run(_pruned_log(tmp_path))
    assert not (tmp_path / keys.segment_key("q", 1)).exists(), "the log was pruned"
    rows = _fold(tmp_path, now)
    assert _final(rows) == stats
    kinds = {r["type"] for r in rows}
    assert {"baseline", "lease_expired", "dead_lettered", "retention_expired", "sample"} <= kinds
    assert not kinds & {"vanished", "appeared", "counters", "orphan", "damage"}
    # Every message the history knows has one origin.
    origins = [r["arrival"] for r in rows if r["type"] in ("put", "baseline")]
    assert len(origins) == len(set(origins))


def test_the_fold_goes_on_from_a_snapshot_when_a_segment_vanishes_mid_read(
    tmp_path: Path,
) -> None:
    now, stats = asyncio.run(_pruned_log(tmp_path))
    segments = sorted((tmp_path / keys.log_prefix("q")).glob("*.seg"))
    snaps = sorted((tmp_path / keys.snapshot_prefix("q")).glob("*.snap"))
    older = keys.seq_of(snaps[0].name)
    victim = next(p for p in segments if keys.seq_of(p.name) > older)

    class VanishingStore(SyncStore):
        def get(self, key: str) -> bytes:
            if key.endswith(victim.name) and victim.exists():
                victim.unlink()  # pruned between the listing and this read
            return super().get(key)

    with VanishingStore(str(tmp_path)) as store:
        rows = pa.Table.from_batches(list(fold_queue(store, "q", now))).to_pylist()
    kinds = [r["type"] for r in rows]
    assert "pruned" in kinds
    assert "damage" not in kinds
    assert _final(rows) == stats


@pytest.mark.parametrize("cut_bytes", [3, 40])
def test_a_torn_segment_keeps_its_valid_prefix(tmp_path: Path, cut_bytes: int) -> None:
    events = [ev.MessagesPut(1, [ev.PutItem(i, b"x" * 50, 1)]) for i in range(1, 4)]
    data = encode_segment(1, 1, encode_payloads(events))
    path = tmp_path / keys.segment_key("q", 1)
    path.parent.mkdir(parents=True)
    path.write_bytes(data[:-cut_bytes])
    with SyncStore(str(tmp_path)) as store:
        meta, read = read_segment(store, keys.segment_key("q", 1))
    assert read is not None
    assert meta.valid == 2
    assert meta.announced == 3
    assert meta.reason is not None
    assert meta.reason.startswith("torn tail")
