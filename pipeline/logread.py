"""Reading a queue log from its object store, synchronously, for Spark's Python workers.

Objects are read through the server's own stores (:func:`actors.log.store.open_store`: a
directory, ``file://``, ``s3://`` through obstore, …) and decoded only by
:mod:`actors.log.codec`. Reading while the server writes is safe because segments and
snapshots are immutable once they exist: a reader lists, then reads what it listed; objects
written later are simply not part of this read, and an object that vanished between listing
and reading was pruned behind a snapshot (:mod:`pipeline.chain`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from actors.core.snapshot import Snapshot, decode_snapshot, restore
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log import keys
from actors.log.codec import SegmentRead, decode_segment, decode_snapshot_object
from actors.log.replay import Discarded
from actors.log.store import KeyNotFound, ObjectStore, open_store
from pipeline.chain import VANISHED, Chain, SegmentMeta
from pipeline.timeline import Timeline, TimelineRows

__all__ = [
    "SyncStore",
    "fold_queue",
    "queue_names",
    "read_segment",
    "read_snapshot",
    "segment_keys",
    "snapshot_keys",
]

log = logging.getLogger(__name__)

BATCH_ROWS = 16_384  # rows per Arrow batch handed to Spark


class SyncStore:
    """An object store called synchronously, on an event loop of its own."""

    def __init__(self, url: str, options: dict[str, Any] | None = None) -> None:
        self.url = url
        self.store: ObjectStore = open_store(url, **(options or {}))  # may raise: no loop yet
        self._loop = asyncio.new_event_loop()

    def get(self, key: str) -> bytes:
        """The object's bytes. Raises: KeyNotFound, StoreError."""
        return self._loop.run_until_complete(self.store.get(key))

    def list(self, prefix: str) -> list[str]:
        """Sorted keys under ``prefix``. Raises: StoreError."""
        return self._loop.run_until_complete(self.store.list(prefix))

    def close(self) -> None:
        """Release the store and the loop."""
        try:
            self._loop.run_until_complete(self.store.close())
        finally:
            self._loop.close()

    def __enter__(self) -> SyncStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def queue_names(store: SyncStore) -> list[str]:
    """Queues that have objects in the store (a queue being deleted is left out)."""
    names: set[str] = set()
    deleted: set[str] = set()
    for key in store.list(keys.ROOT):
        name, _, rest = key[len(keys.ROOT) :].partition("/")
        names.add(name)
        if rest == "DELETED":  # the shard's tombstone: the queue is being erased
            deleted.add(name)
    return sorted(names - deleted)


def _numbered(store: SyncStore, prefix: str) -> list[tuple[int, str]]:
    found = []
    for key in store.list(prefix):
        try:
            found.append((keys.seq_of(key), key))
        except DataError:
            log.warning("ignoring %s: not a log object name", key)
    found.sort()
    return found


def segment_keys(store: SyncStore, queue: str) -> list[tuple[int, str]]:
    """``(first_seq, key)`` of the queue's segments, in order."""
    return _numbered(store, keys.log_prefix(queue))


def snapshot_keys(store: SyncStore, queue: str) -> list[tuple[int, str]]:
    """``(seq, key)`` of the queue's snapshots, oldest first."""
    return _numbered(store, keys.snapshot_prefix(queue))


