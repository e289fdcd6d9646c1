"""The timeline view's partitions: every queue of one shard log, folded in one pass.

A shard log holds the records of all the queues of its shard, interleaved, each queue's in
its own order; reading the log once for all of them is cheaper than once per queue. So
:func:`fold_log` reads the log's segments in LSN order and hands each run of a queue's
records to that queue's :class:`~pipeline.fold.QueueFold`, started when the queue is first
met (from its snapshots and version-1 segments). The log's own rule (:class:`LogChain`)
decides which segments count: damage to the log ends every queue's history there and is
reported for each queue with records in a discarded segment (or, naming none, for the log:
a ``damage`` row whose queue is null). A segment pruned while the log is read leaves each
queue to go on from a snapshot where its records jump.

Queues with objects under ``queues/`` but no record in any shard log (version-1 queues a
version-2 server has not opened yet; queues whose records are all gone) are folded from
their own objects by the partition that adopts them (see :mod:`pipeline.source`), or by
:func:`fold_queue` when the store has no shard log at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

import pyarrow as pa

from actors.core.events import QueueCreated
from actors.status import Discarded
from pipeline.fold import QueueFold
from pipeline.logread import (
    BATCH_ROWS,
    QueueObjects,
    SyncStore,
    WalSegment,
    queue_objects,
    queue_ranges,
    read_wal_segment,
    wal_segments,
)
from pipeline.timeline import TimelineRows, damage_rows
from pipeline.walchain import LogChain, Ranges, damage_by_queue

__all__ = ["fold_log", "fold_queue"]


class _LogFold:
    """The queues of one shard log, folded together (see :func:`fold_log`)."""

    def __init__(
        self, store: SyncStore, shard: int, wanted: set[str] | None, out: TimelineRows
    ) -> None:
        self.store = store
        self.shard = shard
        self.wanted = wanted
        self.out = out
        self.folds: dict[str, QueueFold] = {}
        self.objects: dict[str, QueueObjects] = {}  # listed once, after the log
        self.log = LogChain()
        self.unnamed: list[Discarded] = []  # damage that names no queue

    def _fold(
        self, queue: str, first: tuple[str, int] | None = None, created: bool = False
    ) -> QueueFold | None:
        """The queue's fold, started when first met (None: a queue not asked for)."""
        fold = self.folds.get(queue)
        if fold is None and (self.wanted is None or queue in self.wanted):
            listed = self.objects.get(queue, QueueObjects())
            fold = self.folds[queue] = QueueFold(self.store, queue, self.out, listed)
            fold.begin(first, created)
            if self.log.stopped is not None:
                fold.end([])
        return fold

    def read(self) -> Iterator[None]:
        """Read the log, segment by segment (yields where rows may be handed over)."""
        listed = wal_segments(self.store, self.shard)
        # After the log: the clean-up writes snapshots before it deletes what they cover, so
        # whatever this log listing lacks, a snapshot in the later listing covers.
        self.objects = queue_objects(self.store)
        for index, (_, key) in enumerate(listed):
            following = listed[index + 1][0] if index + 1 < len(listed) else None
            segment = read_wal_segment(self.store, self.shard, key, following)
            told = len(self.log.result.discarded)
            if self.log.opens(segment.meta):
                yield from self._use(segment)
                self.log.closes(segment.meta, following)
                ranges = segment.meta.queues
            elif len(self.log.result.discarded) == told:  # pruned: whose records, unknown
                for fold in self.folds.values():
                    fold.hole()
                continue
            else:
                ranges = queue_ranges(segment)
            self._tell(self.log.result.discarded[told:], ranges)

    def _use(self, segment: WalSegment) -> Iterator[None]:
        key = segment.meta.object
        for _, groups in segment.blocks():
            for queue, first, _, events in groups:
                fold = self.folds.get(queue)
                if fold is None:
                    created = bool(events) and isinstance(events[0], QueueCreated)
                    fold = self._fold(queue, (key, first), created)
                if fold is not None:
                    fold.records(key, first, events)
            yield

    def _tell(self, discarded: list[Discarded], ranges: Ranges) -> None:
        """Report damage to the queues with records in the discarded segment; once the log
        has ended, no queue gets records any more."""
        for damage in discarded:
            told = damage_by_queue(damage, ranges)
            for queue, seen in told:
                fold = self._fold(queue)
                if fold is not None:
                    fold.end([seen])
            if not told:
                self.unnamed.append(damage)
        if discarded and self.log.stopped is not None:
            for fold in self.folds.values():
                if not fold.ended:
                    fold.end([])

    def finish(self, adopted: Iterable[str], as_of_ms: int) -> Iterator[None]:
        """Fold the adopted queues the log did not hold, then end every history."""
        for queue in adopted:
            if queue not in self.folds:
                fold = self._fold(queue)
                if fold is not None:
                    fold.hole()  # what its snapshots hold past its own objects counts
        damage_rows(self.out, None, self.unnamed)
        for queue in sorted(self.folds):
            self.folds[queue].finish(as_of_ms)
            yield


def _batches(out: TimelineRows, steps: Iterator[None]) -> Iterator[pa.RecordBatch]:
    for _ in steps:
        if out.rows >= BATCH_ROWS:
            yield out.batch()
    yield out.batch()


def fold_log(
    store: SyncStore,
    shard: int,
    as_of_ms: int,
    *,
    adopted: Iterable[str] = (),
    wanted: set[str] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The timeline rows (``pipeline.timeline``) of every queue in shard ``shard``'s log and
    of the ``adopted`` queues (found under ``queues/``, in no shard log), as Arrow batches;
    ``wanted``: only these queues.

    Raises:
        StoreError: the store failed.
    """
    out = TimelineRows()
    fold = _LogFold(store, shard, wanted, out)
    return _batches(out, itertools.chain(fold.read(), fold.finish(adopted, as_of_ms)))


def fold_queue(store: SyncStore, queue: str, as_of_ms: int) -> Iterator[pa.RecordBatch]:
    """The timeline rows of one queue of a store without shard logs (format version 1),
    read from its own segments and snapshots, as Arrow batches.

    Raises:
        StoreError: the store failed.
    """
    out = TimelineRows()
    fold = QueueFold(store, queue, out)

    def steps() -> Iterator[None]:
        fold.begin()
        yield
        fold.finish(as_of_ms)

    return _batches(out, steps())
