"""Writing snapshots, verifying them, and pruning what they make unnecessary.

A snapshot is written under the sequence number it covers, read back and checked before
anything older is removed. Two snapshots are kept: segments are deleted once the older of
the two covers them, so a damaged newest snapshot can always fall back to the previous one
without a gap (FORMAT.md, "Snapshot").
"""

from __future__ import annotations

import itertools
import logging

from actors.core.snapshot import encode_snapshot, snapshot
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log import keys
from actors.log.codec import decode_snapshot_object, encode_snapshot_object
from actors.log.store import ObjectStore

__all__ = ["KEEP_SNAPSHOTS", "encode_state", "prune", "write_snapshot"]

log = logging.getLogger(__name__)

KEEP_SNAPSHOTS = 2


def encode_state(state: QueueState, epoch: int, seq: int) -> bytes:
    """A snapshot object of ``state`` as of record ``seq``. CPU-bound; call it in one go."""
    return encode_snapshot_object(epoch, seq, encode_snapshot(snapshot(state)))


async def write_snapshot(store: ObjectStore, queue: str, seq: int, data: bytes) -> str | None:
    """Store an encoded snapshot and read it back; return its key, or None if it was not
    verified (an existing object under that key is verified the same way).

    Raises:
        StoreError: the store failed.
    """
    key = keys.snapshot_key(queue, seq)
    await store.put_if_absent(key, data)
    try:
        _, got_seq, _ = decode_snapshot_object(await store.get(key))
    except DataError as exc:
        log.error("queue %s: snapshot %s does not verify: %s", queue, key, exc.message)
        return None
    if got_seq != seq:
        log.error("queue %s: snapshot %s covers %d, not %d", queue, key, got_seq, seq)
        return None
    return key


async def prune(store: ObjectStore, queue: str) -> tuple[int, int]:
    """Delete snapshots beyond the newest two and segments the older of those covers;
    return (snapshots deleted, segments deleted).

    Raises:
        StoreError: the store failed (pruning is retried at the next snapshot).
    """
    snaps = sorted(await store.list(keys.snapshot_prefix(queue)), key=keys.seq_of)
    if len(snaps) < KEEP_SNAPSHOTS:
        return 0, 0
    keep = snaps[-KEEP_SNAPSHOTS:]
    floor = keys.seq_of(keep[0])  # segments wholly at or below this are covered twice
    for key in snaps[:-KEEP_SNAPSHOTS]:
        await store.delete(key)
    segs = sorted((keys.seq_of(k), k) for k in await store.list(keys.log_prefix(queue)))
    deleted = 0
    for (_, key), (next_first, _) in itertools.pairwise(segs):
        if next_first - 1 <= floor:  # its last record is next_first - 1
            await store.delete(key)
            deleted += 1
    return len(snaps) - KEEP_SNAPSHOTS, deleted
