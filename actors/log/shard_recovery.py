"""Opening a shard's log: what every queue of the shard was when the last incarnation stopped.

:func:`open_shard_log` is what a new incarnation of a shard runs before it serves anything:

1. check the store's layout (:mod:`actors.log.layout`: the logs were written with this shard
   count; a store without one gets one), then take the log (:meth:`LogDevice.open`: a local
   log's exclusive lock);
2. for every queue of the shard found in the store, restore its newest valid snapshot, and
   replay its own version-1 segments after it if it has any (data written before the shard
   log existed; :func:`actors.log.replay.replay`);
3. read the shard log in order and give each queue its records after its snapshot
   (:func:`_replay_wal`); a queue found only in the log starts from its ``QueueCreated``;
4. repair: cut a torn tail (a block whose write never finished: never acknowledged), keep a
   copy of damaged segments under ``damaged/`` and drop what follows damage; move damaged
   version-1 objects aside after snapshotting what was kept of them;
5. claim a new epoch: the first block of the new incarnation (in a segment of its own on a
   local disk; as a create-only object on an object store, which fences older incarnations);
6. store the recovery report under ``wal/<shard>/reports/<epoch>.json`` and log it.

Nothing is decided on a partial reading: a failed store call fails the opening (the shard
retries it), and the claim is retried from step 2 when another incarnation claimed first.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

import msgspec

from actors.clock import Clock
from actors.core.events import Event, QueueCreated, QueueDeleted, WriterStarted
from actors.core.state import QueueState
from actors.errors import DataError, QueueError, Unavailable
from actors.log import keys
from actors.log.bodies import Bodies, Readable, inline_runs, place_of
from actors.log.device import LogDevice
from actors.log.layout import LayoutMismatch, claim_layout, settled_count
from actors.log.placement import Placement, placement, read_placement
from actors.log.replay import replay
from actors.log.shardlog import ShardLog
from actors.log.snapshots import encode_state, write_snapshot
from actors.log.store import KeyNotFound, ObjectStore, copy_object
from actors.log.wal import Block, WalRead, decode_groups, decode_record, scan_segment
from actors.status import Discarded, RecoveryReport, ShardReport

__all__ = [
    "SHARD_STREAM",
    "Progress",
    "QueueRecovered",
    "SegmentInfo",
    "ShardReport",
    "StoredReport",
    "open_shard_log",
    "placement",
    "read_shard",
]

log = logging.getLogger(__name__)

_CLAIM_ATTEMPTS = 8
SHARD_STREAM = ""  # the shard's own records (epoch claims) in its log: no queue has this name
# Segments read ahead while replaying, per block write a device takes at once (on an object
# store, 8 slots: 32 reads in flight; a local log, one slot: none ahead).
READ_AHEAD_PER_SLOT = 4

Progress = Callable[[int, int, int], None]  # (segments done, segments total, records done)
Prepare = Callable[[str, QueueState], object]  # sets up a queue's state before records apply


class QueueRecovered:
    """One queue as recovery rebuilt it."""

    __slots__ = ("gap", "headless", "legacy", "name", "next_seq", "report", "snapshots", "state")

    def __init__(self, name: str, state: QueueState, next_seq: int, report: RecoveryReport) -> None:
        self.name = name
        self.state = state
        self.next_seq = next_seq  # the sequence number its next record gets
        self.report = report
        self.snapshots: list[int] = []  # sequence numbers of its valid snapshots, oldest first
        self.legacy = False  # it still has version-1 segments of its own
        self.gap = False  # a record was missing: later ones were not applied
        # Set to the first missing sequence number while skipping the rest of a deleted life
        # whose first records were pruned (see _Recovery._skip_headless); 0 otherwise.
        self.headless = 0


class SegmentInfo:
    """A segment of the shard log and, per queue, the last sequence number it holds there
    (what pruning needs to know: a segment goes once snapshots cover all of it)."""

    __slots__ = ("bytes", "first_lsn", "key", "queues")

    def __init__(self, key: str, first_lsn: int) -> None:
        self.key = key
        self.first_lsn = first_lsn
        self.queues: dict[str, int] = {}
        self.bytes = 0  # of its blocks


class StoredReport(msgspec.Struct):
    """What an incarnation keeps under ``wal/<shard>/reports/<epoch>.json``: its log's report
    and the reports of the queues that had something to tell."""

    log: ShardReport
    queues: list[RecoveryReport]


class OpenedShard:
    """A recovered shard, ready to serve: its queues, its log (holding the new epoch)."""

    def __init__(
        self,
        queues: dict[str, QueueRecovered],
        wal: ShardLog,
        segments: list[SegmentInfo],
        deleted: dict[str, int],
        stream_seq: int,
        report: ShardReport,
        reports: list[RecoveryReport],
        tombstoned: list[str],
        placed: Placement,
    ) -> None:
        self.placement = placed  # the map it recovered by
        self.queues = queues
        self.wal = wal
        self.segments = segments
        self.deleted = deleted  # queue -> seq of its deletion record, still in the log
        self.stream_seq = stream_seq  # the next seq of the shard's own records
        self.report = report
        self.reports = reports  # one per queue recovered
        self.tombstoned = tombstoned  # version-1 deletions a crash interrupted


async def open_shard_log(
    store: ObjectStore,
    device: LogDevice,
    shard: int,
    count: int,
    clock: Clock,
    *,
    progress: Progress | None = None,
    max_batch_bytes: int = 16 * 1024 * 1024,
    prepare: Prepare | None = None,
) -> OpenedShard:
    """Recover shard ``shard`` of ``count`` (the queues the placement map gives it) and take
    ownership of its log.

    Raises:
        LayoutMismatch: the store's shard logs (or its placement map) were written with
            another shard count.
        Unavailable: the store failed, another process holds the log, or other incarnations
            kept winning the claim.
    """
    began = time.perf_counter()  # a duration for the report; state time is in events
    count = await settled_count(store, count)
    epoch_floor = await claim_layout(store, count)
    await device.open()
    last_error: QueueError | None = None
    for attempt in range(_CLAIM_ATTEMPTS):
        started = began if attempt == 0 else time.perf_counter()
        placed = await read_placement(store, count)  # a resize since may have changed the count
        recovery = _Recovery(store, device, shard, count, progress, prepare, placed.shard_of)
        await recovery.run()
        epoch = max(recovery.max_epoch, epoch_floor) + 1
        report = recovery.report
        report.epoch = epoch
        await recovery.repair(epoch)
        wal = ShardLog(device, epoch, recovery.next_lsn, max_batch_bytes=max_batch_bytes)
        now = max([clock.now_ms(), *(q.state.clock_ms for q in recovery.queues.values())])
        claim: list[Event] = [WriterStarted(now, epoch, secrets.randbits(62) + 1)]
        try:
            await device.begin(epoch, recovery.next_lsn)
            batch = wal.append(SHARD_STREAM, recovery.stream_seq, claim)
            await batch.wait()
        except QueueError as exc:
            # Another incarnation claimed first, or our claim's outcome is unknown: either way
            # the log must be read again before deciding anything.
            last_error = exc
            log.info("shard %d: epoch %d could not claim the log (%s); retrying", shard, epoch, exc)
            await asyncio.sleep(min(0.05 * 2**attempt, 2.0))
            continue
        segments = recovery.segments
        if not segments or segments[-1].key != batch.segment:
            segments.append(SegmentInfo(batch.segment, batch.first_lsn))
        segments[-1].queues[SHARD_STREAM] = recovery.stream_seq
        report.duration_ms = int((time.perf_counter() - started) * 1000)
        report.queues = len(recovery.queues)
        await _store_report(store, shard, report, recovery.reports)
        queues = {n: q for n, q in recovery.queues.items() if q.state.created}
        return OpenedShard(
            queues,
            wal,
            segments,
            recovery.deleted,
            recovery.stream_seq + len(claim),
            report,
            recovery.reports,
            recovery.tombstoned,
            placed,
        )
    raise Unavailable(
        f"shard {shard}: could not claim its log in {_CLAIM_ATTEMPTS} attempts: {last_error}"
    )


async def read_shard(
    store: ObjectStore, device: LogDevice, shard: int, count: int
) -> tuple[dict[str, QueueRecovered], ShardReport]:
    """What recovery of shard ``shard`` would rebuild now, read-only: nothing is repaired,
    no epoch claimed (for tools and tests; a running shard may be writing meanwhile).

    Raises:
        StoreError: the store failed.
    """
    bodies = Bodies(device) if isinstance(device, Readable) else None

    def readable(name: str, state: QueueState) -> None:  # runs of snapshots read back
        state.read = bodies.reader(name) if bodies is not None else None

    placed = await _placement(store, await settled_count(store, count))
    recovery = _Recovery(store, device, shard, count, None, readable, placed.shard_of)
    await recovery.run()
    recovery.report.epoch = recovery.max_epoch
    queues = {n: q for n, q in recovery.queues.items() if q.state.created}
    return queues, recovery.report


async def _placement(store: ObjectStore, count: int) -> Placement:
    """The store's placement map, of ``count`` shards.

    Raises:
        LayoutMismatch: the map is of another count.
    """
    placed = await read_placement(store, count)
    if placed.count != count:
        raise LayoutMismatch(
            f"the placement map (generation {placed.generation}) is of {placed.count} "
            f"shard(s), not {count}",
            shards=placed.count,
        )
    return placed


class _Recovery:
    """One reading of a shard's snapshots and logs (steps 2 to 4 of the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        device: LogDevice,
        shard: int,
        count: int,
        progress: Progress | None,
        prepare: Prepare | None = None,
        owner: Callable[[str], int] | None = None,
    ) -> None:
        self.store = store
        self.prepare = prepare
        self.owner = owner or (lambda name: placement(name, count))
        self._where: tuple[str, int, int, int] = ("", 0, 0, 0)  # the block being applied
        self.device = device
        self.shard = shard
        self.count = count
        self.progress = progress
        self.report = ShardReport(shard=shard)
        self.queues: dict[str, QueueRecovered] = {}
        self.not_ours: set[str] = set()  # queues whose records were skipped (logged once)
        self.deleted: dict[str, int] = {}
        self.segments: list[SegmentInfo] = []
        self.max_epoch = 0
        self.next_lsn = 1
        self.stream_seq = 1
        self.records = 0
        self.tombstoned: list[str] = []
        self.reports: list[RecoveryReport] = []
        # Repairs decided while reading, done once the new epoch is known.
        self._cut: list[tuple[str, int]] = []  # (segment, valid length)
        self._aside: list[str] = []  # damaged segments: a copy under damaged/, then cut/drop
        self._legacy_damage: dict[str, list[str]] = {}  # queue -> version-1 objects

    async def run(self) -> None:
        await self._load_queues()
        await self._replay_wal()
        for queue in self.queues.values():
            if queue.headless:  # no QueueDeleted ended it: records are missing
                self._gap(queue, queue.headless)
        self.report.records = self.records

    # ---------------------------------------------------------------- snapshots and v1

    async def _load_queues(self) -> None:
        by_queue: dict[str, list[str]] = {}
        for key in await self.store.list(keys.ROOT):
            name = key[len(keys.ROOT) :].split("/", 1)[0]
            if self.owner(name) == self.shard:
                by_queue.setdefault(name, []).append(key)
        for name, listing in sorted(by_queue.items()):
            if f"{keys.queue_prefix(name)}DELETED" in listing:
                self.tombstoned.append(name)  # a version-1 deletion: the shard finishes it
                continue
            replayed = await replay(self.store, name, listing=listing)
            report = replayed.report
            self._prepared(name, replayed.state)
            if replayed.state.by_id and replayed.state.read is None:
                await inline_runs(replayed.state, name, self.device.read)
            queue = QueueRecovered(name, replayed.state, report.last_seq + 1, report)
            queue.snapshots = _snapshot_seqs(name, listing, replayed.damaged)
            queue.legacy = any(k.startswith(keys.log_prefix(name)) for k in listing)
            self.queues[name] = queue
            if replayed.damaged:
                self._legacy_damage[name] = replayed.damaged

    # ---------------------------------------------------------------- the shard log

    async def _replay_wal(self) -> None:
        listed = await self.device.segments()
        self.report.segments = len(listed)
        ahead = _ReadAhead(self.device, [key for _, key in listed])
        try:
            await self._replay_segments(listed, ahead)
        finally:
            ahead.cancel()

    async def _replay_segments(self, listed: list[tuple[int, str]], ahead: _ReadAhead) -> None:
        expected: int | None = None
        last_epoch = 0
        for index, (first_lsn, key) in enumerate(listed):
            stop = listed[index + 1][0] if index + 1 < len(listed) else None
            if expected is not None and first_lsn != expected:
                self._drop_rest(listed[index:], f"gap: LSN {expected} is missing")
                return
            read = await self._read(ahead, index, stop, listed[index + 1 :])
            if read is None:
                return
            why = _misplaced(read, first_lsn, last_epoch)
            if why is not None:
                self._drop_rest(listed[index:], why)
                return
            info = SegmentInfo(key, first_lsn)
            self.segments.append(info)
            info.bytes = sum(block.end - block.offset for block in read.blocks)
            for block in read.blocks:
                self.max_epoch = max(self.max_epoch, block.epoch)
                if not self._apply_block(block, info):
                    self._damaged(key, block.offset, block.count, "a record does not decode")
                    self._drop_rest(listed[index + 1 :], f"after damage in {key}")
                    self.next_lsn = block.first_lsn
                    return
            self.max_epoch = max(self.max_epoch, read.header.epoch)
            last_epoch = read.blocks[-1].epoch if read.blocks else read.header.epoch
            self.next_lsn = expected = read.next_lsn
            if not self._ended_well(read, key, stop):
                self._drop_rest(listed[index + 1 :], f"after damage in {key}")
                return
            if not read.blocks and stop is None:
                self._cut.append((key, 0))  # a last segment with no block: drop it
            if self.progress is not None:
                self.progress(index + 1, len(listed), self.records)

    async def _read(
        self, ahead: _ReadAhead, index: int, stop: int | None, later: list[tuple[int, str]]
    ) -> WalRead | None:
        key = ahead.keys[index]
        try:
            return scan_segment(await ahead.read(index), stop_lsn=stop)
        except (DataError, KeyNotFound) as exc:
            reason = exc.message if isinstance(exc, DataError) else "vanished while reading"
            self._damaged(key, 0, None, reason)
            self._drop_rest(later, f"after damage in {key}")
            return None

    def _ended_well(self, read: WalRead, key: str, stop: int | None) -> bool:
        """Whether the log goes on after this segment; decide its repair."""
        if read.end == "clean":
            return True
        if read.end == "zeros" or (read.end == "torn" and (stop is None or stop == read.next_lsn)):
            # Preallocated space, or a write that never finished (never acknowledged): cut.
            if read.end == "torn":
                self.report.repaired.append(f"{key}: torn tail cut at offset {read.valid_end}")
            self._cut.append((key, read.valid_end))
            return True
        self._damaged(key, read.valid_end, None, read.reason or read.end)
        return False

    def _damaged(self, key: str, offset: int, records: int | None, reason: str) -> None:
        self.report.discarded.append(Discarded(key, offset, records, reason))
        self._aside.append(key)
        self._cut.append((key, offset))

    def _drop_rest(self, segments: list[tuple[int, str]], reason: str) -> None:
        for _, key in segments:
            self.report.discarded.append(Discarded(key, 0, None, reason))
            self._aside.append(key)
            self._cut.append((key, 0))

    def _apply_block(self, block: Block, info: SegmentInfo) -> bool:
        """Give each queue of the block its records; False if the block does not decode
        (then nothing of it is applied)."""
        try:
            decoded = []
            for name, first_seq, records in decode_groups(block):
                if name == SHARD_STREAM:
                    self.stream_seq = max(self.stream_seq, first_seq + len(records))
                    continue
                queue = self._queue(name)
                if queue is None:
                    continue
                skip = max(0, queue.next_seq - first_seq)
                events = [decode_record(r) for r in records[skip:]]
                decoded.append((queue, first_seq, skip, events, first_seq + len(records) - 1))
        except DataError:
            return False
        self._where = (info.key, block.offset, block.end - block.offset, block.first_lsn)
        for queue, first_seq, skip, events, last in decoded:
            # the block's last record of the queue, applied or covered by its snapshot
            # (this said the snapshot's seq, and kept the segment until snapshots past it)
            info.queues[queue.name] = last
            self._apply(queue, first_seq + skip, events)
        return True

    def _queue(self, name: str) -> QueueRecovered | None:
        queue = self.queues.get(name)
        if queue is None:
            if self.owner(name) != self.shard:
                if name not in self.not_ours:
                    self.not_ours.add(name)
                    log.warning(
                        "shard %d: records of queue %s, which is not ours", self.shard, name
                    )
                return None
            queue = self.queues[name] = QueueRecovered(
                name, self._prepared(name, QueueState()), 1, RecoveryReport(queue=name)
            )
        return queue

    def _prepared(self, name: str, state: QueueState) -> QueueState:
        if self.prepare is not None:
            self.prepare(name, state)
        return state

    def _place_runs(self, state: QueueState, seq: int, event: Event) -> None:
        """Runs the record just applied made or moved: their bodies are where the record
        is (a state that cannot read them back keeps them)."""
        if state.read is not None:
            segment, offset, length, lsn = self._where
            for run in state.unplaced:
                state.place(run, place_of(segment, offset, length, seq, lsn, event, run.ref))
            for put, i, token in state.unpatched:  # a body an update changed (Run.patches)
                state.place_patch(put, i, token, (segment, offset, length, seq, lsn))
        state.unplaced.clear()
        state.unpatched.clear()

    def _apply(self, queue: QueueRecovered, first_seq: int, events: list[Event]) -> None:
        for offset, event in enumerate(events):
            seq = first_seq + offset
            if queue.gap:
                return
            starts = type(event) is QueueCreated and not queue.state.created
            if not (starts or queue.state.created) and (queue.headless or seq != queue.next_seq):
                self._skip_headless(queue, seq, event)
                continue
            if seq != queue.next_seq and not starts:
                self._gap(queue, queue.next_seq)
                return
            queue.state.apply(event)
            if queue.state.unplaced or queue.state.unpatched:
                self._place_runs(queue.state, seq, event)
            queue.next_seq = seq + 1
            queue.report.records_replayed += 1
            self.records += 1
            if type(event) is QueueDeleted:
                self.deleted[queue.name] = seq
            elif starts:
                self.deleted.pop(queue.name, None)
        queue.report.last_seq = queue.next_seq - 1

    def _skip_headless(self, queue: QueueRecovered, seq: int, event: Event) -> None:
        """Skip a record of a queue that does not exist, whose records before it are gone:
        the rest of a deleted life whose first segments were pruned (FORMAT.md: a deleted
        queue's segments may go once its objects are erased), up to its ``QueueDeleted``. A
        ``QueueCreated`` after it starts the queue's next life; without a ``QueueDeleted``
        the records are missing (reported once the log is read)."""
        if not queue.headless:
            queue.headless = queue.next_seq
        queue.next_seq = seq + 1
        if type(event) is QueueDeleted:
            queue.headless = 0
            self.deleted[queue.name] = seq

    def _gap(self, queue: QueueRecovered, missing: int) -> None:
        queue.gap = True
        reason = f"gap: record {missing} of queue {queue.name} is missing"
        queue.report.discarded.append(Discarded(self.device.url, 0, None, reason))

    # ---------------------------------------------------------------- repairs

    async def repair(self, epoch: int) -> None:
        """Carry out what reading decided: copies of damaged segments, cut tails, and the
        version-1 damage (a snapshot of what was kept first, then the objects aside)."""
        for key in self._aside:
            await self.device.keep_copy(key, epoch)
        for key, length in self._cut:
            await self.device.truncate(key, length)
        for name, damaged in self._legacy_damage.items():
            queue = self.queues[name]
            await _set_legacy_damage_aside(self.store, name, damaged, queue, epoch)
        for queue in self.queues.values():
            if queue.state.created or not queue.report.clean:
                queue.report.epoch = epoch
                self.reports.append(queue.report)


