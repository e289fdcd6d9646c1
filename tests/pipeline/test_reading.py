"""The pipeline's pure parts and its reader, without Spark: rows ⇄ events, the recovery rule
for readers (per queue and per shard log), and the engine fold on logs a real shard wrote:
queues interleaved in a shard log (local segments and one object per commit), a queue deleted
and created again, version-1 queues that go on in a shard log, pruning under the reader, a
torn last block and a damaged block in the middle."""

from __future__ import annotations

import asyncio
import shutil
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
from actors.core.snapshot import decode_snapshot
from actors.log import keys
from actors.log.codec import (
    decode_segment,
    decode_snapshot_object,
    encode_payloads,
    encode_segment,
)
from actors.log.store import LocalDirStore
from actors.log.wal import decode_groups, scan_segment
from actors.settings import LogSettings, QueueSettings
from actors.shard import QueueShard
from pipeline.logread import SyncStore, read_segment
from pipeline.rows import EventRows, event_rows, events_from_rows
from pipeline.shardfold import fold_log, fold_queue
from pipeline.timeline import TIMELINE_SCHEMA
from tests.pipeline import layouts
from tests.pipeline.layouts import QUEUES, run
from tests.pipeline.logs import START_MS, Driver, new

EXCEPTIONS = {"vanished", "appeared", "counters", "orphan", "damage"}

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
    st.builds(ev.QueueDeleted, _times),
    st.builds(ev.Checkpoint, _times),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(_events, min_size=1, max_size=12), st.none() | st.integers(1, 2**40))
def test_event_rows_rebuild_the_exact_events(events: list[ev.Event], lsn: int | None) -> None:
    out = EventRows()
    event_rows(out, "q", "wal/0000/x.seg", 3, 41, events, first_lsn=lsn)
    rows = pa.Table.from_batches([out.batch()]).to_pylist()
    rebuilt = list(events_from_rows(reversed(rows)))  # any order
    assert [seq for _, seq, _ in rebuilt] == list(range(41, 41 + len(events)))
    assert [e for _, _, e in rebuilt] == events
    if lsn is not None:
        assert {(r["seq"] - 41, r["lsn"] - lsn) for r in rows} == {
            (i, i) for i in range(len(events))
        }


def test_version_1_records_are_decoded_by_the_version_1_codec() -> None:
    events = [ev.MessagesPut(5, [ev.PutItem(1, b"x", 5)]), ev.MessagesAcked(6, [1])]
    read = decode_segment(encode_segment(2, 7, encode_payloads(events)))
    out = EventRows()
    event_rows(out, "q", "queues/q/log/7.seg", read.header.epoch, 7, read.events)
    rows = out.to_pylist()
    assert [(r["seq"], r["type"], r["lsn"], r["epoch"]) for r in rows] == [
        (7, "put", None, 2),
        (8, "acked", None, 2),
    ]


# ------------------------------------------------------------------ folding real logs


def _fold(root: Path, now_ms: int, **options: Any) -> list[dict[str, Any]]:
    """The timeline of shard 0's log (and of ``adopted`` queues)."""
    with SyncStore(str(root)) as store:
        batches = list(fold_log(store, 0, now_ms, **options))
    return pa.Table.from_batches(batches, schema=TIMELINE_SCHEMA).to_pylist()


def _finals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    found = {}
    for row in rows:
        if row["type"] == "final":
            stats = msgspec.json.decode(row["detail"])
            stats.pop("settings")
            found[row["queue"]] = stats
    return found


def _kinds(rows: list[dict[str, Any]], queue: str | None = None) -> set[str]:
    return {r["type"] for r in rows if queue is None or r["queue"] == queue}


@pytest.mark.parametrize("objects", [False, True], ids=["local-segments", "object-per-commit"])
def test_queues_interleaved_in_a_shard_log_are_each_read_in_order(
    tmp_path: Path, objects: bool
) -> None:
    now, stats = run(layouts.write_interleaved(tmp_path, objects=objects))
    rows = _fold(tmp_path, now)
    assert _finals(rows) == stats
    assert not _kinds(rows) & EXCEPTIONS
    for queue in QUEUES:
        puts = [r["seq"] for r in rows if r["queue"] == queue and r["type"] == "put"]
        assert puts == sorted(puts)
        assert len(puts) == stats[queue]["enqueued"]


