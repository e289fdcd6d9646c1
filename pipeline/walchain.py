"""Which records of a shard log count: recovery's rule for the log the queues of a shard
share (format version 2), for readers. Pure.

Recovery (``actors/log/shard_recovery.py``) reads a shard log's segments in LSN order and
stops at the first damage, for every queue at once: a segment whose header is unreadable or
names another LSN, a missing LSN between segments, a segment of an older epoch than the one
before it, a block that does not check or does not decode. A segment may end in zeros
(preallocated space) or in a torn write (a block whose write never finished, so was never
acknowledged): that is just where its data stops, as long as the next segment (if any)
begins right after its last valid block. :class:`LogChain` applies that rule to the
outcome of reading each segment (a :class:`WalMeta`); :func:`cut_logs` combines it with each
queue's own rule (:class:`pipeline.chain.Chain`: no missing record, version-1 segments
first) into what counts per queue.

Damage is reported for every queue with records in a segment discarded whole (one that
cannot follow the segments before it, or comes after damage): recovery drops those records.
What names no queue is reported for the log itself: damage inside a segment (what follows a
block that does not check cannot be read), an unreadable segment.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from actors.log import keys
from actors.status import Discarded
from pipeline.chain import VANISHED, Chain, Cut, SegmentMeta

__all__ = ["LogChain", "LogCut", "WalMeta", "cut_logs", "damage_by_queue", "log_of"]

Ranges = dict[str, list[tuple[int, int]]]  # queue -> (first seq, last seq) runs, in log order


class WalMeta(msgspec.Struct, frozen=True):
    """What reading one segment of a shard log found."""

    object: str
    first_lsn: int  # from the object's name
    epoch: int | None = None  # the header's (None: the header was not readable)
    records: int | None = None  # records in valid blocks (None: none readable)
    end: str | None = None  # clean, zeros, torn or damaged (wal.WalRead.end)
    offset: int | None = None  # where the valid blocks end, unless the segment ended clean
    reason: str | None = None  # why reading stopped (torn, damaged), or VANISHED
    queues: Ranges = msgspec.field(default_factory=dict)  # the valid blocks' records by queue

    @property
    def vanished(self) -> bool:
        """The segment was listed but gone when read (pruned meanwhile)."""
        return self.reason == VANISHED and self.records is None

    @property
    def next_lsn(self) -> int:
        """The LSN after its last valid block."""
        return self.first_lsn + (self.records or 0)


class LogCut(msgspec.Struct):
    """What a shard log lost: every discarded segment and every one pruned while read."""

    discarded: list[Discarded] = msgspec.field(default_factory=list)
    pruned: list[str] = msgspec.field(default_factory=list)


def log_of(key: str) -> str:
    """The log an object belongs to: ``wal/<shard>/`` or ``queues/<queue>/log/`` (an
    archived object's, its live name's)."""
    return keys.unarchived(key).rpartition("/")[0] + "/"


class LogChain:
    """Admits a shard log's segments in order, as recovery would.

    :meth:`opens` checks a segment before its blocks are used, :meth:`closes` how it ended
    once they have been (a block that does not decode ends it early); :meth:`admit` does both.
    """

    def __init__(self) -> None:
        self.expected: int | None = None  # the LSN the next segment must start at
        self.last_epoch = 0
        self.stopped: str | None = None
        self.result = LogCut()

    def opens(self, meta: WalMeta) -> bool:
        """Whether the valid blocks of ``meta`` may be used (False: discarded or pruned)."""
        if self.stopped is not None:
            self.result.discarded.append(Discarded(meta.object, 0, meta.records, self.stopped))
            return False
        if meta.vanished:
            self.result.pruned.append(meta.object)  # pruned: the next one starts afresh
            self.expected = None
            return False
        reason = self._refusal(meta)
        if reason is not None:
            self._stop(Discarded(meta.object, 0, meta.records, reason))
            return False
        assert meta.epoch is not None
        self.last_epoch = meta.epoch
        return True

    def closes(self, meta: WalMeta, next_first: int | None) -> None:
        """After the valid blocks of an opened segment: damage after them ends the log."""
        self.expected = meta.next_lsn
        torn_end = meta.end == "torn" and next_first in (None, meta.next_lsn)
        if meta.end in ("clean", "zeros") or torn_end:
            return
        self._stop(Discarded(meta.object, meta.offset or 0, None, meta.reason or "damaged"))

    def admit(self, meta: WalMeta, next_first: int | None) -> bool:
        """:meth:`opens` and :meth:`closes` at once (for a segment already read whole)."""
        if not self.opens(meta):
            return False
        self.closes(meta, next_first)
        return True

    def _refusal(self, meta: WalMeta) -> str | None:
        if meta.records is None or meta.epoch is None:
            return meta.reason or "unreadable"
        if self.expected is not None and meta.first_lsn != self.expected:
            return f"gap: LSN {self.expected} is missing"
        if meta.epoch < self.last_epoch:
            return f"epoch {meta.epoch} after epoch {self.last_epoch}: a fenced writer's segment"
        return None

    def _stop(self, discarded: Discarded) -> None:
        self.result.discarded.append(discarded)
        self.stopped = f"after damage in {discarded.object}"


def damage_by_queue(discarded: Discarded, ranges: Ranges) -> list[tuple[str, Discarded]]:
    """``discarded`` as each queue whose records it discards sees it. Only a whole discarded
    segment names them (``ranges``: its valid blocks' records, counted per queue); what
    follows damage inside a segment cannot be read, so that names no queue."""
    if discarded.offset != 0:
        return []
    return [
        (
            queue,
            Discarded(
                discarded.object,
                0,
                sum(last - first + 1 for first, last in runs),
                discarded.reason,
            ),
        )
        for queue, runs in ranges.items()
    ]


def _cut_log(metas: Sequence[WalMeta], chains: dict[str, Chain]) -> LogCut:
    """Apply the log's rule and each queue's rule to one shard log's segments (in order)."""
    members = {queue for meta in metas for queue in meta.queues}
    for queue in members:
        chains.setdefault(queue, Chain())
    log = LogChain()
    for index, meta in enumerate(metas):
        next_first = metas[index + 1].first_lsn if index + 1 < len(metas) else None
        told = len(log.result.discarded)
        if log.admit(meta, next_first):
            for queue, runs in meta.queues.items():
                for first, last in runs:
                    chains[queue].admit_range(meta.object, first, last)
        elif meta.vanished:  # which queues had records in it is unknown
            for queue in members:
                chains[queue].hole()
        for discarded in log.result.discarded[told:]:
            for queue, seen in damage_by_queue(discarded, meta.queues):
                chains[queue].stop(seen)
    return log.result


def cut_logs(
    v1: Mapping[str, Sequence[SegmentMeta]], wal: Mapping[str, Sequence[WalMeta]]
) -> tuple[dict[str, Cut], dict[str, LogCut]]:
    """What counts of every queue's history: its version-1 segments (``v1``: by queue),
    then its records in the shard logs (``wal``: by log); returns the cut of each queue and
    of each shard log (segments in any order)."""
    chains: dict[str, Chain] = {}
    for queue, metas in v1.items():
        chain = chains[queue] = Chain()
        for meta in sorted(metas, key=lambda m: m.first_seq):
            chain.admit(meta)
    logs = {
        name: _cut_log(sorted(metas, key=lambda m: m.first_lsn), chains)
        for name, metas in sorted(wal.items())
    }
    return {queue: chain.result for queue, chain in chains.items()}, logs
