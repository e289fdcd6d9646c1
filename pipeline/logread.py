"""Reading the log from its object store, synchronously, for Spark's Python workers.

Objects are read through the server's own stores (:func:`actors.log.stores.open_store`: a
directory, ``file://``, ``s3://`` through obstore, …) and shard logs through the server's
own devices (:func:`actors.log.device.open_device`), and decoded only by the log's codecs:
:mod:`actors.log.wal` (shard logs, format version 2), :mod:`actors.log.codec` (version-1
segments, snapshots). What lives where (FORMAT.md, "Object names"):

- ``wal/<shard>/<first_lsn>.seg``: the shard logs, one per shard, shared by its queues;
- ``queues/<queue>/snap/<seq>.snap``: each queue's snapshots;
- ``queues/<queue>/log/<first_seq>.seg``: version-1 segments a queue may still have;
- ``archive/<day>/…``: what the live log pruned, under its own names (the segments of the
  shard logs, and queues' baseline snapshots; ``actors/log/archive.py``).

The archive and the live log are read as one history: each object under its live name
once, the live copy where both hold it (a crash came between archiving and pruning), so
listings below are ordered and have no gap and no overlap where the log had none.

Reading while the server writes is safe: a reader lists, then reads what it listed. Objects
written later are not part of this read; a segment that vanished between listing and
reading was pruned behind snapshots (:mod:`pipeline.chain`), and is looked for in the
archive as it is now; a snapshot whose bodies' segment went with it, once newer snapshots
replaced it, vanished as well (not damage); and the last segment of a local
shard log, still being appended to, simply ends where its data ends (zeros, or a block being
written: a torn end, never acknowledged yet).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import msgspec

from actors.core.events import Event
from actors.core.runs import Contents
from actors.core.snapshot import Snapshot, decode_snapshot, restore
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log import keys
from actors.log.bodies import bodies_in
from actors.log.codec import SegmentRead, decode_segment, decode_snapshot_object
from actors.log.device import LogDevice, open_device
from actors.log.shard_recovery import SHARD_STREAM
from actors.log.store import KeyNotFound, ObjectStore
from actors.log.stores import open_store
from actors.log.wal import Block, WalRead, decode_groups, decode_record, scan_segment
from pipeline.chain import VANISHED, SegmentMeta
from pipeline.walchain import Ranges, WalMeta

__all__ = [
    "BATCH_ROWS",
    "QueueObjects",
    "Records",
    "SyncStore",
    "WalSegment",
    "queue_objects",
    "queue_ranges",
    "read_segment",
    "read_snapshot",
    "read_wal_segment",
    "segment_keys",
    "shard_logs",
    "snapshot_keys",
    "wal_segments",
]

log = logging.getLogger(__name__)

BATCH_ROWS = 16_384  # rows per Arrow batch handed to Spark
_T = TypeVar("_T")
Records = tuple[str, int, int, list[Event]]  # queue, first seq, first LSN, its events


class SyncStore:
    """An object store called synchronously, on an event loop of its own."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.store: ObjectStore = open_store(url, **(options or {}))  # may raise: no loop yet
        self._loop = asyncio.new_event_loop()
        self._devices: dict[int, LogDevice] = {}
        self._archived: dict[str, str] | None = None

    def run(self, call: Coroutine[Any, Any, _T]) -> _T:
        """Wait for one call of the store or a device."""
        return self._loop.run_until_complete(call)

    def get(self, key: str) -> bytes:
        """The object's bytes. Raises: KeyNotFound, StoreError."""
        return self.run(self.store.get(key))

    def list(self, prefix: str) -> list[str]:
        """Sorted keys under ``prefix``. Raises: StoreError."""
        return self.run(self.store.list(prefix))

    def archived(self, *, again: bool = False) -> dict[str, str]:
        """The archive's objects: live name → archived key (listed once per store, or
        ``again``: an object pruned after the first listing was archived since)."""
        if self._archived is None or again:
            found: dict[str, str] = {}
            for key in self.list(keys.ARCHIVE_ROOT):
                live = keys.unarchived(key)
                if live != key:  # the newest day's copy wins (they hold the same bytes)
                    found[live] = max(found.get(live, key), key)
            self._archived = found
        return self._archived

    def device(self, shard: int) -> LogDevice:
        """Shard ``shard``'s log, for reading (never opened: it takes no lock)."""
        if shard not in self._devices:
            self._devices[shard] = open_device(self.store, shard)
        return self._devices[shard]

    def close(self) -> None:
        """Release the store and the loop."""
        try:
            self.run(self.store.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------ listing


class QueueObjects(msgspec.Struct):
    """A queue's own objects: version-1 segments and snapshots, ``(seq, key)`` in order."""

    segments: list[tuple[int, str]] = msgspec.field(default_factory=list)
    snapshots: list[tuple[int, str]] = msgspec.field(default_factory=list)


def queue_objects(store: SyncStore) -> dict[str, QueueObjects]:
    """The queues that have objects under ``queues/`` (or archived snapshots), with their
    version-1 segments and snapshots (a version-1 queue being deleted is left out)."""
    found: dict[str, QueueObjects] = {}
    deleted: set[str] = set()
    for key in _with_archived(store, keys.ROOT, store.list(keys.ROOT)):
        name, _, rest = keys.unarchived(key)[len(keys.ROOT) :].partition("/")
        objects = found.setdefault(name, QueueObjects())
        kind = rest.partition("/")[0]
        if rest == "DELETED":  # a version-1 tombstone: the queue is being erased
            deleted.add(name)
        elif kind in ("log", "snap") and _is_log_name(key):
            listed = objects.segments if kind == "log" else objects.snapshots
            listed.append((keys.seq_of(key), key))
    return {name: objects for name, objects in sorted(found.items()) if name not in deleted}


def _is_log_name(key: str) -> bool:
    try:
        keys.seq_of(key)
    except DataError:
        log.warning("ignoring %s: not a log object name", key)
        return False
    return True


def _with_archived(store: SyncStore, prefix: str, live: list[str]) -> list[str]:
    """``live`` (keys under ``prefix``) and the archived objects under it that are not live."""
    listed = set(live)
    extra = [a for k, a in store.archived().items() if k.startswith(prefix) and k not in listed]
    return live + extra


def _numbered(store: SyncStore, prefix: str) -> list[tuple[int, str]]:
    found = _with_archived(store, prefix, store.list(prefix))
    return sorted((keys.seq_of(k), k) for k in found if _is_log_name(k))


def segment_keys(store: SyncStore, queue: str) -> list[tuple[int, str]]:
    """``(first_seq, key)`` of the queue's version-1 segments, in order."""
    return _numbered(store, keys.log_prefix(queue))


def snapshot_keys(store: SyncStore, queue: str) -> list[tuple[int, str]]:
    """``(seq, key)`` of the queue's snapshots, oldest first."""
    return _numbered(store, keys.snapshot_prefix(queue))


def shard_logs(store: SyncStore) -> list[int]:
    """The shards that have a log under ``wal/``."""
    shards = set()
    for key in _with_archived(store, keys.WAL_ROOT, store.list(keys.WAL_ROOT)):
        head, sep, _ = keys.unarchived(key)[len(keys.WAL_ROOT) :].partition("/")
        if sep and len(head) == 4 and head.isdigit():
            shards.add(int(head))
    return sorted(shards)


def wal_segments(store: SyncStore, shard: int) -> list[tuple[int, str]]:
    """``(first LSN, key)`` of shard ``shard``'s log segments, archived ones first, in order."""
    live = store.run(store.device(shard).segments())
    prefix = keys.wal_prefix(shard)
    names = {k for _, k in live}
    archived = [
        (keys.seq_of(k), a)
        for k, a in store.archived().items()
        if k.startswith(prefix) and keys.is_wal_segment(k) and k not in names
    ]
    return sorted(archived + live)


# ------------------------------------------------------------------ version 1


def read_segment(store: SyncStore, key: str) -> tuple[SegmentMeta, SegmentRead | None]:
    """Read and decode one version-1 segment; the meta says what counts and what is damaged.

    Raises:
        StoreError: the store failed (a missing object is not an error: it was pruned).
    """
    first_seq = keys.seq_of(key)
    try:
        data = store.get(key)
    except KeyNotFound:
        return SegmentMeta(key, first_seq, reason=VANISHED), None
    try:
        read = decode_segment(data)
    except DataError as exc:
        return SegmentMeta(key, first_seq, offset=0, reason=exc.message), None
    header = read.header
    if header.first_seq != first_seq:
        reason = f"header says first record {header.first_seq}, the name says {first_seq}"
        return SegmentMeta(key, first_seq, header.epoch, header.count, None, 0, reason), None
    damage = read.damage
    return (
        SegmentMeta(
            key,
            first_seq,
            header.epoch,
            header.count,
            len(read.events),
            None if damage is None else damage.offset,
            None if damage is None else damage.reason,
        ),
        read,
    )


def read_snapshot(store: SyncStore, key: str) -> tuple[Snapshot, QueueState] | str:
    """A snapshot and the state it restores, or why it cannot be used.

    Raises:
        StoreError: the store failed.
    """
    try:
        _, seq, body = decode_snapshot_object(store.get(key))
        snap = decode_snapshot(body)
    except KeyNotFound:
        return VANISHED
    except DataError as exc:
        return f"snapshot unusable: {exc.message}"
    if seq != keys.seq_of(key):
        return f"snapshot says seq {seq}"
    state = restore(snap)
    if state.by_id:  # messages held as runs (actors/core/runs.py): their bodies read back
        state.read = _runs_reader(store, snap.name)
        try:
            state.unspill_all()
        except KeyNotFound as exc:
            if not _exists(store, key):  # newer snapshots replaced it, then the log went
                return VANISHED
            return f"snapshot unusable: the log that holds its bodies does not read: {exc}"
        except DataError as exc:
            return f"snapshot unusable: the log that holds its bodies does not read: {exc}"
    return snap, state


def _exists(store: SyncStore, key: str) -> bool:
    """Whether ``key`` is still in the live log or the archive. Raises: StoreError."""
    try:
        store.get(key)
    except KeyNotFound:
        return keys.unarchived(key) in store.archived(again=True)
    return True


def _runs_reader(store: SyncStore, queue: str) -> Callable[[Any], Contents]:
    """Reads the bodies (and attributes) of the put at a run's place from its segment,
    live or archived (the last segment read is kept: runs come in log order).

    The reader raises KeyNotFound (the segment is neither) or DataError (it does not hold
    them)."""
    last: dict[str, bytes] = {}

    def read(place: Any) -> Contents:
        segment, offset, length = place[0], place[1], place[2]
        data = last.get(segment)
        if data is None:
            last.clear()
            try:
                data = store.get(segment)
            except KeyNotFound:  # pruned: archived, maybe after the archive was listed
                archived = store.archived().get(segment) or store.archived(again=True).get(segment)
                if archived is None:
                    raise
                data = store.get(archived)
            last[segment] = data
        return bodies_in(data[offset : offset + length], queue, place)

    return read


# ------------------------------------------------------------------ shard logs


class WalSegment:
    """One shard-log segment being read: :meth:`blocks` decodes its valid blocks one at a
    time; :attr:`meta` says what reading found: what its blocks' checks found at first, all
    of it once they have all been decoded (a block whose records do not decode ends the
    segment there, as in recovery; ``queues`` is filled in)."""

    def __init__(self, meta: WalMeta, read: WalRead | None) -> None:
        self.meta = meta
        self.read = read

    def blocks(self) -> Iterator[tuple[Block, list[Records]]]:
        """Each valid block and its records by queue (the shard's own stream left out)."""
        read, meta = self.read, self.meta
        if read is None:
            return
        ranges: Ranges = {}
        records = 0
        for block in read.blocks:
            try:
                groups = _decode(block)
            except DataError as exc:
                why = f"a record does not decode: {exc.message}"
                self.meta = _meta(meta, records, "damaged", block.offset, why, ranges)
                return
            yield block, groups
            records += block.count
            for queue, first, _, events in groups:
                _extend(ranges, queue, first, len(events))
        self.meta = _meta(meta, records, read.end, meta.offset, read.reason, ranges)


def _meta(
    meta: WalMeta, records: int, end: str, offset: int | None, reason: str | None, ranges: Ranges
) -> WalMeta:
    return WalMeta(meta.object, meta.first_lsn, meta.epoch, records, end, offset, reason, ranges)


def _decode(block: Block) -> list[Records]:
    """A block's records by queue, decoded. Raises: DataError."""
    found = []
    lsn = block.first_lsn
    for queue, first_seq, raw in decode_groups(block):
        if queue != SHARD_STREAM and raw:  # the shard's own claims: no queue's history
            found.append((queue, first_seq, lsn, [decode_record(r) for r in raw]))
        lsn += len(raw)
    return found


def _extend(ranges: Ranges, queue: str, first: int, count: int) -> None:
    if not count:
        return
    runs = ranges.setdefault(queue, [])
    if runs and runs[-1][1] + 1 == first:
        runs[-1] = (runs[-1][0], first + count - 1)
    else:
        runs.append((first, first + count - 1))


def queue_ranges(segment: WalSegment) -> Ranges:
    """The queues with records in a segment's valid blocks and their runs of records, from
    the groups alone (records not decoded: for reporting what damage discarded)."""
    ranges: Ranges = {}
    for block in segment.read.blocks if segment.read is not None else []:
        try:
            groups = decode_groups(block)
        except DataError:
            break
        for queue, first_seq, raw in groups:
            if queue != SHARD_STREAM:
                _extend(ranges, queue, first_seq, len(raw))
    return ranges


def read_wal_segment(store: SyncStore, shard: int, key: str, stop_lsn: int | None) -> WalSegment:
    """Read one segment of shard ``shard``'s log (``stop_lsn``: the next listed segment's
    first LSN, where this one's blocks must end; None for the last one).

    The last segment of a local log may be written while it is read, and a read of a file
    being appended to can find a block's pages still empty while the next block's are
    written already: damage that is not there. So a damaged end of the last segment counts
    only if reading it again finds it at the same place.

    Raises:
        StoreError: the store failed (a missing segment is not an error: it was pruned).
    """
    segment = _read_wal_once(store, shard, key, stop_lsn)
    for _ in range(_REREADS if stop_lsn is None else 0):
        if segment.meta.end != "damaged":
            break
        again = _read_wal_once(store, shard, key, stop_lsn)
        if (again.meta.end, again.meta.offset) == (segment.meta.end, segment.meta.offset):
            break
        segment = again
    return segment


_REREADS = 3


def _read_wal_once(store: SyncStore, shard: int, key: str, stop_lsn: int | None) -> WalSegment:
    first_lsn = keys.seq_of(key)
    try:
        data = store.run(store.device(shard).read(key))
    except KeyNotFound:
        return WalSegment(WalMeta(key, first_lsn, reason=VANISHED), None)
    try:
        read = scan_segment(data, stop_lsn=stop_lsn)
    except DataError as exc:
        meta = WalMeta(key, first_lsn, end="damaged", offset=0, reason=exc.message)
        return WalSegment(meta, None)
    header = read.header
    if header.first_lsn != first_lsn:
        why = f"header says first LSN {header.first_lsn}, the name says {first_lsn}"
        return WalSegment(WalMeta(key, first_lsn, header.epoch, None, "damaged", 0, why), None)
    offset = None if read.end == "clean" else read.valid_end
    meta = WalMeta(key, first_lsn, header.epoch)
    return WalSegment(_meta(meta, read.records, read.end, offset, read.reason, {}), read)
