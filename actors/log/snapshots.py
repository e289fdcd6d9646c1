"""Writing snapshots, verifying them, and pruning what they make unnecessary.

A snapshot is written under the sequence number it covers, read back and checked before
anything older is removed. Two snapshots are kept: segments are deleted once the older of
the two covers them, so a damaged newest snapshot can always fall back to the previous one
without a gap (FORMAT.md, "Snapshot").
"""

from __future__ import annotations

import logging

from actors.core.snapshot import encode_snapshot_parts, snapshot
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log import keys
from actors.log.codec import (
    check_snapshot_object,
    decode_segment_header,
    encode_snapshot_object_parts,
)
from actors.log.store import KeyNotFound, ObjectStore

__all__ = [
    "KEEP_SNAPSHOTS",
    "encode_state",
    "prune_legacy",
    "prune_snapshots",
    "write_snapshot",
]

log = logging.getLogger(__name__)

KEEP_SNAPSHOTS = 2


def encode_state(state: QueueState, epoch: int, seq: int) -> bytes:
    """A snapshot object of ``state`` as of record ``seq``. CPU-bound; call it in one go.
    Encoded and compressed a part at a time: besides the state, memory holds about the
    compressed object (twice, while the parts are joined), not the plain encoding."""
    snap = snapshot(state)
    return encode_snapshot_object_parts(epoch, seq, lambda: encode_snapshot_parts(snap))


async def write_snapshot(
    store: ObjectStore, queue: str, seq: int, data: bytes, *, verify: bool = True
) -> str | None:
    """Store an encoded snapshot and read it back; return its key, or None if it was not
    verified (an existing object under that key is verified the same way). The read-back
    checks the header and the stored body's CRC, without decompressing it (which would hold
    the whole plain state again). Without ``verify``, no read-back: a handover's snapshot,
    which the shard taking the queue over reads (and checks) at once.

    Raises:
        StoreError: the store failed.
    """
    key = keys.snapshot_key(queue, seq)
    await store.put_if_absent(key, data)
    if not verify:
        return key
    try:
        _, got_seq = check_snapshot_object(await store.get(key))
    except DataError as exc:
        log.error("queue %s: snapshot %s does not verify: %s", queue, key, exc.message)
        return None
    if got_seq != seq:
        log.error("queue %s: snapshot %s covers %d, not %d", queue, key, got_seq, seq)
        return None
    return key


async def prune_snapshots(store: ObjectStore, queue: str, seqs: list[int]) -> list[int]:
    """Delete the queue's snapshots beyond the newest two (``seqs``: the sequence numbers of
    its snapshots, oldest first); return the ones kept.

    Raises:
        StoreError: the store failed (pruning is retried at the next snapshot).
    """
    for seq in seqs[:-KEEP_SNAPSHOTS]:
        await store.delete(keys.snapshot_key(queue, seq))
    return seqs[-KEEP_SNAPSHOTS:]


async def prune_legacy(store: ObjectStore, queue: str, seqs: list[int]) -> bool:
    """Delete the queue's version-1 segments that the older of its two kept snapshots
    covers; return whether any remain.

    Raises:
        StoreError: the store failed.
    """
    segs = sorted((keys.seq_of(k), k) for k in await store.list(keys.log_prefix(queue)))
    if len(seqs) < KEEP_SNAPSHOTS:
        return bool(segs)
    floor = seqs[-KEEP_SNAPSHOTS]  # segments wholly at or below this are covered twice
    kept = 0
    for i, (_, key) in enumerate(segs):
        # A segment's last record is the next one's first minus one; the last segment's is in
        # its header (it cannot grow: nothing writes version 1 any more).
        last = segs[i + 1][0] - 1 if i + 1 < len(segs) else await _last_record(store, key)
        if last <= floor:
            await store.delete(key)
        else:
            kept += 1
    return kept > 0


async def _last_record(store: ObjectStore, key: str) -> int:
    """The sequence number of the last record of the version-1 segment ``key`` (a damaged
    or vanished one counts as never covered)."""
    try:
        header = decode_segment_header(await store.get(key))
    except (DataError, KeyNotFound):
        return 1 << 62
    return header.first_seq + header.count - 1
