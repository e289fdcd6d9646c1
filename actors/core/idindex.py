"""Where a client-id queue's runs hold each id: the index that lets a run keep its ids
packed (runs.py) and still be found by id, in 8 bytes an id instead of a dict entry and a
``str`` (~100 bytes).

An entry is a 4-byte tag (the id's hash, its low 32 bits) in its bucket's ``bytearray``
and a 4-byte location (the run's number in the state's list of client-id runs, 22 bits,
and the slot, 10: a put holds at most 1000) in the bucket's ``array('I')``, at the same
position. A lookup finds the tag with
``bytearray.find`` (C speed, no object a probe) and hands out the locations whose tags
match: the caller checks each against the run's own id (tags of different ids may be
equal). Buckets grow by linear hashing, one bucket split at a time when they hold
:data:`PER_BUCKET` entries on average, so no insert ever waits for the whole index to be
rebuilt. Python's ``hash`` of a ``str`` changes from process to process: the index is
never written anywhere, a restore builds it again from the runs.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence

__all__ = ["MAX_RUNS", "PER_BUCKET", "SLOT_BITS", "IdIndex"]

PER_BUCKET = 128  # entries a bucket holds on average before the index grows by one
_START = 4  # 2 ** _START buckets to begin with
_MASK32 = 0xFFFFFFFF
SLOT_BITS = 10  # a location's slot: a put holds at most 1000 messages
MAX_RUNS = 1 << (32 - SLOT_BITS)  # run numbers a location can name (the state reuses them)
_SLOT_MASK = (1 << SLOT_BITS) - 1


class IdIndex:
    """Client id → (run number, slot) candidates. Pure: no I/O."""

    __slots__ = ("count", "level", "locs", "split", "tags")

    def __init__(self) -> None:
        self.level = _START  # buckets below 2 ** level are the round's
        self.split = 0  # buckets before it were split this round (their pair is at + 2**level)
        self.tags: list[bytearray] = [bytearray() for _ in range(1 << _START)]
        self.locs: list[array[int]] = [array("I") for _ in range(1 << _START)]
        self.count = 0

    @classmethod
    def built(
        cls, count: int, batches: Iterable[tuple[Sequence[str], int, Sequence[int]]]
    ) -> IdIndex:
        """An index of ``count`` entries made at once (a restore): each batch is ids, the
        run number they are in, and their slots there. It has the buckets ``add`` would
        have grown to, filled in one pass without its splits: ~3x faster an id."""
        index = cls()
        buckets = max(1 << _START, -(-count // PER_BUCKET))
        level = buckets.bit_length() - 1
        split = buckets - (1 << level)
        low, high = (1 << level) - 1, (2 << level) - 1
        tags: list[array[int]] = [array("I") for _ in range(buckets)]
        locs: list[array[int]] = [array("I") for _ in range(buckets)]
        n = 0
        for ids, run, slots in batches:
            base = run << SLOT_BITS
            for tag, slot in zip([hash(mid) & _MASK32 for mid in ids], slots, strict=True):
                b = tag & low
                if b < split:
                    b = tag & high
                tags[b].append(tag)
                locs[b].append(base | slot)
            n += len(slots)
        if sys.byteorder != "little":
            for a in tags:
                a.byteswap()
        index.level, index.split, index.count = level, split, n
        index.tags = [bytearray(a.tobytes()) for a in tags]
        index.locs = locs
        return index

    def __len__(self) -> int:
        return self.count

    def _bucket(self, tag: int) -> int:
        b = tag & ((1 << self.level) - 1)
        if b < self.split:
            b = tag & ((2 << self.level) - 1)
        return b

    def add(self, mid: str, run: int, slot: int) -> None:
        """Index ``mid`` at slot ``slot`` of run number ``run``."""
        tag = hash(mid) & _MASK32
        b = self._bucket(tag)
        self.tags[b] += tag.to_bytes(4, "little")
        self.locs[b].append(run << SLOT_BITS | slot)
        self.count += 1
        if self.count > PER_BUCKET * len(self.tags):
            self._split()

    def find(self, mid: str) -> Iterator[tuple[int, int]]:
        """``(run number, slot)`` of each entry whose tag is ``mid``'s (check each)."""
        tag = hash(mid) & _MASK32
        b = self._bucket(tag)
        tags, locs = self.tags[b], self.locs[b]
        key = tag.to_bytes(4, "little")
        at = tags.find(key)
        while at >= 0:
            if not at & 3:
                loc = locs[at >> 2]
                yield loc >> SLOT_BITS, loc & _SLOT_MASK
            at = tags.find(key, at + 1)

    def remove(self, mid: str, run: int, slot: int) -> bool:
        """Drop the entry of ``mid`` at that place; whether there was one."""
        tag = hash(mid) & _MASK32
        b = self._bucket(tag)
        tags, locs = self.tags[b], self.locs[b]
        key = tag.to_bytes(4, "little")
        want = run << SLOT_BITS | slot
        at = tags.find(key)
        while at >= 0:
            if not at & 3 and locs[at >> 2] == want:
                last = len(locs) - 1  # the last entry takes its place
                tags[at : at + 4] = tags[4 * last :]
                del tags[4 * last :]
                locs[at >> 2] = locs[last]
                locs.pop()
                self.count -= 1
                return True
            at = tags.find(key, at + 1)
        return False

    def _split(self) -> None:
        """Split the next bucket of the round in two by the tag's next bit."""
        b, high = self.split, 1 << self.level
        tags, locs = self.tags[b], self.locs[b]
        keep_t, keep_l = bytearray(), array("I")
        move_t, move_l = bytearray(), array("I")
        for k in range(len(locs)):
            t = tags[4 * k : 4 * k + 4]
            if int.from_bytes(t, "little") & high:
                move_t += t
                move_l.append(locs[k])
            else:
                keep_t += t
                keep_l.append(locs[k])
        self.tags[b], self.locs[b] = keep_t, keep_l
        self.tags.append(move_t)
        self.locs.append(move_l)
        self.split += 1
        if self.split == high:
            self.level += 1
            self.split = 0