def test_a_version_1_queue_is_read_on_into_the_shard_log(tmp_path: Path) -> None:
    now, stats = run(layouts.write_mixed(tmp_path))
    assert list((tmp_path / keys.log_prefix("jobs")).glob("*.seg"))
    rows = _fold(tmp_path, now, adopted=["dead", "jobs", "orders.fifo", "work", "__evq-keys-13"])
    finals = _finals(rows)
    assert {q: finals[q] for q in stats} == stats
    assert not _kinds(rows) & (EXCEPTIONS | {"pruned"})
    # The whole history of jobs: from record 1 (version 1) through the shard log.
    applied = sorted({r["seq"] for r in rows if r["queue"] == "jobs" and r["seq"] is not None})
    assert applied[0] <= 3
    assert "baseline" not in _kinds(rows, "jobs")
    assert applied[-1] > max(
        keys.seq_of(p.name) for p in (tmp_path / keys.log_prefix("jobs")).glob("*.seg")
    )


@pytest.mark.parametrize("archived", [False, True], ids=["live-only", "partly-archived"])
def test_a_deleted_queue_ends_and_its_new_life_starts_at_its_creation(
    tmp_path: Path, archived: bool
) -> None:
    now, stats, created = run(layouts.write_recreated(tmp_path))
    rows = [r for r in _fold(tmp_path, now) if r["queue"] == "gone"]
    assert _finals(rows) == {"gone": stats["gone"]}
    dropped = [r for r in rows if r["type"] == "dropped"]
    assert {r["incarnation"] for r in dropped} == {0}
    assert len(dropped) == 2, "the message left behind and the one taken"
    later = [r for r in rows if r["type"] == "put" and r["seq"] > created]
    assert [r["incarnation"] for r in later] == [1, 1]
    assert {r["arrival"] for r in later} == {1, 2}, "the new queue numbers its arrivals anew"
    assert not _kinds(rows) & EXCEPTIONS
    if archived:
        # The shard's close cancels its tidying, which may have archived some of the old
        # life by then (found by a CI-like run under load: the old life's first segments
        # were in the archive, so the "pruned" history began in the middle of the old life).
        for path in layouts.wal_files(tmp_path)[:4]:
            key = str(path.relative_to(tmp_path))
            copy = tmp_path / keys.archive_key(key, "20231114")
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, copy)
    # The old life pruned away, from the live log and the archive: the history starts at the
    # new creation, with nothing missing.
    for path in sorted(tmp_path.rglob("*.seg")):
        groups = [g for b in scan_segment(path.read_bytes()).blocks for g in decode_groups(b)]
        if all(q != "gone" or first < created for q, first, _ in groups):
            path.unlink()
    rows = [r for r in _fold(tmp_path, now) if r["queue"] == "gone"]
    assert _finals(rows) == {"gone": stats["gone"]}
    assert not _kinds(rows) & (EXCEPTIONS | {"baseline", "dropped"})


def test_a_history_whose_first_records_are_gone_without_a_snapshot_says_so(
    tmp_path: Path,
) -> None:
    now, _ = run(layouts.write_interleaved(tmp_path, objects=True))
    for path in layouts.wal_files(tmp_path)[:10]:  # gone, and no snapshot covers them
        path.unlink()
    rows = _fold(tmp_path, now)
    damage = [r for r in rows if r["type"] == "damage"]
    assert {r["queue"] for r in damage} == set(QUEUES)
    assert all(r["detail"].startswith("history starts at record ") for r in damage)
    assert all(r["object"].startswith(keys.WAL_ROOT) for r in damage)


def test_a_torn_last_block_of_the_local_log_is_just_where_it_ends(tmp_path: Path) -> None:
    now, stats = run(layouts.write_interleaved(tmp_path))
    layouts.tear_last_block(tmp_path)
    recovered = run(layouts.recovered_stats(tmp_path, now))
    assert recovered != stats, "the torn block held a commit"
    rows = _fold(tmp_path, now)
    assert _finals(rows) == recovered
    assert not _kinds(rows) & EXCEPTIONS


