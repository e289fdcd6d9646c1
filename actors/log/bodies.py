"""Bodies (and attributes) read back from a shard's local log, for queues that spill
(actors/core/runs.py).

A run's *place* is where its put's record is: ``(segment, block offset, block length,
queue sequence number, block LSN)``; once compaction moved its bodies, where that
``BodiesMoved`` record is, with two more: the run's index in the record and the slot its
bodies start at. Reading it reads the whole block at once (one
``pread``, through the page cache: a take reads the bodies it wants soon after they were
written, or in the order they were written), verifies its checksum, and decodes that one
record. A bounded cache keeps the bodies of the records read last, so the takes that work
through a put of 1000 read its block once, and those of the puts placed last (the shell
gives them as it places them), so a take soon after its put reads nothing; ``cache_bytes``
bounds the bodies it holds. The last blocks read are kept too, their records still encoded
(a quarter of ``cache_bytes`` at most): a take that reads several puts of one group commit
(a FIFO group's stretch, whose members are one a put) reads and checks their block once.

Reads are synchronous: the engine asks while it decides, and a shard decides one command
at a time. Only a local file is read so: a local log's segment, or the local copy of an
object-store log's (CachedObjectLogDevice, actors/log/device.py); without a copy, an
object store's runs keep their bodies in memory (docs/DESIGN-NOTES.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from actors.core.events import BodiesMoved, Event, MessagesPut, MessageUpdated
from actors.core.runs import Contents, moved_contents
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log.wal import Group, decode_block, decode_groups, decode_record

__all__ = ["Bodies", "Place", "Readable", "bodies_in", "inline_runs", "place_of"]

# What the cache counts for a message's attributes (a dict of a few short strings), beside
# its body's bytes.
ATTRS_BYTES = 256

# segment, block offset, block length, seq, block LSN (and, for a BodiesMoved record, the
# run's index in it and its first slot there)
Place = tuple[int | str, ...]


def place_of(
    segment: str, offset: int, length: int, seq: int, lsn: int, event: Event, first_id: int
) -> Place:
    """The place of the bodies of the run whose first message is ``first_id`` in record
    ``seq`` (``event``) of the block at ``offset`` of ``segment``."""
    if type(event) is BodiesMoved:
        i = event.ids.index(first_id)
        return (segment, offset, length, seq, lsn, i, event.firsts[i])
    return (segment, offset, length, seq, lsn)


@runtime_checkable
class Readable(Protocol):
    """A log device that reads a block back where it was written, locally (LocalLogDevice,
    CachedObjectLogDevice)."""

    def read_at(self, key: str, offset: int, length: int) -> bytes: ...


class Bodies:
    """Reads placed runs' bodies from one shard's log, with a bounded cache."""

    def __init__(self, device: Readable, cache_bytes: int = 16 * 1024 * 1024) -> None:
        self.device = device
        self.cache_bytes = cache_bytes
        self.cached = 0  # bytes of bodies in the cache
        self._cache: OrderedDict[tuple[Any, ...], tuple[Contents, int]] = OrderedDict()
        # the blocks read last, their records still encoded: (segment, offset) -> groups
        self._blocks: OrderedDict[tuple[Any, ...], tuple[list[Group], int]] = OrderedDict()
        self.blocked = 0  # bytes of the blocks kept
        self.blocks_read = 0
        self.hits = 0

    def clear(self) -> None:
        """Drop the cache (a shard short of memory)."""
        self._cache.clear()
        self.cached = 0
        self._blocks.clear()
        self.blocked = 0

    def reader(self, queue: str) -> Callable[[Any], Contents]:
        """The reader a spilling state of ``queue`` is given."""
        return lambda place: self.read(queue, place)

    def read(self, queue: str, place: Any) -> Contents:
        """Every body (and attributes) of the put at ``place`` (a :data:`Place`; a
        snapshot gives it back as a list), in order.

        Raises:
            DataError: the block is gone, damaged, or does not hold that put.
            StoreError: the disk failed.
        """
        key = _key(queue, place)
        cache = self._cache
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            self.hits += 1
            return found[0]
        contents = contents_in(self._groups(place), queue, place)
        self._add(key, contents, sum(len(b) for b in contents.bodies))
        return contents

    def _groups(self, place: Any) -> list[Group]:
        """The records of the block at ``place``, grouped by queue (read, or kept)."""
        at = (place[0], place[1])
        blocks = self._blocks
        found = blocks.get(at)
        if found is not None:
            blocks.move_to_end(at)
            return found[0]
        self.blocks_read += 1
        groups = decode_groups(decode_block(self.device.read_at(place[0], place[1], place[2])))
        size = int(place[2])
        blocks[at] = (groups, size)
        self.blocked += size
        while self.blocked > self.cache_bytes // 4 and len(blocks) > 1:
            _, (_, dropped) = blocks.popitem(last=False)
            self.blocked -= dropped
        return groups

    def keep(self, queue: str, place: Any, contents: Contents, size: int) -> None:
        """The bodies (and attributes) of a put of ``queue`` just placed at ``place``
        (``size``: the bodies' bytes), kept as if read back: a take soon after its put
        reads no block."""
        if size <= self.cache_bytes:
            self._add(_key(queue, place), contents, size)

    def _add(self, key: tuple[Any, ...], contents: Contents, size: int) -> None:
        if contents.attrs is not None:  # a small dict and its strings, about
            size += ATTRS_BYTES * len(contents.attrs)
        cache = self._cache
        cache[key] = (contents, size)
        self.cached += size
        while self.cached > self.cache_bytes and len(cache) > 1:
            _, (_, dropped) = cache.popitem(last=False)
            self.cached -= dropped


def _key(queue: str, place: Any) -> tuple[Any, ...]:
    return (queue, place[0], place[1], place[3], place[5] if len(place) > 5 else -1)


def bodies_in(data: bytes, queue: str, place: Any) -> Contents:
    """The bodies (and attributes) of the run at ``place`` (a :data:`Place`) in the block
    ``data`` holds: every body of its put, in order (slots before the first a move wrote are
    ``b""``, their attributes None: they were taken before, and are never read).

    Raises:
        DataError: the block is damaged, or holds no such record.
    """
    return contents_in(decode_groups(decode_block(data)), queue, place)


def contents_in(groups: list[Group], queue: str, place: Any) -> Contents:
    """:func:`bodies_in` for a block already decoded into its groups.

    Raises:
        DataError: it holds no such record.
    """
    seq = place[3]
    for name, first, records in groups:
        if name == queue and first <= seq < first + len(records):
            event = decode_record(records[seq - first])
            if len(place) > 5:
                index = place[5]
                if (
                    type(event) is BodiesMoved
                    and index < len(event.bodies)
                    and _attributes_fit(event, index)
                ):
                    return moved_contents(event, index)
            elif type(event) is MessagesPut:
                attrs = [it.attributes for it in event.items]
                return Contents(
                    [it.body for it in event.items],
                    attrs if any(a is not None for a in attrs) else None,
                )
            elif type(event) is MessageUpdated and event.body is not None:
                return Contents([event.body], None)  # a body it changed (Run.patches)
            break
    raise DataError(f"{place[0]} at {place[1]} holds no bodies of record {seq} of queue {queue}")


def _attributes_fit(moved: BodiesMoved, index: int) -> bool:
    """Whether ``moved``'s attributes, if any, match its bodies for run ``index``."""
    attrs = moved.attributes
    if attrs is None:
        return True
    if len(attrs) != len(moved.bodies):
        return False
    mine = attrs[index]
    return mine is None or len(mine) == len(moved.bodies[index])


async def inline_runs(
    state: QueueState, queue: str, read: Callable[[str], Awaitable[bytes]]
) -> None:
    """Read the contents of ``state``'s placed runs back into memory, segment by segment
    (``read``: a whole segment), for a state that cannot read them while it decides (a log
    on an object store; runs.py).

    Raises:
        DataError: a segment is gone or damaged. StoreError: the store failed.
    """
    segments: dict[str, bytes] = {}

    async def block(place: Any) -> bytes:
        segment, offset, length = place[0], place[1], place[2]
        if segment not in segments:
            segments.clear()  # runs come in log order, mostly: one segment at a time
            segments[segment] = await read(segment)
        return segments[segment][offset : offset + length]

    for run in state.live_runs():
        if run.place is not None:
            run.bodies, run.attrs = bodies_in(await block(run.place), queue, run.place)
            run.place = None
        if run.patches is not None:  # bodies updates changed, in their records
            found = {}
            for _, place in run.patches.places():
                found[place] = bodies_in(await block(place), queue, place).bodies[0]
            run.patches.inline(found.__getitem__)