class _ReadAhead:
    """A log's segments read in order, the next ones read meanwhile: on an object store,
    where each block is an object of its own, a log of thousands of them then costs one
    round trip per ``depth`` segments, not one per segment (a failed write makes the shard
    read its whole log again: with one read at a time, a 2-s outage of the store cost 20 s
    of reading). A device that writes one block at a time (a local file of 16 MiB
    segments) is read one segment at a time, as before."""

    def __init__(self, device: LogDevice, keys: list[str]) -> None:
        self.device = device
        self.keys = keys
        self.depth = 1 if device.write_slots <= 1 else READ_AHEAD_PER_SLOT * device.write_slots
        self.reads: dict[int, asyncio.Task[bytes]] = {}

    async def read(self, index: int) -> bytes:
        """Segment ``index``'s bytes; the reads of the next ones start.

        Raises: KeyNotFound, StoreError (as :meth:`LogDevice.read`)."""
        for i in range(index, min(index + self.depth, len(self.keys))):
            if i not in self.reads:
                task = asyncio.ensure_future(self.device.read(self.keys[i]))
                task.add_done_callback(_retrieve)
                self.reads[i] = task
        return await self.reads.pop(index)

    def cancel(self) -> None:
        """Drop the reads nobody will use (the replay stopped, or failed)."""
        for task in self.reads.values():
            task.cancel()
        self.reads.clear()