@pytest.mark.parametrize("objects", [False, True], ids=["local-segments", "object-per-commit"])
def test_a_damaged_block_in_the_middle_ends_every_history_there(
    tmp_path: Path, objects: bool
) -> None:
    now, _ = run(layouts.write_interleaved(tmp_path, objects=objects))
    key, offset = layouts.flip_middle_block(tmp_path)
    recovered = run(layouts.recovered_stats(tmp_path, now))
    rows = _fold(tmp_path, now)
    assert _finals(rows) == recovered
    damage = [r for r in rows if r["type"] == "damage"]
    assert [
        (r["queue"], r["object"], r["offset"], r["detail"]) for r in damage if r["queue"] is None
    ] == [(None, key, offset, "block checksum mismatch")]
    named = {r["queue"] for r in damage if r["queue"] is not None}
    # One commit per object: the later objects name the queues whose records follow.
    assert named == (set(QUEUES) if objects else set())
    assert all(r["detail"] == f"after damage in {key}" for r in damage if r["queue"])


def test_a_block_read_before_its_pages_were_written_is_read_again(tmp_path: Path) -> None:
    """Reading the segment being appended to can find a block's pages still empty and the
    next block's written: that is no damage once the segment is read again."""
    now, stats = run(layouts.write_interleaved(tmp_path))
    path = layouts.wal_files(tmp_path)[-1]
    data = path.read_bytes()
    caught = scan_segment(data).blocks[-2]
    racy = data[: caught.offset] + bytes(caught.end - caught.offset) + data[caught.end :]
    key = path.relative_to(tmp_path).as_posix()
    reads = []

    class Appending(LocalDirStore):
        async def get(self, name: str) -> bytes:
            if name == key:
                reads.append(name)
                if len(reads) == 1:
                    return racy
            return await super().get(name)

    with SyncStore(str(tmp_path)) as store:
        store.store = Appending(tmp_path)
        rows = pa.Table.from_batches(list(fold_log(store, 0, now))).to_pylist()
    assert len(reads) == 2
    assert _finals(rows) == stats
    assert not _kinds(rows) & EXCEPTIONS


# ------------------------------------------------------------------ pruning under the reader


async def _pruned_log(root: Path) -> tuple[int, dict[str, Any]]:
    """A queue that snapshots every few records in a log of small segments: old segments
    are pruned behind its snapshots, with no archive (as a deployment from before it, or
    one whose archive retention removed the start): the history starts at a snapshot."""
    clock = ManualClock(START_MS)
    log = LogSettings(
        snapshot_every_records=7, snapshot_every_ms=10**12, segment_bytes=200, archive=False
    )
    shard = QueueShard(
        0, 1, LocalDirStore(root), clock=clock, ids=SequentialIds(), log_settings=log
    )
    await shard.start()
    d = Driver([shard], clock)
    settings_ = QueueSettings(visibility_timeout_ms=5_000, max_receives=2, retention_ms=200_000)
    await shard.create("q", settings_, [])
    for round_ in range(12):
        await d.put("q", *[new(f"m{i}") for i in range(3)])
        clock.advance(4_000)
        taken = await d.take("q", 4)
        if taken:
            await d.ack("q", taken[0])
        if round_ % 4 == 3:
            clock.advance(70_000)
    await d.put("q", new("left to expire"))
    clock.advance(250_000)  # past retention
    await d.put("q", new("last"))  # dead letters go now
    queue = shard.queues["q"]
    for _ in range(500):
        if not queue.state.outbox and not queue._background and not shard._background:
            break
        await asyncio.sleep(0.01)
    stats = await d.stats("q")
    await layouts.stop(shard)
    return clock.now_ms(), stats


def test_a_pruned_history_starts_at_a_snapshot_and_ends_where_the_engine_is(
    tmp_path: Path,
) -> None:
    now, stats = asyncio.run(_pruned_log(tmp_path))
    assert not (tmp_path / keys.wal_segment_key(0, 1)).exists(), "the log was pruned"
    rows = _fold(tmp_path, now)
    assert _finals(rows) == {"q": stats}
    kinds = _kinds(rows)
    assert {"baseline", "lease_expired", "dead_lettered", "retention_expired", "sample"} <= kinds
    assert not kinds & EXCEPTIONS
    # Every message the history knows has one origin.
    origins = [r["arrival"] for r in rows if r["type"] in ("put", "baseline")]
    assert len(origins) == len(set(origins))


