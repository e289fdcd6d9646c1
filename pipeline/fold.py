"""One queue's history, read in order and folded by the engine (:mod:`pipeline.timeline`).

A queue's history is its version-1 segments, if it still has any, then its records in its
shard log. :class:`QueueFold` starts it at record 1 or, when older records were pruned, at
the oldest usable snapshot that the remaining records continue, or at a ``QueueCreated``
(the queue was created again after a deletion whose records are gone). It folds the
version-1 segments itself; the shard log's records are handed to it by whoever reads that
log (:mod:`pipeline.shardfold`), which reads the log once for all its queues.

Recovery's rule applies (:class:`pipeline.chain.Chain`): a missing record or damage ends the
history (``damage`` rows), unless a later snapshot covers the break: then it goes on from
that snapshot (a ``pruned`` row, with ``left``/``joined`` rows for what changed unseen), as
it does after records pruned while being read. Every other snapshot on the way is checked
against the history.
"""

from __future__ import annotations

from actors.core.events import Event
from actors.core.snapshot import Snapshot
from actors.core.state import QueueState
from actors.status import Discarded
from pipeline.chain import VANISHED, Chain, SegmentMeta
from pipeline.logread import (
    QueueObjects,
    SyncStore,
    read_segment,
    read_snapshot,
    segment_keys,
    snapshot_keys,
)
from pipeline.timeline import Timeline, TimelineRows

__all__ = ["QueueFold"]