def _retrieve(task: asyncio.Task[bytes]) -> None:
    """A read ahead that failed and was not used is not an error (nor an asyncio warning):
    the replay raises the error of the segment it needs when it needs it."""
    if not task.cancelled():
        task.exception()


def _misplaced(read: WalRead, first_lsn: int, last_epoch: int) -> str | None:
    """Why a segment with an intact header still cannot follow the ones before it."""
    if read.header.first_lsn != first_lsn:
        return f"header says first LSN {read.header.first_lsn}, the name says {first_lsn}"
    if read.header.epoch < last_epoch:
        return f"epoch {read.header.epoch} after epoch {last_epoch}: a fenced writer's segment"
    return None


def _snapshot_seqs(queue: str, listing: list[str], damaged: list[str]) -> list[int]:
    prefix = keys.snapshot_prefix(queue)
    seqs = []
    for key in listing:
        if key.startswith(prefix) and key not in damaged:
            try:
                seqs.append(keys.seq_of(key))
            except DataError:
                continue
    return sorted(seqs)


async def _set_legacy_damage_aside(
    store: ObjectStore, name: str, damaged: list[str], queue: QueueRecovered, epoch: int
) -> None:
    """Snapshot what was kept of a version-1 log, then move each damaged object aside — in
    that order, so a crash in between repeats the same recovery.

    Raises:
        Unavailable: the snapshot could not be written and verified.
    """
    seq = queue.next_seq - 1
    snapshots = [k for k in damaged if k.startswith(keys.snapshot_prefix(name))]
    segments = [k for k in damaged if k not in snapshots]
    await _move_aside(store, snapshots, epoch)  # segments still hold what they covered
    if segments and queue.state.created:
        key = await write_snapshot(store, name, seq, encode_state(queue.state, epoch, seq))
        if key is None:
            raise Unavailable(f"queue {name}: the repair snapshot did not verify")
        queue.snapshots = sorted({*queue.snapshots, seq})
    await _move_aside(store, segments, epoch)
    log.warning("queue %s: moved %d damaged object(s) aside", name, len(damaged))


async def _move_aside(store: ObjectStore, damaged: list[str], epoch: int) -> None:
    for key in damaged:
        if await copy_object(store, key, keys.damaged_key(key, epoch)):
            await store.delete(key)


async def _store_report(
    store: ObjectStore, shard: int, report: ShardReport, reports: list[RecoveryReport]
) -> None:
    """Keep what recovery found (the log, and each queue that had something to tell)."""
    notable = [r for r in reports if not r.clean or r.segments_replayed or r.records_replayed]
    data = msgspec.json.encode(StoredReport(report, notable))
    try:
        await store.put(keys.wal_report_key(shard, report.epoch), data)
    except QueueError as exc:  # the report is for people; losing it must not stop the shard
        log.error("shard %d: could not store the recovery report: %s", shard, exc)
    clean = report.clean and all(r.clean for r in reports)
    level = logging.INFO if clean else logging.WARNING
    log.log(level, "shard %d recovered: %s", shard, data.decode())
