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
rebuilt.

A tag is a keyed hash of the id (BLAKE2b, a key of 16 random bytes each index draws), the
same in every process, so a snapshot holds the index as it is (:meth:`IdIndex.record`)
and a restore loads it instead of hashing every id again (100M ids: ~100 s). The key keeps
tags unforeseeable: a client cannot choose ids that all land in one bucket and make each
lookup scan it (as it could with an unkeyed hash such as CRC-32).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence

__all__ = ["KEY_BYTES", "MAX_RUNS", "PER_BUCKET", "SLOT_BITS", "IdIndex"]

PER_BUCKET = 128  # entries a bucket holds on average before the index grows by one
_START = 4  # 2 ** _START buckets to begin with
SLOT_BITS = 10  # a location's slot: a put holds at most 1000 messages
MAX_RUNS = 1 << (32 - SLOT_BITS)  # run numbers a location can name (the state reuses them)
_SLOT_MASK = (1 << SLOT_BITS) - 1
KEY_BYTES = 16  # the tag hash's key
_MEMO = 4096  # tags a lookup keeps for the add that follows it (a put looks each id up first)


class IdIndex:
    """Client id → (run number, slot) candidates. Pure: no I/O."""

    __slots__ = ("_hasher", "_memo", "count", "key", "level", "locs", "split", "tags")

    def __init__(self, key: bytes | None = None) -> None:
        self.level = _START  # buckets below 2 ** level are the round's
        self.split = 0  # buckets before it were split this round (their pair is at + 2**level)
        self.tags: list[bytearray] = [bytearray() for _ in range(1 << _START)]
        self.locs: list[array[int]] = [array("I") for _ in range(1 << _START)]
        self.count = 0
        self.key = secrets.token_bytes(KEY_BYTES) if key is None else key
        self._hasher = hashlib.blake2b(digest_size=4, key=self.key)
        self._memo: dict[str, int] = {}

    def tag(self, mid: str) -> int:
        """``mid``'s tag: its keyed hash, 32 bits, the same in every process."""
        h = self._hasher.copy()
        try:
            h.update(mid.encode())
        except UnicodeEncodeError:  # a lone surrogate
            h.update(mid.encode("utf-8", "surrogatepass"))
        return int.from_bytes(h.digest(), "little")

    def _tag_of(self, mid: str) -> int:
        """:meth:`tag`, remembered for a while: a put looks each of its ids up, then adds
        it (one hash an id, not two)."""
        tag = self._memo.get(mid)
        if tag is None:
            tag = self.tag(mid)
            memo = self._memo
            if len(memo) >= _MEMO:
                memo.clear()
            memo[mid] = tag
        return tag

    @classmethod
    def built(
        cls,
        count: int,
        batches: Iterable[tuple[Sequence[str], int, Sequence[int]]],
        key: bytes | None = None,
    ) -> IdIndex:
        """An index of ``count`` entries made at once (a restore without the index): each
        batch is ids, the run number they are in, and their slots there. It has the
        buckets ``add`` would have grown to, filled in one pass without its splits."""
        index = cls(key)
        tag_of = index.tag
        buckets = max(1 << _START, -(-count // PER_BUCKET))
        level = buckets.bit_length() - 1
        split = buckets - (1 << level)
        low, high = (1 << level) - 1, (2 << level) - 1
        tags: list[array[int]] = [array("I") for _ in range(buckets)]
        locs: list[array[int]] = [array("I") for _ in range(buckets)]
        n = 0
        for ids, run, slots in batches:
            base = run << SLOT_BITS
            for tag, slot in zip([tag_of(mid) for mid in ids], slots, strict=True):
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

    def record(self) -> tuple[bytes, int, int, int, list[tuple[bytearray, array[int]]]]:
        """The index as a snapshot holds it: key, level, split, count and each bucket's
        tags and locations (the state's own arrays: encode them before the state moves
        on; the locations little-endian, as ``array('I')`` is on the machines evq runs on)."""
        buckets = list(zip(self.tags, self.locs, strict=True))
        return self.key, self.level, self.split, self.count, buckets

    @classmethod
    def loaded(
        cls,
        key: bytes,
        level: int,
        split: int,
        buckets: Sequence[tuple[bytes, bytes]],
        runs: int,
    ) -> IdIndex:
        """The index :meth:`record` gave, its locations naming run numbers below ``runs``.

        Raises:
            ValueError: the record is not one an index gives (a damaged snapshot).
        """
        if len(key) != KEY_BYTES or not _START <= level < 32 or not 0 <= split < 1 << level:
            raise ValueError("an id index's key, level or split is out of range")
        if len(buckets) != (1 << level) + split:
            raise ValueError(f"an id index of level {level} has {len(buckets)} buckets")
        index = cls(key)
        index.level, index.split = level, split
        tags, locs = [], []
        for t, places in buckets:
            if len(t) != len(places) or len(t) & 3:
                raise ValueError("an id index's bucket has tags and locations apart")
            tags.append(bytearray(t))
            a = array("I")
            a.frombytes(places)
            locs.append(a)
        if sys.byteorder != "little":
            for a in locs:
                a.byteswap()
        if max((max(a) >> SLOT_BITS for a in locs if a), default=-1) >= runs:
            raise ValueError(f"an id index names a run past the {runs} it has")
        index.tags, index.locs = tags, locs
        index.count = sum(len(a) for a in locs)
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
        tag = self._memo.pop(mid, None)
        if tag is None:
            tag = self.tag(mid)
        b = self._bucket(tag)
        self.tags[b] += tag.to_bytes(4, "little")
        self.locs[b].append(run << SLOT_BITS | slot)
        self.count += 1
        if self.count > PER_BUCKET * len(self.tags):
            self._split()

    def find(self, mid: str) -> Iterator[tuple[int, int]]:
        """``(run number, slot)`` of each entry whose tag is ``mid``'s (check each)."""
        tag = self._tag_of(mid)
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
        tag = self._tag_of(mid)
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