class QueueFold:
    """Folds one queue's history into a :class:`Timeline` writing to ``out``.

    Call :meth:`begin` once (it folds the version-1 segments), then :meth:`records` for each
    run of the queue's records in its shard log, in log order, and :meth:`finish`.
    """

    def __init__(
        self, store: SyncStore, queue: str, out: TimelineRows, listed: QueueObjects | None = None
    ) -> None:
        self.store = store
        self.queue = queue
        self.listed = listed  # the queue's objects as listed with its log (None: list them)
        self.timeline = Timeline(queue, out)
        self.chain = Chain(1)
        self.checks: dict[int, str] = {}  # snapshots to compare with the history, by seq
        self.discarded: list[Discarded] = []
        self.unusable: set[str] = set()  # snapshots found damaged (reported once)
        self.missing = False  # records may be missing after those read (pruned, or damage)
        self.ended = False  # the shard log ended at damage: no more records

    # ---------------------------------------------------------------- start, version 1

    def begin(self, first: tuple[str, int] | None = None, created: bool = False) -> None:
        """Pick the start and fold the version-1 segments. ``first``: the segment and
        sequence number of the queue's first record in its shard log, if any; ``created``:
        that record creates the queue."""
        start, segs = self._start(first, created)
        if start is None and self.listed is not None:
            # Listed with the log, in one go: a clean-up between the listing's look at the
            # snapshots and at the segments would leave no covering snapshot. List again.
            self.listed = None
            start, segs = self._start(first, created)
        if start is None:
            obj, seq = (segs[0][1], segs[0][0]) if segs else first or ("", 1)
            why = f"history starts at record {seq}: no snapshot"
            self.discarded.append(Discarded(obj, 0, None, why))
            start = seq
        self._restart(start)
        self._fold_v1(segs)

    def _start(
        self, first: tuple[str, int] | None, created: bool
    ) -> tuple[int | None, list[tuple[int, str]]]:
        """The first record to apply — record 1, a ``QueueCreated``, or the record after the
        oldest usable snapshot the remaining records continue (None: no snapshot does) — and
        the version-1 segments. ``first``: the object and sequence number of the queue's
        first record in its shard log."""
        # Segments are listed before snapshots: the clean-up writes a snapshot before it
        # deletes the segments it covers, so whatever this listing lacks, a snapshot in the
        # later listing covers.
        segs = self._segments()
        seq = segs[0][0] if segs else None if first is None else first[1]
        if seq == 1 or (created and not segs):
            return seq, segs
        for snap_seq, key in self._snapshots():
            if seq is not None and snap_seq < seq - 1:
                continue  # the records after it are gone already
            got = self._snapshot(key)
            if got is not None:
                self.timeline.start(got[1], snap_seq)
                return snap_seq + 1, segs
        return (1 if seq is None else None), segs

    def _restart(self, start: int) -> None:
        """Admit records from ``start`` on; check the snapshots from there."""
        self.chain = Chain(start)
        self.checks.update((seq, key) for seq, key in self._snapshots() if seq >= start)

    def _fold_v1(self, segs: list[tuple[int, str]]) -> None:
        pos = 0
        while pos < len(segs):
            _, key = segs[pos]
            pos += 1
            following = segs[pos][0] if pos < len(segs) else None
            chain = self.chain
            expected = chain.expected or 1
            if following is not None and following - 1 < expected:
                continue  # wholly before the start
            was_stopped = chain.stopped is not None
            meta, read = read_segment(self.store, key)
            kept = None if meta.vanished else chain.admit(meta)
            if kept is not None and read is not None:
                self._apply(read.header.first_seq, read.events, kept)
            if was_stopped or not (meta.vanished or chain.stopped is not None):
                continue
            self.listed = None  # the history broke: list again, segments before snapshots
            listed = self._segments()
            covering = _covering(meta, expected, following)
            if listed:
                covering = max(covering, listed[0][0] - 1)
            if self._resume(covering) is not None:
                segs, pos = listed, 0
            elif meta.vanished:
                chain.admit(meta)  # nothing covers it: a hole in the history

    # ---------------------------------------------------------------- the shard log

    def records(self, obj: str, first: int, events: list[Event]) -> None:
        """Records ``first`` … of the queue, in order, from shard-log segment ``obj``."""
        if self.ended:
            return
        last = first + len(events) - 1
        if self.missing:
            self.missing = False
            expected = self.chain.expected
            if expected is not None and first > expected and self._resume(first - 1) is None:
                self.chain.hole()  # pruned and no snapshot covers it: go on regardless
        chain = self.chain
        was_stopped = chain.stopped is not None
        kept = chain.admit_range(obj, first, last)
        broke = kept is None and not was_stopped and chain.stopped is not None
        if broke and self._resume(first - 1) is not None:  # a snapshot covers what is missing
            kept = self.chain.admit_range(obj, first, last)
        if kept is not None:
            self._apply(first, events, kept)

    def hole(self) -> None:
        """Records of this queue may be missing from here on (a segment of its log was
        pruned while being read): the history goes on from a snapshot if it jumps."""
        self.missing = True

    def end(self, discarded: list[Discarded]) -> None:
        """The shard log ends at damage: no more records; ``discarded``: what of this
        queue's records it discarded (reported)."""
        self.ended = self.missing = True
        self.discarded.extend(discarded)

    def finish(self, as_of_ms: int) -> None:
        """Report damage and write the end rows. When records may be missing at the end,
        the history goes on from the snapshots past them first, as recovery would."""
        if self.missing:  # the newest usable snapshot: one snapshot read, not one per
            # snapshot taken since (a busy queue takes them faster than they are read)
            self._resume(self.chain.expected or 1, newest=True)
        self.discarded.extend(self.chain.result.discarded)
        self.timeline.damage(self.discarded)
        self.timeline.finish(as_of_ms)

    # ---------------------------------------------------------------- snapshots

    def _snapshot(self, key: str) -> tuple[Snapshot, QueueState] | None:
        got = read_snapshot(self.store, key)
        if isinstance(got, str):
            if got != VANISHED and key not in self.unusable:
                self.unusable.add(key)
                self.discarded.append(Discarded(key, 0, None, got))
            return None
        return got

    def _segments(self) -> list[tuple[int, str]]:
        """The queue's version-1 segments (listed before its snapshots)."""
        if self.listed is not None:
            return self.listed.segments
        return segment_keys(self.store, self.queue)

    def _snapshots(self) -> list[tuple[int, str]]:
        if self.listed is not None:
            return self.listed.snapshots
        return snapshot_keys(self.store, self.queue)

    def _resume(self, covering: int, *, newest: bool = False) -> int | None:
        """Go on from the oldest usable snapshot at or past record ``covering`` (the
        history broke: records were pruned while being read, or are damaged but covered by a
        snapshot), or the ``newest`` one (no records follow). Returns its sequence number
        (None: there is none)."""
        self.listed = None  # snapshots taken since the log was listed may be the ones
        snapshots = self._snapshots()
        for seq, key in reversed(snapshots) if newest else snapshots:
            if seq < covering:
                continue
            got = self._snapshot(key)
            if got is not None:
                self.timeline.check(key, got[0], got[1], gap=True)
                self.discarded.extend(self.chain.result.discarded)
                self._restart(seq + 1)
                return seq
        return None

    def _apply(self, first: int, events: list[Event], kept: tuple[int, int]) -> None:
        lo, hi = kept
        apply = self.timeline.apply
        for seq in range(lo, hi + 1):
            apply(seq, events[seq - first])
            key = self.checks.get(seq)
            if key is not None:
                got = self._snapshot(key)
                if got is not None:
                    self.timeline.check(key, got[0], got[1])


def _covering(meta: SegmentMeta, expected: int, following: int | None) -> int:
    """The record a snapshot must cover for the history to go on past this break."""
    if meta.vanished:
        return expected - 1  # at least what was read; raised to the listing by the caller
    if meta.first_seq > expected:
        return meta.first_seq - 1  # a gap before an intact segment
    if following is not None:
        return following - 1  # the damaged segment, whole
    return meta.first_seq + (meta.announced or 0) - 1