def read_segment(store: SyncStore, key: str) -> tuple[SegmentMeta, SegmentRead | None]:
    """Read and decode one segment; the meta says what counts and what is damaged.

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
    return snap, restore(snap)


# ------------------------------------------------------------------ one queue, in order


class _Fold:
    """Reads one queue's history in order into a :class:`Timeline` (see :func:`fold_queue`)."""

    def __init__(self, store: SyncStore, queue: str) -> None:
        self.store = store
        self.queue = queue
        self.out = TimelineRows()
        self.timeline = Timeline(queue, self.out)
        self.discarded: list[Discarded] = []
        self.unusable: set[str] = set()  # snapshots found damaged (reported once)

    def _snapshot(self, key: str) -> tuple[Snapshot, QueueState] | None:
        got = read_snapshot(self.store, key)
        if isinstance(got, str):
            if got != VANISHED and key not in self.unusable:
                self.unusable.add(key)
                self.discarded.append(Discarded(key, 0, None, got))
            return None
        return got

    def _start(self) -> tuple[int, list[tuple[int, str]]]:
        """Pick where the history starts: record 1, or the oldest usable snapshot that the
        remaining segments continue. Returns the first record to apply and the segments."""
        # Segments are listed before snapshots: the clean-up writes a snapshot before it
        # deletes the segments it covers, so whatever this listing lacks, a snapshot in the
        # later listing covers.
        segs = segment_keys(self.store, self.queue)
        first = segs[0][0] if segs else None
        if first == 1:
            return 1, segs
        for seq, key in snapshot_keys(self.store, self.queue):
            if first is not None and seq < first - 1:
                continue  # the records after it are gone already
            got = self._snapshot(key)
            if got is not None:
                self.timeline.start(got[1], seq)
                return seq + 1, segs
        if first is None:
            return 1, []
        self.discarded.append(
            Discarded(segs[0][1], 0, None, f"history starts at record {first}: no snapshot")
        )
        return first, segs

    def _resume(self, covering: int) -> tuple[int, list[tuple[int, str]]] | None:
        """Go on from the oldest usable snapshot at or past record ``covering`` that the
        remaining segments continue (the history broke: records were pruned while being
        read, or are damaged but covered by a snapshot). None: there is none."""
        segs = segment_keys(self.store, self.queue)
        if segs:
            covering = max(covering, segs[0][0] - 1)
        for seq, key in snapshot_keys(self.store, self.queue):
            if seq < covering:
                continue
            got = self._snapshot(key)
            if got is not None:
                self.timeline.check(key, got[0], got[1], gap=True)
                return seq + 1, segs
        return None

    def run(self, as_of_ms: int) -> Iterator[pa.RecordBatch]:
        """Fold the queue; yield rows as batches of about BATCH_ROWS."""
        start, segs = self._start()
        checks = dict(self._later_snapshots(start))
        chain = Chain(start)
        pos = 0
        while pos < len(segs):
            _, key = segs[pos]
            pos += 1
            following = segs[pos][0] if pos < len(segs) else None
            expected = chain.expected if chain.expected is not None else start
            if following is not None and following - 1 < expected:
                continue  # wholly before the start
            was_stopped = chain.stopped is not None
            meta, read = read_segment(self.store, key)
            kept = None if meta.vanished else chain.admit(meta)
            if kept is not None and read is not None:
                self._apply(read, kept, checks)
            if not was_stopped and (meta.vanished or chain.stopped is not None):
                covering = _covering(meta, expected, following)
                resumed = self._resume(covering)
                if resumed is not None:
                    self.discarded.extend(chain.result.discarded)
                    start, segs = resumed
                    chain, pos = Chain(start), 0
                    checks.update(self._later_snapshots(start))
                elif meta.vanished:
                    chain.admit(meta)  # nothing covers it: a hole in the history
            if self.out.rows >= BATCH_ROWS:
                yield self.out.batch()
        self.discarded.extend(chain.result.discarded)
        self.timeline.damage(self.discarded)
        self.timeline.finish(as_of_ms)
        yield self.out.batch()

    def _later_snapshots(self, start: int) -> list[tuple[int, str]]:
        return [(seq, key) for seq, key in snapshot_keys(self.store, self.queue) if seq >= start]

    def _apply(self, read: SegmentRead, kept: tuple[int, int], checks: dict[int, str]) -> None:
        lo, hi = kept
        first = read.header.first_seq
        apply = self.timeline.apply
        for seq in range(lo, hi + 1):
            apply(seq, read.events[seq - first])
            key = checks.get(seq)
            if key is not None:
                got = self._snapshot(key)
                if got is not None:
                    self.timeline.check(key, got[0], got[1])


def _covering(meta: SegmentMeta, expected: int, following: int | None) -> int:
    """The record a snapshot must cover for the history to go on past this break."""
    if meta.vanished:
        return expected - 1  # at least what was read; _resume raises it to the listing
    if meta.first_seq > expected:
        return meta.first_seq - 1  # a gap before an intact segment
    if following is not None:
        return following - 1  # the damaged segment, whole
    return meta.first_seq + (meta.announced or 0) - 1


def fold_queue(store: SyncStore, queue: str, as_of_ms: int) -> Iterator[pa.RecordBatch]:
    """The timeline rows of one queue (``pipeline.timeline``), as Arrow batches.

    The history starts at record 1 or at the oldest snapshot the remaining segments
    continue; damage ends it the way recovery would (``damage`` rows), unless a later
    snapshot covers the damaged segment or records pruned while reading: then it goes on
    from that snapshot (``pruned`` row). Every other snapshot on the way is checked against
    the history.

    Raises:
        StoreError: the store failed.
    """
    return _Fold(store, queue).run(as_of_ms)
