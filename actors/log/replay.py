"""Recovery: newest valid snapshot + replay of the segments after it.

A snapshot that fails any check is skipped for the one before it. Replay goes through
segments in order and stops at the first damage — a damaged header, a bad record, a torn
tail, or a gap in sequence numbers — keeping every record before it. What was discarded is
described exactly (queue, object, byte offset, records) in a :class:`RecoveryReport`, which
the caller logs and keeps. Nothing here writes to the store: acting on the report (moving
damaged objects aside, claiming an epoch) is :mod:`actors.log.shard_recovery`'s job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import msgspec

from actors.core.snapshot import decode_snapshot, restore
from actors.core.state import QueueState
from actors.errors import DataError
from actors.log import keys
from actors.log.codec import (
    SegmentHeader,
    decode_segment,
    decode_segment_header,
    decode_snapshot_object,
)
from actors.log.store import KeyNotFound, ObjectStore
from actors.status import Discarded, RecoveryReport

__all__ = ["Replayed", "replay"]

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]  # (segments done, segments total, records done)


class Replayed(msgspec.Struct):
    """The outcome of :func:`replay`."""

    state: QueueState
    report: RecoveryReport
    max_epoch: int  # highest epoch seen in any header read
    found: bool  # whether the queue has any log object at all
    damaged: list[str]  # objects to move aside before writing again

    @property
    def last_seq(self) -> int:
        """Sequence number of the last record recovered."""
        return self.report.last_seq


async def replay(
    store: ObjectStore,
    queue: str,
    *,
    progress: Progress | None = None,
    listing: list[str] | None = None,
    known: dict[str, bytes] | None = None,
) -> Replayed:
    """Rebuild ``queue``'s state from its newest valid snapshot and the segments after it
    (format version 1: a log per queue). ``listing``: every key under the queue's prefix,
    when the caller has listed them already; ``known``: objects it has read already (key →
    bytes: a handover's snapshot, read while the listing was made).

    Raises:
        StoreError: the store could not be read (nothing is decided on partial listings).
    """
    started = time.perf_counter()  # a duration for the report; state time comes from events
    report = RecoveryReport(queue=queue)
    damaged: list[str] = []
    if listing is None:
        listing = await store.list(keys.queue_prefix(queue))
    state, snap_seq, max_epoch = await _newest_snapshot(
        store, queue, report, damaged, listing, known or {}
    )
    seg_keys = [k for k in listing if k.startswith(keys.log_prefix(queue))]
    found = bool(seg_keys) or report.snapshot is not None or bool(damaged)
    segments = _segments_after(seg_keys, snap_seq)
    expected = snap_seq + 1
    last_epoch = max_epoch  # the snapshot's: segments after it must not be older
    for index, (first_seq, key) in enumerate(segments):
        if first_seq > expected:
            gap = f"gap: record {expected} is missing"
            max_epoch = max(
                max_epoch, await _discard_rest(store, segments[index:], report, damaged, gap)
            )
            break
        try:
            read = decode_segment(await store.get(key))
        except (DataError, KeyNotFound) as exc:
            reason = exc.message if isinstance(exc, DataError) else "vanished while reading"
            report.discarded.append(Discarded(key, 0, None, reason))
            damaged.append(key)
            after = f"after damage in {key}"
            max_epoch = max(
                max_epoch, await _discard_rest(store, segments[index + 1 :], report, damaged, after)
            )
            break
        misplaced = _misplaced(read.header, first_seq, last_epoch)
        if misplaced is not None:
            report.discarded.append(Discarded(key, 0, read.header.count, misplaced))
            damaged.append(key)
            after = f"after damage in {key}"
            max_epoch = max(
                max_epoch,
                read.header.epoch,
                await _discard_rest(store, segments[index + 1 :], report, damaged, after),
            )
            break
        max_epoch = max(max_epoch, read.header.epoch)
        last_epoch = read.header.epoch
        skip = expected - first_seq  # records already in the snapshot
        for event in read.events[skip:]:
            state.apply(event)
        used = max(0, len(read.events) - skip)
        report.records_replayed += used
        report.segments_replayed += 1
        expected += used
        if read.damage is not None:
            d = read.damage
            report.discarded.append(Discarded(key, d.offset, d.records_discarded, d.reason))
            damaged.append(key)
            after = f"after damage in {key}"
            max_epoch = max(
                max_epoch, await _discard_rest(store, segments[index + 1 :], report, damaged, after)
            )
            break
        if progress is not None:
            progress(index + 1, len(segments), report.records_replayed)
    report.last_seq = expected - 1
    report.duration_ms = int((time.perf_counter() - started) * 1000)
    if report.discarded:
        log.warning(
            "queue %s: recovery discarded %s", queue, msgspec.json.encode(report.discarded).decode()
        )
    return Replayed(state, report, max_epoch, found, damaged)


async def _newest_snapshot(
    store: ObjectStore,
    queue: str,
    report: RecoveryReport,
    damaged: list[str],
    listing: list[str],
    known: dict[str, bytes],
) -> tuple[QueueState, int, int]:
    """The newest snapshot that passes every check, restored; older damaged ones reported."""
    prefix = keys.snapshot_prefix(queue)
    snap_keys = sorted(
        (k for k in listing if k.startswith(prefix) and _is_log_name(k)),
        key=keys.seq_of,
        reverse=True,
    )
    for key in snap_keys:
        try:
            data = known[key] if key in known else await store.get(key)
            epoch, seq, body = decode_snapshot_object(data)
            state = restore(decode_snapshot(body))
        except (DataError, KeyNotFound) as exc:
            reason = exc.message if isinstance(exc, DataError) else "vanished while reading"
            report.discarded.append(Discarded(key, 0, None, f"snapshot unusable: {reason}"))
            damaged.append(key)
            continue
        if seq != keys.seq_of(key):
            report.discarded.append(Discarded(key, 0, None, f"snapshot says seq {seq}"))
            damaged.append(key)
            continue
        report.snapshot, report.snapshot_seq = key, seq
        return state, seq, epoch
    return QueueState(), 0, 0


def _misplaced(header: SegmentHeader, first_seq: int, last_epoch: int) -> str | None:
    """Why a segment with an intact header still cannot follow the ones before it."""
    if header.first_seq != first_seq:
        return f"header says first record {header.first_seq}, the name says {first_seq}"
    if header.epoch < last_epoch:
        # A zombie's write that landed above a newer incarnation's claim: never acknowledged
        # (acks are released in order, and the zombie's write at the claim failed first).
        return f"epoch {header.epoch} after epoch {last_epoch}: a fenced writer's segment"
    return None


def _segments_after(seg_keys: list[str], snap_seq: int) -> list[tuple[int, str]]:
    """Segments that may hold records after ``snap_seq``, in order. Objects whose names are
    not segment names are ignored (and logged): they cannot be part of the log."""
    ordered = []
    for k in seg_keys:
        try:
            ordered.append((keys.seq_of(k), k))
        except DataError:
            log.warning("ignoring %s: not a segment name", k)
    ordered.sort()
    keep = []
    for i, (first, key) in enumerate(ordered):
        next_first = ordered[i + 1][0] if i + 1 < len(ordered) else None
        if next_first is None or next_first - 1 > snap_seq:
            keep.append((first, key))
    return keep


def _is_log_name(key: str) -> bool:
    try:
        keys.seq_of(key)
    except DataError:
        log.warning("ignoring %s: not a snapshot name", key)
        return False
    return True


async def _discard_rest(
    store: ObjectStore,
    segments: list[tuple[int, str]],
    report: RecoveryReport,
    damaged: list[str],
    reason: str,
) -> int:
    """Report whole segments that cannot be used, with their record counts when readable;
    return the highest epoch among their headers (a new writer must exceed it too)."""
    max_epoch = 0
    for _, key in segments:
        records: int | None = None
        try:
            header = decode_segment_header(await store.get(key))
            records, max_epoch = header.count, max(max_epoch, header.epoch)
        except (DataError, KeyNotFound):
            pass
        report.discarded.append(Discarded(key, 0, records, reason))
        damaged.append(key)
    return max_epoch
