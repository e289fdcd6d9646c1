"""Which records of a queue's history count: the rule recovery applies, for readers. Pure.

A queue's history is its version-1 segments (``queues/<q>/log/``, records 1 … k), then its
records in its shard log (k + 1 …), numbered by the queue's own sequence throughout.
Recovery (``actors/log/replay.py`` and ``actors/log/shard_recovery.py``) goes through them
in order and stops at the first damage: a version-1 segment whose header is unreadable, a
record that does not check, a segment of an older epoch than the one before it (a fenced
writer's late write), or a record missing from the numbering. Everything before that point
counts; the rest is discarded and reported as ``(object, byte offset, records, reason)``.
Damage to the shard log itself ends every queue's history there (:mod:`pipeline.walchain`).
The pipeline reads segments in parallel, so it learns each segment's outcome separately (a
:class:`SegmentMeta`, or a run of a queue's records in a shard-log segment) and applies the
same rule afterwards with :class:`Chain`.

One difference is deliberate: a segment that vanished between listing and reading was
pruned behind a snapshot (the log's own clean-up deletes the oldest segments first), so
vanished segments are not damage, just history that is gone (reported as ``pruned``).
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from actors.status import Discarded

__all__ = ["VANISHED", "Chain", "Cut", "SegmentMeta", "cut"]

VANISHED = "vanished while reading"


class SegmentMeta(msgspec.Struct, frozen=True):
    """What reading one version-1 segment object found."""

    object: str
    first_seq: int  # from the object's name
    epoch: int | None = None  # None: the header was not readable
    announced: int | None = None  # records the header announces
    valid: int | None = None  # records that decoded and checked (None: none readable)
    offset: int | None = None  # where reading stopped early
    reason: str | None = None  # why (damage), or VANISHED

    @property
    def vanished(self) -> bool:
        """The object was listed but gone when read (pruned meanwhile)."""
        return self.reason == VANISHED and self.valid is None


class Cut(msgspec.Struct):
    """The records of a queue that count, by object, and what was discarded."""

    kept: list[tuple[str, int, int]] = msgspec.field(default_factory=list)  # object, lo, hi
    discarded: list[Discarded] = msgspec.field(default_factory=list)
    pruned: list[str] = msgspec.field(default_factory=list)  # vanished while reading
    first_seq: int | None = None
    last_seq: int | None = None


class Chain:
    """Admits a queue's records in order, as recovery would, and remembers where it stopped."""

    def __init__(self, start_seq: int | None = None) -> None:
        self.expected = start_seq  # the next record that must come (None: the first one seen)
        self.last_epoch = 0
        self.stopped: str | None = None  # why admitting stopped (None: still going)
        self.result = Cut(first_seq=start_seq)
        self._after_hole = False

    def admit(self, meta: SegmentMeta) -> tuple[int, int] | None:
        """The range of a version-1 segment's records that count (None: none do)."""
        discarded = self.result.discarded
        if self.stopped is not None:
            discarded.append(Discarded(meta.object, 0, meta.announced, self.stopped))
            return None
        if meta.vanished:
            # Pruned behind a snapshot before we got to it (pruning goes oldest first, so
            # everything before it is being pruned too): history that is gone, not damage.
            self.result.pruned.append(meta.object)
            self.hole()
            return None
        expected = self._expected(meta.first_seq)
        reason = self._refusal(meta, expected)
        if reason is not None:
            self.stop(Discarded(meta.object, 0, meta.announced, reason))
            return None
        assert meta.valid is not None
        assert meta.epoch is not None
        self.last_epoch = meta.epoch
        kept = self._keep(meta.object, expected, meta.first_seq, meta.first_seq + meta.valid - 1)
        if meta.reason is not None:
            records = None if meta.announced is None else meta.announced - meta.valid
            self.stop(Discarded(meta.object, meta.offset or 0, records, meta.reason))
        return kept

    def admit_range(self, obj: str, first: int, last: int) -> tuple[int, int] | None:
        """The part of records ``first`` … ``last`` of the queue, read in order from the
        valid part of shard-log segment ``obj``, that counts (None: none of it). Records
        already counted (covered by a snapshot or a version-1 segment) are skipped, as
        recovery skips them; a missing record is damage."""
        if self.stopped is not None:
            self.result.discarded.append(Discarded(obj, 0, last - first + 1, self.stopped))
            return None
        expected = self._expected(first)
        if first > expected:
            self.stop(Discarded(obj, 0, last - first + 1, f"gap: record {expected} is missing"))
            return None
        return self._keep(obj, expected, first, last)

    def hole(self) -> None:
        """Records may be missing before the next ones (a segment pruned while reading):
        whatever comes next is taken as it is."""
        self._after_hole = True

    def stop(self, discarded: Discarded) -> None:
        """Damage ends the history here; ``discarded`` says what and why."""
        self.result.discarded.append(discarded)
        if self.stopped is None:
            self.stopped = f"after damage in {discarded.object}"

    def _expected(self, first: int) -> int:
        expected = first if self.expected is None or self._after_hole else self.expected
        self._after_hole = False
        if self.result.first_seq is None:
            self.result.first_seq = expected
        return expected

    def _keep(self, obj: str, expected: int, first: int, last: int) -> tuple[int, int] | None:
        lo, hi = max(first, expected), last
        self.expected = max(expected, hi + 1)
        if hi < lo:
            return None
        self.result.kept.append((obj, lo, hi))
        self.result.last_seq = hi
        return lo, hi

    def _refusal(self, meta: SegmentMeta, expected: int) -> str | None:
        """Why a segment cannot follow the ones before it (the same checks as replay)."""
        if meta.first_seq > expected:
            return f"gap: record {expected} is missing"
        if meta.valid is None or meta.epoch is None:
            return meta.reason or "unreadable"
        if meta.epoch < self.last_epoch:
            return f"epoch {meta.epoch} after epoch {self.last_epoch}: a fenced writer's segment"
        return None


def cut(metas: Iterable[SegmentMeta], start_seq: int | None = None) -> Cut:
    """Apply the recovery rule to one queue's version-1 segments (any order)."""
    chain = Chain(start_seq)
    for meta in sorted(metas, key=lambda m: m.first_seq):
        chain.admit(meta)
    return chain.result