def test_the_fold_goes_on_from_a_snapshot_when_a_segment_vanishes_mid_read(
    tmp_path: Path,
) -> None:
    now, stats = asyncio.run(_pruned_log(tmp_path))
    # Pruning goes oldest first and never takes the segment being written: a segment in the
    # middle vanishes when the ones before it were read already and then pruned too. Its
    # records are covered by a snapshot.
    snapshots = list((tmp_path / keys.snapshot_prefix("q")).iterdir())
    oldest, newest = sorted(keys.seq_of(p.name) for p in snapshots)
    # past the oldest, where the history starts; holding no body a snapshot reads back (a
    # shard keeps those)
    read_from = {
        run.place[0]
        for p in snapshots
        for run in decode_snapshot(decode_snapshot_object(p.read_bytes())[2]).runs
        if run.place is not None
    }
    segments = layouts.wal_files(tmp_path)
    victim = next(
        p
        for p in segments[1:-1]
        if oldest < _last_seq(p) <= newest and keys.wal_prefix(0) + p.name not in read_from
    )

    class Vanishing(LocalDirStore):
        async def get(self, key: str) -> bytes:
            if key.endswith(victim.name) and victim.exists():
                victim.unlink()  # pruned between the listing and this read
            return await super().get(key)

    with SyncStore(str(tmp_path)) as store:
        store.store = Vanishing(tmp_path)
        rows = pa.Table.from_batches(list(fold_log(store, 0, now))).to_pylist()
    kinds = _kinds(rows)
    assert "pruned" in kinds
    assert not kinds & EXCEPTIONS
    assert _finals(rows) == {"q": stats}


async def _compacted_log(root: Path) -> tuple[int, dict[str, Any]]:
    """Two queues of one shard, no archive: "q" takes and acks ~1,500 messages while "few"
    keeps 20 in the oldest segment, until compaction writes those 20 bodies again further
    on and the segment goes. A history that starts at one of "few"'s snapshots reads its
    bodies from the BodiesMoved record."""
    clock = ManualClock(START_MS)
    log = LogSettings(
        segment_bytes=16 * 1024,
        snapshot_every_records=10**9,
        snapshot_every_ms=10**12,
        archive=False,
    )
    shard = QueueShard(
        0, 1, LocalDirStore(root), clock=clock, ids=SequentialIds(), log_settings=log
    )
    await shard.start()
    d = Driver([shard], clock)
    server = QueueSettings(id_mode="server")
    for name in ("few", "q"):
        await shard.create(name, server, [])
    await d.put("few", *[new(f"few {i:03d} " + "x" * 90) for i in range(20)])
    for round_ in range(15):
        await d.put("q", *[new(f"q {round_} {i:03d} " + "y" * 90) for i in range(100)])
        await d.ack("q", *await d.take("q", 100))
    for name in ("q", "few"):
        for _ in range(2):
            await d.run(name, cmd.Checkpoint())
            await shard.queues[name].snapshot()
    for _ in range(500):
        if not shard._background and not any(q._background for q in shard.queues.values()):
            break
        await asyncio.sleep(0.01)
    assert shard.compactions == 1
    stats = {name: await d.stats(name) for name in ("few", "q")}
    await layouts.stop(shard)
    return clock.now_ms(), stats


def test_a_history_reads_bodies_that_compaction_moved(tmp_path: Path) -> None:
    now, stats = asyncio.run(_compacted_log(tmp_path))
    assert not (tmp_path / keys.wal_segment_key(0, 1)).exists(), "the oldest segment went"
    rows = _fold(tmp_path, now)
    assert _finals(rows) == stats
    assert not _kinds(rows) & EXCEPTIONS
    few = [r for r in rows if r["queue"] == "few" and r["type"] == "baseline"]
    assert len(few) == 20
    assert {r["body_bytes"] for r in few} == {len(f"few {0:03d} ") + 90}


def _last_seq(path: Path) -> int:
    blocks = scan_segment(path.read_bytes()).blocks
    return max(first + len(raw) - 1 for b in blocks for _, first, raw in decode_groups(b))


def test_a_version_1_store_is_read_queue_by_queue(tmp_path: Path) -> None:
    shutil.copytree(layouts.DATADIR_V1, tmp_path / "v1")
    with SyncStore(str(tmp_path / "v1")) as store:
        rows = pa.Table.from_batches(list(fold_queue(store, "jobs", START_MS + 1_000))).to_pylist()
    assert _finals(rows)["jobs"]["enqueued"] > 0
    assert not _kinds(rows) & EXCEPTIONS


# ------------------------------------------------------------------ version-1 segments


@pytest.mark.parametrize("cut_bytes", [3, 40])
def test_a_torn_version_1_segment_keeps_its_valid_prefix(tmp_path: Path, cut_bytes: int) -> None:
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
