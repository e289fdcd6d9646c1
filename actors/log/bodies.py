"""Bodies read back from a shard's local log, for queues that spill (actors/core/runs.py).

A run's *place* is where its put's record is: ``(segment, block offset, block length,
queue sequence number, block LSN)``. Reading it reads the whole block at once (one
``pread``, through the page cache: a take reads the bodies it wants soon after they were
written, or in the order they were written), verifies its checksum, and decodes that one
record. A bounded cache keeps the bodies of the records read last, so the takes that work
through a put of 1000 read its block once; ``cache_bytes`` bounds the bodies it holds.

Reads are synchronous: the engine asks while it decides, and a shard decides one command
at a time. Only a local log is read so (object stores: their runs keep bodies in memory,
docs/DESIGN-NOTES.md).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from actors.core.events import MessagesPut
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log.wal import decode_block, decode_groups, decode_record

__all__ = ["Bodies", "Place", "bodies_in", "inline_runs", "place_of"]

Place = tuple[str, int, int, int, int]  # segment, block offset, block length, seq, block LSN


def place_of(segment: str, offset: int, length: int, seq: int, lsn: int) -> Place:
    """The place of queue record ``seq`` in the block at ``offset`` of ``segment``."""
    return (segment, offset, length, seq, lsn)


class Readable(Protocol):
    """A log device that reads a block back where it was written (LocalLogDevice)."""

    def read_at(self, key: str, offset: int, length: int) -> bytes: ...


class Bodies:
    """Reads placed runs' bodies from one shard's log, with a bounded cache."""

    def __init__(self, device: Readable, cache_bytes: int = 16 * 1024 * 1024) -> None:
        self.device = device
        self.cache_bytes = cache_bytes
        self.cached = 0  # bytes of bodies in the cache
        self._cache: OrderedDict[tuple[str, str, int, int], tuple[list[bytes], int]] = OrderedDict()
        self.blocks_read = 0
        self.hits = 0

    def clear(self) -> None:
        """Drop the cache (a shard short of memory)."""
        self._cache.clear()
        self.cached = 0

    def reader(self, queue: str) -> Callable[[Any], list[bytes]]:
        """The reader a spilling state of ``queue`` is given."""
        return lambda place: self.read(queue, place)

    def read(self, queue: str, place: Any) -> list[bytes]:
        """Every body of the put at ``place`` (a :data:`Place`; a snapshot gives it back
        as a list), in order.

        Raises:
            DataError: the block is gone, damaged, or does not hold that put.
            StoreError: the disk failed.
        """
        segment, offset, length, seq = place[0], place[1], place[2], place[3]
        key = (queue, segment, offset, seq)
        cache = self._cache
        found = cache.get(key)
        if found is not None:
            cache.move_to_end(key)
            self.hits += 1
            return found[0]
        bodies = self._read(queue, segment, offset, length, seq)
        size = sum(len(b) for b in bodies)
        cache[key] = (bodies, size)
        self.cached += size
        while self.cached > self.cache_bytes and len(cache) > 1:
            _, (_, dropped) = cache.popitem(last=False)
            self.cached -= dropped
        return bodies

    def _read(self, queue: str, segment: str, offset: int, length: int, seq: int) -> list[bytes]:
        self.blocks_read += 1
        data = self.device.read_at(segment, offset, length)
        return bodies_in(data, queue, seq, f"{segment} at {offset}")


def bodies_in(data: bytes, queue: str, seq: int, where: str) -> list[bytes]:
    """The bodies of ``queue``'s put ``seq`` in the block ``data`` holds.

    Raises:
        DataError: the block is damaged, or holds no such put.
    """
    for name, first, records in decode_groups(decode_block(data)):
        if name == queue and first <= seq < first + len(records):
            event = decode_record(records[seq - first])
            if type(event) is not MessagesPut:
                break
            return [it.body for it in event.items]
    raise DataError(f"{where} holds no put {seq} of queue {queue}")


async def inline_runs(
    state: QueueState, queue: str, read: Callable[[str], Awaitable[bytes]]
) -> None:
    """Read the bodies of ``state``'s placed runs back into memory, segment by segment
    (``read``: a whole segment), for a state that cannot read them while it decides (a log
    on an object store; runs.py).

    Raises:
        DataError: a segment is gone or damaged. StoreError: the store failed.
    """
    segments: dict[str, bytes] = {}
    for run in state.runs[state.run_front :]:
        if not run.left or run.place is None:
            continue
        segment, offset, length, seq = run.place[0], run.place[1], run.place[2], run.place[3]
        if segment not in segments:
            segments.clear()  # runs come in log order: one segment at a time
            segments[segment] = await read(segment)
        data = segments[segment][offset : offset + length]
        run.bodies, run.place = bodies_in(data, queue, seq, f"{segment} at {offset}"), None
